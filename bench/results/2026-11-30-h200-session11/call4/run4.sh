#!/usr/bin/env bash
# Session 11, call 4 (bundle of 3682dcf): programmatic edges into probed cuBLASLt decode GEMMs.
#  tests: the probe and capture helper; captured decode GEMMs vs eager (default and TANDEM_GEMM_PDL=0)
#  A/B: TANDEM_GEMM_PDL=0 (base) vs default, batch 8 / 64 / 256 at 1K, 3 runs each.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_test pdl_probe "$B/programmatic_edge_cuda_test"
dc_test gemm_capture TANDEM_GEMM_AUTOTUNE_LOG=1 "$B/cublas_gemm_cuda_test"
dc_test gemm_capture_no_pdl TANDEM_GEMM_PDL=0 "$B/cublas_gemm_cuda_test"
dc_wait_synth
timeout 100 env TANDEM_GEMM_AUTOTUNE_LOG=1 "$B/engine_bench" --model /tmp/tandem_m8b --batches 64 --contexts 1024 --iters 20 --skip sampling,prefill,profile,gemv-ab,skinny-ab > "$R/log_b64.txt" 2>&1
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b --batches 8,64,256 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" base=engine_bench,TANDEM_GEMM_PDL=0 pdl=engine_bench > "$R/ab.log" 2>&1
dc_finish

#!/usr/bin/env bash
# Session 11, call 11 (bundle of 228f9fd): which cuBLASLt candidates wait for their predecessor
# (TANDEM_GEMM_PDL_PROBE_ALL=1 log at batch 64); the capture tests (default, PDL off, preferring
# waiting algorithms); A/B of TANDEM_GEMM_PDL_PREFER_US=3 / 8 against PDL off and the default.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_test gemm_capture "$B/cublas_gemm_cuda_test"
dc_test gemm_capture_no_pdl TANDEM_GEMM_PDL=0 "$B/cublas_gemm_cuda_test"
dc_test gemm_capture_prefer TANDEM_GEMM_PDL_PREFER_US=5 TANDEM_GEMM_AUTOTUNE_LOG=1 "$B/cublas_gemm_cuda_test"
dc_test pdl_probe "$B/programmatic_edge_cuda_test"
dc_wait_synth
timeout 100 env TANDEM_GEMM_PDL_PROBE_ALL=1 TANDEM_GEMM_AUTOTUNE_LOG=1 "$B/engine_bench" --model /tmp/tandem_m8b --batches 64 --contexts 1024 --iters 20 --skip sampling,prefill,profile,gemv-ab,skinny-ab > "$R/log_probe_all.txt" 2>&1
bash bench/engine/ab.sh "$R/ab8b" 2 "$B" "--model /tmp/tandem_m8b --batches 64,256 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" off=engine_bench,TANDEM_GEMM_PDL=0 pdl=engine_bench prefer3=engine_bench,TANDEM_GEMM_PDL_PREFER_US=3 prefer8=engine_bench,TANDEM_GEMM_PDL_PREFER_US=8 > "$R/ab8b.log" 2>&1
dc_finish

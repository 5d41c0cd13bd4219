#!/usr/bin/env bash
# Session 11, call 5 (bundle of a5195c2): the down projection (cuBLASLt splits K) on the skinny GEMM at
# 33-64 rows (TANDEM_SKINNY_SPLITK_MAX_ROWS=64) against the default; 8B batch 48 / 64 at 1K and 8K,
# 1B batch 64 at 1K; plus the skinny GEMM's GPU test.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_synth llama-3.2-1b /tmp/tandem_m1b
dc_test skinny "$B/skinny_gemm_cuda_test"
dc_wait_synth
timeout 100 env TANDEM_SKINNY_SPLITK_MAX_ROWS=64 TANDEM_GEMM_AUTOTUNE_LOG=1 "$B/engine_bench" --model /tmp/tandem_m8b --batches 64 --contexts 1024 --iters 20 --skip sampling,prefill,gemv-ab,skinny-ab > "$R/profile_splitk64.txt" 2>&1
bash bench/engine/ab.sh "$R/ab8b" 3 "$B" "--model /tmp/tandem_m8b --batches 48,64 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab" base=engine_bench splitk64=engine_bench,TANDEM_SKINNY_SPLITK_MAX_ROWS=64 > "$R/ab8b.log" 2>&1
bash bench/engine/ab.sh "$R/ab1b" 2 "$B" "--model /tmp/tandem_m1b --batches 64 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" base=engine_bench splitk64=engine_bench,TANDEM_SKINNY_SPLITK_MAX_ROWS=64 > "$R/ab1b.log" 2>&1
dc_finish

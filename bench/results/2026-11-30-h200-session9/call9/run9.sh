#!/usr/bin/env bash
# Session 9, call 9 (commit COMMIT): the skinny GEMM's fused forms at 33-64 rows only (QKV + RoPE /
# KV append, gate/up + SiLU), the plain projections on cuBLASLt: A/B at batch 32 / 48 / 64, 1K.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=120
T0=$(date +%s)
dc_test skinny "$B/skinny_gemm_cuda_test"
dc_test runner_qkv64 TANDEM_SKINNY_QKV_MAX_ROWS=64 TANDEM_SKINNY_GATED_MAX_ROWS=64 "$B/cuda_model_runner_test"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b --batches 48,64 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench qkv64=engine_bench,TANDEM_SKINNY_QKV_MAX_ROWS=64 gated64=engine_bench,TANDEM_SKINNY_GATED_MAX_ROWS=64 \
  both=engine_bench,TANDEM_SKINNY_QKV_MAX_ROWS=64,TANDEM_SKINNY_GATED_MAX_ROWS=64 > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

#!/usr/bin/env bash
# Session 9, call 12 (commit b6c1a6b, reverted after): the TMA-fed wide skinny GEMM for the plain 33-64-row
# projections (O, down, LM head): its GPU test, then an A/B at batch 48 / 64 (1K) against the
# defaults (cuBLASLt), with the plain projections on it at three split aims, and on the cp.async
# 64-row kernel for reference. QKV and gate/up stay on cuBLASLt in every variant.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=150
T0=$(date +%s)
P="TANDEM_SKINNY_MAX_ROWS=64,TANDEM_SKINNY_QKV_MAX_ROWS=32,TANDEM_SKINNY_GATED_MAX_ROWS=32"
ok=(base=engine_bench cp64=engine_bench,$P)
dc_test tma_wide TANDEM_SKINNY_TMA_WIDE=1 "$B/skinny_gemm_cuda_test" && \
  ok+=(tw4=engine_bench,$P,TANDEM_SKINNY_TMA_WIDE=1,TANDEM_SKINNY_CTAS_PER_SM=4 \
       tw2=engine_bench,$P,TANDEM_SKINNY_TMA_WIDE=1,TANDEM_SKINNY_CTAS_PER_SM=2 \
       tw8=engine_bench,$P,TANDEM_SKINNY_TMA_WIDE=1,TANDEM_SKINNY_CTAS_PER_SM=8)
echo "variants: ${ok[*]} ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 2 "$B" "--model /tmp/tandem_m8b --batches 48,64 --contexts 1024 --skip sampling,prefill,gemv-ab,skinny-ab" "${ok[@]}" > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

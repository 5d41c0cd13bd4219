#!/usr/bin/env bash
# Session 9, call 4 (commit COMMIT): the TMA producer (TANDEM_PREFILL_SM90_WS=3, =4 with the
# ping-pong): prefill attention tests of each, then an A/B at prefill 2K / 8K.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=90
T0=$(date +%s)
ok=(base=engine_bench ws=engine_bench,TANDEM_PREFILL_SM90_WS=1)
dc_test tma TANDEM_PREFILL_SM90_WS=3 "$B/attention_cuda_test" --gtest_filter='*Prefill*' && ok+=(tma=engine_bench,TANDEM_PREFILL_SM90_WS=3)
dc_test tma_pp TANDEM_PREFILL_SM90_WS=4 "$B/attention_cuda_test" --gtest_filter='*Prefill*' && ok+=(tma_pp=engine_bench,TANDEM_PREFILL_SM90_WS=4)
dc_test tma_2st TANDEM_PREFILL_SM90_WS=3 TANDEM_PREFILL_SM90_STAGES=2 "$B/attention_cuda_test" --gtest_filter='*Prefill*' && ok+=(tma_2st=engine_bench,TANDEM_PREFILL_SM90_WS=3,TANDEM_PREFILL_SM90_STAGES=2)
dc_test base "$B/attention_cuda_test"
echo "variants: ${ok[*]}  ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 2 "$B" "--model /tmp/tandem_m8b --batches 1 --contexts 1024 --iters 5 --prefill 512,2048,8192 --skip sampling,profile,gemv-ab,skinny-ab" "${ok[@]}" > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

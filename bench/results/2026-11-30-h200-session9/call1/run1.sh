#!/usr/bin/env bash
# Session 9, call 1: warp-specialized prefill attention (TANDEM_PREFILL_SM90_WS=1 producer warpgroup,
# =2 plus ping-pong + setmaxnreg), commit 5d3a3cd; prefill attention tests of each variant, then an A/B
# at prefill 2K / 8K on the Llama-3-8B shape (variants whose tests passed).
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=90
ok=(base=engine_bench)
dc_test base "$B/attention_cuda_test" --gtest_filter='*Prefill*'
dc_test ws TANDEM_PREFILL_SM90_WS=1 "$B/attention_cuda_test" --gtest_filter='*Prefill*' && ok+=(ws=engine_bench,TANDEM_PREFILL_SM90_WS=1)
dc_test pp TANDEM_PREFILL_SM90_WS=2 "$B/attention_cuda_test" --gtest_filter='*Prefill*' && ok+=(pp=engine_bench,TANDEM_PREFILL_SM90_WS=2)
dc_test ws_2st TANDEM_PREFILL_SM90_WS=1 TANDEM_PREFILL_SM90_STAGES=2 "$B/attention_cuda_test" --gtest_filter='*Prefill*'
dc_test pp_2st TANDEM_PREFILL_SM90_WS=2 TANDEM_PREFILL_SM90_STAGES=2 "$B/attention_cuda_test" --gtest_filter='*Prefill*' && ok+=(pp2=engine_bench,TANDEM_PREFILL_SM90_WS=2,TANDEM_PREFILL_SM90_STAGES=2)
echo "variants: ${ok[*]}" >> "$R/tests.txt"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 2 "$B" "--model /tmp/tandem_m8b --batches 1 --contexts 1024 --iters 10 --prefill 2048,8192 --skip sampling,profile,gemv-ab,skinny-ab" "${ok[@]}" > "$R/ab.log" 2>&1
dc_finish

#!/usr/bin/env bash
# Session 9, call 7 (commit COMMIT vs e09fff4 as engine_bench_base): the TMA producer's second form
# (one warp, per-lane boxes, tensor map prefetch): attention tests, A/B at prefill 512 / 2K / 8K.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=120
T0=$(date +%s)
ok=(base=engine_bench_base)
dc_test attention "$B/attention_cuda_test" && ok+=(new=engine_bench)
dc_test tma_pp TANDEM_PREFILL_SM90_WS=4 "$B/attention_cuda_test" --gtest_filter='*Prefill*'
dc_test tma_2st TANDEM_PREFILL_SM90_WS=3 TANDEM_PREFILL_SM90_STAGES=2 "$B/attention_cuda_test" --gtest_filter='*Prefill*' && ok+=(new_2st=engine_bench,TANDEM_PREFILL_SM90_STAGES=2)
echo "variants: ${ok[*]}  ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b --batches 1 --contexts 1024 --iters 5 --prefill 512,2048,8192 --skip sampling,profile,gemv-ab,skinny-ab" "${ok[@]}" > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

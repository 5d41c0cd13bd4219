#!/usr/bin/env bash
# Session 9, call 5 (commit COMMIT, the final code: TMA-fed warp-specialized prefill attention by
# default): every attention test with the defaults and the prefill cases of the kernel variants;
# engine_bench on the Llama-3-8B shape (every section but sampling and the A/B sections) and the
# Llama-3.2-1B shape (decode).
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_synth llama-3.2-1b /tmp/tandem_m1b
export DC_TEST_S=120
T0=$(date +%s)
dc_test attention "$B/attention_cuda_test"
for v in "no_ws TANDEM_PREFILL_SM90_WS=0" "wide_2st TANDEM_PREFILL_SM90_WS=0 TANDEM_PREFILL_SM90_STAGES=2" \
         "tma_2st TANDEM_PREFILL_SM90_WS=3 TANDEM_PREFILL_SM90_STAGES=2" "tma_pp TANDEM_PREFILL_SM90_WS=4" \
         "mma_sync TANDEM_PREFILL_ATTN_SM90=0" "one_head TANDEM_PREFILL_SM90_HEADS=1"; do
  set -- $v
  name=$1; shift
  dc_test "$name" "$@" "$B/attention_cuda_test" --gtest_filter='*Prefill*'
done
echo "tests done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
timeout 240 "$B/engine_bench" --model /tmp/tandem_m8b --skip sampling,gemv-ab,skinny-ab --json "$R/engine_bench_8b.json" > "$R/engine_bench_8b.log" 2>&1
echo "8b rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
timeout 100 "$B/engine_bench" --model /tmp/tandem_m1b --batches 1,8,64 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab --json "$R/engine_bench_1b.json" > "$R/engine_bench_1b.log" 2>&1
echo "1b rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

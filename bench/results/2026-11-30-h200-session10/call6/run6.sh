#!/usr/bin/env bash
# Session 10, call 6 (commit c45b527, the final kernels; base 9b59661 = before chaining): every attention
# test; engine_bench on the Llama-3-8B shape (every section but sampling and the A/B sections) and
# the Llama-3.2-1B shape (decode); A/B of chaining (default vs TANDEM_DECODE_CHAIN=0) at batch
# 48-256, 1K.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_synth llama-3.2-1b /tmp/tandem_m1b
export DC_TEST_S=120
T0=$(date +%s)
dc_test attention "$B/attention_cuda_test"
dc_test decode_evict_first TANDEM_DECODE_EVICT_FIRST=1 "$B/attention_cuda_test" --gtest_filter='*Decode*'
echo "tests done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
timeout 240 "$B/engine_bench" --model /tmp/tandem_m8b --skip sampling,gemv-ab,skinny-ab --json "$R/engine_bench_8b.json" > "$R/engine_bench_8b.log" 2>&1
echo "8b rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
timeout 100 "$B/engine_bench" --model /tmp/tandem_m1b --batches 1,8,64 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab --json "$R/engine_bench_1b.json" > "$R/engine_bench_1b.log" 2>&1
echo "1b rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
bash bench/engine/ab.sh "$R/ab" 2 "$B" "--model /tmp/tandem_m8b --batches 1,48,64,128,256 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base new=engine_bench off=engine_bench,TANDEM_DECODE_CHAIN=0 > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

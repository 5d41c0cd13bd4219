#!/usr/bin/env bash
# Session 10, call 5 (commit cb6fa84 vs 9b59661 as engine_bench_base): chained decode attention for
# contexts up to 2K (default chain cap 32; TANDEM_DECODE_CHAIN=2 caps it at 2, =0 turns it off);
# attention tests with and without chaining.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=150
T0=$(date +%s)
dc_test attention "$B/attention_cuda_test"
dc_test decode_unchained TANDEM_DECODE_CHAIN=0 "$B/attention_cuda_test" --gtest_filter='*Decode*'
echo "tests done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b --batches 48,64,128,256 --contexts 1024,2048 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base chain=engine_bench chain2=engine_bench,TANDEM_DECODE_CHAIN=2 off=engine_bench,TANDEM_DECODE_CHAIN=0 > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

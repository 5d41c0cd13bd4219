#!/usr/bin/env bash
# Session 10, call 4 (commit 9309084 vs 0e64cf6 as engine_bench_base): the decode attention's
# cp.async with the L2::256B fetch-size hint, with the evict-first rule (from 2 sequences) and
# without any policy; decode attention tests.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=150
T0=$(date +%s)
dc_test attention "$B/attention_cuda_test"
dc_test decode_no_evict_first TANDEM_DECODE_EVICT_FIRST=0 "$B/attention_cuda_test" --gtest_filter='*Decode*'
echo "tests done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b --batches 1,8,64,256 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base f256=engine_bench base_plain=engine_bench_base,TANDEM_DECODE_EVICT_FIRST=0 \
  f256_plain=engine_bench,TANDEM_DECODE_EVICT_FIRST=0 > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

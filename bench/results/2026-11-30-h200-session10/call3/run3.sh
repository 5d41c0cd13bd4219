#!/usr/bin/env bash
# Session 10, call 3 (commit 2158d47 vs bbfa255 as engine_bench_base): the decode attention's
# evict-first form by batch (default from 8 sequences; forced on for all), with and without the
# O prefetch (8 MiB); attention tests with the policy forced on and off.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=150
T0=$(date +%s)
dc_test attention "$B/attention_cuda_test"
dc_test decode_evict_first TANDEM_DECODE_EVICT_FIRST=1 "$B/attention_cuda_test" --gtest_filter='*Decode*'
dc_test decode_no_evict_first TANDEM_DECODE_EVICT_FIRST=0 "$B/attention_cuda_test" --gtest_filter='*Decode*'
echo "tests done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b --batches 1,2,4,8,16,64,256 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base new=engine_bench ef_all=engine_bench,TANDEM_DECODE_EVICT_FIRST=1 \
  new_o8=engine_bench,TANDEM_DECODE_PREFETCH_O=8 plain_o8=engine_bench,TANDEM_DECODE_EVICT_FIRST=0,TANDEM_DECODE_PREFETCH_O=8 > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

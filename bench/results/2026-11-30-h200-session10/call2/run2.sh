#!/usr/bin/env bash
# Session 10, call 2 (commit e71bd1c vs bbfa255 as engine_bench_base): the decode attention's cache
# read evict-first always, its bulk-copy (TMA) form (TANDEM_DECODE_BULK=1), and the O prefetch
# (TANDEM_DECODE_PREFETCH_O=8); attention tests with and without the bulk form.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=150
T0=$(date +%s)
dc_test attention "$B/attention_cuda_test"
dc_test decode_bulk TANDEM_DECODE_BULK=1 "$B/attention_cuda_test" --gtest_filter='*Decode*'
dc_test decode_bulk_unpacked TANDEM_DECODE_BULK=1 TANDEM_DECODE_PACK_LO=0 "$B/attention_cuda_test" --gtest_filter='*Decode*'
echo "tests done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b --batches 1,8,64,256 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base ef=engine_bench bulk=engine_bench,TANDEM_DECODE_BULK=1 \
  ef_o8=engine_bench,TANDEM_DECODE_PREFETCH_O=8 bulk_o8=engine_bench,TANDEM_DECODE_BULK=1,TANDEM_DECODE_PREFETCH_O=8 > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

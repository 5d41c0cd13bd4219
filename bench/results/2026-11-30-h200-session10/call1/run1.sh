#!/usr/bin/env bash
# Session 10, call 1 (commit 352713a vs bbfa255 as engine_bench_base): the decode attention's L2
# prefetch of the O projection weights (TANDEM_DECODE_PREFETCH_O=MiB); attention tests (decode
# cases relaunch with a prefetch and must give the same bits); A/B base / new off / 8 / 16 / 32 MiB.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=150
T0=$(date +%s)
dc_test attention "$B/attention_cuda_test"
dc_test attention_prefetch_unpacked TANDEM_DECODE_PACK_LO=0 "$B/attention_cuda_test" --gtest_filter='*Decode*'
echo "tests done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b --batches 1,8,64,256 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base off=engine_bench o8=engine_bench,TANDEM_DECODE_PREFETCH_O=8 \
  o16=engine_bench,TANDEM_DECODE_PREFETCH_O=16 o32=engine_bench,TANDEM_DECODE_PREFETCH_O=32 > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

#!/usr/bin/env bash
# Session 9, call 11 (commit 11e3670 vs 5bfb6b5 as engine_bench_base): the TMA producer's boxes of
# up to 128 rows for larger KV blocks; attention tests (now with 64- and 128-token blocks); A/B of
# the base and new builds at 16-token blocks and the new one at 64 and 128 (engine_bench
# --block-size, through wrapper scripts so ab.sh can alternate them).
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=150
T0=$(date +%s)
dc_test attention "$B/attention_cuda_test"
dc_test tma_pp TANDEM_PREFILL_SM90_WS=4 "$B/attention_cuda_test" --gtest_filter='*Prefill*'
for n in 64 128; do
  printf '#!/bin/sh\nexec "$(dirname "$0")/engine_bench" --block-size %s "$@"\n' $n > "$B/engine_bench_bs$n"
  chmod +x "$B/engine_bench_bs$n"
done
echo "tests done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 2 "$B" "--model /tmp/tandem_m8b --batches 1,64 --contexts 1024 --iters 20 --prefill 2048,8192 --skip sampling,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base new=engine_bench bs64=engine_bench_bs64 bs128=engine_bench_bs128 > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

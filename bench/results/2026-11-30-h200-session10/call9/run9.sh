#!/usr/bin/env bash
# Session 10, call 9 (commit 07075e4, the final code, vs c45b527 as engine_bench_base): every
# attention test; the Llama-3.2-1B shape's decode (chaining now head_dim 128 only) and the
# Llama-3-8B shape's batch 1 / 64 at 1K, base and new alternating.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_synth llama-3.2-1b /tmp/tandem_m1b
export DC_TEST_S=120
T0=$(date +%s)
dc_test attention "$B/attention_cuda_test"
dc_test decode_unchained TANDEM_DECODE_CHAIN=0 "$B/attention_cuda_test" --gtest_filter='*Decode*'
echo "tests done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
bash bench/engine/ab.sh "$R/ab1b" 2 "$B" "--model /tmp/tandem_m1b --batches 1,8,64 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base new=engine_bench > "$R/ab1b.log" 2>&1
bash bench/engine/ab.sh "$R/ab8b" 2 "$B" "--model /tmp/tandem_m8b --batches 1,64 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base new=engine_bench > "$R/ab8b.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

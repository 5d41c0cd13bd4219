#!/usr/bin/env bash
# Session 11, call 8 (bundle of 62ad2ca = the final code, the same kernels and runtime as 4cb77e3):
# every kernel GPU test; engine_bench on the Llama-3-8B shape (every section but sampling and the
# A/B sections) and the Llama-3.2-1B shape (decode).
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_synth llama-3.2-1b /tmp/tandem_m1b
export DC_TEST_S=120
T0=$(date +%s)
for t in attention rmsnorm elementwise gemv skinny_gemm sampling wgmma_probe; do
  dc_test $t "$B/${t}_cuda_test"
done
echo "tests done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
timeout 240 "$B/engine_bench" --model /tmp/tandem_m8b --skip sampling,gemv-ab,skinny-ab --json "$R/engine_bench_8b.json" > "$R/engine_bench_8b.log" 2>&1
echo "8b rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
timeout 100 "$B/engine_bench" --model /tmp/tandem_m1b --batches 1,8,64 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab --json "$R/engine_bench_1b.json" > "$R/engine_bench_1b.log" 2>&1
echo "1b rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

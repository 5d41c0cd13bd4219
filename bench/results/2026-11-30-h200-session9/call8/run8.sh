#!/usr/bin/env bash
# Session 9, call 8 (commit 211c76c, the final code; bundle built from 0552139, the same code): every attention test with
# the defaults; engine_bench on the Llama-3-8B shape (every section but sampling and the A/B
# sections) and the Llama-3.2-1B shape (decode); an A/B of the prefill attention forms at 2K / 8K
# (default = TMA producer, ws0 = no producer, ws1 = cp.async producer, ws4 = TMA + ping-pong).
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_synth llama-3.2-1b /tmp/tandem_m1b
export DC_TEST_S=120
T0=$(date +%s)
dc_test attention "$B/attention_cuda_test"
dc_test prefill_ws0 TANDEM_PREFILL_SM90_WS=0 "$B/attention_cuda_test" --gtest_filter='*Prefill*'
echo "tests done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
timeout 240 "$B/engine_bench" --model /tmp/tandem_m8b --skip sampling,gemv-ab,skinny-ab --json "$R/engine_bench_8b.json" > "$R/engine_bench_8b.log" 2>&1
echo "8b rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
timeout 100 "$B/engine_bench" --model /tmp/tandem_m1b --batches 1,8,64 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab --json "$R/engine_bench_1b.json" > "$R/engine_bench_1b.log" 2>&1
echo "1b rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
bash bench/engine/ab.sh "$R/ab" 2 "$B" "--model /tmp/tandem_m8b --batches 1 --contexts 1024 --iters 5 --prefill 2048,8192 --skip sampling,profile,gemv-ab,skinny-ab" \
  default=engine_bench ws0=engine_bench,TANDEM_PREFILL_SM90_WS=0 ws1=engine_bench,TANDEM_PREFILL_SM90_WS=1 ws4=engine_bench,TANDEM_PREFILL_SM90_WS=4 > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

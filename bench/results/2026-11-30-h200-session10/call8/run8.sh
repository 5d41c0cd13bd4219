#!/usr/bin/env bash
# Session 10, call 8 (commit c45b527 vs bbfa255, the session's start, as engine_bench_base): the
# Llama-3.2-1B shape (head_dim 64) with the session's decode changes on and off: chaining
# (TANDEM_DECODE_CHAIN=0) and the evict-first cache read (TANDEM_DECODE_EVICT_FIRST=0).
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3.2-1b /tmp/tandem_m1b
T0=$(date +%s)
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m1b --batches 1,8,64 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base new=engine_bench nochain=engine_bench,TANDEM_DECODE_CHAIN=0 \
  noef=engine_bench,TANDEM_DECODE_EVICT_FIRST=0 none=engine_bench,TANDEM_DECODE_CHAIN=0,TANDEM_DECODE_EVICT_FIRST=0 > "$R/ab.log" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish

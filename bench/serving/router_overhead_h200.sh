#!/usr/bin/env bash
# bench/serving/router_overhead.sh on the GPU host's 16 idle cores (no GPU used): the 2-core VM's
# steal time hid the router's end-to-end share (bench/RESULTS.md, "Router overhead, third look").
# The model is `tandem model synth --like tiny` (the bundled model is too large to travel with the
# bundle); the router's work per request does not depend on the model's size. From the
# repository root with tools/gpu-pack's bundle carried; results in $OUT/r.tgz.
set -u
source bench/engine/device_call.sh
dc_setup || exit 1
TINY=/tmp/tandem_tiny
dc_synth tiny "$TINY"
dc_wait_synth || { echo "synth failed" >> "$R/tests.txt"; dc_finish; exit 1; }
nproc > "$R/cpu.txt"
grep -m1 "model name" /proc/cpuinfo >> "$R/cpu.txt"
for run in 1 2; do
  VOCAB=480 MODEL="$TINY" DIRECT_BENCH="$B/decode_direct_bench" ROUNDS=3 \
    timeout 280 bash bench/serving/router_overhead.sh "$B" > "$R/router_overhead_$run.txt" 2>&1
  echo "router_overhead run $run rc=$?" >> "$R/tests.txt"
  w=$(sed -n 's/^raw output: //p' "$R/router_overhead_$run.txt")
  [[ -n "$w" && -d "$w" ]] && cp -r "$w" "$R/raw_$run" && rm -f "$R/raw_$run/token"
done
dc_finish

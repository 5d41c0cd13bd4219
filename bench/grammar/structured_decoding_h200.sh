#!/usr/bin/env bash
# One device call (issue 23's target): what structured decoding costs the CUDA engine's decode,
# with the grammar masks applied on the GPU (token_mask_kernels.h) after the GPU tests of that
# path (token_mask_cuda_test, sampling_cuda_test, cuda_runner_sampling_test).
# `tandem serve --aggregated --device cuda` on the synthesized Llama-3-8B shape (vocabulary
# 128,256), then `tandem bench` at concurrency 1 and 32
# (input 128, output 256 tokens, greedy): unconstrained (--ignore-eos), under an open-ended regex
# (--ignore-eos: as long as plain), under a JSON Schema and under json_object (those end when the
# document does). The figure is TPOT (per-output-token time) constrained over unconstrained.
# TESTS=0 skips the GPU tests; KINDS picks the cases. (The host-sampled comparison in
# bench/RESULTS.md ran at commit 207dbc5, whose --grammar-masks host is gone since.) From the repository root with the
# bundle of tools/gpu-pack carried; results in $OUT/r.tgz (device_call.sh).
set -u
source bench/engine/device_call.sh
dc_setup || exit 1
M8B=/tmp/tandem_m8b
dc_synth llama-3-8b "$M8B"
# The GPU tests of the masked sampling path first (kernels, then the runner).
if [[ ${TESTS:-1} != 0 ]]; then
  DC_TEST_S=240 dc_test token_mask "$B/token_mask_cuda_test"
  DC_TEST_S=240 dc_test sampling "$B/sampling_cuda_test"
fi
DC_TEST_S=300 dc_test runner_sampling "$B/cuda_runner_sampling_test"
dc_wait_synth || { echo "synth failed" >> "$R/tests.txt"; dc_finish; exit 1; }

# serve_case NAME KINDS...: tandem serve --aggregated, then each kind at concurrency 1 and 32.
serve_case() {
  local masks="$1"
  shift
  local port=18200
  "$B/tandem" serve --aggregated --model "$M8B" --device cuda --port $port --kv-cache-mib 16384 \
    --startup-timeout-s 200 > "$R/serve_$masks.log" 2>&1 &
  local pid=$!
  if dc_wait_serving "$R/serve_$masks.log" $pid 200; then
    for c in 1 32; do
      local n=8
      ((c == 32)) && n=96
      for kind in "$@"; do
        local extra=()
        case $kind in
          plain) extra=(--ignore-eos) ;;
          regex) extra=(--ignore-eos --extra-body "$regex") ;;
          schema) extra=(--extra-body "$schema") ;;
          object) extra=(--extra-body "$object") ;;
        esac
        timeout 240 "$B/tandem" bench --url "http://127.0.0.1:$port/v1" --endpoint chat \
          --tokenizer "$M8B" --input-len 128 --output-len 256 --num-prompts $n \
          --max-concurrency $c --warmup 2 --seed 1 --no-progress "${extra[@]}" \
          --json "$R/bench_${masks}_${kind}_c$c.json" > "$R/bench_${masks}_${kind}_c$c.txt" 2>&1
        echo "bench $masks $kind c=$c rc=$?" >> "$R/tests.txt"
      done
    done
    curl -s "http://127.0.0.1:$port/metrics" > "$R/metrics_$masks.txt"
  else
    echo "serve $masks did not come up" >> "$R/tests.txt"
  fi
  dc_stop $pid
}

# An open-ended regex (never complete, so every output is 256 tokens, like plain's with
# --ignore-eos), a JSON Schema with an unbounded list of integers, and json_object.
regex='{"guided_regex": "[a-zA-Z0-9 ,.]*"}'
schema='{"response_format": {"type": "json_schema", "json_schema": {"name": "ints", "schema": {"type": "object", "properties": {"v": {"type": "array", "items": {"type": "integer"}}}, "required": ["v"], "additionalProperties": false}}}}'
object='{"response_format": {"type": "json_object"}}'
serve_case device ${KINDS:-plain regex schema object}
dc_finish

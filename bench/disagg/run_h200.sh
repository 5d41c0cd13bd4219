#!/usr/bin/env bash
# One device call for GPU KV transfer (issue 19), on one H200, from the repository root with the
# bundle of tools/gpu-pack carried (source bench/engine/device_call.sh conventions):
#   1. GPU tests: cuda_ipc backend (in-process and cross-process), disaggregated CUDA stack over
#      loopback+mirror and over cuda_ipc;
#   2. kv_ipc_bench: one 4,096-token Llama-3-8B-shape prompt (512 MiB) between two processes,
#      contiguous and scattered, beside a same-process device copy (the ceiling);
#   3. serving on the synthesized Llama-3-8B: `tandem serve --device cuda` aggregated, and 1P+1D
#      with the default --kv-transfer auto (cuda_ipc) with layer-wise streaming on and off,
#      `tandem bench` with 4,096 input and 64 output tokens at concurrency 1 and 8 (and 7,936 at
#      1); the router's /metrics before and after each, the workers' after (cases below).
# Everything lands in $OUT/r.tgz (dc_finish).
#   SERVE_CASES picks the serving cases; PROMPTS1 / PROMPTS8 the prompt counts.
set -u
source bench/engine/device_call.sh
dc_setup || exit 1
M8B=/tmp/tandem_m8b
# SYNTH_LIKE=llama-3.1-8b: the same shape with a 128K context, for the *_16k cases.
dc_synth "${SYNTH_LIKE:-llama-3-8b}" "$M8B"

DC_TEST_S=240 dc_test cuda_ipc "$B/cuda_ipc_backend_cuda_test"
DC_TEST_S=300 dc_test disagg_cuda "$B/disagg_cuda_test"
timeout 120 "$B/kv_ipc_bench" --peer "$B/kvtransfer_cuda_ipc_peer" --json "$R/kv_ipc.json" \
  > "$R/kv_ipc.txt" 2>&1
echo "kv_ipc_bench rc=$?" >> "$R/kv_ipc.txt"
timeout 120 "$B/kv_ipc_bench" --peer "$B/kvtransfer_cuda_ipc_peer" --tokens 16384 \
  --json "$R/kv_ipc_16k.json" > "$R/kv_ipc_16k.txt" 2>&1

dc_wait_synth || echo "synth failed" >> "$R/tests.txt"

# serve_case NAME INPUT_LEN "CONCURRENCIES" ARGS...: serve, bench at each concurrency (4,096 or
# INPUT_LEN input tokens, 64 output), scrape /metrics before and after each, stop.
serve_case() {
  local name="$1" input="$2" concurrencies="$3"
  shift 3
  local port=18100
  "$B/tandem" serve --model "$M8B" --device cuda --port $port --kv-cache-mib 12288 \
    --startup-timeout-s 200 "$@" > "$R/serve_$name.log" 2>&1 &
  local pid=$!
  local up=0
  for _ in $(seq 1 200); do
    grep -q "is serving" "$R/serve_$name.log" && { up=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  if ((up)); then
    for c in $concurrencies; do
      local n=${PROMPTS1:-12}
      ((c == 8)) && n=${PROMPTS8:-40}
      curl -s "http://127.0.0.1:$port/metrics" > "$R/metrics_${name}_c${c}_before.txt"
      timeout 200 "$B/tandem" bench --url "http://127.0.0.1:$port/v1" --endpoint completions \
        --tokenizer "$M8B" --input-len "$input" --output-len 64 --num-prompts "$n" \
        --max-concurrency $c --warmup 2 --seed 1 --json "$R/bench_${name}_c$c.json" \
        > "$R/bench_${name}_c$c.txt" 2>&1
      curl -s "http://127.0.0.1:$port/metrics" > "$R/metrics_${name}_c$c.txt"
    done
    # The workers' own metrics (KV bytes, streamed bytes, fallbacks) through serve's ports.
    grep -o "metrics on http://[0-9.:]*" "$R/serve_$name.log" | sed 's/metrics on //' |
      while read -r url; do curl -s "$url/metrics" >> "$R/worker_metrics_$name.txt"; done
  else
    echo "serve $name did not come up" >> "$R/tests.txt"
  fi
  kill -INT $pid 2>/dev/null
  for _ in $(seq 1 30); do kill -0 $pid 2>/dev/null || break; sleep 1; done
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
}

mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d
}
mps_off() {
  echo quit | nvidia-cuda-mps-control
  sleep 2
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

# Cases: agg (aggregated, default 512-token steps), agg8k (aggregated, 8192-token steps), on /
# off (1P+1D, --kv-transfer auto = cuda_ipc, streaming on / off), ucx and cma (the host path:
# pinned mirrors, UCX or cross-memory attach), *_mps (the same under CUDA MPS: a user-space
# daemon started and stopped here, no device setting changed; on_mps2k: prefill workers in
# 2,048-token steps),
# *_long (7,936-token prompts: the synthesized model's context is 8,192), *_16k (16,128-token
# prompts; needs SYNTH_LIKE=llama-3.1-8b).
for c in ${SERVE_CASES:-agg agg8k on off on_mps agg_long on_long off_long}; do
  case $c in
    agg) serve_case agg 4096 "1 8" --aggregated ;;
    agg8k) serve_case agg8k 4096 "1 8" --aggregated --max-num-batched-tokens 8192 ;;
    on) serve_case on 4096 "1 8" --kv-streaming on ;;
    off) serve_case off 4096 "1 8" --kv-streaming off ;;
    ucx) serve_case ucx 4096 "1 8" --kv-transfer ucx ;;
    cma) serve_case cma 4096 "1" --kv-transfer cma ;;
    on_mps) if mps_on; then serve_case on_mps 4096 "1 8"; mps_off; fi ;;
    on_mps2k) if mps_on; then
        serve_case on_mps2k 4096 "1 8" --prefill-max-num-batched-tokens 2048
        mps_off
      fi ;;
    agg_mps) if mps_on; then serve_case agg_mps 4096 "1 8" --aggregated; mps_off; fi ;;
    agg_long) serve_case agg_long 7936 "1" --aggregated ;;
    on_long) serve_case on_long 7936 "1" --kv-streaming on ;;
    off_long) serve_case off_long 7936 "1" --kv-streaming off ;;
    agg_16k) serve_case agg_16k 16128 "1" --aggregated ;;
    on_16k) serve_case on_16k 16128 "1" --kv-streaming on ;;
    off_16k) serve_case off_16k 16128 "1" --kv-streaming off ;;
  esac
done
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
dc_finish

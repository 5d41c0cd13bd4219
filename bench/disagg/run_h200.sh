#!/usr/bin/env bash
# One device call for GPU KV transfer (issue 19), on one H200, from the repository root with the
# bundle of tools/gpu-pack carried (source bench/engine/device_call.sh conventions):
#   1. GPU tests: cuda_ipc backend (in-process and cross-process), disaggregated CUDA stack over
#      loopback+mirror and over cuda_ipc;
#   2. kv_ipc_bench: one 4,096-token Llama-3-8B-shape prompt (512 MiB) between two processes,
#      contiguous and scattered, beside a same-process device copy (the ceiling);
#   3. serving on the synthesized Llama-3-8B: `tandem serve --device cuda` aggregated, and 1P+1D
#      with the default --kv-transfer auto (cuda_ipc), `tandem bench` with 4,096 input and 64
#      output tokens at concurrency 1 and 8; the router's /metrics before and after each.
# Everything lands in $OUT/r.tgz (dc_finish).
#   SERVE_CASES="agg auto ucx" picks the serving cases (also: ipc512, cuda_ipc with 512-token
#   prefill steps); PROMPTS1 / PROMPTS8 the prompt counts.
set -u
source bench/engine/device_call.sh
dc_setup || exit 1
M8B=/tmp/tandem_m8b
dc_synth llama-3-8b "$M8B"

DC_TEST_S=240 dc_test cuda_ipc "$B/cuda_ipc_backend_cuda_test"
DC_TEST_S=300 dc_test disagg_cuda "$B/disagg_cuda_test"
timeout 120 "$B/kv_ipc_bench" --peer "$B/kvtransfer_cuda_ipc_peer" --json "$R/kv_ipc.json" \
  > "$R/kv_ipc.txt" 2>&1
echo "kv_ipc_bench rc=$?" >> "$R/kv_ipc.txt"
timeout 120 "$B/kv_ipc_bench" --peer "$B/kvtransfer_cuda_ipc_peer" --tokens 16384 \
  --json "$R/kv_ipc_16k.json" > "$R/kv_ipc_16k.txt" 2>&1

dc_wait_synth || echo "synth failed" >> "$R/tests.txt"

# serve_case NAME ARGS...: serve, bench at concurrency 1 and 8, scrape /metrics, stop.
serve_case() {
  local name="$1"
  shift
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
    for c in 1 8; do
      local n=${PROMPTS1:-12}
      ((c == 8)) && n=${PROMPTS8:-40}
      curl -s "http://127.0.0.1:$port/metrics" > "$R/metrics_${name}_c${c}_before.txt"
      timeout 200 "$B/tandem" bench --url "http://127.0.0.1:$port/v1" --endpoint completions \
        --tokenizer "$M8B" --input-len 4096 --output-len 64 --num-prompts "$n" --max-concurrency $c --warmup 2 \
        --seed 1 --json "$R/bench_${name}_c$c.json" > "$R/bench_${name}_c$c.txt" 2>&1
      curl -s "http://127.0.0.1:$port/metrics" > "$R/metrics_${name}_c$c.txt"
    done
  else
    echo "serve $name did not come up" >> "$R/tests.txt"
  fi
  kill -INT $pid 2>/dev/null
  for _ in $(seq 1 30); do kill -0 $pid 2>/dev/null || break; sleep 1; done
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
}

for c in ${SERVE_CASES:-agg auto ucx}; do
  case $c in
    agg) serve_case agg --aggregated ;;
    auto) serve_case auto ;;  # the default: cuda_ipc chosen by the pair handshake
    ipc512) serve_case ipc512 --kv-transfer cuda_ipc --prefill-max-num-batched-tokens 512 ;;
    ucx) serve_case ucx --kv-transfer ucx ;;
    # The same 1P+1D under CUDA MPS (a user-space daemon started and stopped here; no device
    # setting changes): kernels of the two processes may then run at once instead of
    # time-sliced.
    auto_mps)
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
      mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
      if nvidia-cuda-mps-control -d; then
        serve_case auto_mps
        echo quit | nvidia-cuda-mps-control
        sleep 2
      else
        echo "MPS did not start" >> "$R/tests.txt"
      fi
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY ;;
  esac
done
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
dc_finish

#!/usr/bin/env bash
# One device call (one H200, bundle of tools/gpu-pack carried): every GPU test of the KV transfer
# work, and mixed-device serving. Results in $OUT/r.tgz (bench/engine/device_call.sh).
#   1. GPU tests: cuda_ipc backend, the GPU conversion kernel against the CPU routine, the nccl
#      backend (what one GPU allows), the disaggregated CUDA stack (loopback+mirror, cuda_ipc,
#      streamed) and mixed-device pairs (CUDA prefill + CPU decode and the reverse);
#   2. `tandem serve --prefill-device cuda --decode-device cpu` and the reverse on the default
#      model (models/target when carried, else the synthesized tiny model), 16 requests of 32
#      greedy tokens through the OpenAI API, beside `--aggregated --device cpu`: the token ids of
#      each request (tandem bench --json) and the workers' /metrics.
set -u
source bench/engine/device_call.sh
dc_setup || exit 1
# The GPU host has NCCL only as a Python wheel (the nccl backend dlopens libnccl.so.2).
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' \
  2>/dev/null || true)
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH${nccl:+:$nccl}"

for t in cuda_ipc_backend_cuda_test kv_convert_cuda_test nccl_backend_cuda_test; do
  [[ -x "$B/$t" ]] && DC_TEST_S=240 dc_test "${t%_test}" "$B/$t"
done
DC_TEST_S=420 dc_test disagg_cuda "$B/disagg_cuda_test"

mixed_case() {
  local name="$1"
  shift
  local port=18200
  "$B/tandem" serve --port $port --startup-timeout-s 120 "$@" > "$R/serve_$name.log" 2>&1 &
  local pid=$! up=0
  for _ in $(seq 1 120); do
    grep -q "is serving" "$R/serve_$name.log" && { up=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  if ((up)); then
    local i model
    model=$(basename "$(grep -o "serving [^ ]* at" "$R/serve_$name.log" | head -1 | cut -d' ' -f2)")
    for i in $(seq 1 16); do
      curl -s -m 120 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\": \"$model\", \"prompt\": \"Request $i of sixteen: tell me about $((i * 37)) apples, the river, and the number $((i * i)).\", \"max_tokens\": 32, \"temperature\": 0}" \
        >> "$R/completions_$name.jsonl"
      echo >> "$R/completions_$name.jsonl"
    done
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
mixed_case cpu_agg --aggregated --device cpu
mixed_case cuda_to_cpu --prefill-device cuda --decode-device cpu
mixed_case cpu_to_cuda --prefill-device cpu --decode-device cuda
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
dc_finish

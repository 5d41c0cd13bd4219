#!/usr/bin/env bash
# MLP offload on the CUDA runner (issue 26), in one device call, with the tools/gpu-pack bundle
# carried (bench/engine/device_call.sh): the GPU tests of the offload
# (runtime/mlp/cuda/mlp_backend_cuda_test.cc, runtime/model/cuda/mlp_offload_cuda_test.cc), the
# CUDA runner's own tests as a regression
# check, and a Llama-3-8B-shape decode worker started with its MLP local and on the `cpu` backend
# at the same --kv-cache-mib: its KV capacity (the worker's log) and GPU memory in use
# (nvidia-smi) once it serves. Results: $OUT/r.tgz (tests.txt, t_*.log, decode-*.log, mem-*.txt).
# Env: KV_MIB (16384).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/engine/device_call.sh
dc_setup || exit 1
dc_synth llama-3-8b /tmp/m8b
dc_test mlp_cuda "$B/mlp_backend_cuda_test"
DC_TEST_S=300 dc_test mlp_offload "$B/mlp_offload_cuda_test"
# The runner's differential tests, less the bundled model's cases (/1) where it is not carried.
filter='*'
[[ -f models/target/config.json ]] || filter='-*/1'
DC_TEST_S=300 dc_test runner "$B/cuda_model_runner_test" --gtest_filter="$filter"
dc_test runner_factory "$B/runner_factory_test"
dc_wait_synth || echo "8B synthesis failed" >> "$R/tests.txt"
token=/tmp/mlp-bench-token
echo "mlp-offload-bench-token-0123456789" > "$token" && chmod 600 "$token"
for mode in local cpu; do
  flags=()
  [[ $mode == cpu ]] && flags=(--mlp cpu)
  start=$(date +%s)
  "$B/tandem" decode --model /tmp/m8b --device cuda --port 19100 --kv-cache-mib "${KV_MIB:-16384}" \
    --service-token-file "$token" "${flags[@]}" > "$R/decode-$mode.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    grep -q "serving on" "$R/decode-$mode.log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  echo "$mode: ready after $(($(date +%s) - start)) s" >> "$R/mem-$mode.txt"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> "$R/mem-$mode.txt" 2>&1
  dc_stop "$pid"
done
dc_finish

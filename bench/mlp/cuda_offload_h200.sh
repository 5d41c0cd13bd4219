#!/usr/bin/env bash
# MLP offload on the CUDA runner (issue 26), in one device call, with the tools/gpu-pack bundle
# carried (bench/engine/device_call.sh):
# 1. the GPU tests of the offload (runtime/mlp/cuda/ipc_flags_cuda_test.cc, mlp_backend_cuda_test.cc,
#    runtime/model/cuda/mlp_offload_cuda_test.cc: cpu, cuda, remote CPU and GPU shards, and a
#    `tandem mlp-shard --device cuda` process over cuda_ipc, against the runner's own MLP) and the
#    runner's own tests as a regression check;
# 2. a Llama-3-8B-shape model synthesized here; a `tandem mlp-shard --device cuda` on the same GPU;
#    mlp_step_bench's decode step at 1K context, batch 64 and 256, with the MLP local (graphs and
#    eager), on the in-process `cuda` backend and on the shard process (`cuda_ipc`), in one run;
# 3. with MPS=1, the same with the CUDA MPS daemon started first (the two processes' kernels
#    then share the GPU instead of time-slicing).
# Results: $OUT/r.tgz (tests.txt, t_*.log, steps*.json / .txt, shard*.log).
# Env: TESTS (mlp: step 1; all: also every other GPU test of the bundle; 0: none), BENCH (1),
#      RUNNER_S (400: the runner test's limit), MPS (0), AB (0; 1: engine_bench_base against engine_bench, decode at 1K, batch 1 and 64,
#      twice each, before the offload bench), E2E (1: tandem serve over HTTP, local against GPU
#      shards), BATCHES (64,256), CONTEXT (1024), ITERS (20), MICRO (1,2: the ping-pong micro-batch
#      counts of each offloaded backend), AUTO_STEPS (40), PLAIN (1: the run without MPS),
#      SINGLE (1: the MPS run of one worker),
#      PAIR (0; 1 with MPS: two workers at batch PAIR_BATCH (64) for PAIR_ITERS (200) steps
#      timed together, each with its MLP local, then both on one shard process whose layer
#      batcher runs their calls of a layer as one GEMM; its stats in shard-pair.log).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/engine/device_call.sh
dc_setup || exit 1
export TANDEM_BIN="$B/tandem"
[[ ${BENCH:-1} == 1 ]] && dc_synth llama-3-8b /tmp/m8b
if [[ ${TESTS:-mlp} != 0 ]]; then
  # The data plane's completion flags between two processes (a peer killed before its signal).
  dc_test ipc_flags "$B/ipc_flags_cuda_test"
  dc_test mlp_cuda "$B/mlp_backend_cuda_test"
  DC_TEST_S=300 dc_test mlp_offload "$B/mlp_offload_cuda_test"
  # The runner's differential tests, less the bundled model's cases (/1) where it is not carried.
  filter='*'
  [[ -f models/target/config.json ]] || filter='-*target*:*/1'
  DC_TEST_S=${RUNNER_S:-400} dc_test runner "$B/cuda_model_runner_test" --gtest_filter="$filter"
fi
if [[ ${TESTS:-mlp} == all ]]; then
  # Every other GPU test of the bundle (the kernels under their tunings and both kernels where
  # two exist).
  for t in "$B"/*_cuda_test runner_factory_test cuda_runner_sampling_test kv_host_mirror_test; do
    [[ $t == */* ]] || t="$B/$t"
    n="$(basename "$t")"
    case $n in mlp_backend_cuda_test | mlp_offload_cuda_test | disagg_cuda_test | ipc_flags_cuda_test) continue ;; esac
    DC_TEST_S=240 dc_test "$n" "$t"
  done
fi
if [[ ${E2E:-1} == 1 ]]; then
  # Over HTTP: tandem serve on the GPU with the MLP local, then on 2 GPU shards over cuda_ipc
  # (--mlp remote --mlp-shards 2), the same greedy completions; the texts are compared.
  timeout 60 "$B/tandem" model synth --like tiny --out /tmp/tiny > "$R/synth-tiny.log" 2>&1
  for mode in local shards; do
    flags=()
    [[ $mode == shards ]] && flags=(--mlp remote --mlp-shards 2)
    "$B/tandem" serve --model /tmp/tiny --device cuda --port 18100 --aggregated \
      --decode-workers 1 --kv-cache-mib 256 "${flags[@]}" > "$R/serve-$mode.log" 2>&1 &
    pid=$!
    if dc_wait_serving "$R/serve-$mode.log" "$pid" 120; then
      python3 - "$R/e2e-$mode.json" <<'PY'
import json, sys, urllib.request
out = []
for prompt in ["The quick brown fox", "Once upon a time", "1, 2, 3,", "Tandem serves"]:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 48,
                       "temperature": 0}).encode()
    req = urllib.request.Request("http://127.0.0.1:18100/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out.append(json.load(r)["choices"][0]["text"])
json.dump(out, open(sys.argv[1], "w"))
PY
      echo "e2e $mode rc=$?" >> "$R/tests.txt"
    else
      echo "e2e $mode: did not serve" >> "$R/tests.txt"
    fi
    dc_stop "$pid"
  done
  if cmp -s "$R/e2e-local.json" "$R/e2e-shards.json"; then
    echo "e2e: identical greedy text" >> "$R/tests.txt"
  else
    echo "e2e: TEXT DIFFERS" >> "$R/tests.txt"
  fi
fi
[[ ${BENCH:-1} == 1 ]] || { dc_finish; exit 0; }
dc_wait_synth || { echo "8B synthesis failed" >> "$R/tests.txt"; dc_finish; exit 1; }
token=/tmp/mlp-bench-token
echo "mlp-offload-bench-token-0123456789" > "$token" && chmod 600 "$token"
bench() {  # bench TAG: a shard process, then mlp_step_bench against it
  "$B/tandem" mlp-shard --model /tmp/m8b --device cuda --port 19200 --max-rows 4096 \
    --service-token-file "$token" > "$R/shard-$1.log" 2>&1 &
  local shard=$! i
  for i in $(seq 1 120); do
    grep -q "serving on" "$R/shard-$1.log" && break
    kill -0 "$shard" 2>/dev/null || break
    sleep 1
  done
  timeout 400 "$B/mlp_step_bench" --model /tmp/m8b --mlp "$2" \
    --batches "${BATCHES:-64,256}" --context "${CONTEXT:-1024}" --iters "${ITERS:-20}" \
    --micro-batches "${MICRO:-1,2}" --auto-steps "${AUTO_STEPS:-40}" \
    --service-token-file "$token" --json "$R/steps-$1.json" > "$R/steps-$1.txt" 2>&1
  echo "mlp_step_bench $1 rc=$?" >> "$R/tests.txt"
  dc_stop "$shard"
}
if [[ ${AB:-0} == 1 && -x "$B/engine_bench_base" ]]; then
  bash bench/engine/ab.sh "$R/ab" 2 "$B" \
    "--model /tmp/m8b --batches 1,64 --contexts 1024 --prefill 2048 --skip sampling,profile,skinny-ab" \
    base=engine_bench_base new=engine_bench > "$R/ab.txt" 2>&1
  echo "ab rc=$?" >> "$R/tests.txt"
fi
"$B/doorbell_bench" > "$R/doorbell.txt" 2>&1
"$B/doorbell_bench" --calls 20000 --gap-us 100 >> "$R/doorbell.txt" 2>&1
[[ ${PLAIN:-1} == 1 ]] && bench plain local,cuda,cuda_ipc:127.0.0.1:19200
# pair TAG SPEC: two attention workers (two mlp_step_bench processes) at batch $PAIR_BATCH, timing
# together (--start-file), each with --mlp SPEC; with cuda_ipc both are sessions of one shard.
pair() {
  local go=/tmp/pair-go-$1 i pids=()
  rm -f "$go"
  for i in 0 1; do
    timeout 400 "$B/mlp_step_bench" --model /tmp/m8b --mlp "$2" --batches "${PAIR_BATCH:-64}" \
      --context "${CONTEXT:-1024}" --iters "${PAIR_ITERS:-200}" --micro-batches 1 \
      --service-token-file "$token" --start-file "$go" --json "$R/pair-$1-$i.json" \
      > "$R/pair-$1-$i.txt" 2>&1 &
    pids+=($!)
  done
  for i in $(seq 1 600); do
    [[ $(grep -l "mlp_step_bench: ready" "$R/pair-$1-0.txt" "$R/pair-$1-1.txt" 2>/dev/null |
      wc -l) == 2 ]] && break
    sleep 0.2
  done
  touch "$go"
  for i in "${pids[@]}"; do wait "$i"; done
  echo "pair $1 done" >> "$R/tests.txt"
}
if [[ ${MPS:-0} == 1 ]]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    [[ ${SINGLE:-1} == 1 ]] && bench mps local,cuda_ipc:127.0.0.1:19200
    if [[ ${PAIR:-0} == 1 ]]; then
      pair local local
      "$B/tandem" mlp-shard --model /tmp/m8b --device cuda --port 19201 --max-rows 4096 \
        --ipc-batch-window-us "${IPC_WINDOW_US:-200}" \
        --service-token-file "$token" > "$R/shard-pair.log" 2>&1 &
      shard=$!
      for i in $(seq 1 120); do grep -q "serving on" "$R/shard-pair.log" && break; sleep 1; done
      pair shared cuda_ipc:127.0.0.1:19201
      dc_stop "$shard"
    fi
    echo quit | nvidia-cuda-mps-control
  else
    echo "MPS daemon did not start" >> "$R/tests.txt"
  fi
fi
dc_finish

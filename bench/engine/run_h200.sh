#!/usr/bin/env bash
# One GPU session for the CUDA engine: GPU tests, a serving smoke test (tandem serve --device cuda),
# synthesized llama-3-8b / llama-3.2-1b models, engine_bench on both, and the PyTorch peer, with
# every output under $OUT.
#
#   bench/engine/run_h200.sh [BIN_DIR]
#
# BIN_DIR (default gpu-out/, or $BIN) holds the binaries built with -DTANDEM_CUDA=ON:
#   tandem engine_bench cuda_model_runner_test cuda_generate_test cuda_step_plan_test
#   runner_factory_test cuda_runner_sampling_test kv_host_mirror_test, and
#   whichever *_cuda_test binaries exist (kernel tests, disagg_cuda_test). Run from the repository root (models/target is the bundled model; override with
#   TANDEM_MODELS_DIR). OUT defaults to ./h200-out. Each step has a timeout and the whole run stays
#   under ~9 minutes (TOTAL_S, default 530); a failing step is recorded and the run goes on.
#   SKIP="step names" leaves those steps out, ONLY="step names" runs just those (to split one
#   session's work over two device calls; benchmark steps need wait-synth in ONLY too).
#   KEEP_MODELS=1 keeps the synthesized models in /tmp for the next call on the same machine.
# Results: $OUT/summary.txt (one line per step: status, seconds), $OUT/<step>.log, JSON from the
# benchmarks, gtest XML from the tests.
set -u

BIN="${1:-${BIN:-gpu-out}}"
BIN="$(cd "$BIN" && pwd)" || { echo "no binary dir $BIN" >&2; exit 1; }
OUT="${OUT:-$PWD/h200-out}"
mkdir -p "$OUT"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export TANDEM_MODELS_DIR="${TANDEM_MODELS_DIR:-$ROOT/models}"
export TANDEM_BIN="$BIN/tandem"
TOTAL_S="${TOTAL_S:-530}"
START=$(date +%s)
M8B=/tmp/tandem_m8b
M1B=/tmp/tandem_m1b
PY="${PYTHON:-python3}"

remaining() { echo $((TOTAL_S - ($(date +%s) - START))); }

# wanted NAME: whether SKIP / ONLY let step NAME run.
wanted() {
  [[ " ${SKIP:-} " != *" $1 "* ]] && { [[ -z "${ONLY:-}" ]] || [[ " $ONLY " == *" $1 "* ]]; }
}

# step NAME TIMEOUT_S CMD... : runs with min(TIMEOUT_S, time left - 5) and records the outcome.
step() {
  local name="$1" limit="$2"
  shift 2
  if ! wanted "$name"; then
    echo "$name: SKIPPED (SKIP/ONLY)" | tee -a "$OUT/summary.txt"
    return
  fi
  local left=$(( $(remaining) - 5 ))
  if (( left < 10 )); then
    echo "$name: SKIPPED (out of time)" | tee -a "$OUT/summary.txt"
    return
  fi
  (( limit > left )) && limit=$left
  local t0=$(date +%s)
  echo "=== $name (timeout ${limit}s): $*" | tee -a "$OUT/steps.txt"
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local status="ok"
  (( rc == 124 || rc == 137 )) && status="TIMEOUT"
  (( rc != 0 && rc != 124 && rc != 137 )) && status="FAILED rc=$rc"
  grep -q '^\[  SKIPPED \]' "$OUT/$name.log" && status="$status, SOME TESTS SKIPPED"
  echo "$name: $status ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.txt"
  tail -n 40 "$OUT/$name.log"
}

: > "$OUT/summary.txt"
{ nvidia-smi; nvidia-smi -q -d CLOCK,POWER | head -60; } > "$OUT/nvidia-smi.txt" 2>&1
"$PY" -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())' \
  > "$OUT/torch-version.txt" 2>&1

# Synthesize the benchmark models in the background while the GPU tests run (CPU-bound).
# A model left by an earlier call with KEEP_MODELS=1 is reused.
( if [[ -f "$M8B/config.json" ]]; then echo "reusing $M8B" > "$OUT/synth-8b.log"; else
    timeout 200 "$BIN/tandem" model synth --like llama-3-8b --out "$M8B" > "$OUT/synth-8b.log" 2>&1
    echo "rc=$?" >> "$OUT/synth-8b.log"; fi
  if [[ -f "$M1B/config.json" ]]; then echo "reusing $M1B" > "$OUT/synth-1b.log"; else
    timeout 100 "$BIN/tandem" model synth --like llama-3.2-1b --out "$M1B" > "$OUT/synth-1b.log" 2>&1
    echo "rc=$?" >> "$OUT/synth-1b.log"; fi ) &
SYNTH_PID=$!

# GPU tests (each prints max errors and shapes on failure). The runner and kernel tests run their
# other plans and kernels themselves (the runner's GEMM routings, the decode tunings, the portable
# prefill and skinny GEMM kernels beside the H100/H200's wgmma ones).
for t in cuda_step_plan_test runner_factory_test cuda_model_runner_test cuda_generate_test \
         cuda_runner_sampling_test kv_host_mirror_test; do
  if [[ -x "$BIN/$t" ]]; then
    limit=150
    [[ "$t" == cuda_model_runner_test ]] && limit=450  # five plans
    step "$t" "$limit" "$BIN/$t" --gtest_output="xml:$OUT/$t.xml"
  else
    echo "$t: MISSING from $BIN" | tee -a "$OUT/summary.txt"
  fi
done
for t in "$BIN"/*_cuda_test; do
  [[ -x "$t" ]] || continue
  n="$(basename "$t")"
  limit=90
  [[ "$n" == attention_cuda_test ]] && limit=300  # the decode tunings, the portable prefill
  [[ "$n" == skinny_gemm_cuda_test ]] && limit=180  # both kernels
  step "$n" "$limit" "$t" --gtest_output="xml:$OUT/$n.xml"
done

# The disaggregated stack on the GPU: tandem serve --device cuda (router, prefill and decode
# workers, KV over UCX through the workers' pinned host mirrors) on the bundled draft model, then
# OpenAI requests over HTTP (tests/gpu/serve_cuda_smoke.py).
if ! wanted serve_cuda_smoke; then
  echo "serve_cuda_smoke: SKIPPED (SKIP/ONLY)" | tee -a "$OUT/summary.txt"
elif [[ -f "$TANDEM_MODELS_DIR/draft/config.json" ]]; then
  [[ -d "$BIN/../ucx" ]] && export UCX_MODULE_DIR="$BIN/../ucx"
  "$BIN/tandem" serve --model "$TANDEM_MODELS_DIR/draft" --device cuda --port 18000 \
    --kv-cache-mib 128 > "$OUT/serve_cuda.log" 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 1 120); do grep -q "is serving" "$OUT/serve_cuda.log" && break; sleep 1; done
  step serve_cuda_smoke 120 "$PY" "$ROOT/tests/gpu/serve_cuda_smoke.py" http://127.0.0.1:18000 \
    draft "$BIN/tandem" "$TANDEM_MODELS_DIR/draft"
  kill -INT "$SERVE_PID" 2>/dev/null
  wait "$SERVE_PID"
else
  echo "serve_cuda_smoke: SKIPPED (no $TANDEM_MODELS_DIR/draft)" | tee -a "$OUT/summary.txt"
fi

step wait-synth 150 bash -c "while kill -0 $SYNTH_PID 2>/dev/null; do sleep 1; done; cat '$OUT/synth-8b.log' '$OUT/synth-1b.log'"

if [[ -f "$M8B/config.json" ]]; then
  step engine_bench_8b 180 "$BIN/engine_bench" --model "$M8B" --json "$OUT/engine_bench_8b.json"
  # The skinny GEMM's split-K aim (CTAs per SM; 2 in the main run's A/B section).
  for aim in 1 4; do
    step "engine_bench_8b_skinny_aim_$aim" 90 "$BIN/engine_bench" --model "$M8B" \
      --tuning "skinny=on,skinny.ctas_per_sm=$aim" --batches 8,64 --contexts 1024 \
      --skip sampling,prefill,profile,skinny-ab --json "$OUT/engine_bench_8b_skinny_aim_$aim.json"
  done
  # Flash-decoding work-item targets around the default 2048 (splits are also at least 256
  # tokens long: docs/tuning.md).
  for st in 1024 4096; do
    step "engine_bench_8b_split_$st" 90 "$BIN/engine_bench" --model "$M8B" \
      --tuning "decode.split_target=$st" --batches 1,8,64 --contexts 1024,8192 \
      --skip sampling,prefill,profile,skinny-ab --json "$OUT/engine_bench_8b_split_$st.json"
  done
  step torch_peer_8b 150 "$PY" "$ROOT/bench/engine/torch_peer.py" --model "$M8B" \
    --batches 1,64 --context 1024 --json "$OUT/torch_peer_8b.json"
else
  echo "engine_bench_8b: SKIPPED (no synthesized llama-3-8b)" | tee -a "$OUT/summary.txt"
fi
if [[ -f "$M1B/config.json" ]]; then
  step engine_bench_1b 120 "$BIN/engine_bench" --model "$M1B" --json "$OUT/engine_bench_1b.json"
else
  echo "engine_bench_1b: SKIPPED (no synthesized llama-3.2-1b)" | tee -a "$OUT/summary.txt"
fi

# The synthesis job, if still running (it started in this script): its timeouts, then itself.
pkill -TERM -P "$SYNTH_PID" 2>/dev/null
kill "$SYNTH_PID" 2>/dev/null
echo "--- summary ($(( $(date +%s) - START )) s total)"
cat "$OUT/summary.txt"
[[ "${KEEP_MODELS:-0}" == 1 ]] || rm -rf "$M8B" "$M1B"
exit 0

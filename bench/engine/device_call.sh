#!/usr/bin/env bash
# Helpers for one device call's script (sourced, not run): the preamble every call of a GPU session
# repeats. On the GPU host, from the repository root, with the bundle of tools/gpu-pack carried:
#
#   source bench/engine/device_call.sh
#   dc_setup                                   # build-gpu/ from gpu-pack/bundle.tar.xz; $B, $R
#   dc_synth llama-3-8b /tmp/tandem_m8b        # in the background; dc_wait_synth before use
#   dc_test attention "$B/attention_cuda_test" --gtest_filter='*Decode*'
#   dc_wait_synth
#   bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b ..." base=engine_bench_base ...
#   dc_finish                                  # strips progress lines, packs $OUT/r.tgz
#
# Results go under $R = $OUT/r (one archive comes back: the device tool limits the file count).
# dc_test appends the test's gtest summary and exit status to $R/tests.txt and keeps its log.

dc_setup() {
  R="$OUT/r"
  mkdir -p "$R"
  rm -rf build-gpu && mkdir -p build-gpu && tar -xJf gpu-pack/bundle.tar.xz -C build-gpu || return 1
  export LD_LIBRARY_PATH="$PWD/build-gpu/gpu-out/lib:/usr/local/cuda/lib64"
  export UCX_MODULE_DIR="$PWD/build-gpu/gpu-out/ucx" NCCL_NVLS_ENABLE=0
  B="$PWD/build-gpu/gpu-out/bin"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv \
    > "$R/gpu.txt" 2>&1
}

# dc_synth LIKE DIR: synthesizes the model shape LIKE into DIR in the background.
dc_synth() {
  (timeout 100 "$B/tandem" model synth --like "$1" --out "$2" >> "$R/synth.log" 2>&1) &
  DC_SYNTH_PIDS="${DC_SYNTH_PIDS:-} $!"
}

dc_wait_synth() {
  local pid rc=0
  for pid in ${DC_SYNTH_PIDS:-}; do wait "$pid" || rc=1; done
  DC_SYNTH_PIDS=""
  return $rc
}

# dc_test NAME [VAR=VALUE...] BINARY [ARGS...]: runs a test binary with a timeout (DC_TEST_S,
# default 150 s), its log at $R/t_NAME.log; the summary lines and "rc=N" go to $R/tests.txt.
dc_test() {
  local name="$1"
  shift
  timeout "${DC_TEST_S:-150}" env "$@" > "$R/t_$name.log" 2>&1
  local rc=$?
  {
    echo "=== $name"
    grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\]|Failure$' "$R/t_$name.log" | head -20
    echo "rc=$rc"
  } >> "$R/tests.txt"
  return $rc
}

# dc_wait_serving LOG PID [SECONDS]: 0 once LOG says "is serving" (tandem serve's ready line),
# 1 when PID exits or SECONDS (default 200) pass first.
dc_wait_serving() {
  local i
  for i in $(seq 1 "${3:-200}"); do
    grep -q "is serving" "$1" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}

# dc_stop PID: SIGINT (a graceful drain), SIGKILL after 30 s, then reaps it.
dc_stop() {
  kill -INT "$1" 2>/dev/null
  local i
  for i in $(seq 1 30); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
  kill -9 "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}

# dc_finish: drops the weight loaders' progress lines from every text result and packs $R into
# $OUT/r.tgz.
dc_finish() {
  local f
  while IFS= read -r -d '' f; do
    grep -v '^loading weights' "$f" > "$f.tmp"
    mv "$f.tmp" "$f"
  done < <(find "$R" -type f \( -name '*.txt' -o -name '*.log' \) -print0)
  (cd "$OUT" && tar czf r.tgz r && rm -rf r)
}

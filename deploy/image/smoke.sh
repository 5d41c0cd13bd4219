#!/usr/bin/env bash
# Smoke test of the Tandem image with podman, end to end: load the OCI archive that
# build-offline.sh wrote (or take an image podman already has), run it with its default command
# (`tandem serve` on the bundled model, 0.0.0.0:8000) and the port published on 127.0.0.1, wait
# for GET /health, send one POST /v1/completions (max_tokens 4), check for a 200 with a
# choices[0].text, then stop and remove the container (and the image, if this script loaded it).
# Run by hand (a minute or so); it is not part of ctest.
#
#   deploy/image/smoke.sh [--archive FILE | --image NAME] [--port N] [--timeout S] [--keep-image]
#
#   --archive FILE  OCI archive to load (default: ${TMPDIR:-/tmp}/tandem-image.oci.tar)
#   --image NAME    use this image podman already has instead (e.g. from podman build)
#   --port N        host port for the container's 8000 (default 18000)
#   --timeout S     seconds /health may take to answer 200 (default 120)
#   --keep-image    keep the loaded image, as localhost/tandem:latest (else it is loaded as
#                   localhost/tandem:smoke-PID and removed)
#
# Environment: PODMAN_RUNTIME (default: podman's own, or runc on a host with hybrid cgroup v1/v2,
# which crun refuses), SMOKE_PODMAN_ARGS (extra `podman run` arguments; default: --ulimit
# nofile/nproc of 16384 when this host's hard limit is below podman's default, which podman cannot
# raise without CAP_SYS_RESOURCE). Needs root (or a working rootless podman), podman, curl, python3.
set -euo pipefail

archive=${TMPDIR:-/tmp}/tandem-image.oci.tar
image=
port=18000
timeout_s=120
keep_image=0
while (($#)); do
  case $1 in
    --archive) archive=${2:?}; shift 2 ;;
    --image) image=${2:?}; shift 2 ;;
    --port) port=${2:?}; shift 2 ;;
    --timeout) timeout_s=${2:?}; shift 2 ;;
    --keep-image) keep_image=1; shift ;;
    -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

say() { printf '[smoke] %s\n' "$*" >&2; }
fail() { printf '[smoke] FAIL: %s\n' "$*" >&2; exit 1; }
for tool in podman curl python3; do
  command -v "$tool" >/dev/null || fail "needs $tool (apt-get install podman curl python3)"
done

# This host's quirks, as flags for every podman call.
podman_cmd=(podman)
runtime=${PODMAN_RUNTIME:-}
if [[ -z $runtime && $(stat -fc %T /sys/fs/cgroup 2>/dev/null) == tmpfs ]] &&
  mountpoint -q /sys/fs/cgroup/unified 2>/dev/null; then
  command -v runc >/dev/null || fail "hybrid cgroups (v1 + /sys/fs/cgroup/unified): crun refuses them; apt-get install runc"
  runtime=runc
fi
[[ -n $runtime ]] && podman_cmd+=(--runtime "$runtime")
if [[ -n ${SMOKE_PODMAN_ARGS+set} ]]; then
  read -r -a run_args <<<"$SMOKE_PODMAN_ARGS"
else
  run_args=()
  if (($(ulimit -Hn) < 1048576)); then run_args+=(--ulimit nofile=16384:16384); fi
  if [[ $(ulimit -Hu) != unlimited ]] && (($(ulimit -Hu) < 4194304)); then
    run_args+=(--ulimit nproc=16384:16384)
  fi
fi

container=tandem-smoke-$$
loaded=
cleanup() {
  "${podman_cmd[@]}" rm -f -t 10 "$container" >/dev/null 2>&1 || true
  if [[ -n $loaded ]] && ((!keep_image)); then
    podman rmi "$loaded" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

t0=$(date +%s)
if [[ -z $image ]]; then
  [[ -f $archive ]] || fail "no image archive at $archive (run deploy/image/build-offline.sh, or pass --image NAME)"
  say "loading $archive"
  out=$(podman load -i "$archive" 2>&1) || fail "podman load: $out"
  # The archive names its image by its OCI tag only ("latest" -> localhost/latest:latest).
  name=$(sed -n -E 's/^Loaded image(\(s\))?: *//p' <<<"$out" | tail -1 | cut -d, -f1)
  [[ -n $name ]] || fail "podman load did not say what it loaded: $out"
  # A tag of its own, so that an image the user already has as localhost/tandem:latest survives.
  if ((keep_image)); then image=localhost/tandem:latest; else image=localhost/tandem:smoke-$$; fi
  podman tag "$name" "$image"
  [[ $name == "$image" ]] || podman untag "$image" "$name"
  loaded=$image
fi

say "podman${runtime:+ --runtime $runtime} run -d -p 127.0.0.1:$port:8000 ${run_args[*]} $image"
"${podman_cmd[@]}" run -d --pull=never --name "$container" -p "127.0.0.1:$port:8000" "${run_args[@]}" "$image" >/dev/null ||
  fail "podman run failed"

say "waiting up to ${timeout_s}s for http://127.0.0.1:$port/health"
deadline=$(($(date +%s) + timeout_s))
until [[ $(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$port/health") == 200 ]]; do
  if [[ $("${podman_cmd[@]}" inspect -f '{{.State.Running}}' "$container" 2>/dev/null) != true ]]; then
    "${podman_cmd[@]}" logs "$container" 2>&1 | tail -40 >&2
    fail "the container exited before /health answered"
  fi
  if (($(date +%s) >= deadline)); then
    "${podman_cmd[@]}" logs "$container" 2>&1 | tail -40 >&2
    fail "/health not 200 after ${timeout_s}s"
  fi
  sleep 1
done
say "healthy after $(($(date +%s) - t0))s"

body=$(mktemp)
code=$(curl -s -o "$body" -w '%{http_code}' -m 60 "http://127.0.0.1:$port/v1/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model": "target", "prompt": "Once upon a time", "max_tokens": 4}') || code=000
response=$(cat "$body")
rm -f "$body"
if [[ $code != 200 ]]; then
  "${podman_cmd[@]}" logs "$container" 2>&1 | tail -40 >&2
  fail "POST /v1/completions: HTTP $code: $response"
fi
text=$(python3 -c 'import json, sys
r = json.loads(sys.argv[1])
t = r["choices"][0]["text"]
assert isinstance(t, str) and t, "empty choices[0].text"
print(json.dumps(t))' "$response") || fail "no choices[0].text in: $response"
say "POST /v1/completions: 200, choices[0].text = $text"

say "stopping (SIGTERM, 15 s)"
"${podman_cmd[@]}" stop -t 15 "$container" >/dev/null
rc=$("${podman_cmd[@]}" inspect -f '{{.State.ExitCode}}' "$container")
((rc == 0)) || fail "tandem serve exited $rc after SIGTERM"
say "PASS in $(($(date +%s) - t0))s (image $image, container exit 0)"

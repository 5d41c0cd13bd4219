#!/usr/bin/env bash
# A/B of engine_bench builds or plans inside one device call: runs every variant in turn,
# REPEATS times (alternating, so a slow or fast stretch of the machine hits all of them), then
# summarizes with ab_summary.py (per point: each run, the median, the change against the first
# variant).
#
#   bench/engine/ab.sh OUT_DIR REPEATS BIN_DIR "ENGINE_BENCH ARGS" VARIANT...
#
# VARIANT is "NAME=BINARY [ARG...]" (one word, quoted): BINARY in BIN_DIR, run with ARGS and then
# its own ARGs, e.g. base=engine_bench_base new=engine_bench
# "unchained=engine_bench --tuning decode.chain=0" (tools/gpu-pack --base REV packs
# engine_bench_base; docs/tuning.md lists the --tuning keys). Each run writes OUT_DIR/NAME_R.txt
# and NAME_R.json (no ARGS may name --json) and has a 120 s timeout; a failing run is reported and
# the others go on.
set -u
if (( $# < 5 )); then
  sed -n '2,14p' "$0" >&2
  exit 2
fi
out="$1" repeats="$2" bin="$3" args="$4"
shift 4
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: REPEATS must be a positive number" >&2; exit 2; }
no_json() {
  [[ " $1 " != *" --json "* ]] || { echo "ab.sh: $2 must not name --json (ab.sh does)" >&2; exit 2; }
}
no_json "$args" ARGS
mkdir -p "$out"
names=()
for spec in "$@"; do
  name="${spec%%=*}"
  read -r -a words <<< "${spec#*=}"
  [[ -n "$name" && "$name" != "$spec" && ${#words[@]} -gt 0 ]] ||
    { echo "ab.sh: bad variant '$spec' (NAME=BINARY [ARG...])" >&2; exit 2; }
  [[ -x "$bin/${words[0]}" ]] || { echo "ab.sh: no executable $bin/${words[0]}" >&2; exit 2; }
  no_json "${words[*]}" "variant $name"
  names+=("$name")
done
for ((r = 1; r <= repeats; ++r)); do
  for spec in "$@"; do
    name="${spec%%=*}"
    read -r -a words <<< "${spec#*=}"
    # shellcheck disable=SC2086  # ARGS is a word list on purpose
    if ! timeout 120 "$bin/${words[0]}" $args "${words[@]:1}" --json "$out/${name}_$r.json" \
        > "$out/${name}_$r.txt" 2>&1; then
      echo "ab.sh: $name run $r failed (see $out/${name}_$r.txt)" >&2
      rm -f "$out/${name}_$r.json"
    fi
  done
done
python3 "$(dirname "$0")/ab_summary.py" "$out" --variants "$(IFS=,; echo "${names[*]}")" |
  tee "$out/summary.txt"

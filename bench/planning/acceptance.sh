#!/usr/bin/env bash
# The planner's acceptance on this machine (issue 24): profile one single-threaded CPU worker
# (one core = one device) with one neighbour runner measuring beside it on the other core (a
# served host is full: the other worker, or the router and the clients); for each workload mix,
# calibrate the profile against a served 1P+1D deployment under that mix's own traffic at a
# modest rate (`tandem profile calibrate`: what a worker's steps cost depends on what shares the
# host with it, docs/planning.md "Calibration"), plan the mix for a budget of 2 devices with the
# calibrated profile, then measure every layout with `tandem serve` + `tandem bench` around the
# predicted goodput, and compare. Rates are swept upward from 0.7x the prediction and the sweep
# stops at the first rate that misses the objective (downward from 0.7x while it misses).
# Output: OUT (default /tmp/plan-acceptance)/{profile.json, profile-*.json, calibrate-*.log,
# plan-*.json, bench-*-rate*.json, summary.txt}.
# Env: OUT, TANDEM (build/tandem), MODEL (models/target), PROMPTS (requests per rate; default
# per mix: 200 for short_in, whose 256-token outputs take that many to reach a steady state, 100
# for long_in, 120 for mixed), SLO_TTFT_MS (1500), SLO_TPOT_MS (60), MIXES (names: short_in
# long_in mixed), CALIBRATE (mix: per mix, an open loop of the mix at CAL_FRACTION (0.5) of the
# uncalibrated plan's 1P+1D goodput; unlike: once, a closed loop of 24 streams of 128 in / 128
# out, a load unlike every mix; 0: the profile as measured).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/plan-acceptance}
tandem=${TANDEM:-build/tandem}
model=${MODEL:-models/target}
ttft=${SLO_TTFT_MS:-1500}
tpot=${SLO_TPOT_MS:-60}
read -r -a mixes <<<"${MIXES:-short_in long_in mixed}"
mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1
source bench/lib/serve.sh

mix_flags() {
  case $1 in
    short_in) echo "--input-len 32 --output-len 256" ;;
    long_in) echo "--input-len 512 --output-len 16" ;;
    mixed) echo "--input-len 256 --output-len 64 --range-ratio 0.9" ;;
    *) echo "unknown mix $1" >&2; exit 2 ;;
  esac
}
layout_flags() {
  case $1 in
    1P+1D) echo "--prefill-workers 1 --decode-workers 1" ;;
    "1 aggregated") echo "--aggregated --decode-workers 1" ;;
    "2 aggregated") echo "--aggregated --decode-workers 2" ;;
  esac
}

mix_prompts() {
  case $1 in
    short_in) echo "${PROMPTS:-200}" ;;
    long_in) echo "${PROMPTS:-100}" ;;
    mixed) echo "${PROMPTS:-120}" ;;
  esac
}

echo "[acceptance] profiling one single-threaded worker beside a neighbour" >&2
"$tandem" profile --model "$model" --prompt-lens 16,64,128,256,512,1000 \
  --batch-sizes 1,2,4,8,16,32 --contexts 64,256,500 --repeats 10 --neighbours 1 --no-progress \
  --out "$out/profile.json"

start_serve() {  # port, log, layout flags...: starts tandem serve, waits for /health
  local port=$1 log=$2
  shift 2
  "$tandem" serve --model "$model" --port "$port" "$@" >"$log" 2>&1 &
  serve=$!
  wait_healthy "$port" "$serve" "$log" 180 || exit 1
}
stop_serve() {
  kill -INT "$serve"
  wait "$serve" || true
}

port=18431
# calibrate TAG LOAD...: serves 1P+1D, puts `tandem bench LOAD...` on it, and calibrates
# $out/profile.json on both workers' counters over 60 s after 20 s of ramp, into
# $out/profile-TAG.json.
calibrate() {
  local tag=$1 metrics load
  shift
  start_serve "$port" "$out/serve-calibrate-$tag.log" --prefill-workers 1 --decode-workers 1
  sleep 1
  # Both workers: the decode worker's decode steps and the prefill worker's prefill steps.
  metrics=$(sed -n 's/.*\[\(decode\|prefill\)-[0-9]*\].*metrics on \(http:[^ ]*\).*/\2/p' \
    "$out/serve-calibrate-$tag.log" | paste -sd, -)
  "$tandem" bench --url "http://127.0.0.1:$port/v1" --endpoint completions --tokenizer "$model" \
    "$@" --ignore-eos --num-prompts 0 --duration 95 --seed 3 --no-progress \
    >"$out/calibrate-bench-$tag.txt" 2>&1 &
  load=$!
  sleep 20  # past the ramp
  "$tandem" profile calibrate --profile "$out/profile.json" --metrics "$metrics" --window-s 60 \
    --min-prefill-chunks 30 --no-progress --out "$out/profile-$tag.json" 2>&1 |
    tee "$out/calibrate-$tag.log" >&2
  kill -INT "$load" 2>/dev/null || true
  wait "$load" || true
  stop_serve
  port=$((port + 1))
}
calibration=${CALIBRATE:-mix}
if [[ $calibration == unlike ]]; then
  # A closed loop of 24 streams of 128 in / 128 out on 1P+1D: a load unlike every mix.
  echo "[acceptance] calibrating against a served 1P+1D under a load unlike every mix" >&2
  calibrate unlike --input-len 128 --output-len 128 --max-concurrency 24
fi

measure() {  # mix layout predicted tag: one tandem bench run per rate, adaptively
  local mix=$1 layout=$2 predicted=$3 tag=$4 f k=0 att
  # shellcheck disable=SC2046
  start_serve "$port" "$out/serve-$tag.log" $(layout_flags "$layout")
  run_rate() {
    local rate
    rate=$(python3 -c "import sys; print('%.3f' % (float(sys.argv[1]) * float(sys.argv[2])))" \
      "$predicted" "$1")
    # shellcheck disable=SC2046
    "$tandem" bench --url "http://127.0.0.1:$port/v1" --endpoint completions \
      --tokenizer "$model" $(mix_flags "$mix") --ignore-eos --num-prompts "$(mix_prompts "$mix")" \
      --warmup 4 --rates "$rate" --slo "ttft=$ttft,tpot=$tpot" --seed 1 --no-progress \
      --json "$out/bench-$tag-rate$1.json" >>"$out/bench-$tag.txt" 2>&1
    att=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; \
print(r['good_completed'] / max(1, r['completed'] + r['failed']))" "$out/bench-$tag-rate$1.json")
    echo "[acceptance] $mix, $layout: rate $rate req/s, attainment $att" >&2
    python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.9 else 1)" "$att"
  }
  if run_rate 0.7; then
    for f in 0.85 1.0 1.15 1.3 1.5; do run_rate "$f" || break; done
  else
    for f in 0.55 0.4 0.3; do run_rate "$f" && break; done
  fi
  stop_serve
  port=$((port + 1))
}

for mix in "${mixes[@]}"; do
  profile=$out/profile.json
  case $calibration in
    unlike) profile=$out/profile-unlike.json ;;
    mix)
      # shellcheck disable=SC2046
      "$tandem" plan --profile "$out/profile.json" $(mix_flags "$mix") --ttft-ms "$ttft" \
        --tpot-ms "$tpot" --devices 2 --requests 1000 --json >"$out/plan-$mix-uncalibrated.json"
      rate=$(python3 -c "import json,sys; p=json.load(open(sys.argv[1])); \
print('%.3f' % (float(sys.argv[2]) * next(c['goodput'] for c in p['candidates'] \
if c['layout'] == '1P+1D')))" "$out/plan-$mix-uncalibrated.json" "${CAL_FRACTION:-0.5}")
      echo "[acceptance] $mix: calibrating against a served 1P+1D under the mix at $rate req/s" >&2
      # shellcheck disable=SC2046
      calibrate "$mix" $(mix_flags "$mix") --rates "$rate"
      profile=$out/profile-$mix.json
      ;;
  esac
  # shellcheck disable=SC2046
  "$tandem" plan --profile "$profile" $(mix_flags "$mix") --ttft-ms "$ttft" \
    --tpot-ms "$tpot" --devices 2 --requests 1000 --json >"$out/plan-$mix.json"
  for layout in "1P+1D" "1 aggregated" "2 aggregated"; do
    predicted=$(python3 -c "import json,sys; p=json.load(open(sys.argv[1])); \
print(next(c['goodput'] for c in p['candidates'] if c['layout']==sys.argv[2]))" \
      "$out/plan-$mix.json" "$layout")
    tag="$mix-${layout// /_}"
    echo "[acceptance] $mix, $layout: predicted goodput $predicted req/s" >&2
    measure "$mix" "$layout" "$predicted" "$tag"
  done
done

python3 - "$out" "${mixes[@]}" <<'PY' | tee "$out/summary.txt"
import glob, json, sys
out, mixes = sys.argv[1], sys.argv[2:]
print(f"{'mix':9} {'layout':13} {'predicted':>9} {'measured':>9} {'error':>7}")
for mix in mixes:
    plan = json.load(open(f"{out}/plan-{mix}.json"))
    for c in plan["candidates"]:
        tag = f"{mix}-{c['layout'].replace(' ', '_')}"
        runs = [json.load(open(f))["runs"][0]
                for f in glob.glob(f"{out}/bench-{tag}-rate*.json")]
        pts = sorted((r["request_rate"], r["good_completed"] / max(1, r["completed"] + r["failed"]))
                     for r in runs)
        # Measured goodput: the highest swept rate meeting the 90% objective, interpolated to
        # where attainment crosses 0.9 before the first rate that misses it.
        good = 0.0
        for k, (rate, att) in enumerate(pts):
            if att >= 0.9:
                good = rate
                continue
            if k > 0 and pts[k - 1][1] >= 0.9:
                r0, a0 = pts[k - 1]
                good = r0 + (rate - r0) * (a0 - 0.9) / (a0 - att)
            break
        err = (c["goodput"] - good) / good if good > 0 else float("inf")
        print(f"{mix:9} {c['layout']:13} {c['goodput']:9.3f} {good:9.3f} {100*err:+6.1f}%  "
              + " ".join(f"{r:.2f}:{a:.2f}" for r, a in pts))
    print(f"{mix:9} recommended {plan['recommended']}")
PY

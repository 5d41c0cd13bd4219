#!/usr/bin/env bash
# The planner's acceptance on this machine (issue 24): profile one single-threaded CPU worker
# (one core = one device) with one neighbour runner measuring beside it on the other core (a
# served host is full: the other worker, or the router and the clients), plan each workload mix
# for a budget of 2 devices, then measure every layout with `tandem serve` + `tandem bench
# --rates` around the predicted goodput, and compare.
# Output: OUT (default /tmp/plan-acceptance)/{profile.json, plan-*.json, bench-*.json, summary.txt}.
# Env: OUT, TANDEM (build/tandem), MODEL (models/target), PROMPTS (requests per rate; default
# per mix: 200 for short_in, whose 256-token outputs take that many to reach a steady state, 100
# for long_in, 120 for mixed), SLO_TTFT_MS (1500), SLO_TPOT_MS (60), MIXES (names: short_in
# long_in mixed).
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

port=18431
for mix in "${mixes[@]}"; do
  # shellcheck disable=SC2046
  "$tandem" plan --profile "$out/profile.json" $(mix_flags "$mix") --ttft-ms "$ttft" \
    --tpot-ms "$tpot" --devices 2 --requests 1000 --json >"$out/plan-$mix.json"
  for layout in "1P+1D" "1 aggregated" "2 aggregated"; do
    predicted=$(python3 -c "import json,sys; p=json.load(open(sys.argv[1])); \
print(next(c['goodput'] for c in p['candidates'] if c['layout']==sys.argv[2]))" \
      "$out/plan-$mix.json" "$layout")
    rates=$(python3 -c "import sys; g=float(sys.argv[1]); \
print(','.join('%.3f' % (g*f) for f in (0.75, 0.9, 1.0, 1.1, 1.25, 1.5)))" "$predicted")
    tag="$mix-${layout// /_}"
    echo "[acceptance] $mix, $layout: predicted goodput $predicted req/s; rates $rates" >&2
    # shellcheck disable=SC2046
    "$tandem" serve --model "$model" --port "$port" $(layout_flags "$layout") \
      >"$out/serve-$tag.log" 2>&1 &
    serve=$!
    deadline=$((SECONDS + 180))
    until curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
      if ((SECONDS > deadline)) || ! kill -0 "$serve" 2>/dev/null; then
        echo "[acceptance] serve did not come up: $out/serve-$tag.log" >&2
        kill -INT "$serve" 2>/dev/null || true
        exit 1
      fi
      sleep 1
    done
    # shellcheck disable=SC2046
    "$tandem" bench --url "http://127.0.0.1:$port/v1" --endpoint completions \
      --tokenizer "$model" $(mix_flags "$mix") --ignore-eos --num-prompts "$(mix_prompts "$mix")" \
      --warmup 4 --rates "$rates" --slo "ttft=$ttft,tpot=$tpot" --seed 1 --no-progress \
      --json "$out/bench-$tag.json" >"$out/bench-$tag.txt" 2>&1
    kill -INT "$serve"
    wait "$serve" || true
    port=$((port + 1))
  done
done

python3 - "$out" "${mixes[@]}" <<'PY' | tee "$out/summary.txt"
import json, sys
out, mixes = sys.argv[1], sys.argv[2:]
print(f"{'mix':9} {'layout':13} {'predicted':>9} {'measured':>9} {'error':>7}")
for mix in mixes:
    plan = json.load(open(f"{out}/plan-{mix}.json"))
    for c in plan["candidates"]:
        tag = f"{mix}-{c['layout'].replace(' ', '_')}"
        runs = json.load(open(f"{out}/bench-{tag}.json"))["runs"]
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

#!/usr/bin/env bash
# Fairness within a step (--long-prefill-token-threshold, docs/tuning.md): short requests arriving
# while long prompts are being prefilled. `tandem serve --aggregated`, one worker, bundled model.
#   long:  LONG_PROMPTS prompts of 960 tokens, 8 output tokens, LONG_CONCURRENCY at a time;
#   short: SHORT_PROMPTS prompts of 16 tokens, 8 output tokens, Poisson at SHORT_RATE/s,
#          started together with the long ones.
# Each threshold in THRESHOLDS runs on a fresh server; the short requests' TTFT is what fairness
# buys, the long ones' what it costs.
# Usage: bench/serving/prefill_fairness.sh [BUILD_DIR]
#   (env: THRESHOLDS, LONG_PROMPTS, LONG_CONCURRENCY, SHORT_PROMPTS, SHORT_RATE, BATCHED_TOKENS)
set -u
cd "$(dirname "$0")/../.."
build=${1:-build}
thresholds=${THRESHOLDS:-"0 64 128"}
long_prompts=${LONG_PROMPTS:-48}
long_concurrency=${LONG_CONCURRENCY:-8}
short_prompts=${SHORT_PROMPTS:-40}
short_rate=${SHORT_RATE:-2}
batched=${BATCHED_TOKENS:-512}
port=18800
work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-fair-XXXXXX")
echo "# $(date -u +%FT%TZ) $(nproc) cores, max-num-batched-tokens $batched, long $long_prompts x 960 (concurrency $long_concurrency), short $short_prompts x 16 at $short_rate/s"

bench() {  # name json-out args...
  local name=$1 out=$2
  shift 2
  "$build/tandem" bench --base-url "http://127.0.0.1:$port/v1" --endpoint completions \
    --tokenizer models/target --output-len 8 --ignore-eos --no-progress \
    --json "$out" "$@" > "$work/$name.txt" 2>&1
}

summary() {  # label json
  python3 - "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[2]))
s = s.get("summary", s)
print(f"  {sys.argv[1]:6s} completed {s.get('completed')} failed {s.get('failed')} "
      f"mean TTFT {s.get('mean_ttft_ms'):.1f} ms  p50 {s.get('median_ttft_ms'):.1f}  "
      f"p90 {s.get('p90_ttft_ms'):.1f}  mean TPOT {s.get('mean_tpot_ms'):.2f} ms  "
      f"duration {s.get('duration', float('nan')):.1f} s")
PY
}

for t in $thresholds; do
  log="$work/serve-$t.log"
  "$build/tandem" serve --port $port --aggregated --decode-workers 1 \
    --max-num-batched-tokens "$batched" --long-prefill-token-threshold "$t" > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do grep -q "is serving" "$log" && break; sleep 0.5; done
  if ! grep -q "is serving" "$log" || ! kill -0 $pid 2>/dev/null; then
    echo "tandem serve did not start (port $port taken?):" >&2
    tail -5 "$log" >&2
    kill -INT $pid 2>/dev/null
    exit 1
  fi
  bench long-$t "$work/long-$t.json" --num-prompts "$long_prompts" --input-len 960 \
    --request-rate inf --max-concurrency "$long_concurrency" --seed 1 &
  long=$!
  sleep 1
  bench short-$t "$work/short-$t.json" --num-prompts "$short_prompts" --input-len 16 \
    --request-rate "$short_rate" --seed 2
  wait $long
  echo "threshold $t"
  summary short "$work/short-$t.json"
  summary long "$work/long-$t.json"
  kill -INT $pid
  wait $pid
done
echo "raw output: $work"

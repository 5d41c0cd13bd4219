#!/usr/bin/env bash
# Head-of-line blocking at the router: while 4 clients post ~3.9 MB prompts (which the router
# must parse and tokenize), how long /health takes. `tandem serve --aggregated`, bundled model.
# The large prompts exceed the context and get 400 after tokenizing: that is the point.
# Usage: bench/serving/head_of_line.sh [BUILD_DIR]
set -u
cd "$(dirname "$0")/../.."
build=${1:-build}
port=18600
work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-hol-XXXXXX")
"$build/tandem" serve --port $port --aggregated > "$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 240); do grep -q "is serving" "$work/serve.log" && break; sleep 0.5; done
python3 -c 'import json; print(json.dumps({"model": "target", "prompt": "lorem ipsum dolor sit amet " * 145000, "max_tokens": 1}))' > "$work/big.json"
echo "body bytes $(stat -c %s "$work/big.json")"
clients=()
for _ in 1 2 3 4; do
  curl -s -o /dev/null -w "big %{http_code} %{time_total}\n" -H 'Content-Type: application/json' \
    --data-binary @"$work/big.json" "http://127.0.0.1:$port/v1/completions" &
  clients+=($!)
done
sleep 0.3
for _ in 1 2 3 4 5; do
  curl -s -o /dev/null -w "health %{http_code} %{time_total}\n" "http://127.0.0.1:$port/health"
  sleep 0.2
done
wait "${clients[@]}"
kill -INT $pid
wait $pid

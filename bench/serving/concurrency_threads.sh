#!/usr/bin/env bash
# N concurrent streaming chat requests against `tandem serve` (1 prefill + 1 decode worker, the
# bundled model on CPU): requests that succeed or fail (by HTTP status), TTFT, and the peak
# thread count of the router and of each worker, sampled every 0.5 s while the load runs.
# Usage: bench/serving/concurrency_threads.sh [N] [BUILD_DIR]
#   (env: KV_MIB, each worker's KV cache, default 512; SERVE_ARGS, more `tandem serve` flags, e.g.
#   "--two-phase-admission off"; INPUT_LEN, default 64, and OUTPUT_LEN, default 32 tokens)
set -u
cd "$(dirname "$0")/../.."
n=${1:-1000}
build=${2:-build}
port=18500
log=$(mktemp -d "${TMPDIR:-/tmp}/tandem-threads-XXXXXX")
"$build/tandem" serve --port $port --kv-cache-mib "${KV_MIB:-512}" ${SERVE_ARGS:-} > "$log/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 240); do grep -q "is serving" "$log/serve.log" && break; sleep 0.5; done
if ! grep -q "is serving" "$log/serve.log" || ! kill -0 $pid 2>/dev/null; then
  echo "tandem serve did not start (port $port taken?):" >&2
  tail -5 "$log/serve.log" >&2
  kill -INT $pid 2>/dev/null
  exit 1
fi
declare -A peak
"$build/tandem" bench --url "http://127.0.0.1:$port/v1" --max-concurrency "$n" --num-prompts "$n" \
  --input-len "${INPUT_LEN:-64}" --output-len "${OUTPUT_LEN:-32}" --ignore-eos --no-progress --request-timeout 600 --json "$log/bench.json" \
  > "$log/bench.txt" 2>&1 &
bench=$!
while kill -0 $bench 2>/dev/null; do
  for c in $(pgrep -P $pid); do
    name=$(tr '\0' ' ' < /proc/$c/cmdline | awk '{print $2}')
    t=$(awk '/Threads/{print $2}' /proc/$c/status 2>/dev/null)
    [[ -n $t ]] && ((t > ${peak[$name]:-0})) && peak[$name]=$t
  done
  sleep 0.5
done
for k in "${!peak[@]}"; do echo "peak threads $k: ${peak[$k]}"; done
grep -E "Successful|Failed|HTTP [0-9]+:|Output token throughput|Mean TTFT|P99 TTFT" "$log/bench.txt"
curl -s "http://127.0.0.1:$port/metrics" > "$log/router-metrics.txt"
i=0
for url in $(grep -o 'metrics on http://[^ ]*' "$log/serve.log" | awk '{print $3}'); do
  curl -s "$url" > "$log/worker-$i-metrics.txt"
  i=$((i + 1))
done
grep -hE "^tandem_ttft_[a-z_]+_seconds_(sum|count)" "$log/router-metrics.txt"
kill -INT $pid
wait $pid
echo "logs in $log"

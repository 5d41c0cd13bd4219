#!/usr/bin/env bash
# N concurrent streaming chat requests against `tandem serve` (1 prefill + 1 decode worker, the
# bundled model on CPU): requests that succeed or fail (by HTTP status), TTFT, and the peak
# thread count of the router and of each worker, sampled every 0.5 s while the load runs.
# Usage: bench/serving/concurrency_threads.sh [N] [BUILD_DIR]
set -u
cd "$(dirname "$0")/../.."
n=${1:-1000}
build=${2:-build}
port=18500
log=$(mktemp -d "${TMPDIR:-/tmp}/tandem-threads-XXXXXX")
"$build/tandem" serve --port $port --kv-cache-mib 512 > "$log/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 240); do grep -q "is serving" "$log/serve.log" && break; sleep 0.5; done
declare -A peak
"$build/tandem" bench --url "http://127.0.0.1:$port/v1" --max-concurrency "$n" --num-prompts "$n" \
  --input-len 64 --output-len 32 --ignore-eos --no-progress --request-timeout 600 \
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
kill -INT $pid
wait $pid
echo "logs in $log"

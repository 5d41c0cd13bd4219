#!/usr/bin/env bash
# What the router adds (issue 22 target: <= 1 ms median), and its CPU per streamed token.
# One decode worker (aggregated: it prefills too) and one router in front of it, the bundled
# model on CPU, prefix caching left on but every prompt random, so nothing is reused.
#   1. direct:  decode_direct_bench, sequential Decode.Generate calls straight to the worker;
#   2. routed:  `tandem bench` through the router, sequential, same prompt length and max_tokens,
#               the completions endpoint (the router tokenizes, validates, routes, detokenizes);
#   both REQUESTS requests of PROMPT_TOKENS random tokens, max_tokens 1 (the median of e2e
#   latency; the model's own time is the same in both);
#      and the router's own median from its access log (e2e_ms: request read to last byte
#      written), which leaves out the HTTP client's share, and router_ms (e2e less the time
#      inside the backend call: what the router itself adds);
#   3. router CPU per streamed token: STREAMS concurrent streams of 64 tokens through the router,
#      the router process's utime + stime (/proc/PID/stat) over the run / output tokens.
# Usage: bench/serving/router_overhead.sh [BUILD_DIR]  (env: REQUESTS, PROMPT_TOKENS, STREAMS,
#   ROUNDS: interleaved direct/routed rounds, default 2; MODEL: default models/target;
#   DIRECT_BENCH: default BUILD_DIR/bench/serving/decode_direct_bench; VOCAB: the ids the direct
#   side draws prompts from, default 8192, within the model's vocabulary)
set -u
cd "$(dirname "$0")/../.."
build=${1:-build}
requests=${REQUESTS:-300}
prompt_tokens=${PROMPT_TOKENS:-64}
streams=${STREAMS:-64}
rounds=${ROUNDS:-2}
model=${MODEL:-models/target}
direct_bench=${DIRECT_BENCH:-$build/bench/serving/decode_direct_bench}
vocab=${VOCAB:-8192}
work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-overhead-XXXXXX")
chmod 700 "$work"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token"
chmod 600 "$work/token"
decode_port=18801
router_port=18802
echo "# $(date -u +%FT%TZ) $(nproc) cores, $requests requests of $prompt_tokens tokens, max_tokens 1"
"$build/tandem" decode --model "$model" --port $decode_port \
  --service-token-file "$work/token" > "$work/decode.log" 2>&1 &
decode=$!
for _ in $(seq 1 240); do grep -q "serving on" "$work/decode.log" && break; sleep 0.5; done
"$build/tandem" router --model "$model" --port $router_port \
  --decode-workers "127.0.0.1:$decode_port" --service-token-file "$work/token" \
  > "$work/router.log" 2>&1 &
router=$!
for _ in $(seq 1 240); do grep -q "serving on" "$work/router.log" && break; sleep 0.5; done

# Warm both paths, then measure each twice, interleaved, so drift shows.
"$direct_bench" --decode "127.0.0.1:$decode_port" \
  --service-token-file "$work/token" --vocab "$vocab" --requests 30 --prompt-tokens "$prompt_tokens" --seed 99 >/dev/null
for round in $(seq 1 "$rounds"); do
  "$direct_bench" --decode "127.0.0.1:$decode_port" \
    --service-token-file "$work/token" --vocab "$vocab" --requests "$requests" --prompt-tokens "$prompt_tokens" \
    --seed "$round" | sed "s/^/round $round /"
  "$build/tandem" bench --base-url "http://127.0.0.1:$router_port/v1" --endpoint completions \
    --tokenizer "$model" --num-prompts "$requests" --input-len "$prompt_tokens" \
    --output-len 1 --ignore-eos --temperature 0 --max-concurrency 1 --seed "$round" --warmup 10 \
    --no-progress --json "$work/routed-$round.json" > "$work/routed-$round.txt" 2>&1
  python3 -c "
import json,sys
s=json.load(open('$work/routed-$round.json'))
print('round $round routed requests', s['completed'], 'failed', s['failed'],
      'median %.3f ms mean %.3f ms p90 %.3f ms' % (s['median_e2el_ms'], s['mean_e2el_ms'], s['p90_e2el_ms']))"
  # The router's own view of the same requests (its access log: request read to response
  # written), without the HTTP client's share: the last REQUESTS lines (after the warm-up).
  grep -o 'access /v1/completions status=200 .* e2e_ms=[0-9.]*' "$work/router.log" \
    | tail -n "$requests" | sed 's/.*e2e_ms=//' | sort -n \
    | awk -v r=$round '{v[NR]=$1} END {printf "round %d router access-log e2e median %.3f ms over %d\n", r, v[int((NR+1)/2)], NR}'
  # The router's own share of each request (router_ms: e2e less the time inside the backend
  # call), which no noise in the worker's own time reaches.
  grep -o 'access /v1/completions status=200 .* router_ms=[0-9.]*' "$work/router.log" \
    | tail -n "$requests" | sed 's/.*router_ms=//' | sort -n \
    | awk -v r=$round '{v[NR]=$1} END {printf "round %d router_ms median %.3f ms p90 %.3f ms over %d\n", r, v[int((NR+1)/2)], v[int(NR*0.9+0.5)], NR}'
done

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
before=$(cpu $router)
"$build/tandem" bench --base-url "http://127.0.0.1:$router_port/v1" --endpoint completions \
  --tokenizer "$model" --num-prompts $((streams * 4)) --input-len 64 --output-len 64 \
  --ignore-eos --max-concurrency "$streams" --seed 7 --no-progress \
  --json "$work/streams.json" > "$work/streams.txt" 2>&1
after=$(cpu $router)
python3 -c "
import json, os
s = json.load(open('$work/streams.json'))
ticks = os.sysconf('SC_CLK_TCK')
cpu_s = ($after - $before) / ticks
tokens = s['total_output_tokens']
print('router CPU %.2f s for %d streamed tokens (%d streams at once): %.1f us per token; output %.1f tok/s'
      % (cpu_s, tokens, $streams, 1e6 * cpu_s / max(tokens, 1), s['output_throughput']))"
kill -INT $router $decode
wait $router $decode 2>/dev/null
echo "raw output: $work"

#!/usr/bin/env bash
# KV-aware routing against round-robin (docs/routing.md), `tandem serve` with the bundled model on
# 1 prefill + 2 decode workers.
#   shared:   8 prefixes of 800 tokens, each reused by 32 requests (256 in all, shuffled), each
#             prompt prefix + 32 tokens of its own, 16 output tokens;
#   unshared: UNSHARED_PROMPTS prompts of 832 tokens with nothing in common.
# Each workload runs under each policy, on fresh workers, at a fixed request rate (Poisson) and
# --max-concurrency: SHARED_RATE and UNSHARED_RATE (the unshared load prefills every prompt in
# full on one prefill worker, so it saturates far earlier). KV_MIB sets every worker's
# --kv-cache-mib (the default 256 holds every prefix on every worker).
# Usage: bench/serving/kv_aware_routing.sh [BUILD_DIR]
#   (env: SHARED_RATE, UNSHARED_RATE, UNSHARED_PROMPTS, KV_MIB, CONCURRENCY, POLICIES, WORKLOADS,
#    SERVE_ARGS: more `tandem serve` flags, e.g. "--local-prefill-threshold 0")
set -u
cd "$(dirname "$0")/../.."
build=${1:-build}
shared_rate=${SHARED_RATE:-2}
unshared_rate=${UNSHARED_RATE:-0.4}
unshared_prompts=${UNSHARED_PROMPTS:-64}
workloads=${WORKLOADS:-"shared unshared"}
kv_mib=${KV_MIB:-256}
concurrency=${CONCURRENCY:-16}
policies=${POLICIES:-"round-robin kv-aware"}
port=18700
work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-kvroute-XXXXXX")
echo "# $(date -u +%FT%TZ) $(nproc) cores, rates shared $shared_rate/s unshared $unshared_rate/s, concurrency $concurrency, kv-cache-mib $kv_mib"

run() {  # policy workload
  local policy=$1 workload=$2
  local log="$work/serve-$policy-$workload.log"
  "$build/tandem" serve --port $port --prefill-workers 1 --decode-workers 2 --routing "$policy" \
    --kv-cache-mib "$kv_mib" ${SERVE_ARGS:-} > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 240); do grep -q "is serving" "$log" && break; sleep 0.5; done
  local shape=(--num-prompts 256 --input-len 32 --shared-prefix-groups 8 --shared-prefix-len 800)
  local rate=$shared_rate
  if [ "$workload" = unshared ]; then
    shape=(--num-prompts "$unshared_prompts" --input-len 832)
    rate=$unshared_rate
  fi
  "$build/tandem" bench --base-url "http://127.0.0.1:$port/v1" --endpoint chat \
    --tokenizer models/target "${shape[@]}" --output-len 16 --ignore-eos \
    --request-rate "$rate" --max-concurrency "$concurrency" --seed 1 --no-progress \
    --json "$work/$policy-$workload.json" > "$work/$policy-$workload.txt" 2>&1
  curl -s "http://127.0.0.1:$port/metrics" > "$work/$policy-$workload.metrics"
  kill -INT $pid
  wait $pid
  python3 - "$work/$policy-$workload.json" "$work/$policy-$workload.metrics" "$policy" "$workload" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1]))
s = r.get("summary", r)
m = open(sys.argv[2]).read()
def total(name):
    return sum(float(v) for v in re.findall(r"^%s(?:\{[^}]*\})? ([0-9.e+]+)$" % name, m, re.M))
local = sum(float(v) for v in re.findall(r'^tandem_routing_prefills_total\{where="decode_worker"\} ([0-9.e+]+)$', m, re.M))
print(f"{sys.argv[3]:12s} {sys.argv[4]:9s} completed {s.get('completed')} failed {s.get('failed')} "
      f"mean TTFT {s.get('mean_ttft_ms'):.1f} ms  p50 {s.get('median_ttft_ms', float('nan')):.1f}  "
      f"p90 {s.get('p90_ttft_ms', float('nan')):.1f}  mean TPOT {s.get('mean_tpot_ms', float('nan')):.2f} ms  "
      f"out tok/s {s.get('output_throughput', float('nan')):.1f}  "
      f"index hit tokens {total('tandem_routing_prefix_hit_tokens_total'):.0f}  local prefills {local:.0f}")
PY
}

for workload in $workloads; do
  for policy in $policies; do run "$policy" "$workload"; done
done
echo "raw output: $work"

#!/usr/bin/env bash
# Where a served request's TTFT goes (issue 24's diagnosis): serves one layout, runs one mix at
# one rate with `tandem bench`, and prints, from the router's TTFT split histograms
# (docs/metrics.md: queue, prefill, transfer, first decode) and the prefill worker's prefill-only
# step counters, each part's mean and p90 over the run, beside the bench's own TTFT percentiles.
# Env: OUT (/tmp/ttft-split), TANDEM (build/tandem), MODEL (models/target), LAYOUT (serve's
# layout flags; "--prefill-workers 1 --decode-workers 1"), MIX (bench's length flags;
# "--input-len 256 --output-len 64 --range-ratio 0.9"), RATE (0.85), PROMPTS (120), SEED (7).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/ttft-split}
tandem=${TANDEM:-build/tandem}
model=${MODEL:-models/target}
port=18471
mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1
source bench/lib/serve.sh
# shellcheck disable=SC2086
"$tandem" serve --model "$model" --port "$port" ${LAYOUT:---prefill-workers 1 --decode-workers 1} \
  >"$out/serve.log" 2>&1 &
serve=$!
trap 'kill -INT $serve 2>/dev/null; wait $serve 2>/dev/null || true' EXIT
wait_healthy "$port" "$serve" "$out/serve.log" 180
sleep 1
scrape() {  # tag: the router's and every worker's /metrics
  http_get "http://127.0.0.1:$port/metrics" >"$out/router-$1.txt"
  local k=0 url
  for url in $(sed -n 's/.*metrics on \(http:[^ ]*\).*/\1/p' "$out/serve.log"); do
    http_get "$url" >"$out/worker$k-$1.txt"
    k=$((k + 1))
  done
}
scrape before
# shellcheck disable=SC2086
"$tandem" bench --url "http://127.0.0.1:$port/v1" --endpoint completions --tokenizer "$model" \
  ${MIX:---input-len 256 --output-len 64 --range-ratio 0.9} --ignore-eos \
  --num-prompts "${PROMPTS:-120}" --rates "${RATE:-0.85}" --seed "${SEED:-7}" --no-progress \
  --json "$out/bench.json" >"$out/bench.txt" 2>&1
scrape after
python3 - "$out" <<'PY'
import glob, json, re, sys
out = sys.argv[1]
def parse(path):
    vals = {}
    for line in open(path):
        if line.startswith('#') or not line.strip():
            continue
        name, _, v = line.rpartition(' ')
        vals[name] = float(v)
    return vals
def hist(before, after, name):
    buckets = sorted((float(re.search(r'le="([^"]+)"', k).group(1).replace('+Inf', 'inf')),
                      after[k] - before.get(k, 0))
                     for k in after if k.startswith(name + '_bucket'))
    n = after.get(name + '_count', 0) - before.get(name + '_count', 0)
    s = after.get(name + '_sum', 0) - before.get(name + '_sum', 0)
    p90 = next((le for le, c in buckets if c >= 0.9 * n), float('nan')) if n else float('nan')
    return n, (s / n if n else float('nan')), p90
rb, ra = parse(f'{out}/router-before.txt'), parse(f'{out}/router-after.txt')
print(f"{'part':22} {'count':>6} {'mean ms':>9} {'p90 bucket ms':>14}")
for part in ('time_to_first_token', 'ttft_queue', 'ttft_prefill', 'ttft_transfer',
             'ttft_first_decode'):
    n, mean, p90 = hist(rb, ra, f'tandem_{part}_seconds')
    print(f"{part:22} {n:6.0f} {mean * 1000:9.1f} {p90 * 1000:14.1f}")
for before in sorted(glob.glob(f'{out}/worker*-before.txt')):
    a, b = parse(before.replace('-before', '-after')), parse(before)
    d = {k: a[k] - b.get(k, 0) for k in a if k.startswith('tandem_engine_')}
    steps = d.get('tandem_engine_prefill_steps_total', 0)
    if steps:
        chunks = d['tandem_engine_prefill_chunks_total']
        print(f"{before.split('/')[-1][:7]}: {steps:.0f} prefill-only steps, "
              f"{chunks / steps:.2f} chunks a step of {d['tandem_engine_prefill_tokens_total'] / chunks:.0f} "
              f"tokens, {1000 * d['tandem_engine_prefill_forward_seconds_total'] / steps:.1f} ms forward a step")
    if d.get('tandem_engine_decode_steps_total', 0):
        s = d['tandem_engine_decode_steps_total']
        print(f"{before.split('/')[-1][:7]}: {s:.0f} decode-only steps at batch "
              f"{d['tandem_engine_decode_sequences_total'] / s:.1f}, "
              f"{1000 * d['tandem_engine_decode_forward_seconds_total'] / s:.1f} ms forward a step")
r = json.load(open(f'{out}/bench.json'))['runs'][0]
print(f"bench: rate {r['request_rate']}, TTFT p50 {r['median_ttft_ms']:.0f} p90 {r['p90_ttft_ms']:.0f} "
      f"p99 {r['p99_ttft_ms']:.0f} ms, attainment {r['good_completed'] / max(1, r['completed'] + r['failed']):.3f}")
PY

#!/usr/bin/env bash
# MLP offload on the CPU (issue 26): output tokens/s of one aggregated decode worker on the
# bundled model with its MLP local, on the `cpu` backend, and on one `tandem mlp-shard`
# (`--mlp remote --mlp-shards 1`, its micro-batch count measured; remote-nopp without ping-pong,
# `--mlp-micro-batches 1`; remote-pp2 with two, `--mlp-micro-batches 2`; remote-cma and
# remote-ucx with the rows through the host data plane, `--mlp-data-plane cma|ucx`), at
# batch 1 and batch 16 (closed loops of 1 and 16 streams,
# greedy, 32 in / 128 out), plus the worker's KV capacity and its mean decode step.
# Output: OUT (default /tmp/mlp-cpu)/{bench-*.json, serve-*.log, metrics-*.txt, summary.txt}.
# Env: OUT, TANDEM (build/tandem), MODEL (models/target), BACKENDS (local cpu remote; also
#      local-2t, local with two BLAS threads, remote-nopp, remote-pp2, remote-cma, remote-ucx),
#      CONCURRENCY (1 16), PROMPTS (per run: 24 at batch 1, 96 at 16).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/mlp-cpu}
tandem=${TANDEM:-build/tandem}
model=${MODEL:-models/target}
read -r -a backends <<<"${BACKENDS:-local cpu remote}"
read -r -a concurrency <<<"${CONCURRENCY:-1 16}"
mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1
source bench/lib/serve.sh

port=18711
for backend in "${backends[@]}"; do
  case $backend in
    local) flags=() ;;
    local-2t) flags=() ;;  # the same with two BLAS threads: the local use of both cores
    cpu) flags=(--mlp cpu) ;;
    remote) flags=(--mlp remote --mlp-shards 1) ;;
    remote-nopp) flags=(--mlp remote --mlp-shards 1 --mlp-micro-batches 1) ;;
    remote-pp2) flags=(--mlp remote --mlp-shards 1 --mlp-micro-batches 2) ;;
    remote-cma) flags=(--mlp remote --mlp-shards 1 --mlp-data-plane cma) ;;
    remote-ucx) flags=(--mlp remote --mlp-shards 1 --mlp-data-plane ucx) ;;
    *) echo "unknown backend $backend (local local-2t cpu remote remote-nopp remote-pp2" \
         "remote-cma remote-ucx)" >&2; exit 2 ;;
  esac
  for c in "${concurrency[@]}"; do
    tag="$backend-b$c"
    prompts=${PROMPTS:-$((c == 1 ? 24 : 96))}
    echo "[mlp] $backend, $c streams, $prompts requests" >&2
    threads=1
    [[ $backend == local-2t ]] && threads=2
    OPENBLAS_NUM_THREADS=$threads "$tandem" serve --model "$model" --port "$port" --aggregated \
      --decode-workers 1 "${flags[@]}" >"$out/serve-$tag.log" 2>&1 &
    serve=$!
    wait_healthy "$port" "$serve" "$out/serve-$tag.log" 120 || exit 1
    "$tandem" bench --url "http://127.0.0.1:$port/v1" --endpoint completions --tokenizer "$model" \
      --input-len 32 --output-len 128 --ignore-eos --num-prompts "$prompts" --max-concurrency "$c" \
      --warmup 2 --seed 1 --no-progress --json "$out/bench-$tag.json" >"$out/bench-$tag.txt" 2>&1
    metrics=$(grep -o 'decode-0\] tandem decode: metrics on http://[0-9.:]*' "$out/serve-$tag.log" |
      head -1 | sed 's/.*metrics on //')
    http_get "$metrics/metrics" | grep -E '^tandem_(engine_decode|kv_cache_blocks|kv_blocks|mlp_)' \
      >"$out/metrics-$tag.txt" || true
    kill -INT "$serve"
    wait "$serve" || true
    port=$((port + 1))
  done
done

python3 - "$out" "${backends[*]}" "${concurrency[*]}" <<'PY' | tee "$out/summary.txt"
import json, sys
out, backends, conc = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
print(f"{'backend':11} {'streams':>7} {'out tok/s':>9} {'median TPOT ms':>14} {'decode step ms':>14} {'KV tokens':>9} {'MLP calls':>9} {'via plane':>9}")
for b in backends:
    for c in conc:
        tag = f"{b}-b{c}"
        j = json.load(open(f"{out}/bench-{tag}.json"))
        r = j if "output_throughput" in j else j["runs"][0]
        m = {}
        for line in open(f"{out}/metrics-{tag}.txt"):
            k, v = line.split()
            m[k] = float(v)
        steps = m.get("tandem_engine_decode_steps_total", 0)
        step = 1000 * m.get("tandem_engine_decode_forward_seconds_total", 0) / steps if steps else 0
        kv = int(m.get("tandem_kv_blocks_capacity", 0)) * 16  # the default block size
        calls = int(m.get("tandem_mlp_calls_total", 0))
        plane = int(m.get("tandem_mlp_plane_calls_total", 0))
        print(f"{b:11} {c:>7} {r['output_throughput']:9.1f} {r['median_tpot_ms']:14.2f} {step:14.2f} {kv:>9} {calls:>9} {plane:>9}")
PY

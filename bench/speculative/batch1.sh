#!/usr/bin/env bash
# Speculative decoding at batch 1 (issue 25): `tandem serve --aggregated` on the bundled target
# (on the CPU, or the GPU with DEVICE=cuda), greedy, one request at a time, without speculation, with n-gram drafts and with
# the bundled draft model (models/draft), on two prompt sets:
#   copy     a paragraph of this repository's docs, then its first quarter again: a model that
#            continues the copy repeats text the prompt holds (n-gram drafts' best case);
#   natural  the first quarter of such a paragraph alone (ordinary continuation).
# Reports output tokens/s, median TPOT and the drafters' acceptance (the decode worker's
# /metrics) per run. Output: OUT (default /tmp/spec-cpu)/{copy,natural}.jsonl, bench-*.json,
# bench-*.txt, metrics-*.txt, summary.txt. Env: OUT, TANDEM (build/tandem), MODEL
# (models/target), DRAFT (models/draft), PROMPTS (16), K (4), DEVICE (cpu; cuda, cuda:N),
# DRAFTERS (ngram draft: which to run beside plain; remote is the draft model in a `tandem
# drafter` service that serve starts).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/spec-cpu}
tandem=${TANDEM:-build/tandem}
model=${MODEL:-models/target}
prompts=${PROMPTS:-16}
k=${K:-4}
draft=${DRAFT:-models/draft}
device=${DEVICE:-cpu}
read -r -a drafters <<<"${DRAFTERS:-ngram draft}"
mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1

# Paragraphs of this repository's docs (the model was trained on software documentation).
python3 - "$out" "$prompts" <<'PY'
import glob, json, sys
out_dir, n = sys.argv[1], int(sys.argv[2])
paras = []
for f in sorted(glob.glob("docs/*.md")):
    for p in open(f).read().split("\n\n"):
        p = " ".join(p.split())
        if 400 <= len(p) <= 900 and not p.startswith(("|", "#", "```", "-")):
            paras.append(p)
with open(f"{out_dir}/copy.jsonl", "w") as copy, open(f"{out_dir}/natural.jsonl", "w") as nat:
    for p in paras[:n]:
        cut = p[: len(p) // 4].rsplit(" ", 1)[0]
        copy.write(json.dumps({"prompt": p + "\n\n" + cut, "output_len": 96}) + "\n")
        nat.write(json.dumps({"prompt": cut, "output_len": 96}) + "\n")
print(f"{min(n, len(paras))} prompts", file=sys.stderr)
PY

source bench/lib/serve.sh

port=18471
run() {  # tag, extra serve flags..., then -- bench flags
  local tag=$1
  shift
  local serve_flags=()
  while [[ $1 != -- ]]; do serve_flags+=("$1"); shift; done
  shift
  "$tandem" serve --model "$model" --port "$port" --aggregated --decode-workers 1 \
    --device "$device" "${serve_flags[@]}" >"$out/serve-$tag.log" 2>&1 &
  local serve=$!
  wait_healthy "$port" "$serve" "$out/serve-$tag.log" 120 || exit 1
  "$tandem" bench --url "http://127.0.0.1:$port/v1" --endpoint completions --tokenizer "$model" \
    --max-concurrency 1 --warmup 1 --seed 1 --no-progress --json "$out/bench-$tag.json" "$@" \
    >"$out/bench-$tag.txt" 2>&1
  local metrics
  metrics=$(grep -o 'metrics on http://[0-9.:]*' "$out/serve-$tag.log" | head -1 | sed 's/metrics on //')
  http_get "$metrics/metrics" | grep -E '^tandem_(spec|engine|generation)' >"$out/metrics-$tag.txt" || true
  kill -INT "$serve"
  wait "$serve" || true
  port=$((port + 1))
}

for set in copy natural; do
  data=(--dataset "$out/$set.jsonl" --num-prompts "$prompts")
  echo "[spec] $set, plain" >&2
  run "$set-plain" -- "${data[@]}"
  for d in "${drafters[@]}"; do
    case $d in
      ngram) spec=(--speculative ngram) ;;
      draft) spec=(--speculative "draft:$draft") ;;
      remote) spec=(--speculative remote --drafters 1 --drafter "draft:$draft") ;;
      *) echo "unknown drafter $d (ngram, draft, remote)" >&2; exit 2 ;;
    esac
    echo "[spec] $set, $d k=$k" >&2
    run "$set-$d" "${spec[@]}" --num-speculative-tokens "$k" -- "${data[@]}"
  done
done

python3 - "$out" "${drafters[@]}" <<'PY' | tee "$out/summary.txt"
import json, sys
out, drafters = sys.argv[1], sys.argv[2:]
def load(tag):
    j = json.load(open(f"{out}/bench-{tag}.json"))
    m = {}
    for line in open(f"{out}/metrics-{tag}.txt"):
        k, v = line.split()
        m[k] = float(v)
    return j, m
print(f"{'run':14} {'out tok/s':>9} {'median TPOT ms':>14} {'drafted':>8} {'accepted':>8} {'rate':>6} {'steps/token':>11}")
for tag in [f"{d}-{m}" for d in ("copy", "natural") for m in ["plain"] + drafters]:
    j, m = load(tag)
    s = j if "output_throughput" in j else j["runs"][0]
    d, a = m.get("tandem_spec_draft_tokens_total", 0), m.get("tandem_spec_accepted_tokens_total", 0)
    steps, toks = m.get("tandem_engine_steps_total", 0), m.get("tandem_generation_tokens_total", 1)
    print(f"{tag:14} {s['output_throughput']:9.1f} {s['median_tpot_ms']:14.2f} {d:8.0f} {a:8.0f} "
          f"{(a / d if d else 0):6.2f} {steps / toks:11.3f}")
PY

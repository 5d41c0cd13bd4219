#!/usr/bin/env bash
# Trains the bundled models on a GPU host, from the repository root, and leaves the results in OUTDIR:
# log.txt, results.json, expected_greedy.json, and target/ + draft/ as models.tar.xz.part-* (15 MiB
# pieces). Needs, under gpu-data/ (ignored by git): corpus.jsonl.xz from make_corpus.py, and
# bundle.tar.xz, a tar of `gpu-bundle bundle build-models/tandem` (a CPU build of tandem and the
# libraries it needs) for the transformers-vs-tandem check. Usage: tools/train/run_h200.sh OUTDIR
set -euo pipefail
out=${1:?usage: run_h200.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
work=/tmp/tandem-train
rm -rf "$work"
mkdir -p "$work"
python3 -c "import tarfile; tarfile.open('gpu-data/bundle.tar.xz').extractall('$work')"
nvidia-smi -L || true
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
set +e
timeout 530 python3 tools/train/train.py --corpus gpu-data/corpus.jsonl.xz --out "$work/run" \
  --epochs 40 --target-seconds 180 --draft-seconds 90 --tandem "$work/bundle/run.sh tandem" 2>&1 |
  tee "$out/log.txt"
rc=${PIPESTATUS[0]}
set -e
cp "$work/run/results.json" "$work/run/expected_greedy.json" "$out/" 2>/dev/null || true
cd "$work/run"
if command -v xz >/dev/null; then
  tar -cf - target draft | xz -T0 -3 | split -b 15M - "$out/models.tar.xz.part-"
else
  tar -cf - target draft | split -b 15M - "$out/models.tar.part-"
fi
ls -la "$out"
exit "$rc"

#!/usr/bin/python3
"""`tandem generate` against the PyTorch greedy reference written by make_reference.py.

For every model directory and prompt, runs
  tandem generate --model DIR --prompt-ids a,b,c --max-tokens 32 --json
and checks that its "token_ids" equal the torch greedy ids (make_reference.py picks bos/eos ids
that never occur in any prompt or continuation, so greedy generation runs the full 32 steps).

Usage: /usr/bin/python3 check_generate.py --tandem build/tandem --models DIR
"""

import argparse
import json
import os
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--models", required=True)
    args = ap.parse_args()
    with open(os.path.join(args.models, "models.json")) as fh:
        models = json.load(fh)
    failures, checked = [], 0
    for model in models:
        model_dir = os.path.join(args.models, model)
        with open(os.path.join(model_dir, "reference.json")) as fh:
            ref = json.load(fh)
        for p in ref["prompts"]:
            cmd = [args.tandem, "generate", "--model", model_dir,
                   "--prompt-ids", ",".join(str(t) for t in p["prompt_ids"]),
                   "--max-tokens", str(ref["steps"]), "--json"]
            label = f"{model}/{p['name']}"
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                failures.append(f"{label}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
                continue
            try:
                got = json.loads(proc.stdout)["token_ids"]
            except (ValueError, KeyError, TypeError) as e:
                failures.append(f"{label}: bad JSON output ({e}): {proc.stdout[:300]!r}")
                continue
            want = p["greedy_ids"]
            checked += 1
            if got != want:
                first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                             min(len(got), len(want)))
                failures.append(f"{label}: ids differ from step {first}\n  tandem {got}\n"
                                f"  torch  {want}")
    for f in failures:
        print("FAIL", f)
    print(f"{checked} generations compared, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Summarizes an A/B run of engine_bench (bench/engine/ab.sh): DIR holds NAME_R.json files, one
per variant NAME and repeat R, as engine_bench --json writes them. Prints, per decode point (batch,
context) and prefill length, each variant's runs in ms, their median, and the median's change
against the base variant (the first one given, or --base). Alternating the variants inside one
device call is what makes the comparison fair: machine starts differ by 1-2%.

  ab_summary.py DIR [--variants base,new,...] [--base NAME]
"""

import argparse
import collections
import json
import os
import re
import statistics
import sys


def load_runs(directory):
    """{variant: [json, ...]} in repeat order, from DIR/NAME_R.json."""
    runs = collections.defaultdict(list)
    pattern = re.compile(r"^(?P<name>.+)_(?P<rep>\d+)\.json$")
    for entry in os.listdir(directory):
        m = pattern.match(entry)
        if not m:
            continue
        with open(os.path.join(directory, entry)) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise SystemExit(f"ab_summary: {entry}: not JSON ({e})")
        runs[m.group("name")].append((int(m.group("rep")), data))
    return {name: [d for _, d in sorted(r, key=lambda x: x[0])] for name, r in runs.items()}


def points(data):
    """{(kind, key): (ms, percent)} of one engine_bench JSON."""
    out = {}
    for row in data.get("decode", []):
        if "ms_per_step" in row:
            out[("decode", (row["batch"], row["context"]))] = (row["ms_per_step"],
                                                              row.get("pct_of_roofline"))
    for row in data.get("prefill", []):
        out[("prefill", row["tokens"])] = (row["ms"], row.get("pct_of_gemm_peak"))
    return out


def summarize(runs, variants, base):
    lines = []
    keys = []
    for name in variants:
        for data in runs[name]:
            for key in points(data):
                if key not in keys:
                    keys.append(key)
    keys.sort(key=lambda k: (k[0] != "decode", k[1]))
    width = max(len(v) for v in variants)
    for kind, key in keys:
        label = (f"decode batch {key[0]}, context {key[1]}" if kind == "decode" else
                 f"prefill {key} tokens")
        lines.append(label)
        medians = {}
        for name in variants:
            vals = [points(d)[(kind, key)] for d in runs[name] if (kind, key) in points(d)]
            if not vals:
                lines.append(f"  {name:<{width}}  (no runs)")
                continue
            ms = [v[0] for v in vals]
            pct = [v[1] for v in vals if v[1] is not None]
            medians[name] = statistics.median(ms)
            delta = ""
            if name != base and base in medians:
                delta = f"  {100.0 * (medians[name] / medians[base] - 1.0):+.1f}% vs {base}"
            pct_text = f"  ({min(pct):.1f}-{max(pct):.1f}%)" if pct else ""
            lines.append(f"  {name:<{width}}  " + " ".join(f"{x:.3f}" for x in ms) +
                         f"  median {medians[name]:.3f} ms{pct_text}{delta}")
    return "\n".join(lines)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--variants", help="comma-separated, in order (default: all, sorted)")
    parser.add_argument("--base", help="the variant the others are compared with")
    args = parser.parse_args(argv)
    runs = load_runs(args.dir)
    if not runs:
        raise SystemExit(f"ab_summary: no NAME_R.json files in {args.dir} (did every run fail?)")
    variants = args.variants.split(",") if args.variants else sorted(runs)
    for v in variants:
        runs.setdefault(v, [])  # every run of it failed: shown as "(no runs)"
    base = args.base or variants[0]
    if base not in variants:
        raise SystemExit(f"ab_summary: base {base} is not among the variants")
    print(summarize(runs, variants, base))


if __name__ == "__main__":
    main(sys.argv[1:])

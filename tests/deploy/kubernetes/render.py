#!/usr/bin/env python3
"""Renders every kustomization under deploy/kubernetes with one kubectl (`kubectl kustomize`).

  render.py --kubectl KUBECTL --root DEPLOY_KUBERNETES_DIR [--out DIR]

Fails (exit 1) when a kustomization does not render, renders nothing, or renders a document
without apiVersion/kind/metadata.name. With --out, writes DIR/<name>.yaml per kustomization
(name: its path with '/' as '_'), for the schema and flag checks. Used by CTest directly and
imported by the other checks (render_all).
"""
import argparse
import os
import subprocess
import sys

import yaml

# Every directory holding a kustomization.yaml is rendered; this many at least must exist, so a
# moved tree cannot make the test pass by finding nothing.
MIN_KUSTOMIZATIONS = 6


def kustomizations(root):
    found = []
    for d, _, files in os.walk(root):
        if "kustomization.yaml" in files:
            found.append(os.path.relpath(d, root))
    return sorted(found)


def render(kubectl, path):
    proc = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{kubectl} kustomize {path} failed ({proc.returncode}):\n"
                           f"{proc.stderr}")
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d is not None]
    if not docs:
        raise RuntimeError(f"{path}: rendered no objects")
    for d in docs:
        if not (isinstance(d, dict) and d.get("apiVersion") and d.get("kind")
                and d.get("metadata", {}).get("name")):
            raise RuntimeError(f"{path}: a document without apiVersion/kind/metadata.name: {d!r}"[:400])
    return proc.stdout, docs


def render_all(kubectl, root):
    """{relative kustomization path: [objects]}; raises RuntimeError on any failure."""
    names = kustomizations(root)
    if len(names) < MIN_KUSTOMIZATIONS:
        raise RuntimeError(f"only {len(names)} kustomizations under {root}: {names}")
    return {name: render(kubectl, os.path.join(root, name)) for name in names}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--root", required=True)
    parser.add_argument("--out")
    args = parser.parse_args()
    version = subprocess.run([args.kubectl, "version", "--client"], capture_output=True,
                             text=True).stdout.strip().splitlines()
    print(f"kubectl: {args.kubectl}: {version[0] if version else '?'}")
    try:
        rendered = render_all(args.kubectl, args.root)
    except (RuntimeError, OSError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    for name, (text, docs) in rendered.items():
        kinds = sorted({d["kind"] for d in docs})
        print(f"ok {name}: {len(docs)} objects ({', '.join(kinds)})")
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, name.replace("/", "_") + ".yaml"), "w") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

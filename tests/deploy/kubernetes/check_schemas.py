#!/usr/bin/env python3
"""Renders every kustomization and validates the objects offline (validate.mjs), then checks that
the validation rejects broken copies of them (validate.mjs --self-test).

  check_schemas.py --kubectl KUBECTL --node NODE --root DEPLOY_KUBERNETES_DIR

Needs this directory's node_modules (`npm ci` here; quickstart runs it).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import render

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--node", default="node")
    parser.add_argument("--root", required=True)
    args = parser.parse_args()
    if not os.path.isdir(os.path.join(HERE, "node_modules", "kubernetes-models")):
        print(f"FAIL: {HERE}/node_modules is missing: run `npm ci` in {HERE}", file=sys.stderr)
        return 1
    try:
        rendered = render.render_all(args.kubectl, args.root)
    except (RuntimeError, OSError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as out:
        for name, (text, _) in rendered.items():
            with open(os.path.join(out, name.replace("/", "_") + ".yaml"), "w") as f:
                f.write(text)
        script = os.path.join(HERE, "validate.mjs")
        ok = subprocess.run([args.node, script, out]).returncode == 0
        ok &= subprocess.run([args.node, script, "--self-test", out]).returncode == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

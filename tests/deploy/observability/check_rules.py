#!/usr/bin/env python3
"""The alert rules of deploy/prometheus through promtool, and what every alert must carry.

  check_rules.py check RULES        `promtool check rules`, then: every alert has a `for:`, a
                                    severity label (critical, warning or info), summary and
                                    description annotations; the TTFT SLO alert's slo_seconds label
                                    is the constant in its expression
  check_rules.py test RULES TESTS   `promtool test rules TESTS`, after checking that TESTS runs
                                    RULES and has, for every alert in RULES, an eval where it fires
                                    and one where it must not

Needs promtool (Debian package prometheus, which ./quickstart installs) and PyYAML (Debian
python3-yaml).
"""
import os
import re
import shutil
import subprocess
import sys

import yaml

SEVERITIES = {"critical", "warning", "info"}


def promtool(*args):
    exe = shutil.which("promtool")
    if not exe:
        sys.exit("promtool is missing: install Debian's prometheus package (./quickstart does)")
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
    sys.stdout.write(r.stdout + r.stderr)
    return r.returncode


def alerts(rules_path):
    with open(rules_path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def check(rules_path):
    if promtool("check", "rules", rules_path) != 0:
        return 1
    problems = []
    found = alerts(rules_path)
    if not found:
        problems.append("no alerts")
    for r in found:
        name = r["alert"]
        if not r.get("for"):
            problems.append(f"{name}: no `for:`")
        sev = (r.get("labels") or {}).get("severity")
        if sev not in SEVERITIES:
            problems.append(f"{name}: severity label {sev!r}, expected one of {sorted(SEVERITIES)}")
        ann = r.get("annotations") or {}
        for key in ("summary", "description"):
            if not str(ann.get(key, "")).strip():
                problems.append(f"{name}: no {key} annotation")
        slo = (r.get("labels") or {}).get("slo_seconds")
        if slo is not None:
            m = re.search(r"\)\s*>\s*([0-9.]+)\s*$", r["expr"].strip())
            if not m or float(m.group(1)) != float(slo):
                problems.append(f"{name}: slo_seconds={slo} but the expression compares with "
                                f"{m.group(1) if m else 'no constant'}")
            if f"{float(slo):g} s" not in ann.get("summary", "") + ann.get("description", ""):
                problems.append(f"{name}: the annotations do not state the {slo} s SLO")
    for p in problems:
        print("FAIL " + p)
    print(f"{len(found)} alerts, {len(problems)} problem(s)")
    return 1 if problems else 0


def test(rules_path, tests_path):
    with open(tests_path, encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    base = os.path.dirname(os.path.abspath(tests_path))
    files = [os.path.realpath(os.path.join(base, p)) for p in spec.get("rule_files", [])]
    problems = []
    if os.path.realpath(rules_path) not in files:
        problems.append(f"{tests_path} does not load {rules_path} (rule_files: {files})")
    fires, quiet = set(), set()
    for t in spec.get("tests", []):
        for case in t.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    for r in alerts(rules_path):
        if r["alert"] not in fires:
            problems.append(f"{r['alert']}: no test where it fires")
        if r["alert"] not in quiet:
            problems.append(f"{r['alert']}: no test where it must not fire")
    for p in problems:
        print("FAIL " + p)
    if problems:
        return 1
    return promtool("test", "rules", tests_path)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        return check(sys.argv[2])
    if len(sys.argv) == 4 and sys.argv[1] == "test":
        return test(sys.argv[2], sys.argv[3])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())

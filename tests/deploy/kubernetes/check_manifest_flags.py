#!/usr/bin/env python3
"""Checks the command lines the rendered manifests give `tandem` against the binary.

  check_manifest_flags.py --tandem BIN --kubectl KUBECTL --root DEPLOY_KUBERNETES_DIR

For every container whose command runs tandem, in every rendered kustomization:
  - args[0] is a subcommand of `tandem --help`, and every `--flag` in its args is listed in
    `tandem SUBCOMMAND --help`;
  - every $(VAR) in its args is defined by its env or the ConfigMaps of its envFrom, among the
    rendered objects (Kubernetes would otherwise pass the text "$(VAR)" on);
  - terminationGracePeriodSeconds exceeds the preStop sleep plus --drain-seconds (+5 s for the
    router's final wait), and a worker's preStop sleep exceeds the routers' --dns-refresh-s.
Then it runs the same checks on broken copies (an unknown flag, an undefined variable, a grace
period below the drain) and fails unless each is caught: the check must be able to fail.
"""
import argparse
import copy
import re
import subprocess
import sys

import render

FLAG = re.compile(r"^\s*(?:-\w,)?(--[A-Za-z0-9][A-Za-z0-9-]*)", re.M)
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
ROUTER_FINAL_WAIT_S = 5  # RouterFrontend::Drain returns at most 5 s after its timeout


def help_flags(tandem, sub):
    cmd = [tandem] + ([sub] if sub else []) + ["--help"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return out


def subcommands(tandem):
    text = help_flags(tandem, None)
    section = text.split("Subcommands:", 1)[1]
    return set(re.findall(r"^\s+([a-z][a-z-]*)\s", section, re.M))


def pod_templates(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield d, d["spec"]["template"]["spec"]


def value_of(args, flag):
    for i, a in enumerate(args[:-1]):
        if a == flag:
            return args[i + 1]
    return None


def check(docs, tandem, helps, subs, where):
    errors = []
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    routers_refresh = []
    workers = []
    checked = 0
    for obj, spec in pod_templates(docs):
        for c in spec.get("containers", []):
            command = c.get("command", [])
            if not command or not command[0].endswith("tandem"):
                continue
            checked += 1
            name = f"{where}: {obj['kind']}/{obj['metadata']['name']} container {c['name']}"
            args = [str(a) for a in c.get("args", [])]
            if not args or args[0] not in subs:
                errors.append(f"{name}: args[0] {args[:1]} is not a tandem subcommand")
                continue
            sub = args[0]
            if sub not in helps:
                helps[sub] = set(FLAG.findall(help_flags(tandem, sub)))
            for a in args[1:]:
                flag = a.split("=", 1)[0]
                if flag.startswith("--") and flag not in helps[sub]:
                    errors.append(f"{name}: `tandem {sub}` has no flag {flag}")
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            for src in c.get("envFrom", []):
                ref = src.get("configMapRef", {}).get("name")
                if ref is not None:
                    if ref not in configmaps:
                        errors.append(f"{name}: envFrom names ConfigMap {ref}, not rendered")
                    else:
                        env.update(configmaps[ref])
            for a in args:
                for var in VAR.findall(a):
                    if var not in env:
                        errors.append(f"{name}: $({var}) is defined by neither env nor envFrom")
            resolved = [VAR.sub(lambda m: str(env.get(m.group(1), m.group(0))), a) for a in args]
            pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            sleep = float(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0.0
            drain = value_of(resolved, "--drain-seconds")
            grace = spec.get("terminationGracePeriodSeconds", 30)
            if drain is None:
                errors.append(f"{name}: no --drain-seconds (the drain time must be explicit)")
            else:
                need = sleep + float(drain) + (ROUTER_FINAL_WAIT_S if sub == "router" else 0)
                if grace <= need:
                    errors.append(f"{name}: terminationGracePeriodSeconds {grace} <= preStop "
                                  f"sleep {sleep} + drain {drain}" +
                                  (f" + {ROUTER_FINAL_WAIT_S}" if sub == "router" else ""))
            if sub == "router":
                refresh = value_of(resolved, "--dns-refresh-s")
                routers_refresh.append(float(refresh) if refresh is not None else 10.0)
            elif sub in ("prefill", "decode"):
                workers.append((name, sleep))
    for name, sleep in workers:
        for refresh in routers_refresh:
            if sleep <= refresh:
                errors.append(f"{name}: preStop sleep {sleep} <= the router's --dns-refresh-s "
                              f"{refresh}: the router may still route to it when it drains")
    return checked, errors


def broken_copies(docs):
    """(description, mutated docs) that check() must reject."""
    def first_container(ds, sub):
        for obj, spec in pod_templates(ds):
            for c in spec["containers"]:
                if c.get("args", [None])[0] == sub:
                    return spec, c
        raise RuntimeError(f"no {sub} container to break")
    out = []
    ds = copy.deepcopy(docs)
    first_container(ds, "decode")[1]["args"].append("--no-such-flag")
    out.append(("an unknown flag", ds))
    ds = copy.deepcopy(docs)
    first_container(ds, "router")[1]["args"] += ["--port", "$(TANDEM_UNDEFINED_PORT)"]
    out.append(("an undefined $(VAR)", ds))
    ds = copy.deepcopy(docs)
    first_container(ds, "prefill")[0]["terminationGracePeriodSeconds"] = 5
    out.append(("a grace period below the drain", ds))
    ds = copy.deepcopy(docs)
    first_container(ds, "router")[1]["args"][0] = "routr"
    out.append(("an unknown subcommand", ds))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--root", required=True)
    args = parser.parse_args()
    subs = subcommands(args.tandem)
    helps = {}
    try:
        rendered = render.render_all(args.kubectl, args.root)
    except (RuntimeError, OSError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    failed = False
    total = 0
    for where, (_, docs) in rendered.items():
        checked, errors = check(docs, args.tandem, helps, subs, where)
        total += checked
        for e in errors:
            print(f"FAIL {e}", file=sys.stderr)
        failed |= bool(errors)
        print(f"{'FAIL' if errors else 'ok'} {where}: {checked} tandem containers")
    if total < 9:  # router, prefill, decode in base and in each of the three overlays, at least
        print(f"FAIL: only {total} tandem containers found", file=sys.stderr)
        failed = True
    for desc, docs in broken_copies(rendered["overlays/cpu-demo"][1]):
        _, errors = check(docs, args.tandem, helps, subs, "broken")
        if errors:
            print(f"ok negative ({desc}): {errors[0]}")
        else:
            print(f"FAIL negative ({desc}): not caught", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Every metric that deploy/ reads is one Tandem exports.

Collects the metric names used by
  - Grafana dashboards (deploy/**/*.json, and dashboards embedded in YAML): every panel target's
    `expr` and every query variable (label_values(METRIC, label));
  - Prometheus rules: plain rules files and PrometheusRule objects (every `expr`);
  - prometheus-adapter rules (any `seriesQuery`/`metricsQuery`/`containerQuery`/`nodeQuery`, in a
    config file, a ConfigMap's embedded config or Helm values), KEDA prometheus triggers, and the
    metric names HorizontalPodAutoscalers ask for (which must be names an adapter rule exposes),
in every deploy/**/*.y*ml and *.json, and checks each name against BOTH
  - docs/metrics.md (its tables of metrics), and
  - a live /metrics scrape of the router and every worker of a real `tandem serve` on the given
    model, started here twice: with the default KV transfer, and with `--kv-transfer loopback`,
    whose pairings fail, so that the labelled failure and fallback counters exist too.
Histogram series (_bucket, _sum, _count) map to their histogram; a histogram's bare name is an
error (Prometheus has no such series). kube-state-metrics names are allowed from KSM_ALLOWLIST.

  check_metrics.py --repo ROOT --tandem BIN --model DIR       the check (exit 1 on a problem)
  check_metrics.py ... --self-test                            proves the check fails: made-up
      names in a dashboard, a rule, an adapter rule and an HPA, a histogram used bare, a suffix
      on a gauge, a name in the docs but not exported live; plus PromQL extraction cases
  check_metrics.py --repo ROOT --list                         the names used and where, no check

Needs Python 3 and PyYAML (Debian python3-yaml).
"""
import argparse
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import yaml

# Metrics of kube-state-metrics (not Tandem's) that deploy/ may read, each with why.
KSM_ALLOWLIST = {
    "kube_deployment_status_replicas": "actual replicas of each pool's Deployment (dashboard)",
    "kube_pod_container_status_restarts_total": "container restarts (alert TandemContainerRestarted)",
}

HIST_SUFFIXES = ("_bucket", "_sum", "_count")

# ---------------------------------------------------------------------------------------------
# PromQL: the metric names an expression selects.

_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
             "bool", "offset", "inf", "nan"}
# Aggregation operators: `sum by (x) (...)` puts a keyword, not `(`, after the name.
_AGGREGATORS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
# Keywords followed by a parenthesised label list, not an expression.
_LABEL_LIST = {"by", "without", "on", "ignoring", "group_left", "group_right"}

_TOKEN = re.compile(r"""
    (?P<ws>\s+|\#[^\n]*)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<var>\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[^\]]*\]\])
  | (?P<num>0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?(?:[a-zA-Z]+[0-9]*)*)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,(){}\[\]@])
""", re.VERBOSE)


def _tokens(expr):
    pos, out = 0, []
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read PromQL at {expr[pos:pos + 20]!r} in {expr!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


def promql_metrics(expr):
    """Metric names in a PromQL expression: names before a selector or alone, and names given as
    {__name__="..."} (a regex __name__=~ is returned as 're:' + regex)."""
    toks = _tokens(expr)
    names = set()
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else None
        if text == "{":  # a selector's matchers: label names and values, and maybe __name__
            j = i + 1
            depth = 1
            inner = []
            while j < len(toks) and depth:
                if toks[j][1] == "{":
                    depth += 1
                elif toks[j][1] == "}":
                    depth -= 1
                if depth:
                    inner.append(toks[j])
                j += 1
            for k in range(len(inner) - 2):
                if inner[k] == ("ident", "__name__") and inner[k + 2][0] == "str":
                    value = inner[k + 2][1][1:-1]
                    if inner[k + 1][1] == "=":
                        names.add(value)
                    elif inner[k + 1][1] == "=~":
                        names.add("re:" + value)
            i = j
            continue
        if text == "[":  # a range or subquery duration
            while i < len(toks) and toks[i][1] != "]":
                i += 1
            i += 1
            continue
        if kind == "ident":
            low = text.lower()
            if low in _LABEL_LIST and nxt == "(":
                while i < len(toks) and toks[i][1] != ")":
                    i += 1
                i += 1
                continue
            if low in _KEYWORDS:
                i += 1
                continue
            if nxt == "(" or (low in _AGGREGATORS and nxt in ("by", "without")):
                i += 1  # a function or an aggregation
                continue
            names.add(text)
        i += 1
    return names


def grafana_to_promql(expr):
    """A Grafana target's PromQL with its variables replaced, so promtool can parse it."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}",
                  "5m", expr)
    expr = re.sub(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[^\]]*\]\]", ".*", expr)
    return expr


def adapter_to_promql(expr):
    """A prometheus-adapter query template as PromQL: <<.Series>> stands for the series' name
    (checked through its seriesQuery), <<.LabelMatchers>> and <<.GroupBy>> for a label."""
    expr = expr.replace("<<.Series>>", "__adapter_series__")
    expr = expr.replace("<<.LabelMatchers>>", 'namespace="adapter"')
    expr = expr.replace("<<.GroupBy>>", "namespace")
    return re.sub(r"<<[^>]*>>", "namespace", expr)


# ---------------------------------------------------------------------------------------------
# Where deploy/ reads metrics.

class Uses:
    def __init__(self):
        self.names = {}          # metric name (or 're:...') -> set of "file: what"
        self.records = set()     # names defined by recording rules
        self.adapter_exposed = {}  # metric name an adapter serves -> where
        self.hpa = {}            # metric name an HPA asks for -> where
        self.promql = []         # (where, PromQL) to parse with promtool

    def add_expr(self, where, expr, translate=None, series_name=None):
        try:
            names = promql_metrics(translate(expr) if translate else expr)
        except ValueError as e:
            self.names.setdefault("<unparsable>", set()).add(f"{where}: {e}")
            return
        names.discard("__adapter_series__")
        for n in names:
            self.names.setdefault(n, set()).add(where)
        self.promql.append((where, translate(expr) if translate else expr))


def _walk_dashboard(uses, path, dash):
    def visit(node, where):
        if isinstance(node, dict):
            title = node.get("title", where) if isinstance(node.get("title"), str) else where
            for key, value in node.items():
                if key == "expr" and isinstance(value, str) and value.strip():
                    uses.add_expr(f"{path}: panel '{title}'", value, grafana_to_promql)
                elif key == "templating" and isinstance(value, dict):
                    for var in value.get("list", []):
                        if var.get("type") != "query":
                            continue
                        q = var.get("query")
                        q = q.get("query", "") if isinstance(q, dict) else (q or "")
                        m = re.match(r"\s*(?:label_values|query_result)\((.*)\)\s*$", q, re.S)
                        if m:
                            arg = m.group(1)
                            if q.strip().startswith("label_values") and "," in arg:
                                arg = arg.rsplit(",", 1)[0]
                            if "(" in arg or "{" in arg or re.match(r"^\s*[A-Za-z_:]", arg):
                                if "," not in arg or "{" in arg:
                                    uses.add_expr(f"{path}: variable '{var.get('name')}'", arg,
                                                  grafana_to_promql)
                else:
                    visit(value, title)
        elif isinstance(node, list):
            for v in node:
                visit(v, where)
    visit(dash, "")


def _is_dashboard(obj):
    return isinstance(obj, dict) and ("panels" in obj or "rows" in obj) and (
        "schemaVersion" in obj or "title" in obj)


def _walk_yaml(uses, path, node, kind=None):
    if isinstance(node, dict):
        kind = node.get("kind", kind) if isinstance(node.get("kind"), str) else kind
        # Prometheus rule groups (a rules file, a PrometheusRule's spec, Helm values).
        if isinstance(node.get("groups"), list) and all(
                isinstance(g, dict) and "rules" in g for g in node["groups"]):
            for g in node["groups"]:
                for r in g.get("rules") or []:
                    if isinstance(r, dict) and isinstance(r.get("expr"), str):
                        what = r.get("alert") or r.get("record")
                        uses.add_expr(f"{path}: rule {what}", r["expr"])
                        if "record" in r:
                            uses.records.add(r["record"])
        # A prometheus-adapter rule.
        if "seriesQuery" in node or "metricsQuery" in node:
            where = f"{path}: adapter rule"
            series = node.get("seriesQuery", "")
            if isinstance(series, str) and series:
                uses.add_expr(f"{where} seriesQuery", series, adapter_to_promql)
            for key in ("metricsQuery",):
                if isinstance(node.get(key), str):
                    uses.add_expr(f"{where} {key}", node[key], adapter_to_promql)
            # The names it serves: name.as (with name.matches' groups), else the series' name.
            try:
                served = promql_metrics(adapter_to_promql(series)) if series else set()
            except ValueError:
                served = set()
            name = node.get("name") or {}
            matches = name.get("matches") or "^(.*)$"
            as_ = name.get("as")
            for s in served:
                if s.startswith("re:"):
                    uses.adapter_exposed[("re", s[3:], matches, as_)] = where
                    continue
                if as_:
                    repl = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", as_)
                    out = re.sub(matches, repl, s) if re.search(matches, s) else None
                else:
                    out = s
                if out:
                    uses.adapter_exposed[out] = where
        for key in ("containerQuery", "nodeQuery"):
            if isinstance(node.get(key), str):
                uses.add_expr(f"{path}: adapter resource {key}", node[key], adapter_to_promql)
        if kind == "HorizontalPodAutoscaler" and isinstance(node.get("metrics"), list):
            for m in node["metrics"]:
                for t in ("pods", "object", "external"):
                    metric = (m.get(t) or {}).get("metric") if isinstance(m, dict) else None
                    if isinstance(metric, dict) and metric.get("name"):
                        uses.hpa[metric["name"]] = f"{path}: HPA {t} metric"
        if kind == "ScaledObject" and isinstance(node.get("triggers"), list):
            for t in node["triggers"]:
                if t.get("type") == "prometheus" and isinstance(t.get("metadata"), dict):
                    if isinstance(t["metadata"].get("query"), str):
                        uses.add_expr(f"{path}: KEDA trigger", t["metadata"]["query"])
        for key, value in node.items():
            if key in ("groups",):
                continue
            _walk_yaml(uses, path, value, kind)
    elif isinstance(node, list):
        for v in node:
            _walk_yaml(uses, path, v, kind)
    elif isinstance(node, str) and "\n" in node:
        # Embedded configuration (a ConfigMap's config.yaml, a dashboard's JSON).
        try:
            inner = json.loads(node)
        except ValueError:
            try:
                inner = yaml.safe_load(node)
            except yaml.YAMLError:
                return
        if _is_dashboard(inner):
            _walk_dashboard(uses, path + " (embedded)", inner)
        elif isinstance(inner, (dict, list)):
            _walk_yaml(uses, path + " (embedded)", inner, kind)


def collect(repo, extra=()):
    uses = Uses()
    deploy = os.path.join(repo, "deploy")
    files = sorted(set(
        glob.glob(os.path.join(deploy, "**", "*.yml"), recursive=True) +
        glob.glob(os.path.join(deploy, "**", "*.yaml"), recursive=True) +
        glob.glob(os.path.join(deploy, "**", "*.json"), recursive=True))) + list(extra)
    for f in files:
        rel = os.path.relpath(f, repo)
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        if f.endswith(".json"):
            obj = json.loads(text)
            if _is_dashboard(obj):
                _walk_dashboard(uses, rel, obj)
            continue
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as e:
            # Not ours to validate (a kustomize patch template, say), but say so.
            print(f"note: {rel}: not YAML ({e.__class__.__name__}); skipped", file=sys.stderr)
            continue
        for d in docs:
            _walk_yaml(uses, rel, d)
    return uses, [os.path.relpath(f, repo) for f in files]


# ---------------------------------------------------------------------------------------------
# What Tandem exports: docs/metrics.md and a live scrape.

def docs_metrics(path):
    types = {}
    row = re.compile(r"^\|\s*`([A-Za-z_:][A-Za-z0-9_:]*)`\s*\|\s*(counter|gauge|histogram|summary)\s*\|")
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = row.match(line)
            if m:
                types[m.group(1)] = m.group(2)
    if len(types) < 10:
        sys.exit(f"{path}: found only {len(types)} metrics in its tables; has the format changed?")
    return types


def parse_exposition(text):
    """{family: type} from a /metrics page: # TYPE lines, and samples (suffixes folded)."""
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                types[parts[2]] = parts[3]
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group()
        if name in types:
            continue
        base = next((name[:-len(s)] for s in HIST_SUFFIXES if name.endswith(s)), None)
        if base not in types:
            types[name] = "untyped"
    return types


def _get(url, data=None, timeout=30):
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


class Serve:
    """`tandem serve --port 0` in its own process group; its router and workers' URLs."""

    def __init__(self, tandem, model, kv_transfer, log, extra=()):
        self.log = log
        self.lines = []
        self.cv = threading.Condition()
        args = [tandem, "serve", "--model", model, "--port", "0", "--kv-transfer", kv_transfer,
                "--startup-timeout-s", "90", "--drain-seconds", "1", "--stop-timeout-s", "10",
                *extra]
        print("starting: " + " ".join(args), file=sys.stderr)
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.log.write(line)
            with self.cv:
                self.lines.append(line)
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def wait_urls(self, workers, timeout):
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                text = "".join(self.lines)
                router = re.search(r"tandem router: serving on (http://[^/\s]+)/v1", text)
                metrics = re.findall(r"metrics on (http://\S+/metrics)", text)
                if router and len(metrics) >= workers:
                    return router.group(1), sorted(set(metrics))
                if self.proc.poll() is not None:
                    raise RuntimeError(f"tandem serve exited ({self.proc.returncode}) before it "
                                       f"was serving:\n{text[-3000:]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"tandem serve not serving after {timeout} s:\n{text[-3000:]}")
                self.cv.wait(min(left, 1.0))

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)  # serve stops its children (Ctrl-C)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                print("tandem serve did not stop in 30 s: SIGKILL to its process group",
                      file=sys.stderr)
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # Nothing of ours may outlive it (its children share its process group).
        self.leftovers = False
        try:
            os.killpg(self.proc.pid, 0)
            time.sleep(1)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.leftovers = True
            print("killed children left in the process group of tandem serve", file=sys.stderr)
        except ProcessLookupError:
            pass
        return self.proc.returncode


class Deadline(Exception):
    pass


def _deadline(signum, frame):
    raise Deadline(f"signal {signum}: out of time (or terminated); stopping tandem serve")


def scrape_live(tandem, model, log_dir, budget_s=240):
    """{family: type} over the router and workers of two `tandem serve` runs."""
    t0 = time.monotonic()
    # One deadline over everything, so that tandem serve is stopped (the finally below) before
    # ctest's TIMEOUT; SIGTERM and SIGINT stop it too.
    signal.signal(signal.SIGALRM, _deadline)
    signal.signal(signal.SIGTERM, _deadline)
    signal.signal(signal.SIGINT, _deadline)
    signal.alarm(budget_s)
    families = {}
    unclean = []
    os.makedirs(log_dir, exist_ok=True)
    prompt = ("The quick brown fox jumps over the lazy dog while the farmer watches from the "
              "porch, counting the clouds that drift over the hills toward the river. ") * 2
    for kv in ("auto", "loopback"):
        left = budget_s - (time.monotonic() - t0)
        with open(os.path.join(log_dir, f"serve-{kv}.log"), "w") as log:
            serve = Serve(tandem, model, kv, log)
            try:
                router, worker_urls = serve.wait_urls(workers=2, timeout=max(10, min(90, left - 30)))
                # Both pools healthy, as the router sees them.
                deadline = time.monotonic() + 30
                while True:
                    page = _get(router + "/metrics")
                    if (re.search(r'tandem_pool_replicas\{pool="decode"\} [1-9]', page) and
                            re.search(r'tandem_pool_replicas\{pool="prefill"\} [1-9]', page)):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError("the router never saw both pools healthy:\n" + page)
                    time.sleep(0.2)
                # Traffic, so labelled families get series: a completion, then a streamed chat
                # completion of the same prompt (a prefix-cache hit), and a 404.
                body = {"model": os.path.basename(os.path.normpath(model)), "prompt": prompt,
                        "max_tokens": 4, "temperature": 0}
                _get(router + "/v1/completions", json.dumps(body).encode())
                time.sleep(1.0)
                chat = {"model": body["model"], "max_tokens": 4, "stream": True,
                        "messages": [{"role": "user", "content": prompt}]}
                _get(router + "/v1/completions", json.dumps(body).encode())
                _get(router + "/v1/chat/completions", json.dumps(chat).encode())
                try:
                    _get(router + "/v1/no-such-route")
                except urllib.error.HTTPError:
                    pass
                time.sleep(1.5)  # a stats interval for the router's per-worker gauges
                for url in [router + "/metrics"] + worker_urls:
                    page = _get(url)
                    got = parse_exposition(page)
                    print(f"  {kv}: {url}: {len(got)} families", file=sys.stderr)
                    for name, typ in got.items():
                        families.setdefault(name, typ)
            finally:
                # Stopping is bounded on its own (40 s); nothing may interrupt it.
                signal.alarm(0)
                handlers = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM,
                                                                          signal.SIGINT)}
                rc = serve.stop()
                for sig, h in handlers.items():
                    signal.signal(sig, h)
                print(f"  {kv}: tandem serve stopped (exit {rc})", file=sys.stderr)
                if rc != 0 or serve.leftovers:
                    unclean.append(f"tandem serve --kv-transfer {kv} did not stop cleanly on "
                                   f"SIGINT (exit {rc}, children left: {serve.leftovers})")
                left = int(budget_s - (time.monotonic() - t0))
        if left <= 0:
            raise Deadline(f"out of time after {budget_s} s")
        signal.alarm(left)
    signal.alarm(0)
    return families, unclean


# ---------------------------------------------------------------------------------------------
# The check.

def check(uses, docs, live):
    """Problems as (name, where, what)."""
    problems = []

    def resolve(name):
        for s in HIST_SUFFIXES:
            if name.endswith(s):
                base = name[:-len(s)]
                if docs.get(base) in ("histogram", "summary") or live.get(base) in (
                        "histogram", "summary"):
                    return base, None
        if docs.get(name) == "histogram" or live.get(name) == "histogram":
            return name, (f"is a histogram: Prometheus has only {name}_bucket, _sum and _count")
        return name, None

    known = set(docs) | set(live)
    for name, wheres in sorted(uses.names.items()):
        where = "; ".join(sorted(wheres))
        if name == "<unparsable>":
            problems.append((name, where, "PromQL that this check cannot read"))
            continue
        if name.startswith("re:"):
            rx = re.compile(name[3:])
            hit = [k for k in known if rx.fullmatch(k)]
            if not hit:
                problems.append((name, where, "a __name__ regex that matches no Tandem metric"))
            continue
        if name in uses.records or name in KSM_ALLOWLIST:
            continue
        base, bad = resolve(name)
        if bad:
            problems.append((name, where, bad))
            continue
        missing = []
        if base not in docs:
            missing.append("docs/metrics.md")
        if base not in live:
            missing.append("a live /metrics of tandem serve")
        if missing:
            problems.append((name, where, "not exported by Tandem: not in " + " nor in ".join(missing)))
    for name, where in sorted(uses.hpa.items()):
        served = name in uses.adapter_exposed or any(
            isinstance(k, tuple) and re.fullmatch(k[1], name) for k in uses.adapter_exposed)
        if not served:
            problems.append((name, where,
                             "an HPA metric that no prometheus-adapter rule in deploy/ serves"))
    return problems


def promtool_parse(uses):
    """Every collected expression (dashboard targets with variables filled in) parses as
    PromQL: promtool check rules on recording rules that hold them."""
    if not uses.promql:
        return []
    rules = {"groups": [{"name": "parse", "rules": [
        {"record": f"parse:expr_{i}", "expr": e} for i, (_, e) in enumerate(uses.promql)]}]}
    with tempfile.TemporaryDirectory(prefix="tandem-promql-") as tmp:
        path = os.path.join(tmp, "parse.yml")
        with open(path, "w") as f:
            yaml.safe_dump(rules, f)
        try:
            r = subprocess.run(["promtool", "check", "rules", path], capture_output=True,
                               text=True, timeout=60)
        except FileNotFoundError:
            return [("promtool", "", "promtool is missing (Debian package prometheus)")]
    if r.returncode == 0:
        return []
    out = r.stdout + r.stderr
    problems = []
    for i, (where, e) in enumerate(uses.promql):
        m = re.search(rf'"parse:expr_{i}": (.*)', out)
        if m:
            problems.append(("PromQL", where, f"{m.group(1)}: {e}"))
    return problems or [("PromQL", "", "promtool check rules failed:\n" + out)]


def report(problems):
    for name, where, what in problems:
        print(f"FAIL {name}: {what}\n     used in {where}")


# ---------------------------------------------------------------------------------------------
# --self-test: the check must catch what it is for.

def self_test(repo, docs, live, tmp):
    failures = []

    def expect(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    cases = {
        'histogram_quantile(0.9, sum by (le, pool) (rate(a_bucket{x="y", le!="0"}[5m])))': {"a_bucket"},
        "sum(rate(b_total[$__rate_interval])) / ignoring (pool) group_left sum(c)": {"b_total", "c"},
        'max by (pool) (label_replace(d{deployment=~".*(prefill|decode).*"}, "pool", "$1", '
        '"deployment", ".*"))': {"d"},
        "absent(e) or vector(0) and on () f offset 5m": {"e", "f"},
        '{__name__="g", job="x"} + {__name__=~"h_.*"}': {"g", "re:h_.*"},
        "vllm:num_requests_waiting > bool 1e3 unless i @ start()": {"vllm:num_requests_waiting", "i"},
        "sum without (instance) (j[5m:1m])": {"j"},
        "max by (pool) (k) / min without (a) (l) + count by (x) (m) - topk by (y) (3, n)":
            {"k", "l", "m", "n"},
    }
    for expr, want in cases.items():
        got = promql_metrics(grafana_to_promql(expr))
        expect(got == want, f"extract {expr!r}: {sorted(got)}")
    tpl = Uses()
    tpl.add_expr("t", "sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>, pool)",
                 adapter_to_promql)
    expect(not tpl.names and not promtool_parse(tpl),
           "an adapter template's <<.Series>> is not a name, and the template parses")

    made_up = "tandem_made_up_metric_total"
    files = {
        "bad-dashboard.json": json.dumps({"title": "x", "schemaVersion": 39, "panels": [
            {"title": "p", "targets": [{"expr": f"sum(rate({made_up}[$__rate_interval]))"}]},
            {"title": "q", "targets": [{"expr": "tandem_time_to_first_token_seconds"}]},
            {"title": "r", "targets": [{"expr": "tandem_pool_replicas_count"}]}]}),
        "bad-rules.yml": yaml.safe_dump({"groups": [{"name": "g", "rules": [
            {"alert": "A", "expr": "tandem_made_up_alert_input > 0", "for": "1m"}]}]}),
        "bad-adapter.yaml": yaml.safe_dump_all([
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "adapter"},
             "data": {"config.yaml": yaml.safe_dump({"rules": [
                 {"seriesQuery": 'tandem_made_up_adapter_input{namespace!=""}',
                  "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
                  "name": {"matches": "^(.*)$", "as": "${1}_served"},
                  "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"}]})}},
            {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
             "metadata": {"name": "h"},
             "spec": {"metrics": [
                 {"type": "Object", "object": {"metric": {"name": "tandem_made_up_adapter_input_served"}}},
                 {"type": "External", "external": {"metric": {"name": "tandem_made_up_hpa_metric"}}}]}}]),
    }
    extra = []
    for name, text in files.items():
        p = os.path.join(tmp, name)
        with open(p, "w") as f:
            f.write(text)
        extra.append(p)
    uses, _ = collect(repo, extra)
    problems = check(uses, docs, live)
    by_name = {}
    for name, where, what in problems:
        by_name.setdefault(name, []).append((where, what))
    for n in sorted(by_name):
        print(f"     reported: {n}: {by_name[n][0][1]}")

    def flagged(name, text):
        return any(text in what for _, what in by_name.get(name, []))

    expect(flagged(made_up, "not in docs/metrics.md nor in a live /metrics"),
           f"a made-up name in a dashboard ({made_up}) fails")
    expect(flagged("tandem_made_up_alert_input", "not exported"), "a made-up name in a rule fails")
    expect(flagged("tandem_made_up_adapter_input", "not exported"),
           "a made-up name in an adapter rule (in a ConfigMap) fails")
    expect("tandem_made_up_adapter_input_served" not in by_name,
           "an HPA metric an adapter rule serves (name.as) passes")
    expect(flagged("tandem_made_up_hpa_metric", "no prometheus-adapter rule"),
           "an HPA metric no adapter rule serves fails")
    expect(flagged("tandem_time_to_first_token_seconds", "is a histogram"),
           "a histogram's bare name fails")
    expect(flagged("tandem_pool_replicas_count", "not exported"), "_count on a gauge fails")
    real = {n for n in by_name if "made_up" not in n and n not in (
        "tandem_time_to_first_token_seconds", "tandem_pool_replicas_count")}
    expect(not real, f"nothing else is reported ({sorted(real)})")

    # A name the docs list but a live Tandem does not export: the live half alone must fail.
    doctored = dict(docs, **{made_up: "counter"})
    p2 = {n for n, _, what in check(uses, doctored, live) if "a live /metrics" in what}
    expect(made_up in p2 and not any(
        made_up == n and "docs/metrics.md" in w for n, _, w in check(uses, doctored, live)),
        "a name in docs/metrics.md but not in the live scrape fails on the live scrape alone")
    # And one exported live but not documented: the docs half alone must fail.
    live2 = dict(live, **{made_up: "counter"})
    p3 = [w for n, _, w in check(uses, docs, live2) if n == made_up]
    expect(p3 and "docs/metrics.md" in p3[0] and "live" not in p3[0],
           "a name exported live but not in docs/metrics.md fails on the docs alone")
    # A dashboard expression that is not PromQL fails the promtool parse.
    bad = Uses()
    bad.add_expr("x: panel 'y'", "sum(rate(tandem_requests_total[5m])", grafana_to_promql)
    expect(bool(promtool_parse(bad)), "an expression that is not PromQL fails promtool's parse")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--tandem", help="the tandem binary")
    ap.add_argument("--model", help="model directory for tandem serve")
    ap.add_argument("--log-dir", default=None, help="where tandem serve logs go")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--list", action="store_true", help="print the names used and where")
    args = ap.parse_args()

    uses, files = collect(args.repo)
    if args.list:
        for n, w in sorted(uses.names.items()):
            print(n, "<-", "; ".join(sorted(w)))
        for n, w in sorted(uses.hpa.items()):
            print(n, "<- (HPA)", w)
        return 0
    if not args.tandem or not args.model:
        ap.error("--tandem and --model are needed (the live scrape)")
    docs = docs_metrics(os.path.join(args.repo, "docs", "metrics.md"))
    tmp = tempfile.mkdtemp(prefix="tandem-obs-")
    log_dir = args.log_dir or tmp
    live, unclean = scrape_live(args.tandem, args.model, log_dir)
    print(f"docs/metrics.md: {len(docs)} metrics; live scrape: {len(live)} families "
          f"(logs in {log_dir})")
    undocumented = sorted(n for n in live if n not in docs)
    if undocumented:
        print(f"note: exported but not in docs/metrics.md: {undocumented}")
    if args.self_test:
        failures = self_test(args.repo, docs, live, tmp)
        print(f"self-test: {'FAILED: ' + str(len(failures)) if failures else 'passed'}")
        return 1 if failures else 0

    print(f"read {len(files)} files under deploy/; {len(uses.names)} metric names, "
          f"{len(uses.hpa)} HPA metrics, {len(uses.adapter_exposed)} adapter-served names")
    problems = check(uses, docs, live) + promtool_parse(uses) + [
        ("tandem serve", "the live scrape", u) for u in unclean]
    for n in sorted(uses.names):
        if n in KSM_ALLOWLIST:
            print(f"  allowlisted (kube-state-metrics): {n}")
        elif not any(n == p[0] for p in problems):
            print(f"  ok: {n}")
    unused = sorted(set(KSM_ALLOWLIST) - set(uses.names))
    if unused:
        print(f"note: allowlisted but unused: {unused}")
    report(problems)
    if not uses.names:
        print("FAIL: no metric use found under deploy/ (is the dashboard there?)")
        return 1
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

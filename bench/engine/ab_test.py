#!/usr/bin/env python3
"""Tests of bench/engine/ab.sh and ab_summary.py with a fake engine_bench (no GPU): variants run
alternately, each variant's arguments reach its binary after the common ones, the summary's medians
and changes are right, a failing variant is reported without stopping the others, bad arguments are
refused."""

import json
import os
import stat
import subprocess
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
AB = os.path.join(HERE, "ab.sh")
SUMMARY = os.path.join(HERE, "ab_summary.py")

# Writes one decode point and one prefill point; --fake-ms MS sets the times (--fake-fail: exit
# 1). Logs its name, its time and its arguments before --json.
FAKE = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, sys
    args = sys.argv[1:]
    ms_arg = args[args.index("--fake-ms") + 1] if "--fake-ms" in args else "?"
    log = os.environ["FAKE_LOG"]
    with open(log, "a") as f:
        f.write(os.path.basename(sys.argv[0]) + ":" + ms_arg + ":" +
                "|".join(args[:args.index("--json")]) + "\\n")
    if "--fake-fail" in args:
        sys.exit(1)
    ms = float(ms_arg if ms_arg != "?" else "10")
    out = sys.argv[sys.argv.index("--json") + 1]
    json.dump({"decode": [{"batch": 64, "context": 1024, "ms_per_step": ms,
                           "pct_of_roofline": 55.0 / ms * 10}],
               "prefill": [{"tokens": 8192, "ms": 20 * ms, "pct_of_gemm_peak": 60.0}]},
              open(out, "w"))
    """)


class AbTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.bin = os.path.join(self.tmp.name, "bin")
        os.makedirs(self.bin)
        for name in ("bench_a", "bench_b"):
            path = os.path.join(self.bin, name)
            with open(path, "w") as f:
                f.write(FAKE)
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        self.log = os.path.join(self.tmp.name, "log")
        self.out = os.path.join(self.tmp.name, "out")
        self.env = dict(os.environ, FAKE_LOG=self.log)

    def tearDown(self):
        self.tmp.cleanup()

    def run_ab(self, *variants, repeats="2"):
        return subprocess.run(["bash", AB, self.out, repeats, self.bin, "--model /m --iters 3",
                               *variants], env=self.env, capture_output=True, text=True,
                              timeout=60)

    def test_alternates_and_summarizes(self):
        r = self.run_ab("base=bench_a --fake-ms 10",
                        "new=bench_b --tuning decode.chain=0,skinny=off --fake-ms 9")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.log) as f:
            self.assertEqual(f.read().split(), [
                "bench_a:10:--model|/m|--iters|3|--fake-ms|10",
                "bench_b:9:--model|/m|--iters|3|--tuning|decode.chain=0,skinny=off|--fake-ms|9"
            ] * 2)
        for name in ("base_1", "base_2", "new_1", "new_2"):
            self.assertTrue(os.path.exists(os.path.join(self.out, name + ".json")), name)
        self.assertIn("decode batch 64, context 1024", r.stdout)
        self.assertIn("median 9.000 ms", r.stdout)
        self.assertIn("-10.0% vs base", r.stdout)
        self.assertIn("prefill 8192 tokens", r.stdout)
        self.assertIn("median 200.000 ms", r.stdout)
        with open(os.path.join(self.out, "summary.txt")) as f:
            self.assertEqual(f.read().strip(), r.stdout.strip())

    def test_failing_variant_is_reported_and_the_others_run(self):
        r = self.run_ab("base=bench_a --fake-ms 10", "bad=bench_b --fake-fail",
                        "new=bench_a --fake-ms 12")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("bad run 1 failed", r.stderr)
        self.assertIn("bad run 2 failed", r.stderr)
        self.assertIn("(no runs)", r.stdout)
        self.assertIn("+20.0% vs base", r.stdout)

    def test_bad_arguments_are_refused(self):
        self.assertEqual(self.run_ab("base=bench_a", repeats="0").returncode, 2)
        r = self.run_ab("nameonly")
        self.assertEqual(r.returncode, 2)
        self.assertIn("bad variant", r.stderr)
        r = self.run_ab("x=missing_binary")
        self.assertEqual(r.returncode, 2)
        self.assertIn("no executable", r.stderr)
        r = self.run_ab("x=")
        self.assertEqual(r.returncode, 2)
        self.assertIn("bad variant", r.stderr)
        r = self.run_ab("x=bench_a --json y")
        self.assertEqual(r.returncode, 2)
        self.assertIn("variant x must not name --json", r.stderr)
        r = subprocess.run(["bash", AB, self.out, "1", self.bin, "--json x", "a=bench_a"],
                           env=self.env, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("must not name --json", r.stderr)

    def test_summary_of_an_empty_directory_is_an_error(self):
        os.makedirs(self.out)
        r = subprocess.run(["python3", SUMMARY, self.out], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no NAME_R.json", r.stderr)


if __name__ == "__main__":
    unittest.main()

"""How fast a host runs now against when it was profiled (bench/planning/acceptance.sh).

A speed check is a `tandem profile` of a few of the profile's points (prefill 256, decode at
batch 1 and 8 at context 256). speed() is the geometric mean of the check's step times over the
profile's at those points: 1.30 means 30% slower. Run as a script: PROFILE CHECK, prints it.
"""
import json
import math
import sys


def points(path):
    p = json.load(open(path))
    pre = next(x["ms"] for x in p["prefill"] if x["tokens"] == 256 and x["cached_tokens"] == 0)
    dec = {(x["batch"], x["context"]): x["ms"] for x in p["decode"]}
    return [pre, dec[(1, 256)], dec[(8, 256)]]


def speed(profile, check):
    """The check's step times over the profile's, or None where either file lacks the points."""
    try:
        base, now = points(profile), points(check)
    except (OSError, ValueError, KeyError, StopIteration):
        return None
    return math.exp(sum(math.log(a / b) for a, b in zip(now, base)) / len(base))


if __name__ == "__main__":
    x = speed(sys.argv[1], sys.argv[2])
    print("nan" if x is None else "%.3f" % x)

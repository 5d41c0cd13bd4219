#!/usr/bin/env python3
"""Structured outputs against an independent validator: every text the compiled automaton of a
JSON Schema (runtime/grammar/json_schema.h) generates must parse as JSON and validate under the
`jsonschema` package (Debian's python3-jsonschema), and hand-written valid instances must be
accepted (so the language is not trivially small). Unsupported schemas must fail to compile with
a message naming the keyword.

usage: check.py JSON_SCHEMA_SAMPLE_BINARY
"""
import datetime
import json
import os
import subprocess
import sys
import tempfile
import uuid
import ipaddress

import jsonschema

TOOL = sys.argv[1]
SAMPLES = 300

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        "role": {"enum": ["admin", "user", None, 3]},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

CASES = [
    # (name, schema, valid instances)
    ("person", PERSON, [{"name": "Ann", "age": 42}, {"name": "B", "age": 0, "role": None},
                        {"name": "C", "age": 130, "tags": ["a", "bb"], "role": "admin"}]),
    ("all_optional", {"type": "object", "properties": {"a": {"type": "boolean"},
                                                      "b": {"type": "null"},
                                                      "c": {"type": "number"}}},
     [{}, {"b": None}, {"a": True, "c": -1.5e3}, {"c": 0}]),
    ("integer_ranges", {"type": "array", "items": {"anyOf": [
        {"type": "integer", "minimum": -1234, "maximum": -7},
        {"type": "integer", "exclusiveMinimum": 99, "exclusiveMaximum": 10001},
        {"type": "integer", "minimum": 5000000000}]}, "minItems": 1, "maxItems": 4},
     [[-7], [-1234, 100, 10000], [5000000000, 123456789012]]),
    ("open_ranges", {"type": "object", "properties": {
        "ge": {"type": "integer", "minimum": -15}, "le": {"type": "integer", "maximum": 42},
        "neg": {"type": "integer", "maximum": -100}}, "required": ["ge", "le", "neg"]},
     [{"ge": -15, "le": 42, "neg": -100}, {"ge": 999, "le": -99999, "neg": -12345}]),
    ("refs", {"$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}},
        "type": "object", "properties": {"from": {"$ref": "#/$defs/point"},
                                          "to": {"$ref": "#/$defs/point"}},
        "required": ["from", "to"]},
     [{"from": {"x": 1, "y": 2}, "to": {"x": -0.5, "y": 3e2}}]),
    ("formats", {"type": "object", "properties": {
        "d": {"type": "string", "format": "date"}, "t": {"type": "string", "format": "time"},
        "dt": {"type": "string", "format": "date-time"},
        "u": {"type": "string", "format": "uuid"}, "ip": {"type": "string", "format": "ipv4"}},
        "required": ["d", "t", "dt", "u", "ip"]},
     [{"d": "2024-12-31", "t": "23:59:59Z", "dt": "2024-02-28T00:00:00.5+01:00",
       "u": "123e4567-e89b-12d3-a456-426614174000", "ip": "192.168.0.255"}]),
    ("strings", {"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 4},
                 "minItems": 2},
     [["ab", "abcd", "\u00e9\u00e9"], ["\"q", "a\\nb"]]),
    ("type_list_and_const", {"type": "object", "properties": {
        "v": {"type": ["string", "integer", "null"]}, "k": {"const": {"a": [1, "x"]}}},
        "required": ["v", "k"]},
     [{"v": None, "k": {"a": [1, "x"]}}, {"v": "s", "k": {"a": [1, "x"]}}]),
    ("map", {"type": "object", "additionalProperties": {"type": "integer"}},
     [{}, {"a": 1, "b": -2}]),
    ("untyped", {}, [{"a": [1, "2"]}, {"a": {"b": None}}, "x", 3, [], None]),
    ("one_of", {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"},
                                                           "r": {"type": "number"}},
                           "required": ["kind", "r"], "additionalProperties": False},
                          {"type": "object", "properties": {"kind": {"const": "square"},
                                                           "side": {"type": "number"}},
                           "required": ["kind", "side"], "additionalProperties": False}]},
     [{"kind": "circle", "r": 1}, {"kind": "square", "side": 2.5}]),
]

UNSUPPORTED = [
    ({"type": "string", "pattern": "a+"}, "pattern"),
    ({"type": "object", "patternProperties": {"x": {}}}, "patternProperties"),
    ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"},
     "recursive"),
    ({"type": "string", "format": "hostname"}, "hostname"),
    ({"type": "number", "minimum": 0}, "minimum"),
    ({"type": "array", "maxItems": 100000}, "maxItems"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "'b'"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "empty"),
]


def check_format(fmt, value):
    """The formats jsonschema's FormatChecker may skip (their optional packages are absent)."""
    if fmt == "date":
        datetime.date.fromisoformat(value)
    elif fmt == "time":
        datetime.time.fromisoformat(value.replace("Z", "+00:00"))
    elif fmt == "date-time":
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    elif fmt == "uuid":
        uuid.UUID(value)
    elif fmt == "ipv4":
        ipaddress.IPv4Address(value)
    elif fmt == "email":
        assert "@" in value


def walk_formats(schema, instance):
    if isinstance(schema, dict):
        if "format" in schema and isinstance(instance, str):
            check_format(schema["format"], instance)
        for key, sub in schema.get("properties", {}).items():
            if isinstance(instance, dict) and key in instance:
                walk_formats(sub, instance[key])


def run(args, stdin=None):
    return subprocess.run([TOOL] + args, input=stdin, capture_output=True, text=True, check=False)


def main():
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, schema, valid in CASES:
            path = os.path.join(tmp, name + ".json")
            with open(path, "w") as f:
                json.dump(schema, f)
            # jsonschema checks date, ipv4, uuid and email itself; without its optional
            # rfc3339-validator it would check "time" as draft 3's %H:%M:%S, so time and
            # date-time are checked by check_format alone.
            validator = jsonschema.Draft202012Validator(
                schema, format_checker=jsonschema.FormatChecker(
                    formats=("date", "ipv4", "uuid", "email")))
            r = run(["sample", path, str(SAMPLES), "1"])
            if r.returncode != 0:
                print(f"FAIL {name}: sample exited {r.returncode}: {r.stderr.strip()}")
                failures += 1
                continue
            texts = [json.loads(line) for line in r.stdout.split("\n") if line]
            bad = 0
            for text in texts:
                try:
                    instance = json.loads(text)
                    validator.validate(instance)
                    walk_formats(schema, instance)
                except Exception as e:  # noqa: BLE001 (any failure is a finding)
                    bad += 1
                    if bad <= 3:
                        print(f"FAIL {name}: generated {text!r}: {type(e).__name__}: {e}")
            distinct = len(set(texts))
            if len(texts) < SAMPLES * 0.9 or distinct < min(20, SAMPLES // 10) and name != "map":
                print(f"FAIL {name}: only {len(texts)} samples, {distinct} distinct")
                bad += 1
            lines = []
            for inst in valid:
                validator.validate(inst)  # the instances themselves are right
                walk_formats(schema, inst)
                lines.append(json.dumps(json.dumps(inst)))
                lines.append(json.dumps(json.dumps(inst, separators=(",", ":"))))
            m = run(["match", path], "\n".join(lines) + "\n")
            for line, got in zip(lines, m.stdout.split()):
                if got != "1":
                    bad += 1
                    print(f"FAIL {name}: valid instance {json.loads(line)} rejected")
            failures += bad
            print(f"{'ok  ' if bad == 0 else 'FAIL'} {name}: {len(texts)} samples "
                  f"({distinct} distinct), {len(lines)} valid instances")
        for i, (schema, word) in enumerate(UNSUPPORTED):
            path = os.path.join(tmp, f"unsupported{i}.json")
            with open(path, "w") as f:
                json.dump(schema, f)
            out = run(["compile", path]).stdout.strip()
            if out == "ok" or word not in out:
                print(f"FAIL unsupported {schema}: got {out!r}, wanted a message naming {word!r}")
                failures += 1
            else:
                print(f"ok   rejected: {out}")
    print("PASS" if failures == 0 else f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/<seed>), deterministically.

    python3 fuzz/make_seeds.py          # rewrites the generated seeds; others are left alone

Each seed is a small realistic input in the target's input format (see the comment at the top of
fuzz/<target>_fuzz.cc), some valid and some slightly broken. Regression seeds for bugs the fuzzers
found are named regression-* and are checked in as found, not generated here. Proto seeds are
encoded by `protoc --encode` from text format, so protoc must be on PATH.
"""
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
MODEL = os.path.join(ROOT, "models", "target")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def dumps(obj):
    return json.dumps(obj, ensure_ascii=False)


# ---- openai_request and http_request ----

CHAT = {"model": "target", "messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hello!"}],
        "max_tokens": 32}
CHAT_STREAM = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                         {"type": "text", "text": "there"}]}],
               "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.7,
               "top_p": 0.9, "seed": 42, "stop": ["\n\n", "END"], "logprobs": True,
               "top_logprobs": 3}
CHAT_EXT = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": None},
                         {"role": "tool", "content": "b"}],
            "add_generation_prompt": False, "top_k": 40, "min_p": 0.05,
            "repetition_penalty": 1.1, "ignore_eos": True, "stop_token_ids": [2, 0],
            "max_completion_tokens": 8, "n": 2, "presence_penalty": -0.5,
            "frequency_penalty": 1.5, "response_format": {"type": "text"}, "tools": [],
            "modalities": ["text"], "user": "u1"}
COMPLETION = {"model": "target", "prompt": "Once upon a time", "max_tokens": 16,
              "temperature": 0}
COMPLETION_IDS = {"prompt": [[0, 17, 300, 8191]], "echo": True, "max_tokens": 4.0}
COMPLETION_LOGPROBS = {"prompt": ["The capital of France is"], "logprobs": 5, "best_of": 1,
                       "stream": True}


def openai_seeds():
    t = "openai_request"
    write(t, "chat-basic", b"\x01" + dumps(CHAT).encode())
    write(t, "chat-stream-parts-logprobs", b"\x01" + dumps(CHAT_STREAM).encode())
    write(t, "chat-extensions", b"\x01" + dumps(CHAT_EXT).encode())
    write(t, "chat-unicode", b"\x01" + dumps(
        {"messages": [{"role": "user", "content": "h\u00e9llo \u4e16\u754c \U0001F642 "
                       "<|im_end|>\\u0000"}]}).encode())
    write(t, "completion-basic", b"\x00" + dumps(COMPLETION).encode())
    write(t, "completion-token-ids-echo", b"\x00" + dumps(COMPLETION_IDS).encode())
    write(t, "completion-logprobs", b"\x00" + dumps(COMPLETION_LOGPROBS).encode())
    schema = {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer",
                                                                      "minimum": -5}}}},
              "type": "object", "properties": {
                  "a": {"$ref": "#/$defs/p"}, "b": {"type": "array", "items": {"enum": [1, "z"]},
                                                   "maxItems": 3},
                  "c": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]}},
              "required": ["a"]}
    write(t, "chat-json-schema", b"\x01" + dumps(
        {"messages": [{"role": "user", "content": "x"}], "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": schema,
                                                   "strict": True}}}).encode())
    write(t, "completion-guided-json-text", b"\x00" + dumps(
        {"prompt": "x", "guided_json": json.dumps(schema),
         "guided_whitespace_pattern": "[ \n]{0,2}"}).encode())
    write(t, "chat-json-object", b"\x01" + dumps(
        {"messages": [{"role": "user", "content": "x"}],
         "structured_outputs": {"json_object": True}}).encode())
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "w",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}},
             {"type": "function", "function": {"name": "noop"}}]
    write(t, "chat-tools-required", b"\x01" + dumps(
        {"messages": [{"role": "user", "content": "x"}], "tools": tools,
         "tool_choice": "required", "parallel_tool_calls": False}).encode())
    write(t, "chat-tools-named-history", b"\x01" + dumps(
        {"messages": [{"role": "user", "content": "x"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "call_1", "type": "function", "function": {
                              "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
         "tools": tools,
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}).encode())
    write(t, "completion-guided-grammar", b"\x00" + dumps(
        {"prompt": "x", "guided_grammar":
         'root ::= expr\nexpr ::= term (("+" | "-") term)*\n'
         'term ::= [1-9] [0-9]{0,2} | "(" expr ")"  # nested\n'}).encode())
    # Slightly broken.
    write(t, "broken-trailing-comma", b"\x01" + b'{"messages": [{"role": "user", "content": "x"},]}')
    write(t, "broken-unknown-role", b"\x01" + dumps(
        {"messages": [{"role": "wizard", "content": "x"}]}).encode())
    write(t, "broken-tools", b"\x01" + dumps(
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}).encode())
    write(t, "broken-ranges", b"\x00" + b'{"prompt": "x", "n": 0, "max_tokens": 1e400, '
          b'"temperature": -1, "stop_token_ids": [-3], "seed": 18446744073709551615}')
    write(t, "broken-prompt-too-long", b"\x00" + dumps({"prompt": "word " * 1500}).encode())


def http_request(method, target, headers, body=b"", version="HTTP/1.1"):
    lines = [f"{method} {target} {version}"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def http_seeds():
    t = "http_request"
    chat = dumps(CHAT).encode()
    write(t, "chat-localhost", b"\x00" + http_request(
        "POST", "/v1/chat/completions",
        [("Host", "localhost:8000"), ("Content-Type", "application/json"),
         ("Content-Length", str(len(chat)))], chat))
    comp = dumps(COMPLETION).encode()
    write(t, "completion-api-key-cors", b"\x01" + http_request(
        "POST", "/v1/completions?x=1",
        [("Host", "127.0.0.1:8000"), ("Authorization", "Bearer sk-test-key"),
         ("Origin", "https://app.example"), ("Content-Type", "application/json; charset=utf-8"),
         ("Content-Length", str(len(comp)))], comp))
    write(t, "preflight", b"\x01" + http_request(
        "OPTIONS", "/v1/chat/completions",
        [("Host", "localhost"), ("Origin", "https://app.example"),
         ("Access-Control-Request-Method", "POST"),
         ("Access-Control-Request-Headers", "authorization, content-type")]))
    write(t, "models-allowed-host", b"\x02" + http_request(
        "GET", "/v1/models", [("Host", "router.internal"), ("Authorization", "Bearer k")]))
    stream = dumps(CHAT_STREAM).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(stream), stream)
    write(t, "chunked-any-origin", b"\x03" + http_request(
        "POST", "/v1/chat/completions",
        [("Host", "10.1.2.3"), ("Origin", "null"), ("Content-Type", "application/json"),
         ("Transfer-Encoding", "chunked")], chunked))
    write(t, "expect-continue-http10", b"\x00" + http_request(
        "POST", "/v1/completions",
        [("Host", "[::1]:8000"), ("Content-Type", "application/json"), ("Expect", "100-continue"),
         ("Content-Length", str(len(comp)))], comp, version="HTTP/1.0"))
    write(t, "health-metrics", b"\x00" + http_request("GET", "/health", [("Host", "localhost")]))
    # Slightly broken.
    write(t, "broken-short-body", b"\x00" + http_request(
        "POST", "/v1/chat/completions",
        [("Host", "localhost"), ("Content-Type", "application/json"), ("Content-Length", "999")],
        chat))
    write(t, "broken-header-line", b"\x00" + b"POST /v1/completions HTTP/1.1\r\nHost localhost\r\n\r\n")
    write(t, "broken-dns-rebinding", b"\x00" + http_request(
        "POST", "/v1/completions",
        [("Host", "127.0.0.1.evil.example"), ("Content-Type", "text/plain"),
         ("Content-Length", str(len(comp)))], comp))


# ---- tokenizer_json and tokenizer_encode ----

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def added(i, content, special=True, **kw):
    a = {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": not special, "special": special}
    a.update(kw)
    return a


def tokenizer_seeds():
    t = "tokenizer_json"
    with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
        bundled = json.load(f)
    # The bundled tokenizer cut down to 300 ids and the merges among them (same components).
    small = json.loads(json.dumps(bundled))
    vocab = {k: v for k, v in bundled["model"]["vocab"].items() if v < 300}
    small["model"]["vocab"] = vocab
    merges = []
    for m in bundled["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    small["model"]["merges"] = merges
    write(t, "bundled-small", dumps(small))

    b2u = bytes_to_unicode()
    byte_vocab = {b2u[b]: b for b in range(256)}
    byte_vocab.update({"\u0120t": 256, "he": 257, "\u0120the": 258, "in": 259})
    byte_level = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(260, "<|begin_of_text|>"), added(261, "<|eot_id|>"),
                         added(262, " magic", special=False, single_word=True, lstrip=True)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}"
                                          "\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [],
                           "special_tokens": {"<|begin_of_text|>": {
                               "id": "<|begin_of_text|>", "ids": [260],
                               "tokens": ["<|begin_of_text|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": byte_vocab, "merges": [["\u0120", "t"], ["h", "e"], ["\u0120t", "he"],
                                                  "i n"]}}
    write(t, "llama3-style-byte-level", dumps(byte_level))

    sp_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "\u2581": 3, "a": 4, "b": 5, "c": 6, "ab": 7,
                "bc": 8, "\u2581ab": 9}
    for b in range(256):
        sp_vocab["<0x%02X>" % b] = 10 + b
    sentencepiece = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1],
                                                                  "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "vocab": sp_vocab,
                  "merges": ["a b", "b c", "\u2581 ab"]}}
    write(t, "llama2-style-sentencepiece", dumps(sentencepiece))

    metaspace = json.loads(json.dumps(sentencepiece))
    metaspace["normalizer"] = {"type": "NFC"}
    metaspace["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                                  "prepend_scheme": "first", "split": True}
    metaspace["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"}
    write(t, "metaspace-nfc", dumps(metaspace))
    # Slightly broken.
    write(t, "broken-truncated", dumps(byte_level)[:700])
    broken = json.loads(json.dumps(sentencepiece))
    broken["model"]["type"] = "Unigram"
    write(t, "broken-unigram", dumps(broken))
    broken = json.loads(json.dumps(sentencepiece))
    broken["added_tokens"].append(added(-4, "<bad>"))
    write(t, "broken-negative-id", dumps(broken))
    broken = json.loads(json.dumps(byte_level))
    broken["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": "(\\p{L}+"}
    write(t, "broken-regex", dumps(broken))
    # Regressions: ids were read with get<int32_t> (undefined for this float) and sized the id
    # table (2^31 entries for the largest int32); a post-processor id outside the vocabulary.
    broken = json.loads(json.dumps(byte_level))
    broken["model"]["vocab"]["\u0120x"] = 6.33333e+120
    write(t, "regression-float-token-id", dumps(broken))
    broken = json.loads(json.dumps(byte_level))
    broken["added_tokens"].append(added(2147483647, "<|big|>"))
    write(t, "regression-huge-token-id", dumps(broken))
    broken = json.loads(json.dumps(byte_level))
    broken["post_processor"]["special_tokens"]["<|begin_of_text|>"]["ids"] = [99999]
    write(t, "regression-post-processor-id-outside-vocab", dumps(broken))

    e = "tokenizer_encode"
    write(e, "text-plain", b"\x00Hello, world! It's a test of 123 numbers.")
    write(e, "text-special-tokens", b"\x02<|im_start|>user\nhi there<|im_end|>\n<|endoftext|>")
    write(e, "text-unicode", "\x00h\u00e9llo \u4e16\u754c \U0001F642\u200d \t\r\n  ")
    write(e, "text-invalid-utf8", b"\x00ok \xff\xfe \xc3( \xed\xa0\x80 \xf4\x90\x80\x80 end")
    write(e, "ids-some", b"\x01" + struct.pack("<8H", 0, 1, 17, 300, 2, 8191, 255, 40000))
    write(e, "ids-skip-special", b"\x03" + struct.pack("<6H", 1, 500, 2, 0, 65535, 3))


# ---- chat_template ----

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
          "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
          "{% endif %}")
QWEN = ("{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for tool in tools %}{{- \"\\n\" }}"
        "{{- tool | tojson }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- else %}"
        "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
        "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are "
        "Qwen.<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- for message in messages %}"
        "{%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
        "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role + '\\n' + "
        "message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
FEATURES = ("{# every construct #}{% set ns = namespace(n=0, last='') %}"
            "{%- for m in messages if true -%}{%- endfor -%}"
            "{%- for i, m in messages | list | reverse | default([]) | items -%}{%- endfor %}"
            "{% for m in messages %}{% set ns.n = ns.n + loop.index * 2 ** 3 // 3 % 5 %}"
            "{{ loop.revindex0 }}{{ m.content[1:-1:2] | upper | replace('A', 'b') }}"
            "{{ m['role'] is string and m.role in ['user', 'assistant'] }}"
            "{{ (m.content ~ '!') if loop.last else m.content.split(' ')[0] }}"
            "{{ m.content | length }}{{ range(3) | join(',') }}{{ {'a': 1}.get('a') }}"
            "{{ m.content.startswith('H') }}{{ m.content | tojson(indent=2) }}{% else %}none"
            "{% endfor %}{{ ns.n | string | int + 1.5 }}{{ strftime_now('%Y') | length }}"
            "{% if messages | selectattr is undefined %}{% endif %}")
RAISE = ("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
         "{{ m.content }}{% endfor %}")


def chat_template_seeds():
    t = "chat_template"

    def seed(flags, template, messages):
        fields = ([] if template is None else [template]) + \
            [x for m in messages for x in m]
        return bytes([flags]) + "\0".join(fields).encode()

    conv = [("system", "You are helpful."), ("user", "Hello!"), ("assistant", "Hi, how can I help?"),
            ("user", "Tell me a joke.")]
    write(t, "bundled-conversation", seed(3, None, conv))
    write(t, "bundled-unicode-specials", seed(2, None, [("user", "<|im_end|>\u4e16\U0001F642"),
                                                        ("", "")]))
    write(t, "llama3", seed(1, LLAMA3, conv))
    write(t, "qwen-tools", seed(17, QWEN, conv))
    write(t, "features", seed(1, FEATURES, conv))
    write(t, "features-no-trim", seed(4 | 8, FEATURES + "\n", conv[:2]))
    write(t, "raise-exception", seed(0, RAISE, [("user", "a"), ("user", "b")]))
    # Slightly broken.
    write(t, "broken-unterminated", seed(1, "{% for m in messages %}{{ m.content }", conv))
    write(t, "broken-unsupported", seed(1, "{% macro f() %}x{% endmacro %}{{ f() }}", conv))
    write(t, "broken-undefined", seed(1, "{{ messages[0].nope.deeper }}{{ 1 + none }}", conv))


# ---- safetensors and model_config ----

def safetensors_file(tensors, metadata=True, pad=True):
    header = {"__metadata__": {"format": "pt"}} if metadata else {}
    data = b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    t = "safetensors"
    tensors = {"model.embed_tokens.weight": ("BF16", [4, 2], struct.pack("<8H", *range(0x3f80, 0x3f88))),
               "model.norm.weight": ("F32", [2], struct.pack("<2f", 1.0, -2.5)),
               "lm_head.weight": ("F16", [2, 2], struct.pack("<4H", 0x3c00, 0x7c00, 0xfc00, 0x7e00)),
               "scalar": ("F32", [], struct.pack("<f", 3.0)),
               "empty": ("BF16", [0, 5], b"")}
    good = safetensors_file(tensors)
    write(t, "single-mixed-dtypes", b"\x00" + good)
    write(t, "single-no-metadata", b"\x00" + safetensors_file(
        {"w": ("F32", [1, 3], struct.pack("<3f", 0.5, 0.25, 0.125))}, metadata=False, pad=False))
    index = json.dumps({"metadata": {"total_size": 12},
                        "weight_map": {"w": "a.safetensors", "b": "a.safetensors"}}).encode()
    shard = safetensors_file({"w": ("F32", [3], struct.pack("<3f", 1, 2, 3)),
                              "b": ("BF16", [1], struct.pack("<H", 0x3f80))})
    write(t, "sharded-index", b"\x01" + struct.pack("<H", len(index)) + index + shard)
    # Slightly broken.
    write(t, "broken-truncated-data", b"\x00" + good[:-3])
    write(t, "broken-header-length", b"\x00" + struct.pack("<Q", 1 << 40) + good[8:])
    write(t, "broken-offsets", b"\x00" + safetensors_file(
        {"w": ("F32", [2], struct.pack("<2f", 1, 2))})[:-8] + struct.pack("<2f", 1, 2))
    bad = json.dumps({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    write(t, "broken-dtype", b"\x00" + struct.pack("<Q", len(bad)) + bad + b"\0" * 8)
    bad = json.dumps({"w": {"dtype": "F32", "shape": [0, 18446744073709551615],
                            "data_offsets": [0, 0]}}).encode()
    # Regression: a dimension above 2^63 - 1 after a zero one was accepted (as a negative dim).
    write(t, "regression-zero-then-huge-dimension", b"\x00" + struct.pack("<Q", len(bad)) + bad)
    # Regression: ToFloat32 of an F32 tensor of no elements passed the empty vector's null data()
    # to memcpy.
    write(t, "regression-empty-f32-tensor", b"\x00" + safetensors_file(
        {"w": ("F32", [0, 65014951], b"")}, metadata=False, pad=False))
    index = json.dumps({"weight_map": {"w": "../etc/passwd", "x": "missing.safetensors"}}).encode()
    write(t, "broken-index-shards", b"\x01" + struct.pack("<H", len(index)) + index + shard)

    c = "model_config"
    with open(os.path.join(MODEL, "config.json"), "rb") as f:
        write(c, "bundled-config", b"\x00" + f.read())
    llama31 = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
               "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
               "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                                                        "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 8192,
                                                        "rope_type": "llama3"},
               "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
               "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    write(c, "llama31-rope-scaling", b"\x00" + json.dumps(llama31).encode())
    qwen = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "rope_theta": 1000000.0, "rope_scaling": None,
            "eos_token_id": 151645, "tie_word_embeddings": True}
    write(c, "qwen2", b"\x00" + json.dumps(qwen).encode())
    broken = dict(llama31, head_dim=127, num_key_value_heads=5)
    write(c, "broken-heads", b"\x00" + json.dumps(broken).encode())
    write(c, "broken-numbers", b"\x00" + b'{"architectures": ["LlamaForCausalLM"], "vocab_size": '
          b'4294967296, "hidden_size": 64.5, "intermediate_size": -1, "num_hidden_layers": 1e999, '
          b'"num_attention_heads": 2, "rope_theta": 1e300, "eos_token_id": [1, "2"]}')
    with open(os.path.join(MODEL, "tokenizer_config.json"), "rb") as f:
        write(c, "bundled-tokenizer-config", b"\x01" + f.read())
    named = {"bos_token": {"content": "<s>", "lstrip": False}, "eos_token": None,
             "chat_template": [{"name": "tool_use", "template": "{{ tools }}"},
                               {"name": "default", "template": LLAMA3}]}
    write(c, "tokenizer-config-named-templates", b"\x01" + json.dumps(named).encode())
    write(c, "broken-tokenizer-config", b"\x01" + json.dumps(
        {"bos_token": 7, "chat_template": [{"name": "other", "template": "x"}]}).encode())


# ---- worker_proto ----

def protoc_encode(message, text):
    proto_dir = os.path.join(ROOT, "proto")
    files = ["tandem/v1/common.proto", "tandem/v1/kv.proto", "tandem/v1/prefill.proto",
             "tandem/v1/decode.proto", "tandem/v1/worker.proto", "tandem/v1/mlp.proto"]
    return subprocess.run(["protoc", "-I", proto_dir, "--encode=tandem.v1." + message] + files,
                          input=text.encode(), stdout=subprocess.PIPE, check=True).stdout


CPU_LAYOUT = ("num_layers: 8 num_blocks: 512 block_size: 16 num_kv_heads: 4 head_dim: 64 "
              "elem_bytes: 4 block_bytes: 16384 layer_stride: 16777216 kv_stride: 8388608 "
              "block_stride: 16384 dtype: KV_DTYPE_F32 total_kv_heads: 4")
BF16_LAYOUT = ("num_layers: 8 num_blocks: 128 block_size: 32 num_kv_heads: 2 head_dim: 64 "
               "elem_bytes: 2 block_bytes: 8192 layer_stride: 2097152 kv_stride: 1048576 "
               "block_stride: 8192 dtype: KV_DTYPE_BF16 head_begin: 2 total_kv_heads: 4")
COMPAT = ("layout_version: 1 num_layers: 8 num_kv_heads: 4 head_dim: 64 vocab_size: 8192 "
          "rope_theta: 10000 hidden_size: 512")
SAMPLING = ('temperature: 0.8 top_k: 50 top_p: 0.95 min_p: 0.01 has_seed: true seed: 7 '
            'repetition_penalty: 1.05 max_tokens: 64 stop_token_ids: 2 stop: "\\n\\n" logprobs: 2')
BOOT = "0f4d0e5c-8b43-4a4e-9d2b-6f1a2b3c4d5e"
HEX32 = "00112233445566778899aabbccddeeff"
CUDA_IPC_ADDR = f"cuda_ipc/1;boot={BOOT};pid=4242;gpu={HEX32}"
CUDA_IPC_REGION = f"cuda_ipc/1;handle={'ab' * 64};offset=4096;length=8388608;gpu={HEX32}"
CMA_ADDR = f"cma/1;boot={BOOT};pid=4242;start=123456;nonce_at=140737488355328;nonce={HEX32};end"
CMA_REGION = "cma/1;region=3;base=140000000000;length=134217728;end"
NCCL_ADDR = f"nccl/1;boot={BOOT};host=decode-0;gpu={HEX32};token={HEX32};staging=268435456"
NCCL_REPLY = f"nccl/1;id={'cd' * 128};secret={HEX32};token={HEX32}"
NCCL_REGION = f"nccl/1;token={HEX32};region=1;length=134217728"


def worker_proto_seeds():
    t = "worker_proto"

    def seed(selector, name, message, text):
        write(t, name, bytes([selector]) + protoc_encode(message, text))

    seed(0, "prefill-paired", "PrefillRequest",
         f'request_id: "r1" prompt_token_ids: [0, 17, 300, 12] sampling {{ {SAMPLING} }} '
         f'target {{ block_ids: [5, 9] num_cached_tokens: 0 }} pair_id: "p-1" transfer_epoch: 3 '
         f'want_kv_checksum: true')
    seed(0, "prefill-layout-convert", "PrefillRequest",
         'request_id: "r2" prompt_token_ids: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, '
         '16, 17, 18, 19, 20] sampling { temperature: 0 logprobs: -1 } '
         f'target {{ layout {{ {BF16_LAYOUT} }} block_ids: [0, 127] num_cached_tokens: 16 }} '
         'pair_id: "p-2" transfer_epoch: 1')
    seed(0, "prefill-same-format", "PrefillRequest",
         'request_id: "r3" prompt_token_ids: [5, 6, 7] sampling { logprobs: -1 } '
         f'target {{ layout {{ {CPU_LAYOUT} }} block_ids: [511] }} pair_id: "p" transfer_epoch: 9')
    seed(1, "connect-endpoints", "ConnectRequest",
         f'decode_worker: "decode-0" compatibility {{ {COMPAT} }} '
         f'endpoints {{ backend: "cuda_ipc" agent_name: "d0" agent_address: "{CUDA_IPC_ADDR}" '
         f'region: "{CUDA_IPC_REGION}" layout {{ {BF16_LAYOUT} }} }} '
         f'endpoints {{ backend: "cma" agent_name: "d0" agent_address: "{CMA_ADDR}" '
         f'region: "{CMA_REGION}" layout {{ {CPU_LAYOUT} }} }} '
         f'endpoints {{ backend: "nccl" agent_name: "d0" agent_address: "{NCCL_ADDR}" '
         f'region: "{NCCL_REGION}" layout {{ {CPU_LAYOUT} }} }} '
         f'endpoints {{ backend: "ucx" agent_name: "d0" agent_address: "\\001\\002" }}')
    seed(1, "connect-incompatible", "ConnectRequest",
         'decode_worker: "d" compatibility { layout_version: 1 num_layers: 32 } '
         'endpoints { backend: "loopback" }')
    seed(2, "fence", "FenceRequest", 'pair_id: "p-1" transfer_epoch: 3')
    seed(3, "generate", "GenerateRequest",
         f'request_id: "g1" prompt_token_ids: [0, 1, 2, 8191] sampling {{ {SAMPLING} }} '
         f'prefill_worker: "127.0.0.1:50051"')
    seed(3, "generate-bad-sampling", "GenerateRequest",
         'request_id: "g2" prompt_token_ids: [9000, -1] sampling { temperature: -1 top_p: 2 '
         'stop_token_ids: 8192 logprobs: 50 max_tokens: -5 }')
    seed(4, "cancel", "CancelRequest", 'request_id: "g1"')
    seed(5, "stats", "StatsRequest", "interval_ms: 200")
    seed(6, "connect-response-nccl", "ConnectResponse",
         f'pair_id: "p-1" backend: "nccl" fallbacks: "cuda_ipc: not here" '
         f'connect_reply: "{NCCL_REPLY}" agent_name: "p0"')
    seed(7, "prefill-response", "PrefillResponse",
         'first_token_id: 17 first_token_logprobs { token_id: 17 logprob: -0.5 top { token_id: 17 '
         'logprob: -0.5 } top { token_id: 3 logprob: -1.5 } } kv_bytes_written: 1048576 '
         'prefix_cached_tokens: 16 kv_checksum: 12345')
    seed(8, "generate-response", "GenerateResponse",
         'token_ids: [5, 6] logprobs { token_id: 5 logprob: -0.1 } logprobs { token_id: 6 } '
         'text: "hi" finish_reason: "length" usage { prompt_tokens: 4 completion_tokens: 2 }')
    seed(9, "worker-stats", "WorkerStats",
         'role: "decode" model: "target" queue_depth: 1 kv_blocks_total: 512 block_size: 16')
    seed(10, "admit", "AdmitRequest",
         'pair_id: "p-1" request_id: "r1" num_prompt_tokens: 75 priority: 0')
    seed(10, "admit-longer-than-window", "AdmitRequest",
         'pair_id: "p-1" request_id: "r-long" num_prompt_tokens: 1000 priority: -3')
    seed(11, "admit-response", "AdmitResponse",
         f'ticket: "{HEX32}" queue_us: 1200 ticket_lease_ms: 30000')
    seed(0, "prefill-with-ticket", "PrefillRequest",
         f'request_id: "r1" prompt_token_ids: [0, 17, 300, 12] sampling {{ {SAMPLING} }} '
         f'target {{ block_ids: [5, 9] num_cached_tokens: 0 }} pair_id: "p-1" transfer_epoch: 3 '
         f'admission_ticket: "{HEX32}" priority: 1')
    # An MLP shard's Compute (the fuzzer's shard: layers 1:3, hidden 8) and a shard's Info.
    seed(12, "mlp-compute", "MlpComputeRequest",
         'layer: 1 rows: 2 activations: "' + "\\000\\000\\200?" * 16 + '"')
    seed(12, "mlp-compute-short", "MlpComputeRequest",
         'layer: 2 rows: 2 activations: "' + "\\000" * 60 + '"')
    # The host data plane: a call naming a session and slot, with no activations.
    seed(12, "mlp-compute-session", "MlpComputeRequest",
         'layer: 1 rows: 3 session: 12345678901 slot: 2')
    seed(13, "mlp-info", "MlpInfo",
         'model_fingerprint: "0123456789abcdef" first_layer: 0 end_layer: 4 hidden_size: 512 '
         'intermediate_size: 1280 max_rows: 8192')
    # The GPU data plane's Attach, both ways (the fuzzer's shard takes 4096 rows a call; the
    # worker asked for 256).
    seed(14, "mlp-attach", "MlpAttachRequest",
         f'max_rows: 256 gpu_uuid: "{HEX32}" boot_id: "{BOOT}"')
    handle = "\\001" * 64
    # The host data plane's AttachHost, both ways (selectors 14 and 15 parse both messages).
    seed(14, "mlp-host-attach", "MlpHostAttachRequest",
         'backend: "cma" agent: "mlp-worker-42-1" address: "\\001\\002\\003" '
         'input_region: "\\004\\005" slots: 4 slot_rows: 256')
    seed(15, "mlp-host-attach-response", "MlpHostAttachResponse",
         'session: 987654321 agent: "cma@mlp-shard-7" address: "\\001\\002" '
         'output_region: "\\003\\004"')
    seed(15, "mlp-attach-response", "MlpAttachResponse",
         f'input_memory: "{handle}" output_memory: "{handle}" flags: "{handle}" '
         f'doorbell: "/tandem-mlp-{HEX32}" max_rows: 256')
    # Slightly broken: a truncated message.
    write(t, "broken-truncated-prefill", bytes([0]) + protoc_encode(
        "PrefillRequest", f'request_id: "r1" target {{ layout {{ {CPU_LAYOUT} }} }}')[:-5])


# ---- transfer_wire and nccl_target ----

NCCL_HEADER_MAGIC = 0x484E564B
SECRET = b"tandem-fuzz-sec!"


def nccl_header(sequence, region, ops, notification, secret=SECRET, data_bytes=None):
    data = sum(length for _, length in ops) if data_bytes is None else data_bytes
    return struct.pack("<IHHQ16sQQQII", NCCL_HEADER_MAGIC, 1, 0, sequence, secret, region,
                       len(ops), data, len(notification), 0)


def nccl_control(ops, notification):
    return b"".join(struct.pack("<QQ", off, length) for off, length in ops) + notification


def transfer_seeds():
    t = "transfer_wire"
    blobs = [
        (0, "cuda-ipc-address", CUDA_IPC_ADDR), (1, "cuda-ipc-region", CUDA_IPC_REGION),
        (2, "cma-address", CMA_ADDR), (3, "cma-region", CMA_REGION),
        (4, "cma-stat", "4242 (tandem (w) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 9 "
                        "0 123456 1000 200 18446744073709551615"),
        (5, "nccl-address", NCCL_ADDR), (6, "nccl-connect-reply", NCCL_REPLY),
        (7, "nccl-region", NCCL_REGION),
    ]
    for selector, name, blob in blobs:
        write(t, name, bytes([selector]) + blob.encode())
    write(t, "nccl-header", bytes([8]) + nccl_header(1, 1, [(0, 64)], b"done"))
    write(t, "nccl-ack", bytes([9]) + struct.pack("<IHHQ16s", 0x414E564B, 1, 0, 1, SECRET))
    ops = [(0, 64), (128, 32)]
    write(t, "nccl-control", bytes([10]) + struct.pack("<IH", len(ops), 4) + nccl_control(ops, b"done"))
    # Slightly broken.
    write(t, "broken-cma-truncated", bytes([2]) + CMA_ADDR[:-4].encode())
    write(t, "broken-cuda-ipc-overflow", bytes([1]) + (
        f"cuda_ipc/1;handle={'ab' * 64};offset=18446744073709551615;length=2;gpu={HEX32}").encode())
    write(t, "broken-nccl-repeated-field", bytes([7]) + (NCCL_REGION + ";region=2").encode())

    n = "nccl_target"
    one = [(0, 64), (128, 32)]
    msg1 = nccl_header(1, 1, one, b"done") + nccl_control(one, b"done")
    msg2 = nccl_header(2, 2, [(8000, 192)], b"") + nccl_control([(8000, 192)], b"")
    write(n, "one-message", msg1)
    write(n, "two-messages", msg1 + msg2)
    write(n, "empty-message", nccl_header(1, 3, [], b"x") + b"x")
    write(n, "zero-length-op", nccl_header(1, 3, [(0, 0), (0, 1)], b"") +
          nccl_control([(0, 0), (0, 1)], b""))
    # Slightly broken.
    write(n, "broken-op-outside-region", nccl_header(1, 1, [(4090, 64)], b"") +
          nccl_control([(4090, 64)], b""))
    write(n, "broken-wrong-secret", nccl_header(1, 1, one, b"", secret=b"x" * 16) +
          nccl_control(one, b""))
    write(n, "broken-sum-mismatch", nccl_header(1, 1, one, b"", data_bytes=100) +
          nccl_control(one, b""))
    write(n, "broken-sequence", msg1 + nccl_header(5, 1, one, b"") + nccl_control(one, b""))
    write(n, "broken-body-missing", nccl_header(1, 1, one, b"done"))


# ---- kv_layout (FuzzedDataProvider input) ----

class FdpEncoder:
    """Builds an input that libFuzzer's FuzzedDataProvider reads back as the given values.

    ConsumeIntegralInRange takes bytes from the end of the data, most significant first; the
    encoder records them in consumption order and reverses them at the end.
    """

    def __init__(self):
        self.tail = []

    def integral(self, value, lo, hi):
        span = hi - lo
        x = value - lo
        assert 0 <= x <= span
        nbytes = 0
        while nbytes < 8 and (span >> (8 * nbytes)) > 0:
            nbytes += 1
        for i in reversed(range(nbytes)):
            self.tail.append((x >> (8 * i)) & 0xFF)

    def u8(self, v):
        self.integral(v, 0, 255)

    def i32(self, v, lo=-(1 << 31), hi=(1 << 31) - 1):
        self.integral(v, lo, hi)

    def u64(self, v, lo=0, hi=(1 << 64) - 1):
        self.integral(v, lo, hi)

    def boolean(self, v):
        self.u8(1 if v else 0)

    def bytes(self):
        return bytes(reversed(self.tail))


def kv_layout_seeds():
    t = "kv_layout"
    size_t_max = (1 << 64) - 1

    def dense(e, kind, layers, blocks, block_size, head_dim, total, head_begin, heads, raw_elem=None,
              like=False):
        e.u8(kind)
        if not (like and (kind & 4) == 0):
            e.i32(layers, 1, 8)
        e.i32(blocks, 1, 64)
        e.i32(block_size, 1, 32)
        if not (like and (kind & 8) == 0):
            e.i32(head_dim, 1, 16)
        if not (like and (kind & 16) == 0):
            e.i32(total, 0, 8)
        t_ = max(total, 1)
        e.i32(head_begin, 0, t_ - 1)
        e.i32(heads, 1, t_ - head_begin)
        if ((kind >> 5) & 3) >= 2:
            e.i32(raw_elem, 1, 4)

    def ids(e, values, raw=False, nblocks=64):
        e.integral(len(values), 0, 96)
        e.boolean(raw)
        for v in values:
            if raw:
                e.i32(v)
            else:
                e.i32(v, 0, nblocks - 1)

    def tail(e, num_tokens, skip, lb, le, max_bytes=1 << 20, max_ops=64, raw_counts=False):
        if raw_counts:
            e.i32(num_tokens, -4, 8192)
            e.i32(skip, -4, 8196)
        else:
            e.i32(num_tokens, 0, 2048)
            e.i32(skip, 0, max(num_tokens, 0))
        e.i32(lb, -1, 9)
        e.i32(le, -1, 9)
        e.u64(max_bytes, 1, 1 << 20)
        e.u64(max_ops, 1, 64)

    # Same format, f32, whole model.
    e = FdpEncoder()
    e.u8(1 | 4)
    dense(e, 0, 4, 16, 16, 8, 4, 0, 4)
    dense(e, 0, 0, 32, 16, 0, 4, 0, 4, like=True)
    ids(e, [3, 4, 5], nblocks=16)
    ids(e, [10, 11, 30], nblocks=32)
    tail(e, 40, 16, 0, 4)
    write(t, "same-format-f32", e.bytes())
    # f32 -> bf16 with another block size, tensor-parallel head range.
    e = FdpEncoder()
    e.u8(1)
    dense(e, 0, 2, 8, 16, 4, 4, 0, 4)
    dense(e, 1 << 5 | 16, 0, 16, 8, 0, 4, 2, 2, like=True)
    ids(e, [0, 1, 2], nblocks=8)
    ids(e, [7, 3, 9, 1, 5], nblocks=16)
    tail(e, 37, 8, 0, 2, max_bytes=256, max_ops=3)
    write(t, "convert-f32-bf16-tp", e.bytes())
    # Odd strides (kind bit 7) on the destination.
    e = FdpEncoder()
    e.u8(1 | 4)
    dense(e, 1 << 5, 2, 4, 4, 2, 2, 0, 2)
    dense(e, 128 | 1 << 5, 0, 4, 4, 0, 2, 0, 2, like=True)
    e.boolean(False)
    e.u64(16 + 8, 0, 64)
    e.boolean(True)
    e.u64(4096)
    e.boolean(False)
    ids(e, [0, 1], nblocks=4)
    ids(e, [3, 2], nblocks=4)
    tail(e, 8, 0, 0, 2)
    write(t, "odd-strides", e.bytes())
    # Slightly broken: raw layouts with huge strides, raw ids and counts.
    e = FdpEncoder()
    e.u8(2)
    e.u8(3)
    for v, lo, hi in [(2, -1, 64), (4, None, None), (16, None, None), (4, None, None),
                      (8, None, None), (4, None, None)]:
        if lo is None:
            e.i32(v)
        else:
            e.i32(v, lo, hi)
    e.u64(16 * 4 * 8 * 4)
    e.u64(1 << 63)
    e.u64(1 << 62)
    e.u64(size_t_max // 3)
    e.i32(1, -1, 3)
    e.i32(0)
    e.i32(0)
    dense(e, 0, 0, 4, 16, 0, 4, 0, 4, like=True)
    ids(e, [3, -1], raw=True)
    ids(e, [0, 2], nblocks=4)
    tail(e, 20, -2, 0, 2, raw_counts=True)
    write(t, "broken-raw-huge-strides", e.bytes())
    # Regression (ValidateKvLayout accepted both): offsets past 2^64, and a block_bytes product
    # (2^30 * 2^30 * 16 * 1) that wraps to 0. Source and destination alike, same format.
    for name, dims, strides in [
            ("regression-layout-extent-wraps", (2, 4, 16, 4, 8, 4, 2048),
             (1 << 63, 1 << 62, size_t_max // 3)),
            ("regression-layout-block-bytes-wraps", (1, 1, 1 << 30, 1 << 30, 16, 1, 0), (0, 0, 0))]:
        e = FdpEncoder()
        e.u8(4)
        for side in range(2):
            e.u8(3)
            layers, blocks, block_size, heads, head_dim, elem, block_bytes = dims
            e.i32(layers, -1, 64) if side == 0 else e.i32(layers)
            for v in (blocks, block_size, heads, head_dim, elem):
                e.i32(v)
            e.u64(block_bytes)
            for v in strides:
                e.u64(v)
            e.i32(0, -1, 3)  # raw dtype
            e.i32(0)
            e.i32(0)
        ids(e, [0], nblocks=1)
        ids(e, [0], nblocks=1)
        tail(e, 1, 0, 0, 1)
        write(t, name, e.bytes())


def tool_call_parser_seeds():
    t = "tool_call_parser"
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    write(t, "hermes-two-calls", b"\x00\x03\x07\x01\x00" +
          ("Checking.\n" + call + "\n" + call.replace("get_weather", "noop")).encode())
    write(t, "hermes-broken", b"\x04\x05\x00" + b'text <tool_call>{"name": "noop", "argu')
    write(t, "llama-calls", b"\x01\x02\x00" +
          b'<|python_tag|>{"name": "get_weather", "parameters": {"city": "Lima"}}; '
          b'{"name": "noop", "parameters": {}}')
    write(t, "llama-text", b"\x01\x00" + "Plain answer, {not a call}. é".encode())
    write(t, "required-list", b"\x02\x09\x00" +
          b'[{"name": "noop", "parameters": {"s": "}]"}}, {"name": "get_weather", '
          b'"parameters": {"city": "Rome"}}]')
    write(t, "named-args", b"\x03\x04\x00" + b'{"city": "Oslo"}')


def gbnf_seeds():
    t = "gbnf"
    write(t, "answer", 'root ::= answer " " [1-9] [0-9]{0,2}\nanswer ::= "yes" | "no"\n')
    write(t, "expr-recursive", 'root ::= expr\nexpr ::= term (("+" | "-") term)*\n'
          'term ::= [0-9]+ | "(" expr ")"\n')
    write(t, "json", 'root ::= value\nvalue ::= object | array | string | "null"\n'
          'object ::=\n  "{" ( string ":" value ("," string ":" value)* )? "}"\n'
          'array ::= "[" ( value ("," value)* )? "]"\n'
          'string ::= "\\"" ( [^"\\\\] | "\\\\" ["nt] )* "\\""  # escapes\n')
    write(t, "classes-utf8", "root ::= [αβa-c]+ '\\u00e9' . [^x]{2,}\n")
    write(t, "broken-undefined", "root ::= missing\n")
    write(t, "broken-never-finishes", 'root ::= "(" root ")"\n')


def main():
    openai_seeds()
    gbnf_seeds()
    tool_call_parser_seeds()
    http_seeds()
    tokenizer_seeds()
    chat_template_seeds()
    safetensors_seeds()
    worker_proto_seeds()
    transfer_seeds()
    kv_layout_seeds()
    for target in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, target))
        size = sum(os.path.getsize(os.path.join(CORPUS, target, f)) for f in files)
        print(f"{target}: {len(files)} seeds, {size} bytes")


if __name__ == "__main__":
    sys.exit(main())

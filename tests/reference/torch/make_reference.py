#!/usr/bin/python3
"""Independent PyTorch reference for Tandem's model forward pass.

Writes small random Hugging Face model directories (config.json, model.safetensors written by
hand, a byte-level tokenizer.json) and, for each, greedy continuations of several prompts with
the last-position logits of every step, computed by a plain, non-paged, full-recompute
implementation of the HF Llama / Qwen2 modeling code (rotate_half RoPE, llama3 rope scaling,
repeat_kv GQA, q/k/v biases for Qwen2, tied embeddings). Nothing here reads Tandem's code.

Usage: /usr/bin/python3 make_reference.py --out DIR
Result: DIR/<model>/{config.json, model.safetensors, tokenizer.json, reference.json}; each
prompt's reference also holds the log-softmax over the vocabulary at each prompt position but
the last (for prompt logprobs).
"""

import argparse
import json
import math
import os
import struct

import torch

STEPS = 32

MODELS = {
    # Llama 3.x style: tied embeddings, GQA (4 query heads per 2 KV heads), llama3 rope scaling
    # with an original context of 64 so that high, medium and low frequencies all occur.
    "llama_tied_gqa": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "seed": 1234,
        "embed_std": 0.35,
    },
    # Qwen2 style: q/k/v biases, untied LM head, GQA 6:2, default RoPE.
    "qwen2_bias_untied": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": 320,
        "hidden_size": 96,
        "intermediate_size": 208,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "seed": 4321,
        "embed_std": 1.0,
    },
}


def head_dim(cfg):
    return cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])


def make_weights(cfg):
    """Random fp32 weights with HF names. The residual branches (o_proj, down_proj) are scaled up
    against the embeddings so that a tied model does not just predict its input token again, and
    greedy continuations vary."""
    g = torch.Generator().manual_seed(cfg["seed"])
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = head_dim(cfg)
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    bias = cfg["model_type"] == "qwen2"

    def rnd(*shape, std):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * std

    w = {"model.embed_tokens.weight": rnd(v, h, std=cfg["embed_std"])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1.0 + rnd(h, std=0.1)
        w[p + "post_attention_layernorm.weight"] = 1.0 + rnd(h, std=0.1)
        w[p + "self_attn.q_proj.weight"] = rnd(nq, h, std=1.5 / math.sqrt(h))
        w[p + "self_attn.k_proj.weight"] = rnd(nkv, h, std=1.5 / math.sqrt(h))
        w[p + "self_attn.v_proj.weight"] = rnd(nkv, h, std=1.0 / math.sqrt(h))
        w[p + "self_attn.o_proj.weight"] = rnd(h, nq, std=2.0 / math.sqrt(nq))
        if bias:
            w[p + "self_attn.q_proj.bias"] = rnd(nq, std=0.3)
            w[p + "self_attn.k_proj.bias"] = rnd(nkv, std=0.3)
            w[p + "self_attn.v_proj.bias"] = rnd(nkv, std=0.3)
        w[p + "mlp.gate_proj.weight"] = rnd(f, h, std=1.0 / math.sqrt(h))
        w[p + "mlp.up_proj.weight"] = rnd(f, h, std=1.0 / math.sqrt(h))
        w[p + "mlp.down_proj.weight"] = rnd(h, f, std=2.0 / math.sqrt(f))
    w["model.norm.weight"] = 1.0 + rnd(h, std=0.1)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = rnd(v, h, std=2.0 / math.sqrt(h))
    return w


def write_safetensors(path, tensors):
    """safetensors by hand: u64 LE header length, JSON header, raw little-endian data."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.numpy().astype("<f4").tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        for b in blobs:
            fh.write(b)


def bytes_to_unicode():
    """GPT-2's byte -> printable unicode map used by byte-level BPE tokenizers."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tokenizer(path, vocab_size):
    """A byte-level BPE tokenizer.json: ids 0..255 are the bytes, the rest merges of letters."""
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges = []
    letters = "etaoinshrdlucmfw"
    for a in letters:
        for b in letters:
            if len(vocab) >= vocab_size:
                break
            vocab[a + b] = len(vocab)
            merges.append(f"{a} {b}")
    assert len(vocab) == vocab_size, (len(vocab), vocab_size)
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    with open(path, "w") as fh:
        json.dump(tok, fh, ensure_ascii=False)


# ---- The model, following transformers' modeling_llama.py / modeling_qwen2.py (eager path). ----


def rope_inv_freq(cfg):
    dim = head_dim(cfg)
    base = cfg["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = cfg.get("rope_scaling")
    if rs is None:
        return inv_freq
    assert rs["rope_type"] == "llama3"
    # _compute_llama3_parameters
    factor = rs["factor"]
    low_freq_factor = rs["low_freq_factor"]
    high_freq_factor = rs["high_freq_factor"]
    old_context_len = rs["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    kvh, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, None, :, :].expand(kvh, n_rep, s, d).reshape(kvh * n_rep, s, d)


def forward(cfg, w, ids):
    """Logits [len(ids), vocab] of one sequence (batch of 1, no cache)."""
    n = len(ids)
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    eps = cfg["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    positions = torch.arange(n).float()
    freqs = positions[:, None] @ rope_inv_freq(cfg)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # [n, hd]
    mask = torch.full((n, n), float("-inf")).triu(1)

    def lin(t, name):
        out = t @ w[name + ".weight"].T
        if name + ".bias" in w:
            out = out + w[name + ".bias"]
        return out

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = lin(h, p + "self_attn.q_proj").view(n, nh, hd).transpose(0, 1)
        k = lin(h, p + "self_attn.k_proj").view(n, nkv, hd).transpose(0, 1)
        v = lin(h, p + "self_attn.v_proj").view(n, nkv, hd).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
        scores = q @ k.transpose(1, 2) * (hd ** -0.5) + mask
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        attn = (probs @ v).transpose(0, 1).reshape(n, nh * hd)
        x = x + lin(attn, p + "self_attn.o_proj")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        act = torch.nn.functional.silu(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj")
        x = x + lin(act, p + "mlp.down_proj")
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def greedy(cfg, w, prompt):
    ids, out_ids, out_logits, min_gap = list(prompt), [], [], float("inf")
    for _ in range(STEPS):
        logits = forward(cfg, w, ids)[-1]
        top2 = torch.topk(logits, 2).values
        min_gap = min(min_gap, float(top2[0] - top2[1]))
        nxt = int(torch.argmax(logits))
        out_ids.append(nxt)
        out_logits.append(logits.tolist())
        ids.append(nxt)
    return out_ids, out_logits, min_gap


def make_prompts(vocab, seed):
    g = torch.Generator().manual_seed(seed)

    def rand(n):
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    prefix = rand(37)  # >= 2 full blocks of 16 (and 9 of 4)
    return [
        ("short", rand(5)),
        ("medium", rand(17)),
        ("long", rand(40)),
        ("prefix_a", prefix + rand(6)),
        ("prefix_b", prefix + rand(11)),
    ], len(prefix)


def build(out_dir, name, spec):
    cfg = dict(spec)
    w = make_weights(cfg)
    prompts, common = make_prompts(cfg["vocab_size"], spec["seed"] + 1)
    with torch.no_grad():
        results = []
        for pname, prompt in prompts:
            ids, logits, gap = greedy(cfg, w, prompt)
            distinct = len(set(ids))
            if distinct < 3:
                raise SystemExit(f"{name}/{pname}: degenerate greedy output {ids}")
            if gap < 1e-3:
                raise SystemExit(f"{name}/{pname}: near-tie in greedy argmax (gap {gap})")
            # Prompt logprobs: the log-softmax at every position but the last, whose row scores
            # the next prompt token (vLLM's prompt_logprobs).
            prompt_lsm = torch.log_softmax(forward(cfg, w, prompt)[:-1].double(), dim=-1)
            results.append({"name": pname, "prompt_ids": prompt, "greedy_ids": ids,
                            "logits": logits, "min_top2_gap": gap, "distinct_ids": distinct,
                            "prompt_log_softmax": prompt_lsm.tolist()})
    # BOS/EOS ids that never occur in any prompt or continuation, so a generate tool that stops at
    # EOS produces the full 32 tokens.
    used = set()
    for r in results:
        used.update(r["prompt_ids"])
        used.update(r["greedy_ids"])
    free = [t for t in range(cfg["vocab_size"]) if t not in used]
    if len(free) < 2:
        raise SystemExit(f"{name}: no free ids for bos/eos")
    cfg.pop("seed")
    cfg.pop("embed_std")
    cfg["bos_token_id"], cfg["eos_token_id"] = free[0], free[1]

    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "model.safetensors"), w)
    write_tokenizer(os.path.join(d, "tokenizer.json"), cfg["vocab_size"])
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    ref = {"model": name, "steps": STEPS, "prompts": results,
           "shared_prefix": {"first": "prefix_a", "second": "prefix_b", "common_len": common}}
    with open(os.path.join(d, "reference.json"), "w") as fh:
        json.dump(ref, fh)
    gaps = min(r["min_top2_gap"] for r in results)
    print(f"{name}: {len(results)} prompts, min top-2 gap {gaps:.4g}, distinct ids "
          f"{[r['distinct_ids'] for r in results]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for name, spec in MODELS.items():
        build(args.out, name, spec)
    with open(os.path.join(args.out, "models.json"), "w") as fh:
        json.dump(sorted(MODELS), fh)


if __name__ == "__main__":
    main()

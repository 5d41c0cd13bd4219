#!/usr/bin/env python3
"""Trains Tandem's bundled default models: a byte-level BPE tokenizer and two Llama models
sharing it, a target (~27M parameters) and a draft (~5M, distilled from the target).

Input: the corpus written by make_corpus.py (xz JSON lines with a train/val split).
Output (under --out):
  target/, draft/          Hugging Face directories (config.json LlamaForCausalLM, bf16 safetensors
                           shards <= 15 MB with model.safetensors.index.json, tokenizer.json,
                           tokenizer_config.json with a ChatML template, generation_config.json)
  results.json             sizes, losses, draft/target greedy agreement, samples, checks
  expected_greedy.json     greedy continuations of fixed prompts, computed by `transformers`
                           (float32 on CPU, from the saved bf16 weights) when it is installed

The model is a plain PyTorch Llama whose parameter names are those of transformers'
LlamaForCausalLM, and the HF directories are written here directly (safetensors is a JSON header
and raw bytes), so the whole pipeline also runs on a machine without transformers/tokenizers:
`--tokenizer bytes --preset tiny` swaps the BPE for a merge-free byte-level BPE (still a valid
tokenizer.json) for CPU smoke tests. When transformers is importable, it loads each saved directory,
its logits are compared with this model's, and its greedy continuations become the references.
With --tandem "CMD", `CMD generate --model DIR --prompt P --max-tokens N --json` is run for each
reference prompt and its token ids are compared with transformers'.

Everything is seeded (--seed); on the same hardware and software the run is reproducible up to
the nondeterminism of GPU kernels.
"""

import argparse
import copy
import hashlib
import json
import lzma
import math
import os
import random
import shlex
import struct
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_ID, IM_START_ID, IM_END_ID = 0, 1, 2
EOS_IDS = [IM_END_ID, BOS_ID]  # end of a chat turn, end of a document

# Starts with the BOS, as every training document does (the router encodes the rendered chat
# without adding special tokens, as HF does).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

PRESETS = {
    "full": {
        "vocab_size": 8192, "seq_len": 1024, "batch": 64,
        "target": dict(hidden_size=512, intermediate_size=1280, num_hidden_layers=8,
                       num_attention_heads=8, num_key_value_heads=4, lr=2e-3),
        "draft": dict(hidden_size=256, intermediate_size=640, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, lr=3e-3),
    },
    "tiny": {
        "vocab_size": 8192, "seq_len": 64, "batch": 8,
        "target": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, lr=3e-3),
        "draft": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, lr=3e-3),
    },
}

PROMPTS = [
    "The history of the city",
    "Once upon a time",
    "In the beginning",
    "The database server",
    "A function is",
    "When the king heard the news",
    "Python is a programming language that",
    "The most important thing to remember is",
]
CHAT_PROMPT = "What is a database?"

RMS_EPS = 1e-5
ROPE_THETA = 10000.0


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------- model
class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(seq_len, head_dim, device):
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float().to(device) / head_dim))
    pos = torch.arange(seq_len, device=device).float()
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads, self.n_kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c["hidden_size"] // self.n_heads
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = cos[:t].to(q.dtype), sin[:t].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_heads // self.n_kv
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (Debian's CPU torch for smoke tests)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            y = att @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.drop = nn.Dropout(c.get("dropout", 0.0))  # training only; inference is plain Llama
        self.input_layernorm = RMSNorm(c["hidden_size"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class Llama(nn.Module):
    """Llama with tied embeddings; parameter names match transformers' LlamaForCausalLM."""

    def __init__(self, c, vocab_size, max_len):
        super().__init__()
        self.c = dict(c)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab_size, c["hidden_size"])
        self.model.layers = nn.ModuleList(Block(c) for _ in range(c["num_hidden_layers"]))
        self.model.norm = RMSNorm(c["hidden_size"])
        head_dim = c["hidden_size"] // c["num_attention_heads"]
        cos, sin = rope_cos_sin(max(max_len, 4096), head_dim, "cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                s = std / math.sqrt(2 * c["num_hidden_layers"]) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                nn.init.normal_(p, mean=0.0, std=s)

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, self.cos, self.sin)
        x = self.model.norm(x)
        return F.linear(x, self.model.embed_tokens.weight)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())


# ------------------------------------------------------------------------------------ corpus
def load_corpus(path, max_docs):
    docs = {"train": [], "val": []}
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if max_docs and i >= max_docs:
                break
            d = json.loads(line)
            docs[d["split"]].append(d)
    return docs


def as_chat(text, rng):
    """A document as one ChatML exchange: its first sentence asks, the rest answers."""
    pars = text.split("\n")
    first = pars[0]
    cut = first.find(". ")
    if 0 < cut < 300:
        user, rest = first[:cut + 1], [first[cut + 2:]] + pars[1:]
    elif len(pars) > 1 and len(first) < 300:
        user, rest = first, pars[1:]
    else:
        return None
    answer, n = [], 0
    for p in rest:
        if n + len(p) > 1500 and answer:
            break
        answer.append(p)
        n += len(p)
    style = rng.random()
    if style < 0.3:
        user = "Tell me more: " + user
    elif style < 0.5:
        user = "Continue this text: " + user
    return (f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
            + "\n".join(answer) + "<|im_end|>\n")


def train_texts(docs, seed, chat_fraction=0.15):
    rng = random.Random(seed)
    out = []
    for d in docs:
        chat = as_chat(d["text"], rng) if rng.random() < chat_fraction else None
        out.append(chat if chat is not None else d["text"])
    return out


# --------------------------------------------------------------------------------- tokenizers
def byte_level_alphabet():
    """GPT-2's bytes_to_unicode: the printable stand-in for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_json(vocab, merges):
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i, s in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": SPECIALS[0], "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": SPECIALS[0], "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": SPECIALS[0], "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {SPECIALS[0]: {"id": SPECIALS[0], "ids": [BOS_ID],
                                             "tokens": [SPECIALS[0]]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


class ByteTokenizer:
    """Merge-free byte-level BPE: one token per byte, for smoke tests without `tokenizers`."""

    def __init__(self):
        alpha = byte_level_alphabet()
        self.vocab = dict((s, i) for i, s in enumerate(SPECIALS))
        for b in range(256):
            self.vocab[alpha[b]] = len(SPECIALS) + b
        self.inv = {i: s for s, i in self.vocab.items()}
        self.alpha_inv = {c: b for b, c in alpha.items()}
        self.json = tokenizer_json(self.vocab, [])

    def vocab_size(self):
        return len(self.vocab)

    def encode(self, text, add_bos):
        ids = [BOS_ID] if add_bos else []
        i = 0
        while i < len(text):
            for k, s in enumerate(SPECIALS):
                if text.startswith(s, i):
                    ids.append(k)
                    i += len(s)
                    break
            else:
                j = i
                while j < len(text) and not any(text.startswith(s, j) for s in SPECIALS):
                    j += 1
                ids.extend(len(SPECIALS) + b for b in text[i:j].encode())
                i = j
        return ids

    def encode_batch(self, texts):
        return [self.encode(t, False) for t in texts]

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            if i >= len(SPECIALS):
                out.append(self.alpha_inv[self.inv[i]])
        return out.decode("utf-8", "replace")


class BpeTokenizer:
    """Byte-level BPE trained with HF `tokenizers`."""

    def __init__(self, texts, vocab_size):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(texts, trainer)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{SPECIALS[0]} $A", pair=f"{SPECIALS[0]} $A {SPECIALS[0]}:1 $B:1",
            special_tokens=[(SPECIALS[0], BOS_ID)])
        for i, s in enumerate(SPECIALS):
            assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
        self.json = json.loads(tok.to_str())
        self.tok = tok
        self._vocab_size = tok.get_vocab_size()

    def vocab_size(self):
        return self._vocab_size

    def encode(self, text, add_bos):
        return self.tok.encode(text, add_special_tokens=add_bos).ids

    def encode_batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=True)


def token_stream(tokenizer, texts):
    parts = []
    for ids in tokenizer.encode_batch(texts):
        parts.append(np.asarray([BOS_ID] + ids, dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


# ------------------------------------------------------------------------------------ training
def windows(stream, seq_len, max_windows):
    n = min((len(stream) - 1) // seq_len, max_windows)
    x = np.stack([stream[i * seq_len:(i + 1) * seq_len + 1] for i in range(n)])
    return torch.from_numpy(x.astype(np.int64))


@torch.no_grad()
def eval_loss(model, data, device, batch, amp):
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(data), batch):
        xb = data[i:i + batch].to(device)
        with amp():
            logits = model(xb[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), xb[:, 1:].reshape(-1),
                               reduction="sum")
        tot += loss.item()
        n += xb[:, 1:].numel()
    model.train()
    return tot / max(n, 1)


def train_model(name, model, stream, val_data, train_eval, args, preset, lr, seconds, teacher=None):
    device = args.device
    model.to(device)
    seq, bsz = preset["seq_len"], preset["batch"]
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.startswith("cuda") else (
        lambda: torch.autocast("cpu", enabled=False))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt_kwargs = {"fused": True} if device.startswith("cuda") else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, **opt_kwargs)
    planned = max(1, int(args.epochs * len(stream) / (seq * bsz)))
    if args.max_steps:
        planned = min(planned, args.max_steps)
    total = planned
    warmup = max(1, min(200, total // 20))
    g = torch.Generator().manual_seed(args.seed + (0 if teacher is None else 1))
    stream_t = torch.from_numpy(stream.astype(np.int64))
    eval_every = max(1, total // 12)
    best = (float("inf"), None, 0)
    history = []
    t0 = time.time()
    ema = None
    step = 0
    while step < total:
        if step == 30 and seconds:
            rate = (time.time() - t0) / 30
            fit = int(seconds / rate)
            if fit < total:
                log(f"{name}: {rate * 1000:.0f} ms/step, {total} steps planned, {fit} fit in {seconds}s")
                total = max(fit, step + 1)
                eval_every = max(1, total // 12)
        lr_now = lr * (step + 1) / warmup if step < warmup else (
            lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))))
        for group in opt.param_groups:
            group["lr"] = lr_now
        starts = torch.randint(0, len(stream_t) - seq - 1, (bsz,), generator=g)
        xb = torch.stack([stream_t[s:s + seq + 1] for s in starts.tolist()]).to(device, non_blocking=True)
        with amp():
            logits = model(xb[:, :-1])
            loss_ce = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), xb[:, 1:].reshape(-1))
            loss = loss_ce
            if teacher is not None:
                with torch.no_grad():
                    t_logits = teacher(xb[:, :-1]).float()
                kl = F.kl_div(F.log_softmax(logits.float(), -1), F.log_softmax(t_logits, -1),
                              log_target=True, reduction="batchmean") / logits.size(1)
                loss = 0.5 * loss_ce + 0.5 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ce = loss_ce.item() if (step % 10 == 0 or step == total) else None
        if ce is not None:
            ema = ce if ema is None else 0.9 * ema + 0.1 * ce
        if step % eval_every == 0 or step == total:
            vl = eval_loss(model, val_data, device, bsz, amp)
            history.append({"step": step, "train_ce_ema": ema, "val_loss": vl,
                            "seconds": round(time.time() - t0, 1)})
            log(f"{name}: step {step}/{total} lr {lr_now:.2e} train_ce~{ema} val {vl:.4f}")
            if vl < best[0]:
                best = (vl, copy.deepcopy({k: v.detach().to("cpu") for k, v in model.state_dict().items()}), step)
    model.load_state_dict(best[1])
    secs = time.time() - t0
    result = {
        "steps": step, "best_step": best[2], "seconds": round(secs, 1),
        "tokens_seen": step * seq * bsz, "epochs_seen": round(step * seq * bsz / len(stream), 2),
        "train_loss": eval_loss(model, train_eval, device, bsz, amp),
        "val_loss": eval_loss(model, val_data, device, bsz, amp),
        "history": history,
    }
    log(f"{name}: done in {secs:.0f}s: best step {best[2]}, train {result['train_loss']:.4f} "
        f"val {result['val_loss']:.4f}")
    return result


@torch.no_grad()
def agreement(target, draft, data, device, batch):
    """Fraction of positions where the draft's argmax next token equals the target's."""
    target.eval()
    draft.eval()
    same, n = 0, 0
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.startswith("cuda") else (
        lambda: torch.autocast("cpu", enabled=False))
    for i in range(0, len(data), batch):
        xb = data[i:i + batch, :-1].to(device)
        with amp():
            a = target(xb).argmax(-1)
            b = draft(xb).argmax(-1)
        same += (a == b).sum().item()
        n += a.numel()
    return same / max(n, 1)


# ------------------------------------------------------------------------- HF directory writer
def bf16_bytes(t):
    return t.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors:
        b = bf16_bytes(t)
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def hf_config(c, vocab_size, max_len):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "head_dim": c["hidden_size"] // c["num_attention_heads"],
        "hidden_act": "silu",
        "max_position_embeddings": max_len,
        "initializer_range": 0.02,
        "rms_norm_eps": RMS_EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_IDS,
        "pad_token_id": BOS_ID,
        "torch_dtype": "bfloat16",
    }


def tokenizer_config(max_len):
    return {
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True} for i, s in enumerate(SPECIALS)},
        "bos_token": SPECIALS[BOS_ID],
        "eos_token": SPECIALS[IM_END_ID],
        "pad_token": SPECIALS[BOS_ID],
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def save_hf_dir(model, out_dir, tokenizer, max_len, shard_bytes):
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        os.remove(os.path.join(out_dir, f))
    sd = model.state_dict()
    names = [n for n in sd if n not in ("cos", "sin")]
    shards, cur, size = [], [], 0
    for n in names:
        nbytes = sd[n].numel() * 2
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(n)
        size += nbytes
    shards.append(cur)
    total = sum(sd[n].numel() * 2 for n in names)
    if len(shards) == 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), [(n, sd[n]) for n in names])
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(out_dir, fname), [(n, sd[n]) for n in shard])
            weight_map.update({n: fname for n in shard})
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    dump = lambda name, obj: json.dump(obj, open(os.path.join(out_dir, name), "w"), indent=2, ensure_ascii=False)
    dump("config.json", hf_config(model.c, tokenizer.vocab_size(), max_len))
    dump("generation_config.json", {"bos_token_id": BOS_ID, "eos_token_id": EOS_IDS,
                                    "pad_token_id": BOS_ID})
    dump("tokenizer.json", tokenizer.json)
    dump("tokenizer_config.json", tokenizer_config(max_len))
    return len(shards)


def bf16_rounded_copy(model):
    m = copy.deepcopy(model).to("cpu").float()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return m.eval()


@torch.no_grad()
def greedy(model, ids, max_new, eos=EOS_IDS):
    """Greedy continuation with a full forward per token (float32, CPU), like HF generate."""
    ids = list(ids)
    out = []
    for _ in range(max_new):
        nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
        out.append(nxt)
        ids.append(nxt)
        if nxt in eos:
            break
    return out


# ---------------------------------------------------------------------------- HF / tandem checks
def hf_checks(name, model_dir, own_model, tokenizer, prompts, max_new):
    """Loads the directory with transformers; compares logits with own model; greedy references."""
    import transformers
    from transformers import AutoTokenizer, LlamaForCausalLM
    res = {"transformers_version": transformers.__version__}
    try:
        hf = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    except TypeError:
        hf = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    hf.eval()
    ids = torch.tensor([tokenizer.encode(prompts[0] + " and some more words to compare logits", True)])
    with torch.no_grad():
        a = hf(ids).logits[0]
        b = own_model(ids)[0]
    res["max_abs_logit_diff_vs_training_model"] = float((a - b).abs().max())
    res["hf_tokenizer"] = {}
    try:
        hft = AutoTokenizer.from_pretrained(model_dir)
        same = all(hft(p)["input_ids"] == tokenizer.encode(p, True) for p in prompts)
        chat = hft.apply_chat_template([{"role": "user", "content": CHAT_PROMPT}], tokenize=False,
                                       add_generation_prompt=True)
        res["hf_tokenizer"] = {"class": type(hft).__name__, "encodes_like_tokenizers": same,
                               "bos": hft.bos_token, "eos": hft.eos_token, "chat_render": chat}
    except Exception as e:  # recorded, not fatal: the references use token ids
        res["hf_tokenizer"] = {"error": repr(e)}
    refs = []
    for p in prompts:
        pid = tokenizer.encode(p, True)
        with torch.no_grad():
            out = hf.generate(torch.tensor([pid]), attention_mask=torch.ones(1, len(pid), dtype=torch.long),
                              max_new_tokens=max_new, do_sample=False, eos_token_id=EOS_IDS,
                              pad_token_id=BOS_ID)
        new = out[0, len(pid):].tolist()
        refs.append({"prompt": p, "prompt_ids": pid, "token_ids": new, "text": tokenizer.decode(new)})
    res["references"] = refs
    own = [greedy(own_model, r["prompt_ids"], max_new) for r in refs]
    res["own_model_greedy_equals_hf"] = [o == r["token_ids"] for o, r in zip(own, refs)]
    log(f"{name}: transformers logit diff {res['max_abs_logit_diff_vs_training_model']:.2e}, "
        f"greedy equal to own model: {res['own_model_greedy_equals_hf']}")
    return res


def tandem_check(cmd, model_dir, refs, max_new):
    out = []
    for r in refs:
        argv = shlex.split(cmd) + ["generate", "--model", model_dir, "--prompt", r["prompt"],
                                   "--max-tokens", str(max_new), "--json"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        item = {"prompt": r["prompt"], "rc": p.returncode}
        try:
            j = json.loads(p.stdout.strip().splitlines()[-1])
            ids = [i for i in j["token_ids"]]
            strip = lambda xs: xs[:-1] if xs and xs[-1] in EOS_IDS else xs
            item.update({"token_ids": ids, "text": j.get("text"),
                         "equal": strip(ids) == strip(r["token_ids"])})
        except Exception as e:
            item.update({"error": repr(e), "stdout": p.stdout[-500:], "stderr": p.stderr[-1000:]})
        out.append(item)
    return out


# ------------------------------------------------------------------------------------------ main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full")
    ap.add_argument("--tokenizer", choices=["bpe", "bytes"], default="bpe")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--epochs", type=float, default=8.0, help="passes over the training tokens")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--dropout", type=float, default=0.1, help="residual dropout while training")
    ap.add_argument("--target-seconds", type=float, default=0, help="time cap (0: none)")
    ap.add_argument("--draft-seconds", type=float, default=0, help="time cap (0: none)")
    ap.add_argument("--max-docs", type=int, default=0, help="read only this many documents")
    ap.add_argument("--max-new", type=int, default=32, help="tokens per reference continuation")
    ap.add_argument("--shard-bytes", type=int, default=15_000_000, help="safetensors shard size cap")
    ap.add_argument("--tandem", default="", help="command prefix running tandem, for the check")
    args = ap.parse_args()

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    preset = PRESETS[args.preset]
    os.makedirs(args.out, exist_ok=True)
    results = {"args": vars(args), "torch": torch.__version__,
               "device_name": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"}
    save_results = lambda: json.dump(results, open(os.path.join(args.out, "results.json"), "w"), indent=1)
    t_start = time.time()

    docs = load_corpus(args.corpus, args.max_docs)
    texts = train_texts(docs["train"], args.seed)
    val_texts = [d["text"] for d in docs["val"]]
    results["corpus"] = {"train_docs": len(docs["train"]), "val_docs": len(docs["val"]),
                         "train_bytes": sum(len(d["text"].encode()) for d in docs["train"]),
                         "val_bytes": sum(len(t.encode()) for t in val_texts),
                         "chat_formatted_train_docs": sum(t.startswith("<|im_start|>") for t in texts)}
    log(f"corpus: {results['corpus']}")

    if args.tokenizer == "bpe":
        tokenizer = BpeTokenizer([d["text"] for d in docs["train"]], preset["vocab_size"])
    else:
        tokenizer = ByteTokenizer()
    train_stream = token_stream(tokenizer, texts)
    val_stream = token_stream(tokenizer, val_texts)
    results["tokens"] = {"vocab_size": tokenizer.vocab_size(), "train": int(len(train_stream)),
                         "val": int(len(val_stream)),
                         "train_bytes_per_token": results["corpus"]["train_bytes"] / max(1, len(train_stream))}
    log(f"tokenizer: {results['tokens']} ({time.time() - t_start:.0f}s)")
    save_results()

    seq = preset["seq_len"]
    val_data = windows(val_stream, seq, 256)
    rng = np.random.default_rng(args.seed)
    starts = rng.integers(0, len(train_stream) - seq - 1, size=len(val_data))
    train_eval = torch.from_numpy(np.stack([train_stream[s:s + seq + 1] for s in starts]).astype(np.int64))

    models = {}
    for name in ("target", "draft"):
        c = dict(preset[name])
        lr = c.pop("lr")
        torch.manual_seed(args.seed + (0 if name == "target" else 7))
        model = Llama(dict(c, dropout=args.dropout), tokenizer.vocab_size(), seq)
        log(f"{name}: {model.num_params() / 1e6:.2f}M parameters {c}")
        teacher = models.get("target")
        if teacher is not None:
            teacher.eval()
        res = train_model(name, model, train_stream, val_data, train_eval, args, preset, lr,
                          args.target_seconds if name == "target" else args.draft_seconds, teacher)
        res["parameters"] = model.num_params()
        res["config"] = c
        results[name] = res
        models[name] = model
        d = os.path.join(args.out, name)
        res["shards"] = save_hf_dir(model, d, tokenizer, seq, args.shard_bytes)
        res["dir_bytes"] = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        save_results()

    results["draft_target_greedy_agreement_val"] = agreement(models["target"], models["draft"], val_data,
                                                             args.device, preset["batch"])
    log(f"agreement: {results['draft_target_greedy_agreement_val']:.4f}")
    save_results()

    cpu_models = {name: bf16_rounded_copy(models[name]) for name in ("target", "draft")}

    samples = {}
    for name in ("target", "draft"):
        samples[name] = []
        for p in PROMPTS:
            ids = greedy(cpu_models[name], tokenizer.encode(p, True), 48)
            samples[name].append({"prompt": p, "continuation": tokenizer.decode(ids)})
        chat = (f"<|im_start|>user\n{CHAT_PROMPT}<|im_end|>\n<|im_start|>assistant\n")
        ids = greedy(cpu_models[name], [BOS_ID] + tokenizer.encode(chat, False), 64)
        samples[name].append({"chat_user": CHAT_PROMPT, "continuation": tokenizer.decode(ids)})
    results["samples"] = samples
    save_results()

    expected = {"max_new_tokens": args.max_new, "eos_token_ids": EOS_IDS, "models": {}}
    try:
        import transformers  # noqa: F401
        have_hf = True
    except ImportError:
        have_hf = False
        results["transformers"] = "not installed: references computed by this script's own model"
    for name in ("target", "draft"):
        d = os.path.join(args.out, name)
        if have_hf:
            try:
                chk = hf_checks(name, d, cpu_models[name], tokenizer, PROMPTS, args.max_new)
                results.setdefault("transformers", {})[name] = chk
                refs, source = chk["references"], "transformers " + chk["transformers_version"]
            except Exception as e:
                import traceback
                results.setdefault("transformers", {})[name] = {"error": traceback.format_exc()}
                log(f"{name}: transformers check failed: {e!r}")
                refs, source = None, None
        if not have_hf or refs is None:
            refs, source = [], "train.py's own model (float32, bf16-rounded weights)"
            for p in PROMPTS:
                pid = tokenizer.encode(p, True)
                new = greedy(cpu_models[name], pid, args.max_new)
                refs.append({"prompt": p, "prompt_ids": pid, "token_ids": new, "text": tokenizer.decode(new)})
        expected["models"][name] = {"reference": source, "continuations": refs}
        save_results()
        if args.tandem:
            chk = tandem_check(args.tandem, d, refs, args.max_new)
            results.setdefault("tandem_check", {})[name] = chk
            log(f"{name}: tandem equal to reference: {[c.get('equal') for c in chk]}")
            save_results()
    json.dump(expected, open(os.path.join(args.out, "expected_greedy.json"), "w"), indent=1,
              ensure_ascii=False)
    results["total_seconds"] = round(time.time() - t_start, 1)
    save_results()
    log(f"all done in {results['total_seconds']}s")


if __name__ == "__main__":
    main()

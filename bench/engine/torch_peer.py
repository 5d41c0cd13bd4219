#!/usr/bin/env python3
"""The PyTorch peer of engine_bench: the same Llama checkpoint in plain torch (HF LlamaForCausalLM
math, with q/k/v and gate/up fused as vLLM does), a static KV cache of exactly `--context`
positions filled with random bf16, and one decode step per call at position context - 1, timed
eager and under torch.compile (mode reduce-overhead: CUDA graphs). Prints ms/step per batch;
--json writes them.

  torch_peer.py --model DIR [--batches 1,64] [--context 1024] [--iters 50] [--json FILE]
                [--no-compile] [--device cuda|cpu]

Needs only torch (the safetensors files are parsed here). Exit status 0, 1 on error (torch missing,
no GPU, bad model), so a caller can keep going.
"""

import argparse
import glob
import json
import math
import os
import struct
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - reported to the caller
    print(f"torch_peer: PyTorch is not installed ({e})", file=sys.stderr)
    sys.exit(1)

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def load_safetensors(model_dir, device):
    tensors = {}
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise RuntimeError(f"no *.safetensors in {model_dir}")
    for path in files:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                start, end = meta["data_offsets"]
                f.seek(8 + n + start)
                buf = bytearray(f.read(end - start))
                t = torch.frombuffer(buf, dtype=DTYPES[meta["dtype"]]).view(meta["shape"])
                tensors[name] = t.to(device=device, dtype=torch.bfloat16)
    return tensors


def rope_inv_freq(cfg, head_dim):
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = torch.where(is_mid, mid, scaled)
    return inv


class Llama(torch.nn.Module):
    def __init__(self, cfg, w, batch, context, device):
        super().__init__()
        self.nl = cfg["num_hidden_layers"]
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads", self.nh)
        self.hd = cfg.get("head_dim") or cfg["hidden_size"] // self.nh
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = w.get("lm_head.weight", self.embed)
        self.final_norm = w["model.norm.weight"]
        self.layers = []
        for i in range(self.nl):
            p = f"model.layers.{i}."
            qkv = torch.cat([w[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
            bias = None
            if p + "self_attn.q_proj.bias" in w:
                bias = torch.cat([w[p + f"self_attn.{x}_proj.bias"] for x in "qkv"])
            gate_up = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
            self.layers.append((w[p + "input_layernorm.weight"], qkv, bias,
                                w[p + "self_attn.o_proj.weight"],
                                w[p + "post_attention_layernorm.weight"], gate_up,
                                w[p + "mlp.down_proj.weight"]))
        shape = (self.nl, batch, self.nkv, context, self.hd)
        self.register_buffer("k_cache", torch.randn(shape, device=device, dtype=torch.bfloat16))
        self.register_buffer("v_cache", torch.randn(shape, device=device, dtype=torch.bfloat16))
        self.register_buffer("inv_freq", rope_inv_freq(cfg, self.hd).to(device))

    def norm(self, x, w):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(torch.bfloat16) * w

    @staticmethod
    def rotate(x, cos, sin):
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return (x.float() * cos + rot.float() * sin).to(torch.bfloat16)

    def forward(self, ids, pos):
        # ids [B] int64; pos [1] int64: every sequence writes position pos and attends to [0, pos].
        b = ids.shape[0]
        nh, nkv, hd = self.nh, self.nkv, self.hd
        g = nh // nkv
        x = self.embed[ids]
        freqs = pos.float() * self.inv_freq
        emb = torch.cat([freqs, freqs])
        cos, sin = emb.cos(), emb.sin()
        ctx = self.k_cache.shape[3]
        mask = torch.where(torch.arange(ctx, device=ids.device) <= pos, 0.0, float("-inf"))
        for li, (w_in, w_qkv, b_qkv, w_o, w_post, w_gu, w_down) in enumerate(self.layers):
            h = self.norm(x, w_in)
            qkv = F.linear(h, w_qkv, b_qkv)
            q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
            q = self.rotate(q.view(b, nh, hd), cos, sin)
            k = self.rotate(k.view(b, nkv, hd), cos, sin)
            self.k_cache[li].index_copy_(2, pos, k.view(b, nkv, 1, hd))
            self.v_cache[li].index_copy_(2, pos, v.view(b, nkv, 1, hd))
            # GQA without repeating the cache: [b, nkv, g, hd] x [b, nkv, ctx, hd].
            qg = q.view(b, nkv, g, hd)
            scores = torch.matmul(qg, self.k_cache[li].transpose(-1, -2)).float()
            scores = scores / math.sqrt(hd) + mask
            p = torch.softmax(scores, dim=-1).to(torch.bfloat16)
            o = torch.matmul(p, self.v_cache[li]).reshape(b, nh * hd)
            x = x + F.linear(o, w_o)
            h = self.norm(x, w_post)
            gate, up = F.linear(h, w_gu).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w_down)
        x = self.norm(x, self.final_norm)
        return F.linear(x, self.lm_head).float()


def time_steps(fn, ids, pos, warmup, iters, device):
    for _ in range(warmup):
        fn(ids, pos)
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn(ids, pos)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(ids, pos)
    return (time.perf_counter() - t0) * 1e3 / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_peer: torch sees no CUDA GPU", file=sys.stderr)
        return 1
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    t0 = time.time()
    w = load_safetensors(args.model, args.device)
    print(f"torch {torch.__version__}: loaded {args.model} in {time.time() - t0:.1f} s", flush=True)
    results = {"torch_version": torch.__version__, "model": args.model, "context": args.context,
               "points": []}
    for b in [int(x) for x in args.batches.split(",")]:
        model = Llama(cfg, w, b, args.context, args.device)
        ids = torch.randint(0, cfg["vocab_size"], (b,), device=args.device)
        pos = torch.tensor([args.context - 1], device=args.device)
        with torch.inference_mode():
            ms = time_steps(model, ids, pos, 3, args.iters, args.device)
            print(f"torch eager    batch {b:4d} context {args.context}: {ms:8.3f} ms/step",
                  flush=True)
            results["points"].append({"mode": "eager", "batch": b, "ms_per_step": ms})
            if not args.no_compile and hasattr(torch, "compile"):
                try:
                    torch._dynamo.reset()
                    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
                    t0 = time.time()
                    compiled(ids, pos)
                    compile_s = time.time() - t0
                    ms = time_steps(compiled, ids, pos, 5, args.iters, args.device)
                    print(f"torch compiled batch {b:4d} context {args.context}: {ms:8.3f} ms/step"
                          f" (reduce-overhead, compiled in {compile_s:.0f} s)", flush=True)
                    results["points"].append({"mode": "compile-reduce-overhead", "batch": b,
                                              "ms_per_step": ms, "compile_s": compile_s})
                except Exception as e:  # compile failures are reported, not fatal
                    print(f"torch compiled batch {b}: failed: {e}", flush=True)
                    results["points"].append({"mode": "compile-reduce-overhead", "batch": b,
                                              "error": str(e)[:500]})
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

import torch, time
from torch.nn.attention import sdpa_kernel, SDPBackend
S, H, D = 8192, 32, 128
q = torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 8, S, D, device="cuda", dtype=torch.bfloat16).repeat_interleave(4, dim=1)
v = torch.randn_like(k)
flops = 4 * S * S * D * H / 2
for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
    try:
        with sdpa_kernel(be):
            for _ in range(3): torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(20): torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            e1.record(); torch.cuda.synchronize()
            ms = e0.elapsed_time(e1) / 20
            print(f"{name}: {ms:.3f} ms per layer-sized call (1 x {H} heads x {S} x {D}, causal), {flops / ms / 1e9:.1f} TFLOP/s")
    except Exception as ex:
        print(f"{name}: unavailable ({type(ex).__name__}: {str(ex)[:120]})")
print(torch.__version__, torch.cuda.get_device_name())

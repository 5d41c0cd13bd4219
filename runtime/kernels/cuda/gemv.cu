// Small-M bf16 GEMV (contract: gemv_kernels.h). Memory-bound on the weight matrix, so the design
// goal is many bytes in flight on every SM from the first to the last microsecond:
//   - a CTA of 256 threads owns kRows = 2 consecutive output features and splits the K dimension
//     across all its threads: thread i streams 16-byte packs i, i + 256, ... of each of its rows
//     (kUnroll packs per row in flight, evict-first: weights are read once per step), so even a
//     4096-row matrix makes 2048 small CTAs that fill every SM several times over. kUnroll is
//     picked per shape (the packs a thread needs, rounded up to 2 or 4), so the k = 4096
//     projections hold only the registers they use, and at one row of x the registers are capped
//     so that 5 CTAs fit on an SM (4 for the down projection): on the H200 more resident CTAs beat
//     more loads per thread (all 7 of the down projection's at once was slower than two rounds of
//     4, and so were CTAs looping over several feature pairs; bench/RESULTS.md);
//   - the first batch of weight loads is issued BEFORE PdlWait(): with programmatic dependent
//     launch the weights stream while the previous kernel (which produced x) is finishing; so are
//     the other inputs no kernel of the step writes (bias, the RoPE angle and KV slot from the step
//     metadata), so no epilogue waits on a dependent load;
//   - the M activation rows (a few KB, shared by every CTA) are read through the read-only cache;
//   - per-thread float32 partials are reduced with warp shuffles, then across warps in shared
//     memory.
// Gated mode (SiLU-and-multiply fused in): the CTA's rows are gate rows j and up rows n + j of a
// [2n, k] matrix, and out[m, j] = silu(gate) * up, so the gate/up projection writes the MLP's
// input directly.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/gemv_internal.h"
#include "runtime/kernels/cuda/kernel_utils.cuh"

namespace tandem::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kRows = 2;  // output features per CTA (gated: 2 gate + 2 up weight rows)

struct GemvParams {
  const uint4* x;  // [m, chunks]
  const uint4* w;  // [n or 2n, chunks]
  const __nv_bfloat16* bias;
  void* out;
  bool out_f32;
  int n;       // output features
  int chunks;  // k / 8
  // RoPE + KV append mode only (see LaunchGemvRopeKvRaw).
  const int32_t* positions;
  const float* inv_freq;
  const int32_t* slot_mapping;
  __nv_bfloat16* k_layer;
  __nv_bfloat16* v_layer;
  int num_heads;
  int num_kv_heads;
  int head_dim;
};

// Output modes: plain (out = x w^T + bias), gated (SiLU-and-multiply of a [2n, k] matrix), rope
// (the fused QKV projection: pairs (i, i + head_dim / 2) of one head per CTA, rotated and appended
// to the KV cache as RopeKvVecKernel does).
constexpr int kPlain = 0;
constexpr int kGatedMode = 1;
constexpr int kRopeMode = 2;

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + __expf(-g)); }

// kMinCtas > 0 asks ptxas for registers that fit kMinCtas CTAs per SM (one row of x only; see
// LaunchConfigured).
template <int M, int kMode, int kUnroll, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas > 0 ? kMinCtas : 1)
    GemvKernel(const GemvParams p) {
  constexpr bool kGated = kMode == kGatedMode;
  constexpr bool kRope = kMode == kRopeMode;
  constexpr int kWRows = kGated ? 2 * kRows : kRows;
  PdlLaunchDependents();
  const int tid = threadIdx.x;
  const int row0 = blockIdx.x * kRows;
  // Rope: CTA c owns features (head h, i) and (h, i + half) for h = c / half, i = c % half.
  const int half = kRope ? p.head_dim / 2 : 1;
  const int rope_head = kRope ? static_cast<int>(blockIdx.x) / half : 0;
  const int rope_i = kRope ? static_cast<int>(blockIdx.x) % half : 0;
  // Rows past n (n odd) re-read row n - 1; their results are not written.
  const uint4* w_rows[kWRows];
#pragma unroll
  for (int r = 0; r < kWRows; ++r) {
    int row;
    if constexpr (kRope) {
      row = rope_head * p.head_dim + rope_i + r * half;
    } else {
      const int feature = row0 + r % kRows < p.n ? row0 + r % kRows : p.n - 1;
      row = kGated && r >= kRows ? p.n + feature : feature;
    }
    w_rows[r] = p.w + static_cast<size_t>(row) * p.chunks;
  }
  float acc[M][kWRows];
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int r = 0; r < kWRows; ++r) acc[m][r] = 0.0f;
  }

  constexpr int kStep = kThreads * kUnroll;
  uint4 wv[kUnroll][kWRows];
  auto load = [&](int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + u * kThreads;
#pragma unroll
      for (int r = 0; r < kWRows; ++r) {
        wv[u][r] = c < p.chunks ? __ldcs(w_rows[r] + c) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  load(tid);  // weights do not depend on the previous kernel

  // Epilogue inputs no kernel of this step writes, read before the wait: the bias, and in the rope
  // mode the angle and KV slot of token tid (step metadata, uploaded before the step's first
  // kernel).
  const int epi_m = kRope ? tid : tid / kRows;
  const int epi_r = kRope ? 0 : tid % kRows;
  const bool epi_thread = kRope ? tid < M : tid < M * kRows && row0 + epi_r < p.n;
  float bias0 = 0.0f, bias1 = 0.0f;
  float rope_cos = 1.0f, rope_sin = 0.0f;
  int rope_slot = -1;
  const bool rope_rotates = kRope && rope_head < p.num_heads + p.num_kv_heads;
  if (epi_thread) {
    if constexpr (kRope) {
      const int f0 = rope_head * p.head_dim + rope_i;
      if (p.bias != nullptr) {
        bias0 = __bfloat162float(p.bias[f0]);
        bias1 = __bfloat162float(p.bias[f0 + half]);
      }
      rope_slot = p.slot_mapping[epi_m];
      if (rope_rotates) {
        RopeCosSin(static_cast<float>(p.positions[epi_m]), p.inv_freq[rope_i], rope_cos, rope_sin);
      }
    } else if (!kGated && p.bias != nullptr) {
      bias0 = __bfloat162float(p.bias[row0 + epi_r]);
    }
  }
  PdlWait();

  for (int base = tid; base < p.chunks; base += kStep) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + u * kThreads;
      if (c < p.chunks) {
        float wf[kWRows][8];
#pragma unroll
        for (int r = 0; r < kWRows; ++r) {
          Bf16x8 pack;
          memcpy(&pack, &wv[u][r], sizeof(pack));
          Bf16x8ToFloat(pack, wf[r]);
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xr = __ldg(p.x + static_cast<size_t>(m) * p.chunks + c);
          Bf16x8 pack;
          memcpy(&pack, &xr, sizeof(pack));
          float xf[8];
          Bf16x8ToFloat(pack, xf);
#pragma unroll
          for (int r = 0; r < kWRows; ++r) {
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[m][r] = fmaf(xf[j], wf[r][j], acc[m][r]);
          }
        }
      }
    }
    if (base + kStep < p.chunks) load(base + kStep);
  }

  __shared__ float s_part[kWarps][M * kWRows];
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int r = 0; r < kWRows; ++r) {
      const float sum = WarpSum(acc[m][r]);
      if (lane == 0) s_part[warp][m * kWRows + r] = sum;
    }
  }
  __syncthreads();
  if (!epi_thread) return;
  auto total = [&](int part) {
    float y = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) y += s_part[w][epi_m * kWRows + part];
    return y;
  };
  if constexpr (kRope) {
    // Token m = tid: the two projections rounded to bf16 as the plain mode writes them, then the
    // exact rotation arithmetic of RopeKvVecKernel on those bf16 values (bit-identical to the
    // GEMV followed by the RoPE + KV append kernel).
    const int m = epi_m;
    const int f0 = rope_head * p.head_dim + rope_i;
    const int f1 = f0 + half;
    __nv_bfloat16 z0 = __float2bfloat16_rn(total(0) + bias0);
    __nv_bfloat16 z1 = __float2bfloat16_rn(total(1) + bias1);
    if (rope_rotates) {
      float y0, y1;
      RopeRotate(__bfloat162float(z0), __bfloat162float(z1), rope_cos, rope_sin, y0, y1);
      z0 = __float2bfloat16_rn(y0);
      z1 = __float2bfloat16_rn(y1);
    }
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + static_cast<size_t>(m) * p.n;
    out[f0] = z0;
    out[f1] = z1;
    if (rope_slot >= 0 && rope_head >= p.num_heads) {
      const bool is_k = rope_rotates;
      __nv_bfloat16* dst =
          (is_k ? p.k_layer : p.v_layer) +
          static_cast<size_t>(rope_slot) * p.num_kv_heads * p.head_dim +
          static_cast<size_t>(rope_head - (is_k ? p.num_heads : p.num_heads + p.num_kv_heads)) *
              p.head_dim +
          rope_i;
      dst[0] = z0;
      dst[half] = z1;
    }
    return;
  }
  float y = total(epi_r);
  if constexpr (kGated) {
    y = Silu(y) * total(kRows + epi_r);
  } else {
    y += bias0;
  }
  const size_t at = static_cast<size_t>(epi_m) * p.n + row0 + epi_r;
  if (p.out_f32) {
    static_cast<float*>(p.out)[at] = y;
  } else {
    static_cast<__nv_bfloat16*>(p.out)[at] = __float2bfloat16_rn(y);
  }
}

// Register caps at one row of x (kMinCtas CTAs per SM), measured on the H200 (bench/RESULTS.md):
// 5 for two packs per weight row (k <= 4096): the gated mode's 61-63 registers allow only 4
// otherwise (the plain and rope modes fit 5 uncapped); 6 made the gated kernel spill and 8 was
// slower still. 4 for four packs in the plain mode (the down projection): ptxas may give it 66
// registers, which leaves 3 (the gated and rope modes would spill at 4). Everything else is
// uncapped.
template <int M, int kMode, int kUnroll>
cudaError_t LaunchConfigured(const GemvParams& p, cudaStream_t stream) {
  constexpr int kMinCtas = M != 1                              ? 0
                           : kUnroll == 2                      ? 5
                           : (kUnroll == 4 && kMode == kPlain) ? 4
                                                               : 0;
  return LaunchKernel(GemvKernel<M, kMode, kUnroll, kMinCtas>, dim3(CeilDiv(p.n, kRows)), kThreads,
                      0, stream, p);
}

// kUnroll: the packs per weight row a thread needs (chunks / 256), 2 or else 4 (the down
// projection's 7 packs all in flight measured slower than two rounds of 4, and so did four rounds
// of 2: bench/RESULTS.md).
template <int M, int kMode>
cudaError_t LaunchUnrolled(const GemvParams& p, cudaStream_t stream) {
  return CeilDiv(p.chunks, kThreads) <= 2 ? LaunchConfigured<M, kMode, 2>(p, stream)
                                          : LaunchConfigured<M, kMode, 4>(p, stream);
}

template <int M>
cudaError_t Launch(const GemvParams& p, int mode, cudaStream_t stream) {
  switch (mode) {
    case kGatedMode:
      return LaunchUnrolled<M, kGatedMode>(p, stream);
    case kRopeMode:
      return LaunchUnrolled<M, kRopeMode>(p, stream);
    default:
      return LaunchUnrolled<M, kPlain>(p, stream);
  }
}

cudaError_t LaunchAnyM(const GemvParams& p, int m, int mode, cudaStream_t stream) {
  switch (m) {
    case 1:
      return Launch<1>(p, mode, stream);
    case 2:
      return Launch<2>(p, mode, stream);
    case 3:
      return Launch<3>(p, mode, stream);
    case 4:
      return Launch<4>(p, mode, stream);
    case 5:
      return Launch<5>(p, mode, stream);
    case 6:
      return Launch<6>(p, mode, stream);
    case 7:
      return Launch<7>(p, mode, stream);
    case 8:
      return Launch<8>(p, mode, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// The fields shared by both launchers.
GemvParams CommonParams(const void* x, const void* w, const void* bias, void* out, int n, int k) {
  GemvParams p = {};
  p.x = static_cast<const uint4*>(x);
  p.w = static_cast<const uint4*>(w);
  p.bias = static_cast<const __nv_bfloat16*>(bias);
  p.out = out;
  p.n = n;
  p.chunks = k / 8;
  return p;
}

}  // namespace

cudaError_t LaunchGemvRaw(const void* x, const void* w, const void* bias, void* out, bool out_f32,
                          bool gated_silu, int m, int n, int k, cudaStream_t stream) {
  GemvParams p = CommonParams(x, w, bias, out, n, k);
  p.out_f32 = out_f32;
  return LaunchAnyM(p, m, gated_silu ? kGatedMode : kPlain, stream);
}

cudaError_t LaunchGemvRopeKvRaw(const void* x, const void* w, const void* bias, void* qkv, int m,
                                int k, const int32_t* positions, const float* inv_freq,
                                const int32_t* slot_mapping, int num_heads, int num_kv_heads,
                                int head_dim, void* k_layer, void* v_layer, cudaStream_t stream) {
  GemvParams p = CommonParams(x, w, bias, qkv, (num_heads + 2 * num_kv_heads) * head_dim, k);
  p.positions = positions;
  p.inv_freq = inv_freq;
  p.slot_mapping = slot_mapping;
  p.k_layer = static_cast<__nv_bfloat16*>(k_layer);
  p.v_layer = static_cast<__nv_bfloat16*>(v_layer);
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  return LaunchAnyM(p, m, kRopeMode, stream);
}

}  // namespace tandem::cuda::internal

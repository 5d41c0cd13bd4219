// Small-M bf16 GEMV (contract: gemv_kernels.h). Memory-bound on the weight matrix, so the design
// goal is many bytes in flight on every SM from the first to the last microsecond:
//   - a CTA of 256 threads owns kRows consecutive output features and splits the K dimension
//     across all its threads: thread i streams 16-byte packs i, i + 256, ... of each of its rows
//     (kUnroll packs per row in flight, evict-first: weights are read once per step), so even a
//     4096-row matrix makes 2048 small CTAs that fill every SM several times over;
//   - the first batch of weight loads is issued BEFORE PdlWait(): with programmatic dependent
//     launch the weights stream while the previous kernel (which produced x) is finishing;
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
// Output features per CTA (kRows): 2 (gated: 2 gate + 2 up weight rows); the plain mode at one or
// two rows of x also has a 4-row instantiation (LaunchGemvRaw's rows_per_cta): half the CTAs, twice
// the bytes each (as the gated mode, which streams at the copy bandwidth), so the smaller decode
// matrices take one wave.
constexpr int kUnroll = 4;  // 16-byte packs per weight row in flight per thread

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

template <int M, int kMode, int kRows>
__global__ void __launch_bounds__(kThreads) GemvKernel(const GemvParams p) {
  constexpr bool kGated = kMode == kGatedMode;
  constexpr bool kRope = kMode == kRopeMode;
  static_assert(!kRope || kRows == 2, "a rope CTA owns one rotation pair");
  constexpr int kWRows = kGated ? 2 * kRows : kRows;
  PdlLaunchDependents();
  const int tid = threadIdx.x;
  const int row0 = blockIdx.x * kRows;
  // Rope: CTA c owns features (head h, i) and (h, i + half) for h = c / half, i = c % half.
  const int half = kRope ? p.head_dim / 2 : 1;
  const int rope_head = kRope ? static_cast<int>(blockIdx.x) / half : 0;
  const int rope_i = kRope ? static_cast<int>(blockIdx.x) % half : 0;
  // Rows past n (n not a multiple of kRows) re-read row n - 1; their results are not written.
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
  if constexpr (kRope) {
    // Token m: the two projections rounded to bf16 as the plain mode writes them, then the exact
    // rotation arithmetic of RopeKvVecKernel on those bf16 values (bit-identical to the GEMV
    // followed by the RoPE + KV append kernel).
    if (tid < M) {
      const int m = tid;
      const int f0 = rope_head * p.head_dim + rope_i;
      const int f1 = f0 + half;
      float y0 = 0.0f, y1 = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        y0 += s_part[w][m * kWRows];
        y1 += s_part[w][m * kWRows + 1];
      }
      if (p.bias != nullptr) {
        y0 += __bfloat162float(p.bias[f0]);
        y1 += __bfloat162float(p.bias[f1]);
      }
      __nv_bfloat16 z0 = __float2bfloat16_rn(y0);
      __nv_bfloat16 z1 = __float2bfloat16_rn(y1);
      const int rotated = p.num_heads + p.num_kv_heads;
      if (rope_head < rotated) {
        RopeRotateBf16(z0, z1, static_cast<float>(p.positions[m]), p.inv_freq[rope_i]);
      }
      __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + static_cast<size_t>(m) * p.n;
      out[f0] = z0;
      out[f1] = z1;
      const int slot = p.slot_mapping[m];
      if (slot >= 0 && rope_head >= p.num_heads) {
        const bool is_k = rope_head < rotated;
        __nv_bfloat16* dst =
            (is_k ? p.k_layer : p.v_layer) +
            static_cast<size_t>(slot) * p.num_kv_heads * p.head_dim +
            static_cast<size_t>(rope_head - (is_k ? p.num_heads : rotated)) * p.head_dim + rope_i;
        dst[0] = z0;
        dst[half] = z1;
      }
    }
    return;
  }
  if (tid < M * kRows) {
    const int m = tid / kRows;
    const int r = tid % kRows;
    const int feature = row0 + r;
    if (feature < p.n) {
      float y = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) y += s_part[w][m * kWRows + r];
      if (kGated) {
        float up = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) up += s_part[w][m * kWRows + kRows + r];
        y = Silu(y) * up;
      } else if (p.bias != nullptr) {
        y += __bfloat162float(p.bias[feature]);
      }
      const size_t at = static_cast<size_t>(m) * p.n + feature;
      if (p.out_f32) {
        static_cast<float*>(p.out)[at] = y;
      } else {
        static_cast<__nv_bfloat16*>(p.out)[at] = __float2bfloat16_rn(y);
      }
    }
  }
}

template <int M, int kMode, int kRows>
cudaError_t LaunchRows(const GemvParams& p, cudaStream_t stream) {
  return LaunchKernel(GemvKernel<M, kMode, kRows>, dim3(CeilDiv(p.n, kRows)), dim3(kThreads), 0,
                      stream, p);
}

template <int M>
cudaError_t Launch(const GemvParams& p, bool gated, int rows_per_cta, cudaStream_t stream) {
  if (gated) return LaunchRows<M, kGatedMode, 2>(p, stream);
  // 4 rows per CTA only where the registers allow it (80 at one row of x, 100 at two).
  if constexpr (M <= 2) {
    if (rows_per_cta == 4) return LaunchRows<M, kPlain, 4>(p, stream);
  }
  return LaunchRows<M, kPlain, 2>(p, stream);
}

template <int M>
cudaError_t LaunchRope(const GemvParams& p, cudaStream_t stream) {
  return LaunchRows<M, kRopeMode, 2>(p, stream);  // n / 2 CTAs: one rotation pair each
}

}  // namespace

cudaError_t LaunchGemvRaw(const void* x, const void* w, const void* bias, void* out, bool out_f32,
                          bool gated_silu, int m, int n, int k, int rows_per_cta,
                          cudaStream_t stream) {
  GemvParams p = {};
  p.x = static_cast<const uint4*>(x);
  p.w = static_cast<const uint4*>(w);
  p.bias = static_cast<const __nv_bfloat16*>(bias);
  p.out = out;
  p.out_f32 = out_f32;
  p.n = n;
  p.chunks = k / 8;
  switch (m) {
    case 1:
      return Launch<1>(p, gated_silu, rows_per_cta, stream);
    case 2:
      return Launch<2>(p, gated_silu, rows_per_cta, stream);
    case 3:
      return Launch<3>(p, gated_silu, rows_per_cta, stream);
    case 4:
      return Launch<4>(p, gated_silu, rows_per_cta, stream);
    case 5:
      return Launch<5>(p, gated_silu, rows_per_cta, stream);
    case 6:
      return Launch<6>(p, gated_silu, rows_per_cta, stream);
    case 7:
      return Launch<7>(p, gated_silu, rows_per_cta, stream);
    case 8:
      return Launch<8>(p, gated_silu, rows_per_cta, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchGemvRopeKvRaw(const void* x, const void* w, const void* bias, void* qkv, int m,
                                int k, const int32_t* positions, const float* inv_freq,
                                const int32_t* slot_mapping, int num_heads, int num_kv_heads,
                                int head_dim, void* k_layer, void* v_layer, cudaStream_t stream) {
  GemvParams p = {};
  p.x = static_cast<const uint4*>(x);
  p.w = static_cast<const uint4*>(w);
  p.bias = static_cast<const __nv_bfloat16*>(bias);
  p.out = qkv;
  p.out_f32 = false;
  p.n = (num_heads + 2 * num_kv_heads) * head_dim;
  p.chunks = k / 8;
  p.positions = positions;
  p.inv_freq = inv_freq;
  p.slot_mapping = slot_mapping;
  p.k_layer = static_cast<__nv_bfloat16*>(k_layer);
  p.v_layer = static_cast<__nv_bfloat16*>(v_layer);
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  switch (m) {
    case 1:
      return LaunchRope<1>(p, stream);
    case 2:
      return LaunchRope<2>(p, stream);
    case 3:
      return LaunchRope<3>(p, stream);
    case 4:
      return LaunchRope<4>(p, stream);
    case 5:
      return LaunchRope<5>(p, stream);
    case 6:
      return LaunchRope<6>(p, stream);
    case 7:
      return LaunchRope<7>(p, stream);
    case 8:
      return LaunchRope<8>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda::internal

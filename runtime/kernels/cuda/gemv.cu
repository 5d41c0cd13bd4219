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
};

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + __expf(-g)); }

template <int M, bool kGated, int kRows>
__global__ void __launch_bounds__(kThreads) GemvKernel(const GemvParams p) {
  constexpr int kWRows = kGated ? 2 * kRows : kRows;
  PdlLaunchDependents();
  const int tid = threadIdx.x;
  const int row0 = blockIdx.x * kRows;
  // Rows past n (n not a multiple of kRows) re-read row n - 1; their results are not written.
  const uint4* w_rows[kWRows];
#pragma unroll
  for (int r = 0; r < kWRows; ++r) {
    const int feature = row0 + r % kRows < p.n ? row0 + r % kRows : p.n - 1;
    const int row = kGated && r >= kRows ? p.n + feature : feature;
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

template <int M, bool kGated, int kRows>
cudaError_t LaunchRows(const GemvParams& p, cudaStream_t stream) {
  return LaunchKernel(GemvKernel<M, kGated, kRows>, dim3(CeilDiv(p.n, kRows)), dim3(kThreads), 0,
                      stream, p);
}

template <int M>
cudaError_t Launch(const GemvParams& p, bool gated, int rows_per_cta, cudaStream_t stream) {
  if (gated) return LaunchRows<M, true, 2>(p, stream);
  // 4 rows per CTA only where the registers allow it (80 at one row of x, 100 at two).
  if constexpr (M <= 2) {
    if (rows_per_cta == 4) return LaunchRows<M, false, 4>(p, stream);
  }
  return LaunchRows<M, false, 2>(p, stream);
}

}  // namespace

cudaError_t LaunchGemvRaw(const void* x, const void* w, const void* bias, void* out, bool out_f32,
                          bool gated_silu, int m, int n, int k, int rows_per_cta,
                          cudaStream_t stream) {
  GemvParams p;
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

}  // namespace tandem::cuda::internal

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
// RMSNorm fusions (one row): a prologue that normalizes x on the fly with an inv_rms computed by
// the previous projection, and an epilogue that adds the output into the residual stream and
// computes the next norm's inv_rms (per-CTA partial sums of squares; the last CTA to finish adds
// them in a fixed order), so a decode step at batch 1 launches no standalone RMSNorm.

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
constexpr int kRows = kGemvRowsPerBlock;  // output features per CTA (gated: + as many up rows)
constexpr int kUnroll = 4;                // 16-byte packs per weight row in flight per thread

struct GemvParams {
  const uint4* x;  // [m, chunks]
  const uint4* w;  // [n or 2n, chunks]
  const __nv_bfloat16* bias;
  void* out;
  bool out_f32;
  int n;       // output features
  int chunks;  // k / 8
  // RMSNorm fusions (m == 1; see gemv_kernels.h).
  const uint4* norm_w;  // [chunks] or null
  const float* inv_rms;
  __nv_bfloat16* residual;  // [n] or null
  float* inv_rms_out;
  float* partials;    // [gridDim.x]
  unsigned* arrived;  // CTAs done, reset by the last
  float eps;
};

// x pack c of row m, normalized when the prologue is on (same rounding as the RMSNorm kernel).
__device__ __forceinline__ void LoadX(const GemvParams& p, int m, int c, float inv_rms,
                                      float (&xf)[8]) {
  const uint4 xr = __ldg(p.x + static_cast<size_t>(m) * p.chunks + c);
  Bf16x8 pack;
  memcpy(&pack, &xr, sizeof(pack));
  Bf16x8ToFloat(pack, xf);
  if (p.norm_w != nullptr) {
    const uint4 wr = __ldg(p.norm_w + c);
    Bf16x8 wpack;
    memcpy(&wpack, &wr, sizeof(wpack));
    float wf[8];
    Bf16x8ToFloat(wpack, wf);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      xf[j] = __bfloat162float(__float2bfloat16_rn(xf[j] * inv_rms * wf[j]));
  }
}

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + __expf(-g)); }

// Lanes that finish the CTA's outputs (tid < M * kRows, M == 1 with the residual epilogue).
constexpr unsigned kPartMask = (1u << kRows) - 1;

// After the residual update: this CTA's sum of squares (squares[0 .. kRows) in shared memory)
// goes to partials[blockIdx.x]; the last CTA to arrive sums all partials in a fixed order and
// writes inv_rms_out (threadfence reduction), then resets the arrival counter.
__device__ void ResidualEpilogue(const GemvParams& p, const float* squares) {
  __shared__ bool s_last;
  __shared__ float s_warp[kWarps];
  const int tid = threadIdx.x;
  __syncthreads();
  if (tid == 0) {
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) sum += squares[r];
    p.partials[blockIdx.x] = sum;
    __threadfence();
    s_last = atomicAdd(p.arrived, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  float sum = 0.0f;
  for (unsigned i = tid; i < gridDim.x; i += kThreads) sum += __ldcg(p.partials + i);
  sum = WarpSum(sum);
  if (tid % kWarpSize == 0) s_warp[tid / kWarpSize] = sum;
  __syncthreads();
  if (tid == 0) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += s_warp[w];
    *p.inv_rms_out = rsqrtf(total / static_cast<float>(p.n) + p.eps);
    *p.arrived = 0;
  }
}

template <int M, bool kGated>
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
  const float inv_rms = p.norm_w != nullptr ? *p.inv_rms : 1.0f;
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
          float xf[8];
          LoadX(p, m, c, inv_rms, xf);
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
    float y = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) y += s_part[w][m * kWRows + r];
    if (kGated) {
      float up = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) up += s_part[w][m * kWRows + kRows + r];
      y = Silu(y) * up;
    } else if (p.bias != nullptr && feature < p.n) {
      y += __bfloat162float(p.bias[feature]);
    }
    if (p.residual != nullptr) __syncwarp(kPartMask);  // the reads above before s_part reuse
    if (feature < p.n) {
      const size_t at = static_cast<size_t>(m) * p.n + feature;
      if (p.residual != nullptr) {
        const float h = __bfloat162float(__float2bfloat16_rn(y));
        const __nv_bfloat16 r = __float2bfloat16_rn(h + __bfloat162float(p.residual[feature]));
        p.residual[feature] = r;
        s_part[0][tid] = __bfloat162float(r) * __bfloat162float(r);
      } else if (p.out_f32) {
        static_cast<float*>(p.out)[at] = y;
      } else {
        static_cast<__nv_bfloat16*>(p.out)[at] = __float2bfloat16_rn(y);
      }
    } else if (p.residual != nullptr) {
      s_part[0][tid] = 0.0f;
    }
  }
  if (p.residual != nullptr) ResidualEpilogue(p, s_part[0]);
}

template <int M>
cudaError_t Launch(const GemvParams& p, bool gated, cudaStream_t stream) {
  const dim3 grid(CeilDiv(p.n, kRows));
  return gated ? LaunchKernel(GemvKernel<M, true>, grid, dim3(kThreads), 0, stream, p)
               : LaunchKernel(GemvKernel<M, false>, grid, dim3(kThreads), 0, stream, p);
}

}  // namespace

cudaError_t LaunchGemvRaw(const void* x, const void* w, const void* bias, void* out, bool out_f32,
                          bool gated_silu, const GemvNormFusion& fusion, int m, int n, int k,
                          cudaStream_t stream) {
  GemvParams p;
  p.norm_w = static_cast<const uint4*>(fusion.norm_weight);
  p.inv_rms = fusion.inv_rms;
  p.residual = static_cast<__nv_bfloat16*>(fusion.residual);
  p.inv_rms_out = fusion.inv_rms_out;
  p.partials = static_cast<float*>(fusion.scratch);
  p.arrived = fusion.scratch == nullptr
                  ? nullptr
                  : reinterpret_cast<unsigned*>(p.partials + CeilDiv(n, kRows));
  p.eps = fusion.eps;
  p.x = static_cast<const uint4*>(x);
  p.w = static_cast<const uint4*>(w);
  p.bias = static_cast<const __nv_bfloat16*>(bias);
  p.out = out;
  p.out_f32 = out_f32;
  p.n = n;
  p.chunks = k / 8;
  switch (m) {
    case 1:
      return Launch<1>(p, gated_silu, stream);
    case 2:
      return Launch<2>(p, gated_silu, stream);
    case 3:
      return Launch<3>(p, gated_silu, stream);
    case 4:
      return Launch<4>(p, gated_silu, stream);
    case 5:
      return Launch<5>(p, gated_silu, stream);
    case 6:
      return Launch<6>(p, gated_silu, stream);
    case 7:
      return Launch<7>(p, gated_silu, stream);
    case 8:
      return Launch<8>(p, gated_silu, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda::internal

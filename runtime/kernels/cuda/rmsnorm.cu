// Fused residual-add + RMSNorm over bf16 rows (contract: norm_kernels.h).
//
// One block per row. Each thread owns the 16-byte packs (8 bf16) at indices
// tid, tid + blockDim, ...; it loads all of them before using any (independent loads in flight),
// keeps them in registers as bf16 (the residual sum is rounded to bf16 anyway, so nothing is lost),
// reduces the sum of squares with warp shuffles plus one shared-memory exchange between warps, and
// writes the normalized row. Rows too long to keep in registers take a two-pass loop kernel that
// re-reads the row (from L2) instead. Accumulation is in float32.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/rmsnorm_internal.h"

namespace tandem::cuda::internal {
namespace {

constexpr int kCachedMaxThreads = 256;
constexpr int kLoopThreads = 1024;

// kVec consecutive bf16 values, loaded and stored as one access (16 bytes for kVec = 8).
template <int kVec>
struct alignas(2 * kVec) Pack {
  __nv_bfloat16 e[kVec];
};

// One access per pack: 16-byte loads for kVec = 8 (the compiler splits struct copies otherwise).
template <int kVec>
__device__ __forceinline__ Pack<kVec> LoadPack(const Pack<kVec>* p) {
  if constexpr (kVec == 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    Pack<kVec> out;
    memcpy(&out, &raw, sizeof(out));
    return out;
  } else {
    return *p;
  }
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32. Called once
// per kernel (its shared array is not reused).
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float warp_sums[kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  v = WarpSum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int num_warps = blockDim.x / kWarpSize;
  return WarpSum(lane < num_warps ? warp_sums[lane] : 0.0f);
}

// Returns h = bf16(x + residual) and stores it into *residual_slot.
template <int kVec>
__device__ __forceinline__ Pack<kVec> AddResidual(const Pack<kVec>& x, const Pack<kVec>& residual,
                                                  Pack<kVec>* residual_slot) {
  Pack<kVec> h;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    h.e[k] = __float2bfloat16_rn(__bfloat162float(x.e[k]) + __bfloat162float(residual.e[k]));
  }
  *residual_slot = h;
  return h;
}

template <int kVec>
__device__ __forceinline__ float SumSquares(const Pack<kVec>& h) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float f = __bfloat162float(h.e[k]);
    s = fmaf(f, f, s);
  }
  return s;
}

template <int kVec>
__device__ __forceinline__ Pack<kVec> Normalize(const Pack<kVec>& h, const Pack<kVec>& w,
                                                float inv_rms) {
  Pack<kVec> o;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    o.e[k] = __float2bfloat16_rn(__bfloat162float(h.e[k]) * inv_rms * __bfloat162float(w.e[k]));
  }
  return o;
}

// Row in registers: each thread holds up to kIters packs. blockDim.x * kIters >= dim / kVec.
// `x` and `out` may alias, so neither is __restrict__.
template <int kVec, int kIters, bool kResidual>
__global__ void __launch_bounds__(kCachedMaxThreads)
    RmsNormCachedKernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                        const __nv_bfloat16* __restrict__ weight, __nv_bfloat16* out, int dim,
                        float eps) {
  PdlLaunchDependents();
  using P = Pack<kVec>;
  const int num_packs = dim / kVec;
  const size_t row_offset = static_cast<size_t>(blockIdx.x) * static_cast<size_t>(dim);
  const P* x_row = reinterpret_cast<const P*>(x + row_offset);
  P* residual_row = kResidual ? reinterpret_cast<P*>(residual + row_offset) : nullptr;
  const P* w = reinterpret_cast<const P*>(weight);
  P* out_row = reinterpret_cast<P*>(out + row_offset);

  // The norm weights are no earlier kernel's output: they load while the previous kernel finishes
  // (ncu, decode batch 64: the kernel took 5-6 us, mostly dependent memory round trips).
  P wv[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = threadIdx.x + it * blockDim.x;
    if (i < num_packs) wv[it] = LoadPack(w + i);
  }
  PdlWait();
  P h[kIters];
  P r[kResidual ? kIters : 1];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = threadIdx.x + it * blockDim.x;
    if (i < num_packs) {
      h[it] = LoadPack(x_row + i);
      if constexpr (kResidual) r[it] = LoadPack(residual_row + i);
    }
  }
  float sum_squares = 0.0f;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = threadIdx.x + it * blockDim.x;
    if (i < num_packs) {
      if constexpr (kResidual) h[it] = AddResidual(h[it], r[it], residual_row + i);
      sum_squares += SumSquares(h[it]);
    }
  }
  const float inv_rms = rsqrtf(BlockSum(sum_squares) / static_cast<float>(dim) + eps);
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = threadIdx.x + it * blockDim.x;
    if (i < num_packs) out_row[i] = Normalize(h[it], wv[it], inv_rms);
  }
}

// Any row length: pass 1 adds, stores the residual and sums squares; pass 2 re-reads what this
// same thread wrote (or x) and normalizes.
template <int kVec, bool kResidual>
__global__ void __launch_bounds__(kLoopThreads)
    RmsNormLoopKernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                      const __nv_bfloat16* __restrict__ weight, __nv_bfloat16* out, int dim,
                      float eps) {
  PdlLaunchDependents();
  PdlWait();
  using P = Pack<kVec>;
  const int num_packs = dim / kVec;
  const size_t row_offset = static_cast<size_t>(blockIdx.x) * static_cast<size_t>(dim);
  const P* x_row = reinterpret_cast<const P*>(x + row_offset);
  P* residual_row = kResidual ? reinterpret_cast<P*>(residual + row_offset) : nullptr;
  const P* w = reinterpret_cast<const P*>(weight);
  P* out_row = reinterpret_cast<P*>(out + row_offset);

  float sum_squares = 0.0f;
  for (int i = threadIdx.x; i < num_packs; i += blockDim.x) {
    P h = LoadPack(x_row + i);
    if constexpr (kResidual) h = AddResidual(h, LoadPack(residual_row + i), residual_row + i);
    sum_squares += SumSquares(h);
  }
  const float inv_rms = rsqrtf(BlockSum(sum_squares) / static_cast<float>(dim) + eps);
  for (int i = threadIdx.x; i < num_packs; i += blockDim.x) {
    const P h = LoadPack(kResidual ? residual_row + i : x_row + i);
    out_row[i] = Normalize(h, LoadPack(w + i), inv_rms);
  }
}

struct KernelArgs {
  const __nv_bfloat16* x;
  __nv_bfloat16* residual;
  const __nv_bfloat16* weight;
  __nv_bfloat16* out;
  int rows;
  int dim;
  float eps;
};

int RoundUpToWarp(int n) { return (n + kWarpSize - 1) / kWarpSize * kWarpSize; }

template <int kVec, bool kResidual>
void Dispatch(const KernelArgs& a, cudaStream_t stream) {
  const int num_packs = a.dim / kVec;
  const dim3 grid(static_cast<unsigned>(a.rows));
  // Fewest packs per thread that fit in kCachedMaxThreads threads.
  auto threads_for = [&](int iters) { return RoundUpToWarp((num_packs + iters - 1) / iters); };
  if (threads_for(1) <= kCachedMaxThreads) {
    LaunchKernel(RmsNormCachedKernel<kVec, 1, kResidual>, grid, threads_for(1), 0, stream, a.x,
                 a.residual, a.weight, a.out, a.dim, a.eps);
  } else if (threads_for(2) <= kCachedMaxThreads) {
    LaunchKernel(RmsNormCachedKernel<kVec, 2, kResidual>, grid, threads_for(2), 0, stream, a.x,
                 a.residual, a.weight, a.out, a.dim, a.eps);
  } else if (threads_for(4) <= kCachedMaxThreads) {
    LaunchKernel(RmsNormCachedKernel<kVec, 4, kResidual>, grid, threads_for(4), 0, stream, a.x,
                 a.residual, a.weight, a.out, a.dim, a.eps);
  } else if (threads_for(8) <= kCachedMaxThreads) {
    LaunchKernel(RmsNormCachedKernel<kVec, 8, kResidual>, grid, threads_for(8), 0, stream, a.x,
                 a.residual, a.weight, a.out, a.dim, a.eps);
  } else {
    LaunchKernel(RmsNormLoopKernel<kVec, kResidual>, grid, kLoopThreads, 0, stream, a.x, a.residual,
                 a.weight, a.out, a.dim, a.eps);
  }
}

}  // namespace

cudaError_t LaunchRmsNormRaw(const void* x, void* residual, const void* weight, void* out, int rows,
                             int dim, float eps, cudaStream_t stream) {
  const KernelArgs a{static_cast<const __nv_bfloat16*>(x),
                     static_cast<__nv_bfloat16*>(residual),
                     static_cast<const __nv_bfloat16*>(weight),
                     static_cast<__nv_bfloat16*>(out),
                     rows,
                     dim,
                     eps};
  const bool vectorized = dim % 8 == 0 && IsAligned16(x) && IsAligned16(weight) &&
                          IsAligned16(out) && (residual == nullptr || IsAligned16(residual));
  const bool has_residual = residual != nullptr;
  if (vectorized && has_residual) {
    Dispatch<8, true>(a, stream);
  } else if (vectorized) {
    Dispatch<8, false>(a, stream);
  } else if (has_residual) {
    Dispatch<1, true>(a, stream);
  } else {
    Dispatch<1, false>(a, stream);
  }
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal

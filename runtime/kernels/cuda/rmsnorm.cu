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
#include "runtime/kernels/cuda/rmsnorm_row.cuh"

namespace tandem::cuda::internal {
namespace {

constexpr int kCachedMaxThreads = kRmsNormCachedMaxThreads;
constexpr int kLoopThreads = 1024;

// Row in registers: each thread holds up to kIters packs. blockDim.x * kIters >= dim / kVec.
// `x` and `out` may alias, so neither is __restrict__.
template <int kVec, int kIters, bool kResidual>
__global__ void __launch_bounds__(kCachedMaxThreads)
    RmsNormCachedKernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                        const __nv_bfloat16* __restrict__ weight, __nv_bfloat16* out, int dim,
                        float eps) {
  PdlLaunchDependents();
  PdlWait();
  __shared__ float warp_sums[kWarpSize];
  using P = Pack<kVec>;
  const int num_packs = dim / kVec;
  const size_t row_offset = static_cast<size_t>(blockIdx.x) * static_cast<size_t>(dim);
  const P* x_row = reinterpret_cast<const P*>(x + row_offset);
  P* residual_row = kResidual ? reinterpret_cast<P*>(residual + row_offset) : nullptr;
  const P* w = reinterpret_cast<const P*>(weight);
  P* out_row = reinterpret_cast<P*>(out + row_offset);

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
      if constexpr (kResidual) {
        h[it] = AddResidual(h[it], r[it]);
        residual_row[i] = h[it];
      }
      sum_squares += SumSquares(h[it]);
    }
  }
  const float inv_rms = InvRms(BlockSum(sum_squares, warp_sums), dim, eps);
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = threadIdx.x + it * blockDim.x;
    if (i < num_packs) out_row[i] = Normalize(h[it], LoadPack(w + i), inv_rms);
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
  __shared__ float warp_sums[kWarpSize];
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
    if constexpr (kResidual) {
      h = AddResidual(h, LoadPack(residual_row + i));
      residual_row[i] = h;
    }
    sum_squares += SumSquares(h);
  }
  const float inv_rms = InvRms(BlockSum(sum_squares, warp_sums), dim, eps);
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

template <int kVec, bool kResidual>
void Dispatch(const KernelArgs& a, cudaStream_t stream) {
  const int num_packs = a.dim / kVec;
  const dim3 grid(static_cast<unsigned>(a.rows));
  const int iters = RmsNormCachedIters(num_packs);
  const int threads = RmsNormCachedThreads(num_packs, iters);
  if (iters == 1) {
    LaunchKernel(RmsNormCachedKernel<kVec, 1, kResidual>, grid, threads, 0, stream, a.x,
                 a.residual, a.weight, a.out, a.dim, a.eps);
  } else if (iters == 2) {
    LaunchKernel(RmsNormCachedKernel<kVec, 2, kResidual>, grid, threads, 0, stream, a.x,
                 a.residual, a.weight, a.out, a.dim, a.eps);
  } else if (iters == 4) {
    LaunchKernel(RmsNormCachedKernel<kVec, 4, kResidual>, grid, threads, 0, stream, a.x,
                 a.residual, a.weight, a.out, a.dim, a.eps);
  } else if (iters == 8) {
    LaunchKernel(RmsNormCachedKernel<kVec, 8, kResidual>, grid, threads, 0, stream, a.x,
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

#pragma once
// Private to tandem_kernels_cuda: the RMSNorm row arithmetic in one place, used by the RMSNorm
// kernels (rmsnorm.cu) and the GEMV's RMSNorm prologue (gemv.cu), so the fused path is
// bit-identical to LaunchRmsNorm followed by the GEMV by construction. Thread mapping: thread t of
// the first `threads` threads owns the packs t, t + threads, ... (rmsnorm_internal.h's
// RmsNormCachedThreads / RmsNormCachedIters pick both); the float32 sum of squares is summed per
// thread in pack order, then over the block by BlockSum. Threads past `threads` contribute exact
// zeros, which leave every partial sum of the shuffle trees unchanged, so a larger block computes
// the same value.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"

namespace tandem::cuda::internal {

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

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32; warp_sums
// is a shared array of kWarpSize floats, which the caller may reuse only after a __syncthreads().
__device__ __forceinline__ float BlockSum(float v, float* warp_sums) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  v = WarpSum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int num_warps = blockDim.x / kWarpSize;
  return WarpSum(lane < num_warps ? warp_sums[lane] : 0.0f);
}

// h = bf16(x + residual): the residual stream's rounded sum.
template <int kVec>
__device__ __forceinline__ Pack<kVec> AddResidual(const Pack<kVec>& x, const Pack<kVec>& residual) {
  Pack<kVec> h;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    h.e[k] = __float2bfloat16_rn(__bfloat162float(x.e[k]) + __bfloat162float(residual.e[k]));
  }
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

__device__ __forceinline__ float InvRms(float block_sum_squares, int dim, float eps) {
  return rsqrtf(__fadd_rn(__fdiv_rn(block_sum_squares, static_cast<float>(dim)), eps));
}

template <int kVec>
__device__ __forceinline__ Pack<kVec> Normalize(const Pack<kVec>& h, const Pack<kVec>& w,
                                                float inv_rms) {
  Pack<kVec> o;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    o.e[k] = __float2bfloat16_rn(
        __fmul_rn(__fmul_rn(__bfloat162float(h.e[k]), inv_rms), __bfloat162float(w.e[k])));
  }
  return o;
}

}  // namespace tandem::cuda::internal

// Greedy sampling: argmax over float32 logit rows (contract: model_kernels.h). One block per row;
// each thread scans a strided slice (float4 loads when the rows allow), then (value, index) pairs
// are reduced with warp shuffles and one shared-memory exchange. Ties go to the smaller index, as
// cpu::Argmax; NaN is never chosen.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem::cuda::internal {
namespace {

constexpr int kThreads = 1024;
constexpr int kNoIndex = 0x7fffffff;

struct Best {
  float value;
  int index;
};

// Whether (v, i) beats the current best: larger value, or equal value at a smaller index.
__device__ __forceinline__ void Consider(Best& best, float v, int i) {
  if (v > best.value || (v == best.value && i < best.index)) best = {v, i};
}

__device__ __forceinline__ Best WarpBest(Best b) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, b.value, offset);
    const int i = __shfl_xor_sync(0xffffffffu, b.index, offset);
    Consider(b, v, i);
  }
  return b;
}

template <bool kVec4>
__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* __restrict__ logits, int vocab, int32_t* __restrict__ out) {
  PdlLaunchDependents();
  PdlWait();
  const float* row = logits + static_cast<size_t>(blockIdx.x) * vocab;
  Best best{-INFINITY, kNoIndex};
  if constexpr (kVec4) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int i = threadIdx.x; i < vocab / 4; i += blockDim.x) {
      const float4 v = row4[i];
      Consider(best, v.x, 4 * i);
      Consider(best, v.y, 4 * i + 1);
      Consider(best, v.z, 4 * i + 2);
      Consider(best, v.w, 4 * i + 3);
    }
  } else {
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) Consider(best, row[i], i);
  }
  __shared__ Best warp_best[kThreads / kWarpSize];
  best = WarpBest(best);
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp == 0) {
    const int num_warps = blockDim.x / kWarpSize;
    best = lane < num_warps ? warp_best[lane] : Best{-INFINITY, kNoIndex};
    best = WarpBest(best);
    // A row of NaN only has no best: answer 0, as cpu::Argmax does.
    if (lane == 0) out[blockIdx.x] = best.index == kNoIndex ? 0 : best.index;
  }
}

}  // namespace

cudaError_t LaunchArgmaxRaw(const float* logits, int rows, int vocab, int32_t* out,
                            cudaStream_t stream) {
  const bool vec4 = vocab % 4 == 0 && IsAligned16(logits);
  const int work = vec4 ? vocab / 4 : vocab;
  int threads = (work + kWarpSize - 1) / kWarpSize * kWarpSize;
  if (threads > kThreads) threads = kThreads;
  if (vec4) {
    LaunchKernel(ArgmaxKernel<true>, rows, threads, 0, stream, logits, vocab, out);
  } else {
    LaunchKernel(ArgmaxKernel<false>, rows, threads, 0, stream, logits, vocab, out);
  }
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal

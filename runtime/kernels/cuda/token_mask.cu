// Grammar masks around GPU sampling (contract: token_mask_kernels.h).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "runtime/kernels/cuda/token_mask_kernels.h"

namespace tandem::cuda::internal {
namespace {

constexpr int kThreads = 1024;

// Block-wide reduction of one value per thread (max or sum), the result to every thread.
template <typename T, typename Op>
__device__ T BlockReduce(T v, Op op, T* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = scratch[lane];  // kThreads / 32 == 32 warps
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const T out = scratch[0];
  __syncthreads();
  return out;
}

__global__ void __launch_bounds__(kThreads)
    ApplyTokenMaskKernel(float* __restrict__ logits, const uint64_t* __restrict__ allowed,
                         const int32_t* __restrict__ mask, int vocab, int words,
                         double* __restrict__ lse) {
  const int r = blockIdx.x;
  if (mask[r] == 0) return;
  __shared__ double scratch_d[32];
  __shared__ float scratch_f[32];
  float* row = logits + static_cast<size_t>(r) * vocab;
  const uint64_t* bits = allowed + static_cast<size_t>(r) * words;
  // The raw log-sum-exp, before any token is masked.
  float m = -INFINITY;
  for (int t = threadIdx.x; t < vocab; t += kThreads) m = fmaxf(m, row[t]);
  m = BlockReduce(
      m, [](float a, float b) { return fmaxf(a, b); }, scratch_f);
  double s = 0.0;
  for (int t = threadIdx.x; t < vocab; t += kThreads) {
    s += exp(static_cast<double>(row[t]) - static_cast<double>(m));
  }
  s = BlockReduce(
      s, [](double a, double b) { return a + b; }, scratch_d);
  if (threadIdx.x == 0) lse[r] = log(s) + static_cast<double>(m);
  for (int t = threadIdx.x; t < vocab; t += kThreads) {
    if (((bits[t >> 6] >> (t & 63)) & 1u) == 0) row[t] = -INFINITY;
  }
}

__global__ void MaskedLogprobsKernel(const float* __restrict__ logits,
                                     const int32_t* __restrict__ mask, int rows, int vocab,
                                     const double* __restrict__ lse,
                                     const int32_t* __restrict__ tokens,
                                     float* __restrict__ logprobs) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows || mask[r] == 0) return;
  const int token = tokens[r];
  if (token < 0 || token >= vocab) return;
  logprobs[r] = static_cast<float>(
      static_cast<double>(logits[static_cast<size_t>(r) * vocab + token]) - lse[r]);
}

}  // namespace

cudaError_t LaunchApplyTokenMaskRaw(const TokenMaskArgs& a, cudaStream_t stream) {
  ApplyTokenMaskKernel<<<a.rows, kThreads, 0, stream>>>(a.logits, a.allowed, a.mask, a.vocab,
                                                        a.words, a.lse);
  return cudaGetLastError();
}

cudaError_t LaunchMaskedLogprobsRaw(const TokenMaskArgs& a, const int32_t* tokens, float* logprobs,
                                    cudaStream_t stream) {
  MaskedLogprobsKernel<<<(a.rows + 255) / 256, 256, 0, stream>>>(a.logits, a.mask, a.rows, a.vocab,
                                                                 a.lse, tokens, logprobs);
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal

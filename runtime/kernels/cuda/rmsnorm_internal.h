#pragma once
// Private to tandem_kernels_cuda: the raw launcher in rmsnorm.cu, which norm_kernels.cc wraps with
// argument checks and absl::Status. Kept free of absl so nvcc compiles only CUDA code.
// Preconditions (checked by LaunchRmsNorm): non-null x, weight, out; rows > 0; dim > 0; eps > 0.

#include <cuda_runtime_api.h>

namespace tandem::cuda::internal {

// The register-cached RMSNorm kernel's launch shape for rows of num_packs packs: the fewest packs
// per thread (1, 2, 4 or 8) that fit in kRmsNormCachedMaxThreads threads, and as many threads as
// that needs, rounded up to whole warps. Iters 0: the row takes the loop kernel. The GEMV's
// RMSNorm prologue reproduces the same mapping (rmsnorm_row.cuh).
constexpr int kRmsNormCachedMaxThreads = 256;
constexpr int RmsNormCachedThreads(int num_packs, int iters) {
  return ((num_packs + iters - 1) / iters + 31) / 32 * 32;
}
constexpr int RmsNormCachedIters(int num_packs) {
  for (int iters = 1; iters <= 8; iters *= 2) {
    if (RmsNormCachedThreads(num_packs, iters) <= kRmsNormCachedMaxThreads) return iters;
  }
  return 0;
}

// Queues the kernel and returns cudaGetLastError() after the launch.
cudaError_t LaunchRmsNormRaw(const void* x, void* residual, const void* weight, void* out, int rows,
                             int dim, float eps, cudaStream_t stream);

}  // namespace tandem::cuda::internal

#pragma once
// Private to tandem_kernels_cuda: the raw launcher in rmsnorm.cu, which norm_kernels.cc wraps with
// argument checks and absl::Status. Kept free of absl so nvcc compiles only CUDA code.
// Preconditions (checked by LaunchRmsNorm): non-null x, weight, out; rows > 0; dim > 0; eps > 0.

#include <cuda_runtime_api.h>

namespace tandem::cuda::internal {

// Queues the kernel and returns cudaGetLastError() after the launch.
cudaError_t LaunchRmsNormRaw(const void* x, void* residual, const void* weight, void* out, int rows,
                             int dim, float eps, cudaStream_t stream);

}  // namespace tandem::cuda::internal

#pragma once
// Private to tandem_kernels_cuda: the raw GEMV launcher of gemv.cu, which gemv_kernels.cc wraps
// with argument checks (gemv_kernels.h preconditions: 1 <= m <= kGemvMaxRows, k % 8 == 0, x and w
// 16-byte aligned, non-null pointers). Returns cudaGetLastError() after the launch.

#include <cuda_runtime_api.h>

namespace tandem::cuda::internal {

// Same value as kGemvMaxRows (gemv_kernels.h, which nvcc does not include: it pulls absl).
constexpr int kGemvMaxRowsDevice = 8;

// m in [1, kGemvMaxRowsDevice].
cudaError_t LaunchGemvRaw(const void* x, const void* w, const void* bias, void* out, bool out_f32,
                          bool gated_silu, int m, int n, int k, cudaStream_t stream);

}  // namespace tandem::cuda::internal

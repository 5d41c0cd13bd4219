#pragma once
// Private to tandem_kernels_cuda: the raw GEMV launcher of gemv.cu, which gemv_kernels.cc wraps
// with argument checks (gemv_kernels.h preconditions: 1 <= m <= kGemvMaxRows, k % 8 == 0, x and w
// 16-byte aligned, non-null pointers). Returns cudaGetLastError() after the launch.

#include <cuda_runtime_api.h>

namespace tandem::cuda::internal {

// Same value as kGemvMaxRows (gemv_kernels.h, which nvcc does not include: it pulls absl).
constexpr int kGemvMaxRowsDevice = 8;

// Output features per CTA of the GEMV (the residual epilogue keeps one partial sum per CTA).
constexpr int kGemvRowsPerBlock = 2;

// The optional RMSNorm fusions of gemv_kernels.h (all null: none). m must be 1 when any is set.
struct GemvNormFusion {
  const void* norm_weight = nullptr;
  const float* inv_rms = nullptr;
  void* residual = nullptr;
  float* inv_rms_out = nullptr;
  void* scratch = nullptr;  // [ceil(n / kGemvRowsPerBlock)] floats, then one unsigned counter
  float eps = 0.0f;
};

// m in [1, kGemvMaxRowsDevice].
cudaError_t LaunchGemvRaw(const void* x, const void* w, const void* bias, void* out, bool out_f32,
                          bool gated_silu, const GemvNormFusion& fusion, int m, int n, int k,
                          cudaStream_t stream);

}  // namespace tandem::cuda::internal

#pragma once
// Private to tandem_kernels_cuda: the raw GEMV launcher of gemv.cu, which gemv_kernels.cc wraps
// with argument checks (gemv_kernels.h preconditions: 1 <= m <= kGemvMaxRows, k % 8 == 0, x and w
// 16-byte aligned, non-null pointers). Returns cudaGetLastError() after the launch.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::cuda::internal {

// Same value as kGemvMaxRows (gemv_kernels.h, which nvcc does not include: it pulls absl).
constexpr int kGemvMaxRowsDevice = 8;

// m in [1, kGemvMaxRowsDevice]; rows_per_cta: output features per CTA in the plain mode, 2 or (for
// m <= 2) 4; anything else is 2, and the gated mode always takes 2.
cudaError_t LaunchGemvRaw(const void* x, const void* w, const void* bias, void* out, bool out_f32,
                          bool gated_silu, int m, int n, int k, int rows_per_cta,
                          cudaStream_t stream);

// The fused QKV projection of model_kernels.h (LaunchQkvGemvRopeKvAppend): m in [1,
// kGemvMaxRowsDevice], k % 8 == 0, head_dim even; k_layer / v_layer the layer's cache.
cudaError_t LaunchGemvRopeKvRaw(const void* x, const void* w, const void* bias, void* qkv, int m,
                                int k, const int32_t* positions, const float* inv_freq,
                                const int32_t* slot_mapping, int num_heads, int num_kv_heads,
                                int head_dim, void* k_layer, void* v_layer, cudaStream_t stream);

}  // namespace tandem::cuda::internal

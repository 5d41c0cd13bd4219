#pragma once
// Private to tandem_kernels_cuda: the raw GEMV launchers of gemv.cu, which gemv_kernels.cc and
// model_kernels.cc wrap with argument checks (gemv_kernels.h preconditions: 1 <= m <= kGemvMaxRows,
// k % 8 == 0, x and w 16-byte aligned, non-null pointers). Return cudaGetLastError() after the
// launch, or cudaErrorInvalidValue for a combination the kernels do not take.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::cuda::internal {

// Same value as kGemvMaxRows (gemv_kernels.h, which nvcc does not include: it pulls absl).
constexpr int kGemvMaxRowsDevice = 8;

// m in [1, kGemvMaxRowsDevice].
cudaError_t LaunchGemvRaw(const void* x, const void* w, const void* bias, void* out, bool out_f32,
                          bool gated_silu, int m, int n, int k, cudaStream_t stream);

// The fused QKV projection of model_kernels.h (LaunchQkvGemvRopeKvAppend): m in [1,
// kGemvMaxRowsDevice], k % 8 == 0, head_dim even; k_layer / v_layer the layer's cache.
cudaError_t LaunchGemvRopeKvRaw(const void* x, const void* w, const void* bias, void* qkv, int m,
                                int k, const int32_t* positions, const float* inv_freq,
                                const int32_t* slot_mapping, int num_heads, int num_kv_heads,
                                int head_dim, void* k_layer, void* v_layer, cudaStream_t stream);

}  // namespace tandem::cuda::internal

#pragma once
// Test probe of the wgmma building blocks of prefill_attention_sm90.cu (the Hopper prefill
// attention), for wgmma_probe_cuda_test: one warpgroup copies Q, K and V (each a dense row-major
// bf16 [64, 128] matrix) into the kernel's swizzled shared tiles with the kernel's maps, computes
// S = Q K^T with the kernel's shared-memory descriptors and wgmma.m64n64k16, and O = P V with P (a
// dense bf16 [64, 64] matrix) packed into register A fragments as the kernel packs its
// probabilities and wgmma.m64n128k16 on V read MN-major. Writes S [64, 64] and O [64, 128]
// (float32, row-major) from the accumulator fragments with the kernel's maps. When the attention
// kernel's differential test fails, this says whether the layouts or the rest are wrong. Compute
// capability 9.0 only (sm_90a code); returns the launch's error.

#include <cuda_runtime_api.h>

namespace tandem::cuda::internal {

cudaError_t LaunchWgmmaProbeRaw(const void* q, const void* k, const void* v, const void* p,
                                float* s_out, float* o_out, cudaStream_t stream);

}  // namespace tandem::cuda::internal

// SiLU-and-multiply of the fused gate/up projection (contract: model_kernels.h). Elementwise and
// memory-bound: 16-byte accesses when inter is a multiple of 8 and the buffers are aligned.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem::cuda::internal {
namespace {

constexpr int kThreads = 256;

// As cpu::SiluAndMul, in float32 (expf, not the fast-math intrinsic).
__device__ __forceinline__ float SiluMul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// One thread per 8 outputs.
__global__ void __launch_bounds__(kThreads)
    SiluMulVecKernel(const __nv_bfloat16* __restrict__ gate_up, long long total_packs,
                     int inter_packs, __nv_bfloat16* __restrict__ out) {
  PdlLaunchDependents();
  PdlWait();
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total_packs) return;
  const long long row = idx / inter_packs;
  const int p = static_cast<int>(idx % inter_packs);
  const __nv_bfloat16* gate = gate_up + (row * 2 * inter_packs + p) * 8;
  const Bf16x8 g8 = LoadBf16x8(gate);
  const Bf16x8 u8 = LoadBf16x8(gate + static_cast<size_t>(inter_packs) * 8);
  float g[8], u[8], o[8];
  Bf16x8ToFloat(g8, g);
  Bf16x8ToFloat(u8, u);
#pragma unroll
  for (int k = 0; k < 8; ++k) o[k] = SiluMul(g[k], u[k]);
  StoreBf16x8(out + idx * 8, FloatToBf16x8(o));
}

__global__ void __launch_bounds__(kThreads)
    SiluMulScalarKernel(const __nv_bfloat16* __restrict__ gate_up, long long total, int inter,
                        __nv_bfloat16* __restrict__ out) {
  PdlLaunchDependents();
  PdlWait();
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const long long row = idx / inter;
  const int i = static_cast<int>(idx % inter);
  const __nv_bfloat16* gate = gate_up + row * 2 * inter + i;
  out[idx] = __float2bfloat16_rn(SiluMul(__bfloat162float(gate[0]), __bfloat162float(gate[inter])));
}

}  // namespace

cudaError_t LaunchSiluMulRaw(const void* gate_up, int n, int inter, void* out,
                             cudaStream_t stream) {
  const auto* in = static_cast<const __nv_bfloat16*>(gate_up);
  auto* o = static_cast<__nv_bfloat16*>(out);
  if (inter % 8 == 0 && IsAligned16(gate_up) && IsAligned16(out)) {
    const long long packs = static_cast<long long>(n) * (inter / 8);
    LaunchKernel(SiluMulVecKernel, CeilDiv(packs, kThreads), kThreads, 0, stream, in, packs,
                 inter / 8, o);
  } else {
    const long long total = static_cast<long long>(n) * inter;
    LaunchKernel(SiluMulScalarKernel, CeilDiv(total, kThreads), kThreads, 0, stream, in, total,
                 inter, o);
  }
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal

#pragma once
// Private device helpers shared by the model kernels' .cu files: bf16 packs, 16-byte loads,
// warp reductions. Included only by .cu files of tandem_kernels_cuda.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda::internal {

constexpr int kWarpSize = 32;

// Eight bf16 in one 16-byte access.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

__device__ __forceinline__ Bf16x8 LoadBf16x8(const void* p) {
  const uint4 raw = *static_cast<const uint4*>(p);
  Bf16x8 out;
  memcpy(&out, &raw, sizeof(out));
  return out;
}

__device__ __forceinline__ void StoreBf16x8(void* p, const Bf16x8& v) {
  uint4 raw;
  memcpy(&raw, &v, sizeof(raw));
  *static_cast<uint4*>(p) = raw;
}

__device__ __forceinline__ void Bf16x8ToFloat(const Bf16x8& v, float (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(v.h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ __forceinline__ Bf16x8 FloatToBf16x8(const float (&f)[8]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

inline bool IsAligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline unsigned CeilDiv(long long a, long long b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace tandem::cuda::internal

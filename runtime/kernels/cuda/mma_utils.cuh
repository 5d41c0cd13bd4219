#pragma once
// Private device helpers for tensor-core kernels of tandem_kernels_cuda (sm_80+ mma.sync and
// ldmatrix). Fragment layouts of mma.m16n8k16 (bf16 in, f32 accumulate), with g = lane / 4 and
// t = lane % 4:
//   A (16 x 16, row-major): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9],
//                           a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col"):      b0 = B[2t, 2t+1][g],  b1 = B[2t+8, 2t+9][g]
//   C (16 x 8):             c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda::internal {

__device__ __forceinline__ unsigned SharedAddress(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Two floats rounded to bf16 and packed (lo in the low half), as an mma operand register.
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// (lo, hi) split into bf16 high parts (packed into `high`) and the bf16-rounded remainders
// (packed into `low`): high + low carries about 16 significant bits of each float.
__device__ __forceinline__ void SplitBf16x2(float lo, float hi, uint32_t& high, uint32_t& low) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  const float2 hf = __bfloat1622float2(h);
  memcpy(&high, &h, sizeof(high));
  low = PackBf16x2(lo - hf.x, hi - hf.y);
}

// d += a * b for one m16n8k16 tile (row-major A, column-major B, f32 accumulators).
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 bf16 matrices from shared memory: lanes 8i .. 8i+7 give the 16-byte row addresses of
// matrix i; r[i] receives this lane's fragment of matrix i (row lane / 4, columns 2 (lane % 4)
// and + 1). The .trans form delivers the transposed matrices.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], unsigned smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row)
               : "memory");
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], unsigned smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row)
               : "memory");
}

}  // namespace tandem::cuda::internal

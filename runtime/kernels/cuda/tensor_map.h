#pragma once
// Host helpers for TMA tensor maps of the sm_90a kernels (tandem_kernels_sm90): the driver's
// cuTensorMapEncodeTiled reached through the runtime (no libcuda link), and the one map shape the
// kernels use, a row-major bf16 matrix read in 128-byte-swizzled boxes of 64 columns.

#include <cuda.h>  // CUtensorMap
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda::internal {

// cuTensorMapEncodeTiled from the driver, or null where the runtime cannot find it.
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A [rows, cols] row-major bf16 matrix (cols a multiple of 64, data 16-byte aligned) as a tensor
// map of 64-column x box_rows boxes, 128-byte swizzle; rows past `rows` read as zeros. False when
// the encoder is missing or refuses.
inline bool EncodeRowMajorBf16(CUtensorMap* map, const void* data, uint64_t rows, uint64_t cols,
                               uint32_t box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr || rows == 0) return false;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * 2};
  const cuuint32_t box[2] = {64, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides,
                box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace tandem::cuda::internal

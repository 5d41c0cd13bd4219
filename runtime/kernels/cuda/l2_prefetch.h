#pragma once
// A prefetch hint a small kernel carries for the kernel after it: before its PDL wait (the bytes
// are weights, which no kernel writes), it asks L2 for the first `bytes` of each of `rows` rows of
// a matrix, so that the next kernel (a cuBLASLt GEMM, which cannot start early under programmatic
// dependent launch) finds the first k-steps of its rows in L2 instead of waiting on HBM. One
// cp.async.bulk.prefetch.L2 per row, spread over the kernel's threads (compute capability 9.0 and
// up; ignored below). A hint only: no result depends on it. Plain C++ (kernels include it too).

#include <cstddef>
#include <cstdint>

namespace tandem::cuda {

struct L2Prefetch {
  const void* base = nullptr;  // device address of row 0, 16-byte aligned; null: no prefetch
  int rows = 0;                // >= 0
  size_t row_stride = 0;       // bytes between rows, a multiple of 16
  int bytes = 0;               // prefix of each row, a positive multiple of 16, <= row_stride
};

// Whether `p` is empty (null base) or meets the constraints above.
inline bool L2PrefetchValid(const L2Prefetch& p) {
  if (p.base == nullptr) return true;
  return reinterpret_cast<uintptr_t>(p.base) % 16 == 0 && p.rows >= 0 && p.row_stride % 16 == 0 &&
         p.bytes > 0 && p.bytes % 16 == 0 && static_cast<size_t>(p.bytes) <= p.row_stride;
}

}  // namespace tandem::cuda

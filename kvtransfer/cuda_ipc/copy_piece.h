#pragma once
// The unit the cuda_ipc copy kernel moves (shared by the host planner and the kernel; C++17, no
// other includes, so .cu files can include it).

#include <cstdint>

namespace tandem::kvtransfer::cuda_ipc {

// One range: three 64-bit fields, device addresses.
struct CopyPiece {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t bytes = 0;
};

// Largest piece: the kernel's CTAs take one piece at a time, so this bounds the load imbalance.
inline constexpr uint64_t kMaxPieceBytes = 64 * 1024;

}  // namespace tandem::kvtransfer::cuda_ipc

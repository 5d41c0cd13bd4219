#pragma once
// Host-side planning of the cuda_ipc backend, with no CUDA types (unit-tested without a GPU):
// the pieces one scatter-copy launch moves, and the bounds checks that keep every piece inside
// the two registered regions.
//
// Thread-safety: stateless functions.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtransfer/cuda_ipc/copy_piece.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer::cuda_ipc {

// The pieces moving `ops` from [src_base, src_base + src_length) to
// [dst_base, dst_base + dst_length): each op split into pieces of at most kMaxPieceBytes, in op
// order. Zero-length ops are dropped. InvalidArgument (naming the op) when an op lies outside
// either region (overflow-safe), or when two ops' destination ranges overlap (the kernel copies
// pieces concurrently, so overlapping writes would race).
absl::StatusOr<std::vector<CopyPiece>> PlanPieces(std::span<const CopyOp> ops, uint64_t src_base,
                                                  uint64_t src_length, uint64_t dst_base,
                                                  uint64_t dst_length);

}  // namespace tandem::kvtransfer::cuda_ipc

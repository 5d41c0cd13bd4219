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

// Validates `ops` against a source region of `src_length` bytes and a destination region of
// `dst_length` bytes and returns how many pieces (of at most kMaxPieceBytes) they make.
// InvalidArgument (naming the op) when an op lies outside either region (overflow-safe).
// Destinations may overlap: they all lie in the region the peer exported, so overlapping ops only
// scramble the peer's own bytes (the kernel copies pieces concurrently).
absl::StatusOr<size_t> CountPieces(std::span<const CopyOp> ops, uint64_t src_length,
                                   uint64_t dst_length);

// Writes the CountPieces(ops) pieces moving `ops` from `src_base` to `dst_base` into `out`, in op
// order (zero-length ops make none). Host memory only (the pinned upload buffer): no allocation.
void FillPieces(std::span<const CopyOp> ops, uint64_t src_base, uint64_t dst_base, CopyPiece* out);

// Both, into a vector (tests).
absl::StatusOr<std::vector<CopyPiece>> PlanPieces(std::span<const CopyOp> ops, uint64_t src_base,
                                                  uint64_t src_length, uint64_t dst_base,
                                                  uint64_t dst_length);

}  // namespace tandem::kvtransfer::cuda_ipc

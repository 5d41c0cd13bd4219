#include "kvtransfer/cuda_ipc/ipc_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::cuda_ipc {

absl::StatusOr<size_t> CountPieces(std::span<const CopyOp> ops, uint64_t src_length,
                                   uint64_t dst_length) {
  size_t pieces = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    if (op.length > src_length || op.local_offset > src_length - op.length ||
        op.length > dst_length || op.remote_offset > dst_length - op.length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda_ipc: op ", i, " (local ", op.local_offset, ", remote ", op.remote_offset,
          ", length ", op.length, ") lies outside the regions (local ", src_length,
          " bytes, remote ", dst_length, " bytes)"));
    }
    pieces += (op.length + kMaxPieceBytes - 1) / kMaxPieceBytes;
  }
  return pieces;
}

void FillPieces(std::span<const CopyOp> ops, uint64_t src_base, uint64_t dst_base, CopyPiece* out) {
  for (const CopyOp& op : ops) {
    for (uint64_t done = 0; done < op.length; done += kMaxPieceBytes) {
      out->src = src_base + op.local_offset + done;
      out->dst = dst_base + op.remote_offset + done;
      out->bytes = std::min<uint64_t>(kMaxPieceBytes, op.length - done);
      ++out;
    }
  }
}

absl::StatusOr<std::vector<CopyPiece>> PlanPieces(std::span<const CopyOp> ops, uint64_t src_base,
                                                  uint64_t src_length, uint64_t dst_base,
                                                  uint64_t dst_length) {
  absl::StatusOr<size_t> n = CountPieces(ops, src_length, dst_length);
  if (!n.ok()) return n.status();
  std::vector<CopyPiece> pieces(*n);
  FillPieces(ops, src_base, dst_base, pieces.data());
  return pieces;
}

}  // namespace tandem::kvtransfer::cuda_ipc

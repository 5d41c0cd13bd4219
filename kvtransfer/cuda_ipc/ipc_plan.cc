#include "kvtransfer/cuda_ipc/ipc_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kvtransfer/copy_ops.h"

namespace tandem::kvtransfer::cuda_ipc {

absl::StatusOr<size_t> CountPieces(std::span<const CopyOp> ops, uint64_t src_length,
                                   uint64_t dst_length) {
  const absl::Status in_regions = CheckOpsInRegions("cuda_ipc", ops, src_length, dst_length);
  if (!in_regions.ok()) return in_regions;
  size_t pieces = 0;
  for (const CopyOp& op : ops) pieces += (op.length + kMaxPieceBytes - 1) / kMaxPieceBytes;
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

#include "kvtransfer/cuda_ipc/ipc_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::cuda_ipc {

absl::StatusOr<std::vector<CopyPiece>> PlanPieces(std::span<const CopyOp> ops, uint64_t src_base,
                                                  uint64_t src_length, uint64_t dst_base,
                                                  uint64_t dst_length) {
  std::vector<std::pair<uint64_t, uint64_t>> dst_ranges;  // [begin, end) per op
  dst_ranges.reserve(ops.size());
  size_t num_pieces = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    if (op.length > src_length || op.local_offset > src_length - op.length ||
        op.length > dst_length || op.remote_offset > dst_length - op.length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda_ipc: op ", i, " (local ", op.local_offset, ", remote ", op.remote_offset,
          ", length ", op.length, ") lies outside the regions (local ", src_length,
          " bytes, remote ", dst_length, " bytes)"));
    }
    if (op.length == 0) continue;
    dst_ranges.emplace_back(op.remote_offset, op.remote_offset + op.length);
    num_pieces += (op.length + kMaxPieceBytes - 1) / kMaxPieceBytes;
  }
  std::sort(dst_ranges.begin(), dst_ranges.end());
  for (size_t i = 1; i < dst_ranges.size(); ++i) {
    if (dst_ranges[i].first < dst_ranges[i - 1].second) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc: two ops write overlapping remote ranges (at offset ",
                       dst_ranges[i].first, ")"));
    }
  }
  std::vector<CopyPiece> pieces;
  pieces.reserve(num_pieces);
  for (const CopyOp& op : ops) {
    for (uint64_t done = 0; done < op.length; done += kMaxPieceBytes) {
      pieces.push_back(CopyPiece{.src = src_base + op.local_offset + done,
                                 .dst = dst_base + op.remote_offset + done,
                                 .bytes = std::min<uint64_t>(kMaxPieceBytes, op.length - done)});
    }
  }
  return pieces;
}

}  // namespace tandem::kvtransfer::cuda_ipc

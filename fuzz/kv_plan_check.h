#pragma once
// Checks of what the KV planners (kvtransfer/kv_layout.h, kv_convert.h) return, shared by the
// kv_layout and worker_proto fuzzers, and the prefill worker's admission of a destination layout
// (KvSender::Admit / CheckDestination in kvtransfer/handoff/kv_sender.cc, which need a running
// transfer thread; the same calls to the same planners here).
//
// A layout's extent is the end of its last byte: (layers-1)*layer_stride + kv_stride +
// (blocks-1)*block_stride + block_bytes, computed in 128 bits. A plan the planners accept must
// lie inside the extents of both layouts, and the extents must be addressable (< 2^64): offsets
// that wrap around would name other memory than the layout describes.

#include <cstdint>
#include <span>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kvtransfer/kv_convert.h"
#include "kvtransfer/kv_layout.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::fuzz {

using u128 = unsigned __int128;

inline u128 Extent128(const kvtransfer::KvLayout& l) {
  return static_cast<u128>(l.num_layers - 1) * l.layer_stride + l.kv_stride +
         static_cast<u128>(l.num_blocks - 1) * l.block_stride + l.block_bytes;
}

// An accepted layout: its block_bytes is the true product of its dimensions and its extent fits
// in 64 bits.
inline void CheckAcceptedLayout(const kvtransfer::KvLayout& l) {
  FUZZ_CHECK(l.num_layers > 0 && l.num_blocks > 0 && l.block_size > 0 && l.num_kv_heads > 0 &&
             l.head_dim > 0 && l.elem_bytes > 0);
  const u128 product = static_cast<u128>(l.block_size) * static_cast<u128>(l.num_kv_heads) *
                       static_cast<u128>(l.head_dim) * static_cast<u128>(l.elem_bytes);
  FUZZ_CHECK(product == l.block_bytes);
  FUZZ_CHECK(Extent128(l) <= UINT64_MAX);
}

inline void CheckOpsInExtents(const kvtransfer::KvLayout& src, const kvtransfer::KvLayout& dst,
                              std::span<const kvtransfer::CopyOp> ops) {
  CheckAcceptedLayout(src);
  CheckAcceptedLayout(dst);
  const u128 src_end = Extent128(src);
  const u128 dst_end = Extent128(dst);
  for (const kvtransfer::CopyOp& op : ops) {
    FUZZ_CHECK(op.length > 0 && op.length % src.block_bytes == 0);
    FUZZ_CHECK(static_cast<u128>(op.local_offset) + op.length <= src_end);
    FUZZ_CHECK(static_cast<u128>(op.remote_offset) + op.length <= dst_end);
  }
}

inline void CheckPlanInExtents(const kvtransfer::KvLayout& src, const kvtransfer::KvLayout& dst,
                               const kvtransfer::ConversionPlan& plan) {
  CheckAcceptedLayout(src);
  CheckAcceptedLayout(dst);
  const u128 src_end = Extent128(src);
  const u128 dst_end = Extent128(dst);
  for (const kvtransfer::ConvertPiece& p : plan.pieces) {
    FUZZ_CHECK(p.rows > 0 && p.row_elems > 0);
    const u128 src_row = static_cast<u128>(p.row_elems) * plan.src_elem_bytes;
    const u128 dst_row = static_cast<u128>(p.row_elems) * plan.dst_elem_bytes;
    FUZZ_CHECK(p.src_offset + static_cast<u128>(p.rows - 1) * p.src_pitch + src_row <= src_end);
    FUZZ_CHECK(p.dst_offset + static_cast<u128>(p.rows - 1) * p.dst_pitch + dst_row <= dst_end);
  }
  // The planner's own bounds check (the one ConvertOnHost applies) agrees.
  FUZZ_CHECK(kvtransfer::CheckPiecesInBuffers(plan, static_cast<uint64_t>(src_end),
                                              static_cast<uint64_t>(dst_end))
                 .ok());
}

// KvSender::Admit: may KV of `local`'s format go to `target` at all?
inline absl::Status AdmitLayout(const kvtransfer::KvLayout& local,
                                const kvtransfer::KvLayout& target) {
  if (kvtransfer::SameBlockFormat(local, target)) {
    const std::vector<int32_t> one = {0};
    absl::StatusOr<std::vector<kvtransfer::CopyOp>> ops =
        kvtransfer::PlanBlockCopies(local, target, one, one, 1, 0);
    if (ops.ok()) CheckOpsInExtents(local, target, *ops);
    return ops.status();
  }
  return kvtransfer::CheckConvertible(local, target);
}

// KvSender::CheckDestination: the plan for a prompt of `num_tokens` into `block_ids`.
inline absl::Status CheckDestination(const kvtransfer::KvLayout& local,
                                     const kvtransfer::KvLayout& target,
                                     std::span<const int32_t> block_ids, int num_tokens,
                                     int num_cached_tokens) {
  if (absl::Status s = AdmitLayout(local, target); !s.ok()) return s;
  const int blocks = (num_tokens + local.block_size - 1) / local.block_size;
  const std::vector<int32_t> stand_in(blocks, 0);
  if (kvtransfer::SameBlockFormat(local, target)) {
    absl::StatusOr<std::vector<kvtransfer::CopyOp>> ops = kvtransfer::PlanBlockCopies(
        local, target, stand_in, block_ids, num_tokens, num_cached_tokens);
    if (ops.ok()) CheckOpsInExtents(local, target, *ops);
    return ops.status();
  }
  absl::StatusOr<kvtransfer::ConversionPlan> plan = kvtransfer::PlanKvConversion(
      local, target, stand_in, block_ids, num_tokens, num_cached_tokens, 0, local.num_layers);
  if (plan.ok()) CheckPlanInExtents(local, target, *plan);
  return plan.status();
}

}  // namespace tandem::fuzz

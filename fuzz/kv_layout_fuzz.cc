// The KV layout planners with arbitrary layouts and block ids: ValidateKvLayout, PlanBlockCopies,
// PlanLayerBlockCopies, CheckConvertible, PlanKvConversion, StageConversion and ConvertOnHost
// (kvtransfer/), then the backends' planning of what the ops become: CheckOpsInRegions,
// cuda_ipc::PlanPieces and nccl::PlanSegments.
//
// Input (FuzzedDataProvider): a mode byte, the source and destination layouts (each either a
// dense layout from small dimensions, with a chance of odd strides, or every field raw), block id
// lists, num_tokens, skip_tokens and a layer range. The source is the sender's own cache, so its
// layer count stays small (a peer cannot choose it: the planners require equal layer counts).
// Properties (__builtin_trap when violated): every planned op and piece lies inside both layouts'
// extents, which are addressable in 64 bits; a block copy plan moves exactly the blocks asked
// for, in order, at the offsets of the layout formula; the host conversion routine and the
// staged conversion stay inside buffers of exactly the extents (ASan checks the writes); the
// backends' piece and segment plans cover the ops byte for byte inside the regions.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "fuzz/kv_plan_check.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/cuda_ipc/ipc_plan.h"
#include "kvtransfer/kv_convert.h"
#include "kvtransfer/kv_layout.h"
#include "kvtransfer/nccl/nccl_protocol.h"

namespace {

using tandem::fuzz::Extent128;
using tandem::fuzz::u128;
using tandem::kvtransfer::CopyOp;
using tandem::kvtransfer::KvDtype;
using tandem::kvtransfer::KvLayout;

// Buffers are only allocated for layouts this small.
constexpr u128 kMaxBufferBytes = 1 << 20;

KvLayout MakeLayout(FuzzedDataProvider& in, const KvLayout* like, bool source) {
  KvLayout l;
  const uint8_t kind = in.ConsumeIntegral<uint8_t>();
  if ((kind & 3) == 3) {  // every field raw
    l.num_layers =
        source ? in.ConsumeIntegralInRange<int32_t>(-1, 64) : in.ConsumeIntegral<int32_t>();
    l.num_blocks = in.ConsumeIntegral<int32_t>();
    l.block_size = in.ConsumeIntegral<int32_t>();
    l.num_kv_heads = in.ConsumeIntegral<int32_t>();
    l.head_dim = in.ConsumeIntegral<int32_t>();
    l.elem_bytes = in.ConsumeIntegral<int32_t>();
    l.block_bytes = in.ConsumeIntegral<uint64_t>();
    l.layer_stride = in.ConsumeIntegral<uint64_t>();
    l.kv_stride = in.ConsumeIntegral<uint64_t>();
    l.block_stride = in.ConsumeIntegral<uint64_t>();
    l.dtype = static_cast<KvDtype>(in.ConsumeIntegralInRange<int32_t>(-1, 3));
    l.head_begin = in.ConsumeIntegral<int32_t>();
    l.total_kv_heads = in.ConsumeIntegral<int32_t>();
    return l;
  }
  // Dense [layer][kv][block] from small dimensions; `like` (the source) shares the model's shape.
  l.num_layers = like != nullptr && (kind & 4) == 0 ? like->num_layers
                                                    : in.ConsumeIntegralInRange<int32_t>(1, 8);
  l.num_blocks = in.ConsumeIntegralInRange<int32_t>(1, 64);
  l.block_size = in.ConsumeIntegralInRange<int32_t>(1, 32);
  l.head_dim = like != nullptr && (kind & 8) == 0 ? like->head_dim
                                                  : in.ConsumeIntegralInRange<int32_t>(1, 16);
  l.total_kv_heads = like != nullptr && (kind & 16) == 0
                         ? (like->total_kv_heads == 0 ? like->num_kv_heads : like->total_kv_heads)
                         : in.ConsumeIntegralInRange<int32_t>(0, 8);
  const int32_t total = std::max<int32_t>(l.total_kv_heads, 1);
  l.head_begin = in.ConsumeIntegralInRange<int32_t>(0, total - 1);
  l.num_kv_heads = in.ConsumeIntegralInRange<int32_t>(1, total - l.head_begin);
  if (l.total_kv_heads == 0) {  // 0 means "all": then the layout holds every head from 0
    l.head_begin = 0;
    l.total_kv_heads = 0;
  }
  switch ((kind >> 5) & 3) {
    case 0:
      l.dtype = KvDtype::kF32;
      l.elem_bytes = 4;
      break;
    case 1:
      l.dtype = KvDtype::kBf16;
      l.elem_bytes = 2;
      break;
    default:
      l.dtype = KvDtype::kRaw;
      l.elem_bytes = in.ConsumeIntegralInRange<int32_t>(1, 4);
      break;
  }
  l.block_bytes = static_cast<uint64_t>(l.block_size) * l.num_kv_heads * l.head_dim * l.elem_bytes;
  l.block_stride = l.block_bytes;
  l.kv_stride = l.block_stride * static_cast<uint64_t>(l.num_blocks);
  l.layer_stride = 2 * l.kv_stride;
  if ((kind & 128) != 0) {  // odd strides: gaps, overlaps, huge values
    l.block_stride = in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>()
                                      : l.block_bytes + in.ConsumeIntegralInRange<uint64_t>(0, 64);
    l.kv_stride = in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>() : l.kv_stride;
    l.layer_stride = in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>() : l.layer_stride;
  }
  return l;
}

std::vector<int32_t> MakeIds(FuzzedDataProvider& in, int32_t num_blocks) {
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 96);
  std::vector<int32_t> ids;
  const bool raw = in.ConsumeBool();
  for (size_t i = 0; i < n && in.remaining_bytes() > 0; ++i) {
    ids.push_back(raw ? in.ConsumeIntegral<int32_t>()
                      : in.ConsumeIntegralInRange<int32_t>(0, std::max(num_blocks, 1) - 1));
  }
  return ids;
}

// The block copy plan against the layout formula, block by block, in 128 bits.
void CheckExactBlockCopies(const KvLayout& src, const KvLayout& dst,
                           const std::vector<int32_t>& src_ids, const std::vector<int32_t>& dst_ids,
                           int num_tokens, int skip_tokens, int layer_begin, int layer_end,
                           const std::vector<CopyOp>& ops) {
  tandem::fuzz::CheckOpsInExtents(src, dst, ops);
  const size_t needed = (static_cast<size_t>(num_tokens) + src.block_size - 1) / src.block_size;
  const size_t first = static_cast<size_t>(skip_tokens) / src.block_size;
  auto offset = [](const KvLayout& l, int layer, int kv, int block) {
    return static_cast<u128>(layer) * l.layer_stride + static_cast<u128>(kv) * l.kv_stride +
           static_cast<u128>(block) * l.block_stride;
  };
  size_t op = 0;
  u128 covered = 0;  // bytes of ops[op] already matched
  for (int layer = layer_begin; layer < layer_end; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (size_t i = first; i < needed; ++i) {
        FUZZ_CHECK(op < ops.size());
        FUZZ_CHECK(ops[op].local_offset + covered == offset(src, layer, kv, src_ids[i]));
        FUZZ_CHECK(ops[op].remote_offset + covered == offset(dst, layer, kv, dst_ids[i]));
        covered += src.block_bytes;
        FUZZ_CHECK(covered <= ops[op].length);
        if (covered == ops[op].length) {
          ++op;
          covered = 0;
        }
      }
    }
  }
  FUZZ_CHECK(op == ops.size() && covered == 0);
}

// What the backends make of bounds-checked ops.
void CheckBackendPlans(const std::vector<CopyOp>& ops, uint64_t src_length, uint64_t dst_length,
                       uint64_t max_bytes, uint64_t max_ops) {
  FUZZ_CHECK(tandem::kvtransfer::CheckOpsInRegions("fuzz", ops, src_length, dst_length).ok());
  uint64_t total = 0;
  for (const CopyOp& op : ops) total += op.length;

  // Where the regions are mapped (a region never runs past the top of the address space).
  const uint64_t kSrcBase = std::min<uint64_t>(0x100000000ull, UINT64_MAX - src_length);
  const uint64_t kDstBase = std::min<uint64_t>(0x900000000ull, UINT64_MAX - dst_length);
  absl::StatusOr<std::vector<tandem::kvtransfer::cuda_ipc::CopyPiece>> pieces =
      tandem::kvtransfer::cuda_ipc::PlanPieces(ops, kSrcBase, src_length, kDstBase, dst_length);
  FUZZ_CHECK(pieces.ok());
  uint64_t piece_bytes = 0;
  for (const auto& p : *pieces) {
    FUZZ_CHECK(p.bytes > 0 && p.bytes <= tandem::kvtransfer::cuda_ipc::kMaxPieceBytes);
    FUZZ_CHECK(p.src >= kSrcBase && p.src - kSrcBase <= src_length &&
               p.bytes <= src_length - (p.src - kSrcBase));
    FUZZ_CHECK(p.dst >= kDstBase && p.dst - kDstBase <= dst_length &&
               p.bytes <= dst_length - (p.dst - kDstBase));
    piece_bytes += p.bytes;
  }
  FUZZ_CHECK(piece_bytes == total);

  const std::vector<tandem::kvtransfer::nccl::Segment> segments =
      tandem::kvtransfer::nccl::PlanSegments(ops, kSrcBase, 7, "done", max_bytes, max_ops);
  FUZZ_CHECK(!segments.empty());
  uint64_t segment_bytes = 0;
  for (const auto& s : segments) {
    FUZZ_CHECK(s.region == 7);
    FUZZ_CHECK(s.data_bytes <= max_bytes && s.ops.size() <= max_ops);
    FUZZ_CHECK(s.ops.size() == s.gather.size());
    uint64_t in_segment = 0;
    for (size_t i = 0; i < s.ops.size(); ++i) {
      const auto& w = s.ops[i];
      const auto& g = s.gather[i];
      FUZZ_CHECK(w.length > 0 && w.length == g.bytes);
      FUZZ_CHECK(w.remote_offset <= dst_length && w.length <= dst_length - w.remote_offset);
      FUZZ_CHECK(g.address >= kSrcBase && g.address - kSrcBase <= src_length &&
                 g.bytes <= src_length - (g.address - kSrcBase));
      FUZZ_CHECK(g.staging_offset == in_segment);
      in_segment += w.length;
    }
    FUZZ_CHECK(in_segment == s.data_bytes);
    segment_bytes += s.data_bytes;
  }
  FUZZ_CHECK(segment_bytes == total);
  FUZZ_CHECK(segments.back().notification == "done");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const uint8_t mode = in.ConsumeIntegral<uint8_t>();
  const KvLayout src = MakeLayout(in, nullptr, /*source=*/true);
  const KvLayout dst = MakeLayout(in, (mode & 1) != 0 ? &src : nullptr, /*source=*/false);
  const std::vector<int32_t> src_ids = MakeIds(in, src.num_blocks);
  const std::vector<int32_t> dst_ids = MakeIds(in, dst.num_blocks);
  const bool raw_counts = (mode & 2) != 0;
  // Prompts are bounded by the context limit; raw counts go a little past both ends.
  const int num_tokens =
      raw_counts ? in.ConsumeIntegralInRange(-4, 8192) : in.ConsumeIntegralInRange(0, 2048);
  const int skip_tokens = raw_counts ? in.ConsumeIntegralInRange(-4, 8196)
                                     : in.ConsumeIntegralInRange(0, std::max(num_tokens, 0));
  int layer_begin = in.ConsumeIntegralInRange(-1, 9);
  int layer_end = in.ConsumeIntegralInRange(-1, 9);
  if ((mode & 4) != 0) {  // whole model
    layer_begin = 0;
    layer_end = src.num_layers;
  }
  const uint64_t max_bytes = in.ConsumeIntegralInRange<uint64_t>(1, 1 << 20);
  const uint64_t max_ops = in.ConsumeIntegralInRange<uint64_t>(1, 64);

  const bool src_valid = tandem::kvtransfer::ValidateKvLayout(src).ok();
  const bool dst_valid = tandem::kvtransfer::ValidateKvLayout(dst).ok();
  if (src_valid) tandem::fuzz::CheckAcceptedLayout(src);
  if (dst_valid) tandem::fuzz::CheckAcceptedLayout(dst);

  // Byte copies (same block format).
  absl::StatusOr<std::vector<CopyOp>> whole =
      tandem::kvtransfer::PlanBlockCopies(src, dst, src_ids, dst_ids, num_tokens, skip_tokens);
  if (whole.ok()) {
    FUZZ_CHECK(src_valid && dst_valid && tandem::kvtransfer::SameBlockFormat(src, dst));
    CheckExactBlockCopies(src, dst, src_ids, dst_ids, num_tokens, skip_tokens, 0, src.num_layers,
                          *whole);
    CheckBackendPlans(*whole, static_cast<uint64_t>(Extent128(src)),
                      static_cast<uint64_t>(Extent128(dst)), max_bytes, max_ops);
  }
  absl::StatusOr<std::vector<CopyOp>> layers = tandem::kvtransfer::PlanLayerBlockCopies(
      src, dst, src_ids, dst_ids, num_tokens, skip_tokens, layer_begin, layer_end);
  if (layers.ok()) {
    CheckExactBlockCopies(src, dst, src_ids, dst_ids, num_tokens, skip_tokens, layer_begin,
                          layer_end, *layers);
  }

  // Conversion (any convertible pair).
  absl::StatusOr<tandem::kvtransfer::ConversionPlan> plan = tandem::kvtransfer::PlanKvConversion(
      src, dst, src_ids, dst_ids, num_tokens, skip_tokens, layer_begin, layer_end);
  if (!plan.ok()) return 0;
  FUZZ_CHECK(tandem::kvtransfer::CheckConvertible(src, dst).ok());
  tandem::fuzz::CheckPlanInExtents(src, dst, *plan);
  const tandem::kvtransfer::StagedConversion staged = tandem::kvtransfer::StageConversion(*plan);
  FUZZ_CHECK(staged.staging_bytes == tandem::kvtransfer::ConversionBytes(*plan));
  const u128 src_end = Extent128(src);
  const u128 dst_end = Extent128(dst);
  FUZZ_CHECK(tandem::kvtransfer::CheckOpsInRegions("staged", staged.ops, staged.staging_bytes,
                                                   static_cast<uint64_t>(dst_end))
                 .ok());
  if (src_end <= kMaxBufferBytes && dst_end <= kMaxBufferBytes &&
      staged.staging_bytes <= kMaxBufferBytes) {
    std::vector<char> s(static_cast<size_t>(src_end), 1);
    std::vector<char> d(static_cast<size_t>(dst_end));
    FUZZ_CHECK(
        tandem::kvtransfer::ConvertOnHost(*plan, s.data(), s.size(), d.data(), d.size()).ok());
    std::vector<char> staging(staged.staging_bytes);
    FUZZ_CHECK(tandem::kvtransfer::ConvertOnHost(staged.pack, s.data(), s.size(), staging.data(),
                                                 staging.size())
                   .ok());
    for (const CopyOp& op : staged.ops) {
      std::copy_n(staging.data() + op.local_offset, op.length, d.data() + op.remote_offset);
    }
    CheckBackendPlans(staged.ops, staged.staging_bytes, static_cast<uint64_t>(dst_end), max_bytes,
                      max_ops);
  }
  return 0;
}

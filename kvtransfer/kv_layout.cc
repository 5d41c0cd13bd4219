#include "kvtransfer/kv_layout.h"

#include <cstddef>
#include <limits>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {

absl::Status ValidateKvLayout(const KvLayout& layout) {
  if (layout.num_layers <= 0 || layout.num_blocks <= 0 || layout.block_size <= 0 ||
      layout.num_kv_heads <= 0 || layout.head_dim <= 0 || layout.elem_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout dimensions must be positive: layers=", layout.num_layers, " blocks=",
        layout.num_blocks, " block_size=", layout.block_size, " kv_heads=", layout.num_kv_heads,
        " head_dim=", layout.head_dim, " elem_bytes=", layout.elem_bytes));
  }
  // In 128 bits: a product of four int32 dimensions can wrap 64 bits and then match block_bytes.
  const absl::uint128 expected = absl::uint128(static_cast<uint64_t>(layout.block_size)) *
                                 static_cast<uint64_t>(layout.num_kv_heads) *
                                 static_cast<uint64_t>(layout.head_dim) *
                                 static_cast<uint64_t>(layout.elem_bytes);
  if (expected != layout.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("KV layout block_bytes ", layout.block_bytes,
                                                   " != block_size*heads*head_dim*elem_bytes (",
                                                   layout.block_size, "*", layout.num_kv_heads, "*",
                                                   layout.head_dim, "*", layout.elem_bytes, ")"));
  }
  if (layout.dtype != KvDtype::kRaw && layout.dtype != KvDtype::kF32 &&
      layout.dtype != KvDtype::kBf16) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout dtype ", static_cast<int>(layout.dtype), " is unknown"));
  }
  if (layout.dtype != KvDtype::kRaw && KvDtypeBytes(layout.dtype) != layout.elem_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("KV layout elem_bytes ", layout.elem_bytes,
                                                   " does not fit dtype ",
                                                   KvDtypeName(layout.dtype)));
  }
  const int64_t total = layout.total_kv_heads == 0 ? layout.num_kv_heads : layout.total_kv_heads;
  if (layout.head_begin < 0 || total <= 0 ||
      static_cast<int64_t>(layout.head_begin) + layout.num_kv_heads > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout heads [", layout.head_begin, ", ",
                     static_cast<int64_t>(layout.head_begin) + layout.num_kv_heads,
                     ") outside the model's ", total));
  }
  // Offsets never wrap: the end of the last block (the largest offset plus block_bytes) must be
  // addressable, or KvBlockOffset would name memory the layout does not describe.
  const absl::uint128 end =
      absl::uint128(static_cast<uint64_t>(layout.num_layers - 1)) * layout.layer_stride +
      layout.kv_stride +
      absl::uint128(static_cast<uint64_t>(layout.num_blocks - 1)) * layout.block_stride +
      layout.block_bytes;
  if (end > std::numeric_limits<uint64_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout strides (layer ", layout.layer_stride, ", kv ", layout.kv_stride,
                     ", block ", layout.block_stride, ") put the last of ", layout.num_layers,
                     " layers x ", layout.num_blocks, " blocks past 2^64 bytes"));
  }
  return absl::OkStatus();
}

int KvDtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kBf16:
      return 2;
    case KvDtype::kRaw:
      break;
  }
  return 0;
}

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kBf16:
      return "bf16";
    case KvDtype::kRaw:
      break;
  }
  return "raw";
}

bool SameBlockFormat(const KvLayout& a, const KvLayout& b) {
  const int32_t a_total = a.total_kv_heads == 0 ? a.num_kv_heads : a.total_kv_heads;
  const int32_t b_total = b.total_kv_heads == 0 ? b.num_kv_heads : b.total_kv_heads;
  return a.block_size == b.block_size && a.num_kv_heads == b.num_kv_heads &&
         a.head_begin == b.head_begin && a_total == b_total && a.head_dim == b.head_dim &&
         a.elem_bytes == b.elem_bytes && a.block_bytes == b.block_bytes &&
         (a.dtype == b.dtype || a.dtype == KvDtype::kRaw || b.dtype == KvDtype::kRaw);
}

absl::Status CheckBlockIds(std::span<const int32_t> ids, size_t needed, int32_t num_blocks,
                           const char* which) {
  if (ids.size() < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(which, " blocks: ", ids.size(), " ids given, ", needed, " needed"));
  }
  for (size_t i = 0; i < needed; ++i) {
    if (ids[i] < 0 || ids[i] >= num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(which, " block id ", ids[i], " at position ",
                                                     i, " is out of range [0, ", num_blocks, ")"));
    }
  }
  return absl::OkStatus();
}

uint64_t KvBlockOffset(const KvLayout& layout, int layer, int kv, int block) {
  return static_cast<uint64_t>(layer) * layout.layer_stride +
         static_cast<uint64_t>(kv) * layout.kv_stride +
         static_cast<uint64_t>(block) * layout.block_stride;
}

namespace {

absl::Status CheckCompatible(const KvLayout& src, const KvLayout& dst) {
  if (src.num_layers != dst.num_layers || !SameBlockFormat(src, dst)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layouts differ (byte copies cannot convert them): src (layers=", src.num_layers,
        " block_size=", src.block_size, " heads=[", src.head_begin, "+", src.num_kv_heads,
        "] head_dim=", src.head_dim, " ", KvDtypeName(src.dtype), "/", src.elem_bytes,
        ") vs dst (layers=", dst.num_layers, " block_size=", dst.block_size, " heads=[",
        dst.head_begin, "+", dst.num_kv_heads, "] head_dim=", dst.head_dim, " ",
        KvDtypeName(dst.dtype), "/", dst.elem_bytes, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

absl::StatusOr<std::vector<CopyOp>> Plan(const KvLayout& src, const KvLayout& dst,
                                         std::span<const int32_t> src_blocks,
                                         std::span<const int32_t> dst_blocks, int num_tokens,
                                         int skip_tokens, int layer_begin, int layer_end,
                                         bool merge_across_layers) {
  RETURN_IF_ERROR(ValidateKvLayout(src));
  RETURN_IF_ERROR(ValidateKvLayout(dst));
  RETURN_IF_ERROR(CheckCompatible(src, dst));
  if (num_tokens < 0 || skip_tokens < 0 || skip_tokens > num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 0 <= skip_tokens (", skip_tokens, ") <= num_tokens (", num_tokens, ")"));
  }
  const size_t needed = (static_cast<size_t>(num_tokens) + src.block_size - 1) / src.block_size;
  RETURN_IF_ERROR(CheckBlockIds(src_blocks, needed, src.num_blocks, "source"));
  RETURN_IF_ERROR(CheckBlockIds(dst_blocks, needed, dst.num_blocks, "destination"));
  // Block i holds tokens [i*bs, (i+1)*bs): wholly cached iff (i+1)*bs <= skip_tokens.
  const size_t first = static_cast<size_t>(skip_tokens) / src.block_size;
  if (layer_begin < 0 || layer_begin >= layer_end || layer_end > src.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", layer_begin, ", ", layer_end,
                                                   ") outside [0, ", src.num_layers, ")"));
  }

  std::vector<CopyOp> ops;
  if (needed > first) {
    ops.reserve(static_cast<size_t>(layer_end - layer_begin) * 2 * (needed - first));
  }
  for (int layer = layer_begin; layer < layer_end; ++layer) {
    const size_t layer_first_op = merge_across_layers ? 0 : ops.size();
    for (int kv = 0; kv < 2; ++kv) {
      for (size_t i = first; i < needed; ++i) {
        const CopyOp op{.local_offset = KvBlockOffset(src, layer, kv, src_blocks[i]),
                        .remote_offset = KvBlockOffset(dst, layer, kv, dst_blocks[i]),
                        .length = src.block_bytes};
        if (ops.size() > layer_first_op) {  // merge within the layer only
          CopyOp& last = ops.back();
          if (last.local_offset + last.length == op.local_offset &&
              last.remote_offset + last.length == op.remote_offset) {
            last.length += op.length;
            continue;
          }
        }
        ops.push_back(op);
      }
    }
  }
  return ops;
}

}  // namespace

absl::StatusOr<std::vector<CopyOp>> PlanBlockCopies(const KvLayout& src, const KvLayout& dst,
                                                    std::span<const int32_t> src_blocks,
                                                    std::span<const int32_t> dst_blocks,
                                                    int num_tokens, int skip_tokens) {
  return Plan(src, dst, src_blocks, dst_blocks, num_tokens, skip_tokens, 0, src.num_layers,
              /*merge_across_layers=*/true);
}

absl::StatusOr<std::vector<CopyOp>> PlanLayerBlockCopies(const KvLayout& src, const KvLayout& dst,
                                                         std::span<const int32_t> src_blocks,
                                                         std::span<const int32_t> dst_blocks,
                                                         int num_tokens, int skip_tokens,
                                                         int layer_begin, int layer_end) {
  return Plan(src, dst, src_blocks, dst_blocks, num_tokens, skip_tokens, layer_begin, layer_end,
              /*merge_across_layers=*/false);
}

}  // namespace tandem::kvtransfer

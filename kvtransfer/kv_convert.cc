#include "kvtransfer/kv_convert.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/float16.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {
namespace {

int32_t TotalHeads(const KvLayout& l) {
  return l.total_kv_heads == 0 ? l.num_kv_heads : l.total_kv_heads;
}

// [begin, end) of a piece's bytes on one side, overflow-safe; false when it does not fit.
bool Fits(uint64_t offset, uint64_t rows, uint64_t pitch, uint64_t row_bytes, uint64_t length) {
  if (rows == 0 || row_bytes == 0) return true;
  if (row_bytes > length || offset > length - row_bytes) return false;
  const uint64_t room = length - row_bytes - offset;  // for (rows - 1) * pitch
  return rows - 1 == 0 || pitch <= room / (rows - 1);
}

void ConvertRow(KvDtype from, KvDtype to, int from_bytes, const char* src, char* dst,
                uint64_t elems) {
  if (from == to) {
    std::memcpy(dst, src, elems * static_cast<uint64_t>(from_bytes));
    return;
  }
  if (from == KvDtype::kBf16 && to == KvDtype::kF32) {
    for (uint64_t i = 0; i < elems; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      const float f = Bf16ToFloat(h);
      std::memcpy(dst + 4 * i, &f, 4);
    }
    return;
  }
  // f32 -> bf16 (CheckConvertible admits nothing else).
  for (uint64_t i = 0; i < elems; ++i) {
    float f;
    std::memcpy(&f, src + 4 * i, 4);
    const uint16_t h = FloatToBf16(f);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

}  // namespace

absl::Status CheckConvertible(const KvLayout& src, const KvLayout& dst) {
  RETURN_IF_ERROR(ValidateKvLayout(src));
  RETURN_IF_ERROR(ValidateKvLayout(dst));
  const auto differ = [](const char* what, int64_t a, int64_t b) {
    return absl::InvalidArgumentError(absl::StrCat("KV layouts cannot be converted: ", what, " is ",
                                                   a, " at the source, ", b,
                                                   " at the destination"));
  };
  if (src.num_layers != dst.num_layers) return differ("num_layers", src.num_layers, dst.num_layers);
  if (src.head_dim != dst.head_dim) return differ("head_dim", src.head_dim, dst.head_dim);
  if (TotalHeads(src) != TotalHeads(dst)) {
    return differ("the model's KV heads", TotalHeads(src), TotalHeads(dst));
  }
  const bool typed = src.dtype != KvDtype::kRaw && dst.dtype != KvDtype::kRaw;
  const bool raw_same =
      src.dtype == KvDtype::kRaw && dst.dtype == KvDtype::kRaw && src.elem_bytes == dst.elem_bytes;
  if (!typed && !raw_same) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layouts cannot be converted: element types ", KvDtypeName(src.dtype), "/",
                     src.elem_bytes, " bytes to ", KvDtypeName(dst.dtype), "/", dst.elem_bytes,
                     " bytes (both sides must name f32 or bf16)"));
  }
  const int32_t begin = std::max(src.head_begin, dst.head_begin);
  const int32_t end =
      std::min(src.head_begin + src.num_kv_heads, dst.head_begin + dst.num_kv_heads);
  if (begin >= end) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layouts cannot be converted: the source holds heads [", src.head_begin,
                     ", ", src.head_begin + src.num_kv_heads, "), the destination [",
                     dst.head_begin, ", ", dst.head_begin + dst.num_kv_heads, "): none in common"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ConversionPlan> PlanKvConversion(const KvLayout& src, const KvLayout& dst,
                                                std::span<const int32_t> src_blocks,
                                                std::span<const int32_t> dst_blocks, int num_tokens,
                                                int skip_tokens, int layer_begin, int layer_end) {
  RETURN_IF_ERROR(CheckConvertible(src, dst));
  if (num_tokens < 0 || skip_tokens < 0 || skip_tokens > num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 0 <= skip_tokens (", skip_tokens, ") <= num_tokens (", num_tokens, ")"));
  }
  if (layer_begin < 0 || layer_begin >= layer_end || layer_end > src.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", layer_begin, ", ", layer_end,
                                                   ") outside [0, ", src.num_layers, ")"));
  }
  const auto blocks_for = [num_tokens](int block_size) {
    return (static_cast<size_t>(num_tokens) + block_size - 1) / block_size;
  };
  RETURN_IF_ERROR(CheckBlockIds(src_blocks, blocks_for(src.block_size), src.num_blocks, "source"));
  RETURN_IF_ERROR(
      CheckBlockIds(dst_blocks, blocks_for(dst.block_size), dst.num_blocks, "destination"));

  ConversionPlan plan;
  plan.src_dtype = src.dtype;
  plan.dst_dtype = dst.dtype;
  plan.src_elem_bytes = src.elem_bytes;
  plan.dst_elem_bytes = dst.elem_bytes;

  const int32_t h_begin = std::max(src.head_begin, dst.head_begin);
  const int32_t h_end =
      std::min(src.head_begin + src.num_kv_heads, dst.head_begin + dst.num_kv_heads);
  const uint64_t hd = static_cast<uint64_t>(src.head_dim);
  const uint64_t row_elems = static_cast<uint64_t>(h_end - h_begin) * hd;
  const uint64_t src_pitch = static_cast<uint64_t>(src.num_kv_heads) * hd * src.elem_bytes;
  const uint64_t dst_pitch = static_cast<uint64_t>(dst.num_kv_heads) * hd * dst.elem_bytes;
  const uint64_t src_head = static_cast<uint64_t>(h_begin - src.head_begin) * hd * src.elem_bytes;
  const uint64_t dst_head = static_cast<uint64_t>(h_begin - dst.head_begin) * hd * dst.elem_bytes;
  // Rows are back to back on both sides when each side's rows are exactly the common heads.
  const bool contiguous =
      row_elems * src.elem_bytes == src_pitch && row_elems * dst.elem_bytes == dst_pitch;

  const int first = (skip_tokens / dst.block_size) * dst.block_size;
  for (int layer = layer_begin; layer < layer_end; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      const size_t layer_first = plan.pieces.size();
      for (int t = first; t < num_tokens;) {
        const int s_slot = t % src.block_size;
        const int d_slot = t % dst.block_size;
        const int run =
            std::min({src.block_size - s_slot, dst.block_size - d_slot, num_tokens - t});
        ConvertPiece piece;
        piece.src_offset = KvBlockOffset(src, layer, kv, src_blocks[t / src.block_size]) +
                           static_cast<uint64_t>(s_slot) * src_pitch + src_head;
        piece.dst_offset = KvBlockOffset(dst, layer, kv, dst_blocks[t / dst.block_size]) +
                           static_cast<uint64_t>(d_slot) * dst_pitch + dst_head;
        if (contiguous) {
          piece.rows = 1;
          piece.row_elems = row_elems * static_cast<uint64_t>(run);
          piece.src_pitch = piece.row_elems * src.elem_bytes;
          piece.dst_pitch = piece.row_elems * dst.elem_bytes;
        } else {
          piece.rows = static_cast<uint64_t>(run);
          piece.row_elems = row_elems;
          piece.src_pitch = src_pitch;
          piece.dst_pitch = dst_pitch;
        }
        t += run;
        if (plan.pieces.size() > layer_first) {  // merge within one (layer, kv)
          ConvertPiece& last = plan.pieces.back();
          if (contiguous && last.src_offset + last.row_elems * src.elem_bytes == piece.src_offset &&
              last.dst_offset + last.row_elems * dst.elem_bytes == piece.dst_offset) {
            last.row_elems += piece.row_elems;
            last.src_pitch = last.row_elems * src.elem_bytes;
            last.dst_pitch = last.row_elems * dst.elem_bytes;
            continue;
          }
          if (!contiguous && last.src_pitch == piece.src_pitch &&
              last.dst_pitch == piece.dst_pitch &&
              last.src_offset + last.rows * last.src_pitch == piece.src_offset &&
              last.dst_offset + last.rows * last.dst_pitch == piece.dst_offset) {
            last.rows += piece.rows;
            continue;
          }
        }
        plan.pieces.push_back(piece);
      }
    }
  }
  return plan;
}

uint64_t ConversionBytes(const ConversionPlan& plan) {
  uint64_t bytes = 0;
  for (const ConvertPiece& p : plan.pieces) {
    bytes += p.rows * p.row_elems * static_cast<uint64_t>(plan.dst_elem_bytes);
  }
  return bytes;
}

absl::Status CheckPiecesInBuffers(const ConversionPlan& plan, uint64_t src_length,
                                  uint64_t dst_length) {
  if (plan.src_elem_bytes <= 0 || plan.dst_elem_bytes <= 0) {
    return absl::InvalidArgumentError("conversion plan without element sizes");
  }
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    const ConvertPiece& p = plan.pieces[i];
    if (!Fits(p.src_offset, p.rows, p.src_pitch, p.row_elems * plan.src_elem_bytes, src_length) ||
        !Fits(p.dst_offset, p.rows, p.dst_pitch, p.row_elems * plan.dst_elem_bytes, dst_length)) {
      return absl::InvalidArgumentError(
          absl::StrCat("conversion piece ", i, " (", p.rows, " rows of ", p.row_elems,
                       " elements) lies outside the source (", src_length,
                       " bytes) or the destination (", dst_length, " bytes)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ConvertOnHost(const ConversionPlan& plan, const void* src, uint64_t src_length,
                           void* dst, uint64_t dst_length) {
  RETURN_IF_ERROR(CheckPiecesInBuffers(plan, src_length, dst_length));
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (const ConvertPiece& p : plan.pieces) {
    for (uint64_t r = 0; r < p.rows; ++r) {
      ConvertRow(plan.src_dtype, plan.dst_dtype, plan.src_elem_bytes,
                 s + p.src_offset + r * p.src_pitch, d + p.dst_offset + r * p.dst_pitch,
                 p.row_elems);
    }
  }
  return absl::OkStatus();
}

StagedConversion StageConversion(const ConversionPlan& plan) {
  StagedConversion staged;
  staged.pack.src_dtype = plan.src_dtype;
  staged.pack.dst_dtype = plan.dst_dtype;
  staged.pack.src_elem_bytes = plan.src_elem_bytes;
  staged.pack.dst_elem_bytes = plan.dst_elem_bytes;
  staged.pack.pieces.reserve(plan.pieces.size());
  const uint64_t elem = static_cast<uint64_t>(plan.dst_elem_bytes);
  uint64_t at = 0;
  for (const ConvertPiece& p : plan.pieces) {
    const uint64_t row_bytes = p.row_elems * elem;
    ConvertPiece packed = p;
    packed.dst_offset = at;
    packed.dst_pitch = row_bytes;
    staged.pack.pieces.push_back(packed);
    for (uint64_t r = 0; r < p.rows; ++r) {
      const CopyOp op{
          .local_offset = at, .remote_offset = p.dst_offset + r * p.dst_pitch, .length = row_bytes};
      at += row_bytes;
      if (!staged.ops.empty()) {
        CopyOp& last = staged.ops.back();
        if (last.local_offset + last.length == op.local_offset &&
            last.remote_offset + last.length == op.remote_offset) {
          last.length += op.length;
          continue;
        }
      }
      staged.ops.push_back(op);
    }
  }
  staged.staging_bytes = at;
  return staged;
}

}  // namespace tandem::kvtransfer

#pragma once
// Layout conversion: moving a prompt's KV between two layouts that differ in block size, element
// type (f32 <-> bf16) or the range of KV heads each side holds (DESIGN.md "Devices per pool").
// PlanBlockCopies (kv_layout.h) covers layouts of the same block format with byte copies; this
// planner covers every convertible pair, with a CPU routine that converts and scatters (the GPU
// twin is kvtransfer/cuda_convert/, same plan, same result bit for bit).
//
// Semantics (the same as PlanBlockCopies where both apply): token t of the prompt lives in source
// block src_blocks[t / src.block_size] at slot t % src.block_size, and goes to destination block
// dst_blocks[t / dst.block_size] at slot t % dst.block_size. Tokens from the start of the first
// destination block not wholly inside the first `skip_tokens` (the destination's cached prefix)
// up to num_tokens are written, for layers [layer_begin, layer_end), K and V, and the model heads
// both sides hold (the intersection of the two head ranges: a tensor-parallel shard writes its own
// heads). Nothing else of the destination is touched. f32 -> bf16 rounds to nearest even (NaN
// stays a quiet NaN); bf16 -> f32 is exact.
//
// A plan is a list of ConvertPieces: `rows` rows of `row_elems` elements, row r at
// src_offset + r * src_pitch in the source region and dst_offset + r * dst_pitch in the
// destination region (bytes). Contiguous runs are collapsed to one row and adjacent pieces merged.
//
// Thread-safety: stateless functions, callable from any thread.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtransfer/kv_layout.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

struct ConvertPiece {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t rows = 0;
  uint64_t row_elems = 0;
  uint64_t src_pitch = 0;
  uint64_t dst_pitch = 0;
};

struct ConversionPlan {
  KvDtype src_dtype = KvDtype::kRaw;
  KvDtype dst_dtype = KvDtype::kRaw;
  int src_elem_bytes = 0;
  int dst_elem_bytes = 0;
  std::vector<ConvertPiece> pieces;
};

// OK when KV can be converted from `src` to `dst`: both valid, the same number of layers, head_dim
// and model KV heads, overlapping head ranges, and element types f32/bf16 on both sides (or the
// same raw element size). Otherwise InvalidArgument naming the first difference: such a pair is
// refused before any byte moves.
absl::Status CheckConvertible(const KvLayout& src, const KvLayout& dst);

// The pieces described in the header comment. InvalidArgument when CheckConvertible fails, a span
// holds too few ids (ceil(num_tokens / block_size) of each side), a used id is out of range, or
// num_tokens, skip_tokens or the layer range are out of range.
absl::StatusOr<ConversionPlan> PlanKvConversion(const KvLayout& src, const KvLayout& dst,
                                                std::span<const int32_t> src_blocks,
                                                std::span<const int32_t> dst_blocks, int num_tokens,
                                                int skip_tokens, int layer_begin, int layer_end);

// Destination bytes the plan writes.
uint64_t ConversionBytes(const ConversionPlan& plan);

// InvalidArgument naming the first piece outside a source of `src_length` or a destination of
// `dst_length` bytes (overflow-safe), or a plan without element sizes.
absl::Status CheckPiecesInBuffers(const ConversionPlan& plan, uint64_t src_length,
                                  uint64_t dst_length);

// The CPU routine: converts and scatters every piece from `src` into `dst`. InvalidArgument (and
// nothing written) when a piece lies outside either buffer.
absl::Status ConvertOnHost(const ConversionPlan& plan, const void* src, uint64_t src_length,
                           void* dst, uint64_t dst_length);

// For backends that only copy bytes: the sender converts into a packed local staging buffer
// (`pack`: the same pieces with destinations in the buffer, rows back to back) and then writes the
// buffer to the real destination with `ops` (local offsets in the buffer, remote offsets in the
// destination region; one op per contiguous destination run).
struct StagedConversion {
  ConversionPlan pack;
  std::vector<CopyOp> ops;
  uint64_t staging_bytes = 0;
};
StagedConversion StageConversion(const ConversionPlan& plan);

}  // namespace tandem::kvtransfer

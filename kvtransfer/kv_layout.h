#pragma once
// Layout planner: turns "the KV of these source blocks goes into those destination blocks" into
// the CopyOps a TransferBackend moves. Pure host logic over plain data (no proto, no backend): the
// caller converts proto KvLayout <-> KvLayout at its edge.
//
// Offsets (identical to proto tandem.v1.KvLayout): block b of layer l, K (kv=0) or V (kv=1),
// starts at l * layer_stride + kv * kv_stride + b * block_stride from the region base and is
// block_bytes long. In the returned CopyOps, local_offset is in the SOURCE layout (the initiator,
// a prefill worker, writes its own KV) and remote_offset in the DESTINATION layout.
//
// Thread-safety: stateless functions, callable from any thread.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

// Element type of the KV values (proto tandem.v1.KvDtype). kRaw: opaque elements of elem_bytes
// (a peer that does not say), which only a byte copy between equal layouts can move.
enum class KvDtype : int32_t { kRaw = 0, kF32 = 1, kBf16 = 2 };

struct KvLayout {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 0;    // tokens per block
  int32_t num_kv_heads = 0;  // heads held: [head_begin, head_begin + num_kv_heads)
  int32_t head_dim = 0;
  int32_t elem_bytes = 0;
  uint64_t block_bytes = 0;  // block_size * num_kv_heads * head_dim * elem_bytes
  uint64_t layer_stride = 0;
  uint64_t kv_stride = 0;
  uint64_t block_stride = 0;
  KvDtype dtype = KvDtype::kRaw;
  // The model's KV heads this layout holds (tensor-parallel shards hold a range): a token's row
  // in a block is [num_kv_heads][head_dim], head h of the model at index h - head_begin.
  int32_t head_begin = 0;
  int32_t total_kv_heads = 0;  // the model's KV heads; 0 = num_kv_heads (all of them)
};

// Bytes of one element of `dtype` (0 for kRaw).
int KvDtypeBytes(KvDtype dtype);
const char* KvDtypeName(KvDtype dtype);

// InvalidArgument unless every dimension is positive, block_bytes matches the dimensions, a typed
// dtype has its elem_bytes, the head range lies inside [0, total_kv_heads) and every block's bytes
// lie below 2^64 (offsets never wrap).
absl::Status ValidateKvLayout(const KvLayout& layout);

// True when KV moves between the two by byte copies of whole blocks (PlanBlockCopies): same block
// size, head range, head_dim and element size, and the same dtype or one side kRaw (a peer that
// does not say). Otherwise it needs conversion (kv_convert.h).
bool SameBlockFormat(const KvLayout& a, const KvLayout& b);

// InvalidArgument unless `ids` holds at least `needed` ids and each of the first `needed` is in
// [0, num_blocks); `which` ("source", "destination") names the side in the message.
absl::Status CheckBlockIds(std::span<const int32_t> ids, size_t needed, int32_t num_blocks,
                           const char* which);

// Byte offset of (layer, kv, block) in `layout`.
uint64_t KvBlockOffset(const KvLayout& layout, int layer, int kv, int block);

// CopyOps moving the KV of the first ceil(num_tokens / block_size) entries of `src_blocks`
// (source layout) into the same positions of `dst_blocks` (destination layout), for every layer
// and both K and V, skipping blocks that lie wholly inside the first `skip_tokens` tokens (a
// partially cached block IS written). Ranges adjacent in both layouts are merged into one op.
// Extra trailing block ids beyond those the tokens need are ignored.
// InvalidArgument when a layout is invalid, the layouts are incompatible (num_layers differ, or
// not SameBlockFormat), a span holds too few ids, a used id
// is out of [0, num_blocks), or num_tokens / skip_tokens are out of range
// (0 <= skip_tokens <= num_tokens).
absl::StatusOr<std::vector<CopyOp>> PlanBlockCopies(const KvLayout& src, const KvLayout& dst,
                                                    std::span<const int32_t> src_blocks,
                                                    std::span<const int32_t> dst_blocks,
                                                    int num_tokens, int skip_tokens);

// The same for layers [layer_begin, layer_end) only (layer-wise streaming: one call per layer
// whose KV is ready); ops never span two layers. InvalidArgument also for an empty or
// out-of-range layer range.
absl::StatusOr<std::vector<CopyOp>> PlanLayerBlockCopies(const KvLayout& src, const KvLayout& dst,
                                                         std::span<const int32_t> src_blocks,
                                                         std::span<const int32_t> dst_blocks,
                                                         int num_tokens, int skip_tokens,
                                                         int layer_begin, int layer_end);

}  // namespace tandem::kvtransfer

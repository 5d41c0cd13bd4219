#pragma once
// A checksum of a prompt's KV that does not depend on how it is stored: the prefill worker
// computes it over its source blocks, the decode worker over its destination blocks, and equal
// KV gives equal values whatever each side's block size, block ids, strides or held head range.
//
// What is hashed: for each layer in [layer_begin, layer_end), K then V, each token in
// [token_begin, token_end), each model head (absolute index) in [head_begin, head_end): that
// head's head_dim elements, their raw bytes in host byte order, as one stream. Token t lives in
// block block_ids[t / block_size] at slot t % block_size (kv_layout.h / kv_convert.h). The ranges
// are folded in too, so two sides that checksum different ranges disagree. Raw bytes: both sides
// must hold the same element format (after an f32 -> bf16 conversion, checksum the destination
// against a bf16 copy of the source, not the f32 source).
//
// The hash is a fast 64-bit non-cryptographic one, written here: it detects accidental
// corruption (any single changed word always changes it; other changes escape with probability
// about 2^-64), NOT tampering; it is no MAC.
//
// Thread-safety: a stateless function, callable from any thread.

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "kvtransfer/kv_layout.h"

namespace tandem::kvtransfer {

// `memory` is the base of the region `layout` describes (memory_bytes long, host memory).
// InvalidArgument, reading nothing, when the layout is invalid; the layer range is empty or
// outside [0, num_layers); the head range is empty or not inside the heads the layout holds;
// token_begin < 0 or token_end < token_begin; block_ids holds fewer than
// ceil(token_end / block_size) ids or one of those is out of [0, num_blocks); or a block the
// range reads ends past memory_bytes (or memory is null).
absl::StatusOr<uint64_t> KvChecksum(const KvLayout& layout, const void* memory, size_t memory_bytes,
                                    std::span<const int32_t> block_ids, int token_begin,
                                    int token_end, int head_begin, int head_end, int layer_begin,
                                    int layer_end);

}  // namespace tandem::kvtransfer

#pragma once
// Test helper: the KV layout of a dense bf16 pool, blocks back to back within K and V of each
// layer (the offsets of kv_layout.h), for tests that need a layout but not a particular stride.

#include <cstdint>

#include "kvtransfer/kv_layout.h"

namespace tandem::kvtransfer::testing {

inline KvLayout DenseBf16Layout(int layers, int blocks, int block_size, int kv_heads,
                                int head_dim) {
  KvLayout l;
  l.num_layers = layers;
  l.num_blocks = blocks;
  l.block_size = block_size;
  l.num_kv_heads = kv_heads;
  l.head_dim = head_dim;
  l.elem_bytes = 2;
  l.dtype = KvDtype::kBf16;
  l.block_bytes = static_cast<uint64_t>(block_size) * kv_heads * head_dim * l.elem_bytes;
  l.block_stride = l.block_bytes;
  l.kv_stride = l.block_stride * blocks;
  l.layer_stride = 2 * l.kv_stride;
  return l;
}

// Bytes of the whole pool.
inline uint64_t LayoutBytes(const KvLayout& l) { return l.layer_stride * l.num_layers; }

}  // namespace tandem::kvtransfer::testing

#pragma once
// Private to the prefill attention kernels (prefill_attention.cu, mma.sync;
// prefill_attention_sm90.cu, wgmma): their common launch parameters, built once by
// LaunchPrefillAttentionRaw, and the pieces of the online softmax both use.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem::cuda::internal {

constexpr float kLog2e = 1.4426950408889634f;
// A row's exponent base is raised to its running maximum (log2 domain) only when a tile's maximum
// exceeds the base by more than this, so exponentials stay <= 2^kRescaleSlack and O is rescaled
// only on such tiles (rarely after a row's first tile).
constexpr float kRescaleSlack = 8.0f;

struct PrefillParams {
  const __nv_bfloat16* q;
  int q_row_stride;
  bool q_vector;    // q is 16-byte aligned and q_row_stride a multiple of 8
  bool out_vector;  // out is 4-byte aligned
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  int block_size;
  int block_shift;  // log2(block_size) when it is a power of two, else -1
  int num_kv_heads;
  const int32_t* block_tables;
  int max_blocks_per_seq;
  const int32_t* seq_start_rows;
  const int32_t* start_pos;
  int num_heads;
  int group;
  float scale_log2;
  __nv_bfloat16* out;
};

// The query tile a prefill CTA owns: grid (head or head group, sequence, query tile), heaviest
// tiles (the last, with the most keys) first. False when the tile starts past the sequence's new
// tokens (the CTA has nothing to do).
struct PrefillTile {
  int seq;
  int row_begin;  // the sequence's first row in q / out
  int num_new;    // its new tokens
  int q0;         // the tile's first new token
  int start;      // cached tokens before the new ones
};
__device__ __forceinline__ bool LocatePrefillTile(const PrefillParams& p, int block_m,
                                                  PrefillTile& t) {
  t.seq = blockIdx.y;
  t.row_begin = p.seq_start_rows[t.seq];
  t.num_new = p.seq_start_rows[t.seq + 1] - t.row_begin;
  t.q0 = (gridDim.z - 1 - blockIdx.z) * block_m;
  if (t.q0 >= t.num_new) return false;
  t.start = p.start_pos[t.seq];
  return true;
}

inline PrefillParams MakePrefillParams(const void* q, int q_row_stride, const PagedLayerView& kv,
                                       const int32_t* seq_start_rows, const int32_t* start_pos,
                                       int num_heads, float scale, void* out) {
  PrefillParams p;
  p.q = static_cast<const __nv_bfloat16*>(q);
  p.q_row_stride = q_row_stride;
  p.q_vector = reinterpret_cast<uintptr_t>(q) % 16 == 0 && q_row_stride % 8 == 0;
  p.out_vector = reinterpret_cast<uintptr_t>(out) % 4 == 0;
  p.k = static_cast<const __nv_bfloat16*>(kv.k);
  p.v = static_cast<const __nv_bfloat16*>(kv.v);
  p.block_size = kv.block_size;
  p.block_shift = -1;
  for (int shift = 0; shift < 31; ++shift) {
    if ((1 << shift) == kv.block_size) p.block_shift = shift;
  }
  p.num_kv_heads = kv.num_kv_heads;
  p.block_tables = kv.block_tables;
  p.max_blocks_per_seq = kv.max_blocks_per_seq;
  p.seq_start_rows = seq_start_rows;
  p.start_pos = start_pos;
  p.num_heads = num_heads;
  p.group = num_heads / kv.num_kv_heads;
  p.scale_log2 = scale * kLog2e;
  p.out = static_cast<__nv_bfloat16*>(out);
  return p;
}

__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The wgmma kernel of prefill_attention_sm90.cu (its own sm_90a target): head_dim 128, p.q_vector
// and p.out_vector, compute capability 9.0 (LaunchPrefillAttentionRaw checks all of it first).
// num_slots (the cache's rows, num_blocks * block_size; 0 if unknown) bounds the TMA tensor maps
// of its warp-specialized variant.
cudaError_t LaunchPrefillAttentionSm90(const PrefillParams& p, int num_seqs, int max_new_tokens,
                                       int64_t num_slots, cudaStream_t stream);

}  // namespace tandem::cuda::internal

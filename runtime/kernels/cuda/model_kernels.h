#pragma once
// Host launchers for the CUDA model kernels of the forward pass (embedding, RoPE, KV append,
// SiLU-mul, paged decode and prefill attention, argmax). RMSNorm is in norm_kernels.h.
// No CUDA types here: `stream` is a cudaStream_t passed as void* (Stream::native from
// runtime/device/device.h; null is the legacy default stream), so host code includes this without
// the CUDA toolkit's headers.
//
// Numerics: activations, weights and KV are bf16 (passed as void*), accumulation is float32.
// Every pointer below is device memory unless marked host; all arrays are row-major and dense
// unless a stride is given. Ids, positions, slots and block ids are int32.
// Launchers only queue work: they allocate nothing and do not synchronize, so they are safe to
// capture in a CUDA graph. Buffers are caller-owned and must stay valid until the stream has run
// the kernel. Device-side contents (ids, positions, block tables, lengths) are trusted: the
// launchers check shapes and pointers on the host, not the values inside device arrays (an
// out-of-range id or block id is undefined behaviour, as in the CPU reference).
// Failure: a bad argument returns kInvalidArgument before anything is queued; a launch failure
// returns the CUDA error as a status (cuda_status.h) and leaves the outputs unspecified.
// Thread-safety: launchers are reentrant; the stream's owner calls them (device.h contract).

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "runtime/kernels/cuda/decode_attention_tuning.h"

namespace tandem::cuda {

// The paged KV cache of all layers. k and v are each, per layer,
// [num_blocks][block_size][num_kv_heads][head_dim] bf16; layer l starts at k + l * layer_stride
// (elements). A sequence's position p lives in block block_table[p / block_size], slot
// p % block_size. With one allocation in KvCacheLayout's order ([layer][k|v][block], strides in
// bytes, elem_bytes 2), use k = base, v = (char*)base + kv_stride, layer_stride =
// layout.layer_stride / 2 (elements).
struct PagedKvCache {
  void* k = nullptr;
  void* v = nullptr;
  int num_layers = 0;
  int num_blocks = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  // Elements between consecutive layers of k (and of v); 0 means dense:
  // num_blocks * block_size * num_kv_heads * head_dim.
  size_t layer_stride = 0;
};

// The k and v of one layer of the cache: [num_blocks * block_size, num_kv_heads, head_dim].
void* KvCacheLayerK(const PagedKvCache& cache, int layer);
void* KvCacheLayerV(const PagedKvCache& cache, int layer);

// Writes `value` to `counter` (host-mapped pinned memory, by its device address) once every
// earlier launch on `stream` has completed: the layer progress of layer-wise KV streaming
// (model_runner.h, kv_progress). A plain launch, so it is a full dependency for what follows.
absl::Status LaunchStoreProgress(uint64_t* counter, uint64_t value, void* stream);

// out[r, :] = table[ids[r], :] for r in [0, n).
// ids: [n] in [0, vocab); table: bf16 [vocab, hidden]; out: bf16 [n, hidden].
absl::Status LaunchEmbedding(const int32_t* ids, const void* table, int n, int hidden, int vocab,
                             void* out, void* stream);

// Rotates q and k heads of the fused qkv rows in place, neox style (HF rotate_half), as
// cpu::ApplyRope: with h = head_dim / 2, angle = float(positions[r]) * inv_freq[i] (float32),
// cos/sin in float32:
//   y[i] = x[i] * c - x[i + h] * s;   y[i + h] = x[i + h] * c + x[i] * s.
// qkv: bf16 [n, (num_heads + 2 * num_kv_heads) * head_dim], q heads then k heads then v heads
// (v untouched). positions: [n]. inv_freq: float32 [head_dim / 2], computed on the host with
// cpu::RopeInvFreq (llama3 scaling included). head_dim even.
absl::Status LaunchRope(void* qkv, const int32_t* positions, const float* inv_freq, int n,
                        int num_heads, int num_kv_heads, int head_dim, void* stream);

// Copies the k and v heads of each qkv row into the cache of `layer`:
//   cache.k[layer][slot / block_size][slot % block_size] = k heads of row r (same for v),
// slot = slot_mapping[r] = block_id * block_size + offset. qkv: as in LaunchRope, with
// cache.num_kv_heads and cache.head_dim. A negative slot skips the row (padding).
absl::Status LaunchKvAppend(const void* qkv, const int32_t* slot_mapping, int n, int num_heads,
                            const PagedKvCache& cache, int layer, void* stream);

// LaunchRope followed by LaunchKvAppend (same arguments, same results bit for bit in qkv and in
// the cache) in one kernel: the decode step's per-layer launch count is what bounds small batches.
absl::Status LaunchRopeKvAppend(void* qkv, const int32_t* positions, const float* inv_freq,
                                const int32_t* slot_mapping, int n, int num_heads,
                                const PagedKvCache& cache, int layer, void* stream);

// The QKV projection of one to kGemvMaxRows tokens (the GEMV of gemv_kernels.h: qkv = x · w^T
// + bias, bf16) with the RoPE and KV append of LaunchRopeKvAppend fused into its epilogue, in one
// launch: each CTA owns one rotation pair (i, i + head_dim / 2) of one head. Bit-identical to
// LaunchGemv followed by LaunchRopeKvAppend (the same bf16 rounding, then the same rotation
// arithmetic). x: bf16 [m, hidden], 16-byte aligned; w: bf16 [(num_heads + 2 * kv heads) *
// head_dim, hidden], 16-byte aligned; bias: bf16 [that], or null; qkv: bf16 [m, that] (written
// rotated); hidden a positive multiple of 8.
absl::Status LaunchQkvGemvRopeKvAppend(const void* x, const void* w, const void* bias, int m,
                                       int hidden, void* qkv, const int32_t* positions,
                                       const float* inv_freq, const int32_t* slot_mapping,
                                       int num_heads, const PagedKvCache& cache, int layer,
                                       void* stream);

// out[r, i] = silu(gate[r, i]) * up[r, i], silu(g) = g / (1 + exp(-g)), in float32.
// gate_up: bf16 [n, 2 * inter], the gate half then the up half of each row; out: bf16 [n, inter].
absl::Status LaunchSiluMul(const void* gate_up, int n, int inter, void* out, void* stream);

// One new token per sequence attending to its whole cached context (its own KV already appended),
// as cpu::PagedAttention with rows = 1, start_pos = context_len - 1. GQA: query head h reads KV
// head h / (num_heads / cache.num_kv_heads). Flash-decoding: the context is split into chunks
// handled by separate CTAs when the batch alone does not fill the GPU, with partial results in
// `workspace` merged by a second kernel. One CTA per
// (sequence, KV head, split) reads each KV block once for all query heads of the group (up to 16;
// larger groups take several CTAs); for head_dim 128 at contexts up to 1K, a batch that needs 2-4
// waves of such CTAs runs as one wave whose CTAs take 2-4 (sequence, KV head) items in turn
// (PlanDecodeSplits in model_kernels_internal.h). From 2 sequences up the cache is read with an
// evict-first L2 policy. `tuning` (decode_attention_tuning.h) moves the split target and floor,
// the chain length and the L2 policy; a field out of its range returns kInvalidArgument.
// Attention supports head_dim 32, 64 and 128 (others return kInvalidArgument) and any
// block_size >= 1.
struct DecodeAttentionArgs {
  const void* q = nullptr;  // bf16 [num_seqs, q_row_stride]; row s holds [num_heads, head_dim]
  int q_row_stride = 0;     // elements between rows, >= num_heads * head_dim
  const PagedKvCache* cache = nullptr;  // host struct; its k/v pointers are device memory
  int layer = 0;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  // [num_seqs]: tokens in cache incl. the new one; 0 (a padding row) writes zeros, reads nothing
  const int32_t* context_lens = nullptr;
  int num_seqs = 0;
  int num_heads = 0;  // query heads; a multiple of cache->num_kv_heads
  float scale = 0.0f;
  void* out = nullptr;        // bf16 [num_seqs, num_heads * head_dim]
  void* workspace = nullptr;  // f32 scratch, DecodeAttentionWorkspaceBytes(...) bytes
  size_t workspace_bytes = 0;
  // Host hint, >= every context_lens[s]: sets the split count (a CUDA graph captured with the
  // largest context it will see stays valid; splits past a shorter context exit at once). A
  // smaller hint still gives right results, only fewer splits.
  int max_context_len = 0;
  DecodeAttentionTuning tuning;  // host values; the defaults are the measured choices
};
absl::Status LaunchPagedDecodeAttention(const DecodeAttentionArgs& args, void* stream);
// Workspace bytes LaunchPagedDecodeAttention needs for these sizes and this tuning (the launch's
// DecodeAttentionArgs::tuning): a bound that never decreases as num_seqs or max_context_len grow,
// so one workspace sized for the largest batch and context serves every smaller launch (0 when
// the context is too short to split). Host values only.
size_t DecodeAttentionWorkspaceBytes(int num_seqs, int num_heads, int head_dim, int max_context_len,
                                     const DecodeAttentionTuning& tuning);

// Causal attention of each sequence's new tokens over its paged KV (cached prefix plus the new
// tokens, whose KV is already appended), as cpu::PagedAttention per sequence: sequence s has
// rows [seq_start_rows[s], seq_start_rows[s + 1]) of q, at positions start_pos[s] + i; query i
// sees keys [0, start_pos[s] + i].
struct PrefillAttentionArgs {
  const void* q = nullptr;  // bf16 [total_rows, q_row_stride]; row r holds [num_heads, head_dim]
  int q_row_stride = 0;     // elements, >= num_heads * head_dim
  const PagedKvCache* cache = nullptr;  // host struct; its k/v pointers are device memory
  int layer = 0;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const int32_t* seq_start_rows = nullptr;  // [num_seqs + 1], cumulative, [0] = 0
  const int32_t* start_pos = nullptr;       // [num_seqs]
  int num_seqs = 0;
  int max_new_tokens = 0;  // host: >= every seq_start_rows[s + 1] - seq_start_rows[s]
  int num_heads = 0;       // a multiple of cache->num_kv_heads
  float scale = 0.0f;
  void* out = nullptr;  // bf16 [total_rows, num_heads * head_dim]
};
absl::Status LaunchPrefillAttention(const PrefillAttentionArgs& args, void* stream);

// out[r] = index of the largest logits[r, :], the smallest such index on ties (cpu::Argmax).
// logits: float32 [rows, vocab]; out: [rows].
absl::Status LaunchArgmax(const float* logits, int rows, int vocab, int32_t* out, void* stream);

}  // namespace tandem::cuda

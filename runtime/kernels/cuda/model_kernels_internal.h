#pragma once
// Private to tandem_kernels_cuda: the raw launchers in the .cu files, which model_kernels.cc wraps
// with argument checks and absl::Status. Kept free of absl so nvcc compiles only CUDA code.
// Preconditions are the ones model_kernels.cc checks (non-null pointers, valid shapes, n > 0,
// supported head dims, 16-byte aligned KV cache). Each returns cudaGetLastError() after its
// launches.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tandem::cuda {
struct DecodeAttentionTuning;  // decode_attention_tuning.h (C++20: host code only)
}  // namespace tandem::cuda

namespace tandem::cuda::internal {

// A plain (non-programmatic) launch: `*counter = value` once all earlier work of `stream` is done.
cudaError_t LaunchStoreProgressRaw(uint64_t* counter, uint64_t value, cudaStream_t stream);

cudaError_t LaunchEmbeddingRaw(const int32_t* ids, const void* table, int n, int hidden, void* out,
                               cudaStream_t stream);

cudaError_t LaunchRopeRaw(void* qkv, const int32_t* positions, const float* inv_freq, int n,
                          int num_heads, int num_kv_heads, int head_dim, cudaStream_t stream);

// RoPE, then (k_layer non-null) the KV append of LaunchKvAppendRaw, in one launch.
cudaError_t LaunchRopeKvRaw(void* qkv, const int32_t* positions, const float* inv_freq, int n,
                            int num_heads, int num_kv_heads, int head_dim,
                            const int32_t* slot_mapping, void* k_layer, void* v_layer,
                            cudaStream_t stream);

// k_layer / v_layer: the layer's cache, [num_blocks * block_size, num_kv_heads * head_dim].
cudaError_t LaunchKvAppendRaw(const void* qkv, const int32_t* slot_mapping, int n, int num_heads,
                              int num_kv_heads, int head_dim, void* k_layer, void* v_layer,
                              cudaStream_t stream);

cudaError_t LaunchSiluMulRaw(const void* gate_up, int n, int inter, void* out, cudaStream_t stream);

cudaError_t LaunchArgmaxRaw(const float* logits, int rows, int vocab, int32_t* out,
                            cudaStream_t stream);

// The attention kernels' view of one layer's paged cache and tables.
struct PagedLayerView {
  const void* k = nullptr;  // this layer's [num_blocks, block_size, num_kv_heads, head_dim]
  const void* v = nullptr;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;                       // 32, 64 or 128
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  int64_t num_slots = 0;  // num_blocks * block_size: the cache rows (0: unknown)
};

// Tokens per decode-attention tile; a split's partition is a multiple of it.
constexpr int kDecodeTileTokens = 64;
// A split covers at least this many tokens by default (DecodeAttentionTuning::min_split_tokens):
// shorter ones cost more in the merge and in per-CTA start-up than they gain in parallelism
// (H200, Llama-3-8B shape: batch 1 at 8K is 4.62 ms with 32 splits of 256 tokens against 4.83
// with 64 of 128; batch 1 and 8 at 1K are faster with 4-8 splits than with 8-16 of one tile;
// bench/RESULTS.md).
constexpr int kDecodeMinSplitTokens = 4 * kDecodeTileTokens;

// The split-K plan of one decode launch: a function of host values only.
struct DecodeSplitPlan {
  int num_splits = 1;      // context chunks per sequence (1: no merge pass)
  int partition_size = 0;  // tokens per chunk (multiple of the kernel's tile); the last chunk
                           // also takes any tokens beyond num_splits * partition_size
  int chain = 1;  // (sequence, KV head) items per CTA, taken in turn (1: one each); at most
                  // kDecodeMaxChain
};
// Splits = min(ceil(tuning.split_target / (num_seqs * num_heads)),
//              ceil(max_context_len / tuning.min_split_tokens)), at least 1; with num_sms > 0
// (and num_kv_heads, whose count the CTAs follow) raised, up to the same target and to splits of
// one tile, to the fewest that give each SM a CTA: ceil(num_sms / (num_seqs * num_kv_heads)).
// (H200, Llama-3-8B shape, batch 1 at 1K: 16 splits of 64 tokens, 128 CTAs, 4.009 ms against
// 4.060 with 4 splits of 256; longer contexts and larger batches keep the 256-token floor, which
// measured faster there: bench/RESULTS.md.)
//
// Chaining (one split only, num_sms and num_kv_heads known, contexts of at most
// kDecodeChainMaxContext tokens): when the (sequence, KV head) items are more than
// kDecodeChainCtasPerSm CTAs per SM can hold at once but at most kDecodeMaxChain times that, each
// CTA takes chain = ceil(items / (kDecodeChainCtasPerSm * num_sms)) items, so the grid is one wave
// and each CTA streams its items back to back (the next item's first tiles load while the last
// one's warps merge) instead of every CTA filling and draining its own pipeline. Measured (H200,
// Llama-3-8B shape, against one item per CTA in the same binary; bench/RESULTS.md, tenth session):
// at 1K, batch 48 / 64 / 128 (chains of 2 / 2 / 4) 0.6 / 0.9 / 0.3% faster, batch 256 (8) 0.3%
// slower; at 2K the same or slower (batch 48 +0.7%), at 8K slower (eighth session: +0.8%).
// The launcher chains only head_dim 128 (Llama-3.2-1B's 64 at batch 64, 1K: 3% slower chained).
// tuning.max_chain lowers kDecodeMaxChain; 0 or 1 turns chaining off.
// num_kv_heads and num_sms may be 0 (unknown: no raise, no chaining); `tuning` must be valid
// (DecodeAttentionTuningValid).
constexpr int kDecodeChainCtasPerSm = 2;
constexpr int kDecodeMaxChain = 4;
constexpr int kDecodeChainMaxContext = 1024;
DecodeSplitPlan PlanDecodeSplits(int num_seqs, int num_heads, int max_context_len, int num_kv_heads,
                                 int num_sms, const DecodeAttentionTuning& tuning);
// Workspace bytes for a plan: partial outputs [num_seqs, num_heads, num_splits, head_dim] and
// (max, sum) pairs [num_seqs, num_heads, num_splits, 2], f32. 0 when num_splits == 1.
size_t DecodeWorkspaceBytesForPlan(const DecodeSplitPlan& plan, int num_seqs, int num_heads,
                                   int head_dim);

// Whether a plan's chain > 1 runs the chained kernel (head_dim 128 only) for this head_dim and
// group (query heads per KV head) on the current device; otherwise the launch takes one item per
// CTA (same results).
bool DecodeChainRuns(int head_dim, int group);
cudaError_t LaunchDecodeAttentionRaw(const void* q, int q_row_stride, const PagedLayerView& kv,
                                     const int32_t* context_lens, int num_seqs, int num_heads,
                                     float scale, void* out, void* workspace,
                                     const DecodeSplitPlan& plan, bool evict_first,
                                     cudaStream_t stream);

// With allow_wgmma, head_dim 128 takes the wgmma kernel (prefill_attention_sm90.cu) on compute
// capability 9.0 when the q and out rows are 16-byte aligned; everything else, and every launch
// without it (the portable kernel's own test on such a GPU), takes the mma.sync kernel.
cudaError_t LaunchPrefillAttentionRaw(const void* q, int q_row_stride, const PagedLayerView& kv,
                                      const int32_t* seq_start_rows, const int32_t* start_pos,
                                      int num_seqs, int max_new_tokens, int num_heads, float scale,
                                      void* out, bool allow_wgmma, cudaStream_t stream);

}  // namespace tandem::cuda::internal

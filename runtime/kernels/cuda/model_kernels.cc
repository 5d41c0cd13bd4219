#include "runtime/kernels/cuda/model_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/gemv_internal.h"
#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem::cuda {
namespace {

// Grid y and z dimensions (sequences, heads) are limited to 65535.
constexpr int kMaxGridYZ = 65535;
// The tuning header (C++20, which the .cu files cannot include, so not the internal header either)
// repeats the kernels' constants: they must agree. Flash-decoding's default target of 2048
// (sequence, query head, split) work items is enough CTAs to fill an H100/H200 several times over
// whatever the GQA group.
static_assert(kDecodeSplitTokensStep == internal::kDecodeTileTokens);
static_assert(kDecodeChainMax == internal::kDecodeMaxChain);
static_assert(DecodeAttentionTuning{}.min_split_tokens == internal::kDecodeMinSplitTokens);
static_assert(DecodeAttentionTuning{}.max_chain == internal::kDecodeMaxChain);
static_assert(DecodeAttentionTuningValid(DecodeAttentionTuning{}));

cudaStream_t Native(void* stream) { return static_cast<cudaStream_t>(stream); }

// SMs of the current device, queried once (the process uses one device type); 0 if unknown.
int DeviceSmCount() {
  static const int sms = [] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return count;
  }();
  return sms;
}

int64_t CeilDiv64(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

size_t DenseLayerElements(const PagedKvCache& c) {
  return static_cast<size_t>(c.num_blocks) * c.block_size * c.num_kv_heads * c.head_dim;
}

absl::Status ValidateCache(const PagedKvCache& c, int layer, const char* what) {
  if (c.k == nullptr || c.v == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": KV cache k and v must not be null"));
  }
  if (c.num_layers <= 0 || c.num_blocks <= 0 || c.block_size <= 0 || c.num_kv_heads <= 0 ||
      c.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": KV cache shape [", c.num_layers, ", ", c.num_blocks, ", ",
                     c.block_size, ", ", c.num_kv_heads, ", ", c.head_dim, "] is not valid"));
  }
  if (c.layer_stride != 0 && c.layer_stride < DenseLayerElements(c)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": KV cache layer_stride ", c.layer_stride,
                                                   " is smaller than a layer (",
                                                   DenseLayerElements(c), " elements)"));
  }
  if (layer < 0 || layer >= c.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": layer ", layer, " is not in [0, ", c.num_layers, ")"));
  }
  return absl::OkStatus();
}

size_t LayerOffset(const PagedKvCache& c, int layer) {
  const size_t stride = c.layer_stride != 0 ? c.layer_stride : DenseLayerElements(c);
  return static_cast<size_t>(layer) * stride;
}

void* LayerPtr(void* base, const PagedKvCache& c, int layer) {
  return static_cast<uint16_t*>(base) + LayerOffset(c, layer);
}

// What both attention launchers need of the cache: a supported head dim, 16-byte aligned layers,
// heads that group evenly, a usable block table shape.
absl::Status ValidateAttention(const void* q, int q_row_stride, const PagedKvCache* cache,
                               int layer, const int32_t* block_tables, int max_blocks_per_seq,
                               int num_seqs, int num_heads, float scale, const void* out,
                               const char* what) {
  if (cache == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cache must not be null"));
  }
  if (absl::Status s = ValidateCache(*cache, layer, what); !s.ok()) return s;
  const int hd = cache->head_dim;
  if (hd != 32 && hd != 64 && hd != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": head_dim ", hd, " is not supported (32, 64 or 128)"));
  }
  const size_t offset = LayerOffset(*cache, layer);
  if (!Aligned16(cache->k) || !Aligned16(cache->v) || offset % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": KV cache layers must be 16-byte aligned"));
  }
  if (num_seqs < 0 || num_seqs > kMaxGridYZ) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": num_seqs ", num_seqs, " is not in [0, ", kMaxGridYZ, "]"));
  }
  if (num_heads <= 0 || num_heads % cache->num_kv_heads != 0 || num_heads > kMaxGridYZ) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": num_heads ", num_heads,
                                                   " is not a positive multiple of num_kv_heads ",
                                                   cache->num_kv_heads));
  }
  if (q_row_stride < num_heads * hd) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": q_row_stride ", q_row_stride,
                     " is less than num_heads * head_dim = ", num_heads * hd));
  }
  if (max_blocks_per_seq <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": max_blocks_per_seq ", max_blocks_per_seq, " is not > 0"));
  }
  if (!std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": scale ", scale, " is not finite"));
  }
  if (q == nullptr || block_tables == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": q, block_tables and out must not be null"));
  }
  return absl::OkStatus();
}

internal::PagedLayerView LayerView(const PagedKvCache& c, int layer, const int32_t* block_tables,
                                   int max_blocks_per_seq) {
  internal::PagedLayerView view;
  view.k = LayerPtr(c.k, c, layer);
  view.v = LayerPtr(c.v, c, layer);
  view.block_size = c.block_size;
  view.num_kv_heads = c.num_kv_heads;
  view.head_dim = c.head_dim;
  view.block_tables = block_tables;
  view.max_blocks_per_seq = max_blocks_per_seq;
  view.num_slots = static_cast<int64_t>(c.num_blocks) * c.block_size;
  return view;
}

}  // namespace

namespace internal {

DecodeSplitPlan PlanDecodeSplits(int num_seqs, int num_heads, int max_context_len, int num_kv_heads,
                                 int num_sms, const DecodeAttentionTuning& tuning) {
  DecodeSplitPlan plan;
  const int64_t context = std::max(max_context_len, 1);
  plan.partition_size = static_cast<int>(CeilDiv64(context, kDecodeTileTokens)) * kDecodeTileTokens;
  const int64_t by_length = CeilDiv64(context, tuning.min_split_tokens);
  const int64_t items = std::max<int64_t>(1, int64_t{num_seqs} * num_heads);
  const int64_t wanted = CeilDiv64(tuning.split_target, items);
  int64_t splits = std::max<int64_t>(1, std::min(by_length, wanted));
  if (num_sms > 0 && num_kv_heads > 0) {
    const int64_t ctas_per_split = std::max<int64_t>(1, int64_t{num_seqs} * num_kv_heads);
    const int64_t fill = std::min(
        {CeilDiv64(num_sms, ctas_per_split), CeilDiv64(context, kDecodeTileTokens), wanted});
    splits = std::max(splits, fill);
  }
  if (splits == 1) {
    const int64_t pairs = int64_t{num_seqs} * num_kv_heads;
    const int64_t slots = int64_t{kDecodeChainCtasPerSm} * num_sms;
    if (num_sms > 0 && num_kv_heads > 0 && pairs > slots && context <= kDecodeChainMaxContext) {
      const int64_t chain = CeilDiv64(pairs, slots);
      if (chain <= tuning.max_chain) plan.chain = static_cast<int>(chain);
    }
    return plan;
  }
  const int64_t partition =
      CeilDiv64(CeilDiv64(context, splits), kDecodeTileTokens) * kDecodeTileTokens;
  plan.partition_size = static_cast<int>(partition);
  plan.num_splits = static_cast<int>(CeilDiv64(context, partition));
  return plan;
}

size_t DecodeWorkspaceBytesForPlan(const DecodeSplitPlan& plan, int num_seqs, int num_heads,
                                   int head_dim) {
  if (plan.num_splits <= 1) return 0;
  return static_cast<size_t>(num_seqs) * num_heads * plan.num_splits * (head_dim + 2) *
         sizeof(float);
}

}  // namespace internal

size_t DecodeAttentionWorkspaceBytes(int num_seqs, int num_heads, int head_dim, int max_context_len,
                                     const DecodeAttentionTuning& tuning) {
  if (num_seqs <= 0 || num_heads <= 0 || head_dim <= 0 ||
      max_context_len <= internal::kDecodeTileTokens) {
    return 0;
  }
  // PlanDecodeSplits uses splits <= ceil(context / tile) and splits <= ceil(target / items) <
  // target / items + 1, so items * splits is below both bounds; each grows with num_seqs and
  // max_context_len, and so does their minimum.
  const int64_t items = int64_t{num_seqs} * num_heads;
  const int64_t by_length = items * CeilDiv64(max_context_len, internal::kDecodeTileTokens);
  const int64_t by_target = int64_t{tuning.split_target} + items;
  return static_cast<size_t>(std::min(by_length, by_target)) * (head_dim + 2) * sizeof(float);
}

absl::Status LaunchStoreProgress(uint64_t* counter, uint64_t value, void* stream) {
  if (counter == nullptr) return absl::InvalidArgumentError("StoreProgress: null counter");
  return CudaStatus(internal::LaunchStoreProgressRaw(counter, value, Native(stream)),
                    "StoreProgress kernel launch");
}

absl::Status LaunchEmbedding(const int32_t* ids, const void* table, int n, int hidden, int vocab,
                             void* out, void* stream) {
  if (n < 0 || hidden <= 0 || vocab <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Embedding shape n=", n, " hidden=", hidden,
                                                   " vocab=", vocab, " is not valid"));
  }
  if (ids == nullptr || table == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("Embedding ids, table and out must not be null");
  }
  if (n == 0) return absl::OkStatus();
  return CudaStatus(internal::LaunchEmbeddingRaw(ids, table, n, hidden, out, Native(stream)),
                    "Embedding kernel launch");
}

absl::Status LaunchRope(void* qkv, const int32_t* positions, const float* inv_freq, int n,
                        int num_heads, int num_kv_heads, int head_dim, void* stream) {
  if (n < 0 || num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Rope shape n=", n, " heads=", num_heads,
                                                   " kv_heads=", num_kv_heads,
                                                   " head_dim=", head_dim, " is not valid"));
  }
  if (qkv == nullptr || positions == nullptr || inv_freq == nullptr) {
    return absl::InvalidArgumentError("Rope qkv, positions and inv_freq must not be null");
  }
  if (n == 0) return absl::OkStatus();
  return CudaStatus(internal::LaunchRopeRaw(qkv, positions, inv_freq, n, num_heads, num_kv_heads,
                                            head_dim, Native(stream)),
                    "Rope kernel launch");
}

absl::Status LaunchKvAppend(const void* qkv, const int32_t* slot_mapping, int n, int num_heads,
                            const PagedKvCache& cache, int layer, void* stream) {
  if (absl::Status s = ValidateCache(cache, layer, "KvAppend"); !s.ok()) return s;
  if (n < 0 || num_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvAppend shape n=", n, " heads=", num_heads, " is not valid"));
  }
  if (qkv == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError("KvAppend qkv and slot_mapping must not be null");
  }
  if (n == 0) return absl::OkStatus();
  return CudaStatus(internal::LaunchKvAppendRaw(qkv, slot_mapping, n, num_heads, cache.num_kv_heads,
                                                cache.head_dim, LayerPtr(cache.k, cache, layer),
                                                LayerPtr(cache.v, cache, layer), Native(stream)),
                    "KvAppend kernel launch");
}

absl::Status LaunchRopeKvAppend(void* qkv, const int32_t* positions, const float* inv_freq,
                                const int32_t* slot_mapping, int n, int num_heads,
                                const PagedKvCache& cache, int layer, void* stream) {
  if (absl::Status s = ValidateCache(cache, layer, "RopeKvAppend"); !s.ok()) return s;
  if (n < 0 || num_heads <= 0 || cache.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("RopeKvAppend shape n=", n, " heads=", num_heads,
                                                   " head_dim=", cache.head_dim, " is not valid"));
  }
  if (qkv == nullptr || positions == nullptr || inv_freq == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError(
        "RopeKvAppend qkv, positions, inv_freq and slot_mapping must not be null");
  }
  if (n == 0) return absl::OkStatus();
  return CudaStatus(
      internal::LaunchRopeKvRaw(qkv, positions, inv_freq, n, num_heads, cache.num_kv_heads,
                                cache.head_dim, slot_mapping, LayerPtr(cache.k, cache, layer),
                                LayerPtr(cache.v, cache, layer), Native(stream)),
      "RopeKvAppend kernel launch");
}

void* KvCacheLayerK(const PagedKvCache& cache, int layer) {
  return LayerPtr(cache.k, cache, layer);
}

void* KvCacheLayerV(const PagedKvCache& cache, int layer) {
  return LayerPtr(cache.v, cache, layer);
}

absl::Status LaunchQkvGemvRopeKvAppend(const void* x, const void* w, const void* bias, int m,
                                       int hidden, void* qkv, const int32_t* positions,
                                       const float* inv_freq, const int32_t* slot_mapping,
                                       int num_heads, const PagedKvCache& cache, int layer,
                                       void* stream) {
  if (absl::Status s = ValidateCache(cache, layer, "QkvGemvRopeKvAppend"); !s.ok()) return s;
  if (m < 0 || m > internal::kGemvMaxRowsDevice || hidden <= 0 || hidden % 8 != 0 ||
      num_heads <= 0 || cache.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("QkvGemvRopeKvAppend shape m=", m, " hidden=", hidden, " heads=", num_heads,
                     " head_dim=", cache.head_dim, " is not valid (m in [0, ",
                     internal::kGemvMaxRowsDevice, "], hidden a positive multiple of 8)"));
  }
  if (x == nullptr || w == nullptr || qkv == nullptr || positions == nullptr ||
      inv_freq == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError(
        "QkvGemvRopeKvAppend x, w, qkv, positions, inv_freq and slot_mapping must not be null");
  }
  if (!Aligned16(x) || !Aligned16(w)) {
    return absl::InvalidArgumentError("QkvGemvRopeKvAppend x and w must be 16-byte aligned");
  }
  if (m == 0) return absl::OkStatus();
  return CudaStatus(internal::LaunchGemvRopeKvRaw(x, w, bias, qkv, m, hidden, positions, inv_freq,
                                                  slot_mapping, num_heads, cache.num_kv_heads,
                                                  cache.head_dim, LayerPtr(cache.k, cache, layer),
                                                  LayerPtr(cache.v, cache, layer), Native(stream)),
                    "QkvGemvRopeKvAppend kernel launch");
}

absl::Status LaunchSiluMul(const void* gate_up, int n, int inter, void* out, void* stream) {
  if (n < 0 || inter <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SiluMul shape n=", n, " inter=", inter, " is not valid"));
  }
  if (gate_up == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("SiluMul gate_up and out must not be null");
  }
  if (n == 0) return absl::OkStatus();
  return CudaStatus(internal::LaunchSiluMulRaw(gate_up, n, inter, out, Native(stream)),
                    "SiluMul kernel launch");
}

absl::Status LaunchArgmax(const float* logits, int rows, int vocab, int32_t* out, void* stream) {
  if (rows < 0 || vocab <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Argmax shape rows=", rows, " vocab=", vocab, " is not valid"));
  }
  if (logits == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("Argmax logits and out must not be null");
  }
  if (rows == 0) return absl::OkStatus();
  return CudaStatus(internal::LaunchArgmaxRaw(logits, rows, vocab, out, Native(stream)),
                    "Argmax kernel launch");
}

// Whether a decode launch reads the cache with an evict-first L2 policy: by default from 2
// sequences up (H200, Llama-3-8B shape, A/B against no policy: batch 2 / 4 / 8 / 16 at 8K 0.5-0.8%
// faster, at 1K and at batch 64 / 256 the same within noise; batch 1 2.0-2.2% slower, and an
// explicit evict_normal policy 3-8.5% slower at batch 64; bench/RESULTS.md, tenth session).
// kAlways / kNever apply to every batch of the one item per CTA kernel; the chained kernel (34+
// sequences of the Llama-3 shapes) reads evict-first always.
bool DecodeEvictFirst(DecodeAttentionTuning::EvictFirst mode, int num_seqs) {
  constexpr int kMinSeqs = 2;
  switch (mode) {
    case DecodeAttentionTuning::EvictFirst::kAuto:
      return num_seqs >= kMinSeqs;
    case DecodeAttentionTuning::EvictFirst::kAlways:
      return true;
    case DecodeAttentionTuning::EvictFirst::kNever:
      return false;
  }
  return false;
}

absl::Status LaunchPagedDecodeAttention(const DecodeAttentionArgs& a, void* stream) {
  if (absl::Status s = ValidateAttention(a.q, a.q_row_stride, a.cache, a.layer, a.block_tables,
                                         a.max_blocks_per_seq, a.num_seqs, a.num_heads, a.scale,
                                         a.out, "DecodeAttention");
      !s.ok()) {
    return s;
  }
  if (a.context_lens == nullptr) {
    return absl::InvalidArgumentError("DecodeAttention: context_lens must not be null");
  }
  if (!DecodeAttentionTuningValid(a.tuning)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeAttention: tuning out of range (split_target ", a.tuning.split_target,
                     ", min_split_tokens ", a.tuning.min_split_tokens, ", max_chain ",
                     a.tuning.max_chain, "; see decode_attention_tuning.h)"));
  }
  if (a.num_seqs == 0) return absl::OkStatus();
  if (a.max_context_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeAttention: max_context_len ", a.max_context_len, " is not > 0"));
  }
  const internal::DecodeSplitPlan plan = internal::PlanDecodeSplits(
      a.num_seqs, a.num_heads, a.max_context_len, a.cache->num_kv_heads, DeviceSmCount(), a.tuning);
  const size_t need =
      internal::DecodeWorkspaceBytesForPlan(plan, a.num_seqs, a.num_heads, a.cache->head_dim);
  if (need > 0 && (a.workspace == nullptr || a.workspace_bytes < need)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeAttention: workspace of ", a.workspace_bytes, " bytes (",
                     a.workspace == nullptr ? "null" : "non-null", ") is less than the ", need,
                     " bytes needed; size it with DecodeAttentionWorkspaceBytes"));
  }
  return CudaStatus(
      internal::LaunchDecodeAttentionRaw(
          a.q, a.q_row_stride, LayerView(*a.cache, a.layer, a.block_tables, a.max_blocks_per_seq),
          a.context_lens, a.num_seqs, a.num_heads, a.scale, a.out, a.workspace, plan,
          DecodeEvictFirst(a.tuning.evict_first, a.num_seqs), Native(stream)),
      "DecodeAttention kernel launch");
}

absl::Status LaunchPrefillAttention(const PrefillAttentionArgs& a, void* stream) {
  if (absl::Status s = ValidateAttention(a.q, a.q_row_stride, a.cache, a.layer, a.block_tables,
                                         a.max_blocks_per_seq, a.num_seqs, a.num_heads, a.scale,
                                         a.out, "PrefillAttention");
      !s.ok()) {
    return s;
  }
  if (a.seq_start_rows == nullptr || a.start_pos == nullptr) {
    return absl::InvalidArgumentError(
        "PrefillAttention: seq_start_rows and start_pos must not be null");
  }
  if (a.num_seqs == 0) return absl::OkStatus();
  if (a.max_new_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PrefillAttention: max_new_tokens ", a.max_new_tokens, " is not > 0"));
  }
  return CudaStatus(
      internal::LaunchPrefillAttentionRaw(
          a.q, a.q_row_stride, LayerView(*a.cache, a.layer, a.block_tables, a.max_blocks_per_seq),
          a.seq_start_rows, a.start_pos, a.num_seqs, a.max_new_tokens, a.num_heads, a.scale, a.out,
          /*allow_wgmma=*/true, Native(stream)),
      "PrefillAttention kernel launch");
}

}  // namespace tandem::cuda

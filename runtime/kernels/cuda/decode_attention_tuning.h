#pragma once
// The tuning parameters of the paged decode attention launcher (model_kernels.h,
// DecodeAttentionArgs::tuning): plain data, no CUDA types, so the runner's plan
// (runtime/model/cuda/cuda_tuning.h) holds them in builds without CUDA too. They change how the
// work is split and read, never the results beyond float32 summation order. The defaults are
// the measured choices (bench/RESULTS.md); docs/tuning.md lists what each field does.

namespace tandem::cuda {

// Ranges the fields take (the launcher returns kInvalidArgument outside them).
constexpr int kDecodeSplitTargetMin = 32;
constexpr int kDecodeSplitTargetMax = 65536;
constexpr int kDecodeSplitTokensStep = 64;  // one tile of the kernel
constexpr int kDecodeSplitTokensMax = 4096;
constexpr int kDecodeChainMax = 4;

struct DecodeAttentionTuning {
  // Flash-decoding aims for about this many (sequence, query head, split) work items.
  int split_target = 2048;  // [kDecodeSplitTargetMin, kDecodeSplitTargetMax]
  // The shortest split, in tokens, unless that leaves SMs without a CTA (short contexts split
  // further, down to one tile). A multiple of kDecodeSplitTokensStep, at most
  // kDecodeSplitTokensMax.
  int min_split_tokens = 256;
  // The most (sequence, KV head) items one CTA takes in turn (chained decode, head_dim 128 at
  // contexts up to 1K); 0 or 1: one item per CTA. At most kDecodeChainMax.
  int max_chain = kDecodeChainMax;
  // The KV cache read with an evict-first L2 policy: from 2 sequences up (kAuto), always or never.
  enum class EvictFirst { kAuto, kAlways, kNever };
  EvictFirst evict_first = EvictFirst::kAuto;

  bool operator==(const DecodeAttentionTuning&) const = default;
};

// Whether every field is in its range.
constexpr bool DecodeAttentionTuningValid(const DecodeAttentionTuning& t) {
  return t.split_target >= kDecodeSplitTargetMin && t.split_target <= kDecodeSplitTargetMax &&
         t.min_split_tokens >= kDecodeSplitTokensStep &&
         t.min_split_tokens <= kDecodeSplitTokensMax &&
         t.min_split_tokens % kDecodeSplitTokensStep == 0 && t.max_chain >= 0 &&
         t.max_chain <= kDecodeChainMax;
}

}  // namespace tandem::cuda

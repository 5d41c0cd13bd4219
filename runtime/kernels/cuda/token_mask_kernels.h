#pragma once
// Grammar masks on the GPU: the two kernels around LaunchSampling (sampling_kernels.h) that make
// it sample a guided row as tandem::Sample(params, logits, {}, {}, seed, step, {}, allowed) does:
// the disallowed tokens cannot be drawn, and the reported logprob stays the raw log-softmax.
//
//   LaunchApplyTokenMask   before sampling: for each row with mask[r] set, the raw log-sum-exp of
//                          the row (into lse[r]), then -inf for every token whose bit in
//                          allowed[r] is clear (in place: the logits buffer is the step's own);
//   LaunchSampling         samples the masked logits (tokens exact; its logprobs are of the
//                          masked distribution);
//   LaunchMaskedLogprobs   after sampling: logprobs[r] = logits[r][token] - lse[r] for the masked
//                          rows (the sampled token is allowed, so its logit was not touched).
// Rows whose mask[r] is 0 are left alone by both. A row whose allowed set is empty gives what
// LaunchSampling gives on a row of -inf (its argmax); the caller refuses such rows before.
//
// allowed is [rows, words] uint64 words (bit t % 64 of word t / 64 allows token t), words >=
// ceil(vocab / 64); bits past vocab are ignored. Pointers are device memory; both launchers only
// queue one kernel (no allocation, no synchronization), so they are safe to capture in a graph.
// Failure: kInvalidArgument before anything is queued, or the launch's CUDA error.
// Thread-safety: reentrant; the stream's owner calls it.

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::cuda {

struct TokenMaskArgs {
  float* logits = nullptr;            // [rows, vocab]
  const uint64_t* allowed = nullptr;  // [rows, words]
  const int32_t* mask = nullptr;      // [rows]: nonzero where the row is masked
  int rows = 0;                       // [1, kSamplingMaxRows]
  int vocab = 0;                      // [1, kSamplingMaxVocab]
  int words = 0;                      // >= ceil(vocab / 64)
  double* lse = nullptr;              // [rows] out: raw log-sum-exp of the masked rows
};

absl::Status LaunchApplyTokenMask(const TokenMaskArgs& args, void* stream);

// `tokens` as LaunchSampling wrote them; overwrites logprobs[r] of the masked rows.
absl::Status LaunchMaskedLogprobs(const TokenMaskArgs& args, const int32_t* tokens, float* logprobs,
                                  void* stream);

}  // namespace tandem::cuda

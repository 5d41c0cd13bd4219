#pragma once
// Per-request sampling parameters (OpenAI / vLLM semantics) and their validation.
//
// Value type; no ownership, no threads. Validate() names the offending parameter in an
// InvalidArgument status and changes nothing.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

inline constexpr int kMaxLogprobs = 20;

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax after penalties)
  int top_k = 0;             // 0 or -1: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  // Same seed -> same tokens regardless of batch composition or preemption. Without a seed the
  // engine draws one per request.
  std::optional<uint64_t> seed;
  float repetition_penalty = 1.0f;  // HF semantics over prompt + output tokens; 1: off
  float presence_penalty = 0.0f;    // OpenAI semantics over output tokens, [-2, 2]
  float frequency_penalty = 0.0f;   // OpenAI semantics over output tokens, [-2, 2]
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings, matched on the detokenized output
  // Generated tokens at most; unset: up to the context limit.
  std::optional<int> max_tokens;
  bool ignore_eos = false;
  // Top-N logprobs (N <= 20) of the log-softmax of the raw logits, besides the sampled
  // token's own logprob. Unset: none reported.
  std::optional<int> logprobs;
  bool skip_special_tokens = true;  // for the detokenized text

  bool greedy() const { return temperature == 0.0f; }
};

// InvalidArgument naming the parameter for out-of-range values. `vocab_size` bounds
// stop_token_ids (0 skips that check).
absl::Status ValidateSamplingParams(const SamplingParams& params, int vocab_size);

}  // namespace tandem

#pragma once
// Per-request sampling parameters (OpenAI / vLLM semantics) and their validation.
//
// Value type; no ownership, no threads. Validate() names the offending parameter in an
// InvalidArgument status and changes nothing.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

inline constexpr int kMaxLogprobs = 20;
inline constexpr float kMaxLogitBias = 100.0f;  // OpenAI's range: [-100, 100]
inline constexpr int kMaxLogitBiasEntries = 1024;
// A regex (a compiled JSON Schema is at most 96 KiB: grammar::JsonSchemaOptions), or all choices
// together; ByteDfaLimits::max_pattern_bytes matches it.
inline constexpr size_t kMaxGuidedBytes = 128 << 10;
inline constexpr int kMaxGuidedChoices = 1024;

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
  // vLLM's prompt_logprobs: every prompt token after the first scored against the logits of the
  // position before it (raw log-softmax, rank) with the top N (N <= 20) there. The engine then
  // computes every prompt position (no prefix-cache hit for the request). Unset: none.
  std::optional<int> prompt_logprobs;
  bool skip_special_tokens = true;  // for the detokenized text
  // vLLM's min_tokens: while fewer than this many tokens were generated (resumed output
  // included), EOS and stop_token_ids cannot be sampled (their logits are -inf) and stop strings
  // are not matched; a stop string is matched only in text of the min_tokens-th token and after.
  int min_tokens = 0;
  // OpenAI's logit_bias: added to the raw logits before penalties and sampling (token id, bias
  // in [-100, 100]); ids unique, in the vocabulary.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // vLLM's allowed_token_ids: when non-empty, every other token's logit is -inf.
  std::vector<int32_t> allowed_token_ids;
  // vLLM's include_stop_str_in_output: a matched stop string stays in the output text.
  bool include_stop_str_in_output = false;
  // Guided decoding (vLLM's guided_regex / guided_choice): the output must match `regex` in full,
  // or be exactly one of `choices`; at most one of the two is set. The engine compiles it
  // (runtime/grammar) and masks the logits with it at every step; the output ends (finish
  // reason "stop") as soon as nothing else could follow.
  struct Guided {
    std::string regex;
    std::vector<std::string> choices;
    std::string grammar;  // GBNF (runtime/grammar/gbnf.h)
    bool empty() const { return regex.empty() && choices.empty() && grammar.empty(); }
  };
  Guided guided;

  bool greedy() const { return temperature == 0.0f; }
};

// InvalidArgument naming the parameter for out-of-range values. `vocab_size` bounds
// stop_token_ids (0 skips that check).
absl::Status ValidateSamplingParams(const SamplingParams& params, int vocab_size);

}  // namespace tandem

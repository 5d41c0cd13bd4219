#include "runtime/sampling/sampling_params.h"

#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

absl::Status Bad(const char* name, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", why));
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p, int vocab_size) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    return Bad("temperature", absl::StrCat("must be >= 0, got ", p.temperature));
  }
  if (p.top_k < -1) return Bad("top_k", absl::StrCat("must be -1, 0 or >= 1, got ", p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return Bad("top_p", absl::StrCat("must be in (0, 1], got ", p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return Bad("min_p", absl::StrCat("must be in [0, 1], got ", p.min_p));
  }
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.0f) {
    return Bad("repetition_penalty", absl::StrCat("must be > 0, got ", p.repetition_penalty));
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return Bad("presence_penalty", absl::StrCat("must be in [-2, 2], got ", p.presence_penalty));
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return Bad("frequency_penalty", absl::StrCat("must be in [-2, 2], got ", p.frequency_penalty));
  }
  if (p.max_tokens.has_value() && *p.max_tokens < 1) {
    return Bad("max_tokens", absl::StrCat("must be >= 1, got ", *p.max_tokens));
  }
  if (p.logprobs.has_value() && (*p.logprobs < 0 || *p.logprobs > kMaxLogprobs)) {
    return Bad("logprobs", absl::StrCat("must be in [0, ", kMaxLogprobs, "], got ", *p.logprobs));
  }
  if (p.prompt_logprobs.has_value() &&
      (*p.prompt_logprobs < 0 || *p.prompt_logprobs > kMaxLogprobs)) {
    return Bad("prompt_logprobs",
               absl::StrCat("must be in [0, ", kMaxLogprobs, "], got ", *p.prompt_logprobs));
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || (vocab_size > 0 && id >= vocab_size)) {
      return Bad("stop_token_ids", absl::StrCat("token id ", id, " is outside the vocabulary"));
    }
  }
  for (const std::string& s : p.stop) {
    if (s.empty()) return Bad("stop", "stop strings must be non-empty");
  }
  if (p.min_tokens < 0) return Bad("min_tokens", absl::StrCat("must be >= 0, got ", p.min_tokens));
  if (p.max_tokens.has_value() && p.min_tokens > *p.max_tokens) {
    return Bad("min_tokens",
               absl::StrCat("must be <= max_tokens (", *p.max_tokens, "), got ", p.min_tokens));
  }
  if (p.logit_bias.size() > static_cast<size_t>(kMaxLogitBiasEntries)) {
    return Bad("logit_bias", absl::StrCat("at most ", kMaxLogitBiasEntries, " entries, got ",
                                          p.logit_bias.size()));
  }
  absl::flat_hash_set<int32_t> seen;
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || (vocab_size > 0 && id >= vocab_size)) {
      return Bad("logit_bias", absl::StrCat("token id ", id, " is outside the vocabulary"));
    }
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias)) {
      return Bad("logit_bias",
                 absl::StrCat("bias of token ", id, " must be in [-100, 100], got ", bias));
    }
    if (!seen.insert(id).second) {
      return Bad("logit_bias", absl::StrCat("token id ", id, " appears twice"));
    }
  }
  if (vocab_size > 0 && p.allowed_token_ids.size() > static_cast<size_t>(vocab_size)) {
    return Bad("allowed_token_ids", "more ids than the vocabulary has");
  }
  if (!p.guided.regex.empty() + !p.guided.choices.empty() + !p.guided.grammar.empty() > 1) {
    return Bad("guided", "at most one of a regex, choices and a grammar");
  }
  if (p.guided.grammar.size() > kMaxGuidedBytes) {
    return Bad("guided_grammar", absl::StrCat("at most ", kMaxGuidedBytes, " bytes"));
  }
  if (p.guided.regex.size() > kMaxGuidedBytes) {
    return Bad("guided_regex", absl::StrCat("at most ", kMaxGuidedBytes, " bytes"));
  }
  if (p.guided.choices.size() > static_cast<size_t>(kMaxGuidedChoices)) {
    return Bad("guided_choice", absl::StrCat("at most ", kMaxGuidedChoices, " choices"));
  }
  size_t choice_bytes = 0;
  for (const std::string& c : p.guided.choices) {
    if (c.empty()) return Bad("guided_choice", "a choice is empty");
    choice_bytes += c.size();
  }
  if (choice_bytes > kMaxGuidedBytes) {
    return Bad("guided_choice", absl::StrCat("at most ", kMaxGuidedBytes, " bytes in all"));
  }
  for (int32_t id : p.allowed_token_ids) {
    if (id < 0 || (vocab_size > 0 && id >= vocab_size)) {
      return Bad("allowed_token_ids", absl::StrCat("token id ", id, " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem

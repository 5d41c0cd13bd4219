#pragma once
// From a parsed OpenAI request to what the workers are given: for each prompt of the request (one
// for chat, one or more for completions) the chat template is rendered (with
// chat_template_kwargs and continue_final_message), the text tokenized (add_special_tokens),
// truncated (truncate_prompt_tokens), checked against the context limit, and given its
// max_tokens; then the sampling parameters are validated against the vocabulary, for each prompt
// (a default max_tokens depends on the prompt's length). The model's generation_config.json
// defaults (FrontendModel::generation_defaults) fill the sampling fields the request left out.
//
// Pure function over the model's tokenizer and template; thread-safe (the frontend runs it on its
// prepare pool; the fuzzers run it directly). Errors are InvalidParam statuses naming the field
// (openai_protocol.h), so they map to a 400 with the OpenAI body.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/router/frontend.h"
#include "runtime/router/openai_protocol.h"

namespace tandem::router {

struct PreparedPrompt {
  std::vector<int32_t> token_ids;  // non-empty, shorter than the context limit
  std::string text;                // what `echo` sends back (the prompt text; chat: rendered)
  std::optional<int> max_tokens;   // the request's, or the endpoint default clamped to the room
  // The request's sampling parameters with the model's generation defaults (for fields it did
  // not give) and `max_tokens`; validated.
  SamplingParams params;
};

// One prompt rendered and tokenized, nothing more (no truncation, no limits): prompt `index` of a
// completions request, or the chat. For /tokenize.
absl::StatusOr<PreparedPrompt> TokenizePrompt(const FrontendModel& model, const OpenAiRequest& req,
                                              size_t index = 0);

// `req.params.max_tokens` stays as the client gave it.
absl::StatusOr<std::vector<PreparedPrompt>> PreparePrompts(const FrontendModel& model,
                                                           const OpenAiRequest& req);

}  // namespace tandem::router

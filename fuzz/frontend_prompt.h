#pragma once
// What the router's frontend does with a decoded OpenAI request before anything reaches a worker
// (runtime/router/prompt_builder.h: render the chat template, tokenize, truncate, check the
// context limit and validate the sampling parameters), here with the bundled model; then the
// response serializers over the prompt text.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fuzz/fuzz_support.h"
#include "runtime/router/frontend.h"
#include "runtime/router/openai_protocol.h"
#include "runtime/router/prompt_builder.h"
#include "runtime/sampling/sampling_params.h"

namespace tandem::fuzz {

// The bundled model as the frontend loads it (once per process).
inline const router::FrontendModel& BundledFrontendModel() {
  static const router::FrontendModel* model = [] {
    absl::StatusOr<router::FrontendModel> m = router::LoadFrontendModel(ModelDir());
    if (!m.ok()) {
      std::fprintf(stderr, "cannot load %s: %s\n", ModelDir().c_str(),
                   std::string(m.status().message()).c_str());
      std::abort();
    }
    return new router::FrontendModel(*std::move(m));
  }();
  return *model;
}

// The frontend's own preparation (runtime/router/prompt_builder.h), and its guarantees: every
// prompt it accepts is non-empty, in the vocabulary, with room for output. Returns the first
// prompt's text (what echo would send) in `text`.
inline absl::Status PreparePrompt(const router::FrontendModel& model, router::OpenAiRequest& req,
                                  std::string* text) {
  absl::StatusOr<std::vector<router::PreparedPrompt>> prompts = router::PreparePrompts(model, req);
  if (!prompts.ok()) return prompts.status();
  FUZZ_CHECK(!prompts->empty());
  FUZZ_CHECK(req.endpoint == router::Endpoint::kChatCompletions ||
             prompts->size() == req.prompts.size());
  const Tokenizer& tok = *model.tokenizer;
  for (const router::PreparedPrompt& p : *prompts) {
    FUZZ_CHECK(!p.token_ids.empty() && static_cast<int>(p.token_ids.size()) < model.max_model_len);
    for (int32_t id : p.token_ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
    FUZZ_CHECK(!p.max_tokens.has_value() ||
               (*p.max_tokens >= 1 &&
                static_cast<int64_t>(p.token_ids.size()) + *p.max_tokens <= model.max_model_len));
  }
  *text = (*prompts)[0].text;
  return absl::OkStatus();
}

// Serializes what a response to `req` could carry (its prompt text as choice text, stream
// chunks, logprob entries and the error body), as the frontend would.
inline void SerializeResponses(const router::OpenAiRequest& req, const std::string& text,
                               const absl::Status& status) {
  router::ResponseMeta meta;
  meta.endpoint = req.endpoint;
  meta.id = "cmpl-fuzz";
  meta.created = 1;
  meta.model = req.model;
  meta.logprobs = req.logprobs.has_value();
  router::ChoiceResult choice;
  choice.text = text;
  choice.finish_reason = "length";
  router::LogprobEntry entry;
  entry.token = text.substr(0, 8);
  entry.top.push_back({text.substr(0, 3), -1.0f});
  entry.top.push_back({text.substr(0, 3), -0.5f});
  choice.logprobs.push_back(entry);
  const std::string body = router::ResponseJson(meta, {choice}, router::Usage{});
  FUZZ_CHECK(!body.empty());
  router::StreamDelta delta;
  delta.role = true;
  delta.text = text;
  delta.logprobs = choice.logprobs;
  delta.finish_reason = "stop";
  FUZZ_CHECK(!router::StreamChunkEvent(meta, delta, req.include_usage).empty());
  if (!status.ok()) {
    const router::ApiError error = router::ToApiError(status);
    FUZZ_CHECK(error.http_status >= 400 && error.http_status < 600);
    FUZZ_CHECK(!router::ErrorJson(error).empty());
  }
}

}  // namespace tandem::fuzz

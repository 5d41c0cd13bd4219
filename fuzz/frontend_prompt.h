#pragma once
// What the router's frontend does with a decoded OpenAI request before anything reaches a worker
// (runtime/router/frontend.cc, RouterFrontend::Core::PreparePrompt, which is private to that
// file): render the chat template, tokenize, check the context limit and validate the sampling
// parameters, here with the bundled model; then the response serializers over the prompt text.
// The same sequence of the same public functions, so the fuzzers reach them with what a decoded
// request can hold.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fuzz/fuzz_support.h"
#include "runtime/router/frontend.h"
#include "runtime/router/openai_protocol.h"
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

// PreparePrompt's checks; OK when the frontend would send the request on.
inline absl::Status PreparePrompt(const router::FrontendModel& model, router::OpenAiRequest& req,
                                  std::vector<int32_t>* ids, std::string* text) {
  const Tokenizer& tok = *model.tokenizer;
  if (req.endpoint == router::Endpoint::kChatCompletions) {
    if (model.chat_template == nullptr) return absl::InvalidArgumentError("no chat template");
    absl::StatusOr<std::string> rendered =
        model.chat_template->Render(req.messages, req.add_generation_prompt);
    if (!rendered.ok()) return rendered.status();
    *ids = tok.Encode(*rendered, /*add_special_tokens=*/false);
    *text = *std::move(rendered);
  } else if (req.prompt_token_ids.has_value()) {
    for (int32_t id : *req.prompt_token_ids) {
      if (id >= tok.vocab_size()) return absl::InvalidArgumentError("token id out of range");
    }
    *ids = *req.prompt_token_ids;
    if (req.echo) *text = tok.Decode(*ids, /*skip_special_tokens=*/false);
  } else {
    *ids = tok.Encode(req.prompt, /*add_special_tokens=*/true);
    *text = req.prompt;
  }
  for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  if (ids->empty()) return absl::InvalidArgumentError("empty prompt");
  const int len = static_cast<int>(ids->size());
  const int limit = model.max_model_len;
  if (len >= limit) return absl::InvalidArgumentError("context_length_exceeded");
  SamplingParams& p = req.params;
  if (p.max_tokens.has_value()) {
    if (static_cast<int64_t>(len) + *p.max_tokens > limit) {
      return absl::InvalidArgumentError("context_length_exceeded");
    }
  } else if (req.default_max_tokens.has_value()) {
    p.max_tokens = std::min(*req.default_max_tokens, limit - len);
  }
  return ValidateSamplingParams(p, tok.vocab_size());
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

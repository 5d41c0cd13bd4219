// OpenAI request decoding (runtime/router/openai_protocol.h) from a request body, then what the
// frontend does with an accepted request: chat template, tokenizer, context limit and sampling
// validation with the bundled model, and the response and error serializers.
//
// Input: one byte (its low bit: 0 /v1/completions, 1 /v1/chat/completions), then the JSON body.
// Properties: no crash; an accepted request satisfies the documented bounds (n in [1, 128], at
// most 16 non-empty stop strings, logprobs in [0, 20], a non-empty prompt or message list).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/frontend_prompt.h"
#include "fuzz/fuzz_support.h"
#include "runtime/router/openai_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  using tandem::router::Endpoint;
  const bool chat = (data[0] & 1) != 0;
  const absl::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  absl::StatusOr<tandem::router::OpenAiRequest> parsed =
      chat ? tandem::router::ParseChatCompletionRequest(body)
           : tandem::router::ParseCompletionRequest(body);
  if (!parsed.ok()) {
    FUZZ_CHECK(tandem::router::ToApiError(parsed.status()).http_status == 400);
    tandem::fuzz::SerializeResponses(tandem::router::OpenAiRequest{}, "", parsed.status());
    return 0;
  }
  tandem::router::OpenAiRequest& req = *parsed;
  FUZZ_CHECK(req.endpoint == (chat ? Endpoint::kChatCompletions : Endpoint::kCompletions));
  FUZZ_CHECK(req.n >= 1 && req.n <= tandem::router::kMaxChoices);
  FUZZ_CHECK(req.params.stop.size() <= static_cast<size_t>(tandem::router::kMaxStopStrings));
  for (const std::string& s : req.params.stop) FUZZ_CHECK(!s.empty());
  FUZZ_CHECK(!req.logprobs.has_value() || (*req.logprobs >= 0 && *req.logprobs <= 20));
  FUZZ_CHECK(!req.params.max_tokens.has_value() || *req.params.max_tokens >= 1);
  if (chat) {
    FUZZ_CHECK(!req.messages.empty());
  } else {
    FUZZ_CHECK(!req.prompts.empty() &&
               req.prompts.size() <= static_cast<size_t>(tandem::router::kMaxBatchedPrompts));
    for (const tandem::router::OpenAiRequest::Prompt& p : req.prompts) {
      if (p.token_ids.has_value()) {
        FUZZ_CHECK(!p.token_ids->empty());
        for (int32_t id : *p.token_ids) FUZZ_CHECK(id >= 0);
      } else {
        FUZZ_CHECK(!p.text.empty());
      }
    }
  }

  std::string text;
  const absl::Status prepared =
      tandem::fuzz::PreparePrompt(tandem::fuzz::BundledFrontendModel(), req, &text);
  tandem::fuzz::SerializeResponses(req, text, prepared);
  return 0;
}

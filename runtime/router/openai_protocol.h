#pragma once
// The OpenAI HTTP API as the router speaks it: request parsing and validation for
// `POST /v1/completions` and `POST /v1/chat/completions`, the error body, and serialization of
// responses and stream chunks. Pure functions over strings and plain structs; no I/O, no threads.
//
// Errors are absl::Status values: InvalidArgument for bad input, carrying the OpenAI `param` and
// `code` as payloads (InvalidParam / ToApiError), so one mapping turns any status into the
// nested OpenAI error body {"error": {"message", "type", "param", "code"}}.
//
// Every field either endpoint takes is in api_fields.h (and docs/api.md): implemented, rejected
// with a 400 naming it, or a documented no-op. A field not in that table is a 400 with code
// "unknown_parameter", so nothing is silently ignored. Choices where OpenAI leaves room:
// - `model` may be omitted (the served model is used); another name is an error (the frontend
//   checks it, 404 code "model_not_found").
// - `stop`: a string or a list of at most kMaxStopStrings non-empty strings.
// - `n` in [1, 128]; `logprobs` (completions) and `top_logprobs` (chat) in [0, 20].
// - Completions: `prompt` is a string, a list of token ids, or a list of strings / token-id lists
//   (batched: at most kMaxBatchedPrompts, n choices each). `max_tokens` defaults to 16 as in
//   OpenAI (clamped to the context left). `echo` with `logprobs: k` puts the prompt's tokens
//   first in the logprobs (the first with null logprob and alternatives), scored with k
//   alternatives (params.prompt_logprobs is at least k).
// - vLLM's `prompt_logprobs` (0 to 20, both endpoints; not with `stream`, as in vLLM): every
//   prompt token after the first with its logprob, rank and the top alternatives.
// - Chat: `content` is a string, null, or a list of {"type": "text", "text"} parts (joined);
//   other part types are rejected. `max_completion_tokens` wins over `max_tokens`.
// - `logit_bias` keys are token ids written as strings (OpenAI's form); sorted by id here.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/model/chat_template.h"
#include "runtime/router/tool_calls.h"
#include "runtime/sampling/sampling_params.h"

namespace tandem::router {

inline constexpr int kMaxChoices = 128;
inline constexpr int kMaxStopStrings = 16;
inline constexpr int kDefaultCompletionMaxTokens = 16;
inline constexpr int kMaxBatchedPrompts = 128;
// n * prompts: the choices one request may ask for.
inline constexpr int kMaxChoicesPerRequest = 1024;

// ---- Errors ----

struct ApiError {
  int http_status = 500;
  std::string type;  // "invalid_request_error", "server_error", "service_unavailable_error"
  std::string message;
  std::string param;  // "" serializes as null
  std::string code;   // "" serializes as null
};

// InvalidArgument carrying the OpenAI `param` and `code`.
absl::Status InvalidParam(absl::string_view param, absl::string_view message,
                          absl::string_view code = "");
// InvalidArgument/OutOfRange/FailedPrecondition -> 400 invalid_request_error; NotFound -> 404;
// Unavailable -> 503 service_unavailable_error; ResourceExhausted (the router is full) -> 429
// (type "requests", code rate_limit_exceeded, as OpenAI's rate limits); DeadlineExceeded -> 504;
// everything else -> 500
// server_error. `param`/`code` come from InvalidParam payloads.
ApiError ToApiError(const absl::Status& status);
ApiError MakeApiError(int http_status, std::string message, std::string param = "",
                      std::string code = "");
// {"error": {"message", "type", "param", "code"}}
std::string ErrorJson(const ApiError& error);

// ---- Requests ----

enum class Endpoint { kCompletions, kChatCompletions };

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // "" when omitted

  // Completions: one entry per prompt (several: a batched request), each as text or as token ids.
  struct Prompt {
    std::string text;
    std::optional<std::vector<int32_t>> token_ids;
  };
  std::vector<Prompt> prompts;
  bool echo = false;

  // Chat.
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  // chat_template_kwargs as JSON object text ("" when none); its keys are not the template's own
  // variables (messages, add_generation_prompt, tools, documents, bos_token, eos_token).
  std::string chat_template_kwargs;
  // tools / tool_choice / parallel_tool_calls (tool_calls.h); a forced choice has set
  // params.guided.
  ToolRequest tools;

  // Prompt handling (vLLM): the tokenizer's special tokens (nullopt: completions yes, chat no);
  // keep only the last k prompt tokens (-1: as many as the context allows; nullopt: all).
  std::optional<bool> add_special_tokens;
  std::optional<int> truncate_prompt_tokens;

  int n = 1;
  // vLLM's `priority`: lower is scheduled first on the workers (admission order and preemption
  // victims), FCFS among equals; 0 by default. Any 32-bit integer.
  int priority = 0;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Logprobs requested (completions `logprobs: k`; chat `logprobs: true` with `top_logprobs: k`):
  // the number of alternatives per token. nullopt: none.
  std::optional<int> logprobs;
  // vLLM's prompt_logprobs as given (params.prompt_logprobs may be larger: echo with logprobs).
  std::optional<int> prompt_logprobs;
  // Sampling, with params.max_tokens as the client gave it (unset when omitted) and
  // params.logprobs == logprobs. The frontend adds the context limit.
  SamplingParams params;
  // Used when max_tokens is omitted (completions: 16); nullopt: up to the context limit.
  std::optional<int> default_max_tokens;
  // Which sampling fields the client gave (a generation_config.json default applies to the
  // others: prompt_builder.h).
  struct Given {
    bool temperature = false;
    bool top_p = false;
    bool top_k = false;
    bool min_p = false;
    bool repetition_penalty = false;
  };
  Given given;
};

absl::StatusOr<OpenAiRequest> ParseCompletionRequest(absl::string_view body);
absl::StatusOr<OpenAiRequest> ParseChatCompletionRequest(absl::string_view body);

// vLLM's `POST /tokenize`: {"prompt": str, "add_special_tokens" (default true)} or {"messages",
// "tools" (rendered by the template, as in chat), "add_generation_prompt",
// "continue_final_message", "chat_template_kwargs",
// "add_special_tokens" (default false)}, each with optional "model" and "return_token_strs".
// The result is a request of the matching endpoint (one prompt) for TokenizePrompt.
struct TokenizeRequest {
  OpenAiRequest request;
  bool return_token_strs = false;
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body);
// vLLM's `POST /detokenize`: {"model"?, "tokens": [ids]}; the ids are checked against the
// vocabulary by the caller.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body);

// Every field of `r` as one JSON object (for tests and debugging logs): two requests that would
// be served alike give the same text.
std::string RequestDebugJson(const OpenAiRequest& r);

// ---- Responses ----

struct LogprobAlternative {
  std::string token;
  float logprob = 0.0f;
};

struct LogprobEntry {
  std::string token;  // the token's text
  float logprob = 0.0f;
  std::vector<LogprobAlternative> top;
  int text_offset = 0;  // completions: offset of the token in the choice's text
  bool null = false;    // echo: the prompt's first token (null logprob and alternatives)
};

// vLLM's prompt_logprobs: one position's {"<token id>": {"logprob", "rank", "decoded_token"}},
// the prompt token first, then the alternatives not already listed.
struct PromptLogprobToken {
  int32_t token_id = 0;
  float logprob = 0.0f;
  int rank = 0;
  std::string decoded;
};
// Prompt position 0 is null; position i > 0 scores prompt token i.
using PromptLogprobs = std::vector<std::optional<std::vector<PromptLogprobToken>>>;

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};

struct ResponseMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  bool logprobs = false;         // logprobs were requested (else `logprobs: null`)
  bool prompt_logprobs = false;  // prompt_logprobs were requested (else absent)
};

struct ChoiceResult {
  int index = 0;
  std::string text;
  std::vector<LogprobEntry> logprobs;
  std::string finish_reason;
  bool content_null = false;  // chat: "content": null (a message of tool calls only)
  std::vector<ToolCall> tool_calls = {};
  PromptLogprobs prompt_logprobs = {};  // meta.prompt_logprobs: the choice's prompt's
};

// The whole non-streaming response body. meta.prompt_logprobs: completions put each choice's
// prompt_logprobs in the choice; chat puts the first choice's at the top level (vLLM's shapes).
std::string ResponseJson(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                         const Usage& usage);

// One streamed choice delta. Chat: `role` sends {"role": "assistant", "content": ""}; `text`
// sends {"content": text}; `tool_calls` sends {"tool_calls": [{index, id?, type?, function:
// {name?, arguments}}]} (id, type and name on a call's first delta); a finish chunk has an empty
// delta. Completions: {"text": text}.
struct StreamDelta {
  int index = 0;
  bool role = false;
  std::optional<std::string> text;
  std::vector<LogprobEntry> logprobs;
  std::optional<std::string> finish_reason;
  std::vector<ToolCallDelta> tool_calls = {};  // chat: {"tool_calls": [...]}
};

// "data: {...}\n\n". `usage_null` adds "usage": null (stream_options.include_usage).
std::string StreamChunkEvent(const ResponseMeta& meta, const StreamDelta& delta, bool usage_null);
// The final usage chunk: "choices": [] and "usage".
std::string UsageChunkEvent(const ResponseMeta& meta, const Usage& usage);
std::string ErrorEvent(const ApiError& error);
inline constexpr absl::string_view kDoneEvent = "data: [DONE]\n\n";

}  // namespace tandem::router

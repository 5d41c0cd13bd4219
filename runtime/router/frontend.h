#pragma once
// The router's OpenAI HTTP frontend: validates requests (openai_protocol.h), applies the chat
// template, tokenizes, enforces the context limit, fans `n` choices out to a GenerationBackend,
// and answers JSON or Server-Sent Events. Routes:
//   POST /v1/completions, POST /v1/chat/completions
//   GET  /v1/models, GET /v1/models/{name}
//   GET  /health   200 {"status":"ok"} when backend->Ready(), else 503 with the reason
//   GET  /metrics  Prometheus text of `registry` (RouterMetrics) plus options.extra_metrics()
// Before routing, options.access is checked (access_policy.h): 421 for a Host this server does
// not answer for, 401 without a valid API key on /v1/ routes (when keys are set), 415 for a POST
// that is not application/json.
// Errors use the OpenAI body {"error": {"message", "type", "param", "code"}}: 400 bad input
// (prompt too long: code "context_length_exceeded"), 404 unknown model (code "model_not_found")
// or route, 405 wrong method (with Allow), 413 oversized body, 503 backend not ready or
// Unavailable/ResourceExhausted before anything was streamed, 500 other backend errors before
// streaming; an error after streaming started is a `data: {"error": ...}` event then `[DONE]`.
// A client that disconnects has its backend requests cancelled (GenerationBackend::Cancel).
//
// Ownership: `backend` and `registry` are not owned and must outlive the frontend (and reach
// their final events for every request before being destroyed; Stop() waits for that, bounded).
// Threading: Create/Start/Stop/port from one controlling thread; requests are served on
// options.http.num_threads io threads; backend callbacks may come from any thread.
// Failure: Create fails (nothing started) on an unreadable model dir or bad access options
// (an empty key, an allowed host with a port); Start fails when the port
// cannot be bound (the frontend can then be destroyed or Start retried).
//
//   auto frontend = RouterFrontend::Create(options, &backend, &registry);   // StatusOr
//   RETURN_IF_ERROR((*frontend)->Start());
//   int port = (*frontend)->port();
//   ...
//   (*frontend)->Stop();

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/model/chat_template.h"
#include "runtime/model/tokenizer.h"
#include "runtime/router/access_policy.h"
#include "runtime/router/generation_backend.h"
#include "runtime/router/http_server.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace tandem::metrics {
struct RouterMetrics;
}  // namespace tandem::metrics

namespace tandem::router {

struct FrontendModelOptions {
  // `--chat-template FILE`: this template instead of the model's ("": the model's).
  std::string chat_template_file;
  // `--generation-config`: "auto" (the model directory's generation_config.json, if any),
  // "vllm" or "none" (no defaults: the API's own), or a directory holding generation_config.json.
  std::string generation_config = "auto";
  // `--tool-call-parser`: how tool_choice "auto" reads calls from the output: "auto" (from the
  // chat template's text, tool_calls.h DetectToolCallParser), "hermes", "llama3_json", or "none"
  // (auto is then a 400; required and named functions still work).
  std::string tool_call_parser = "auto";
};

struct RouterFrontendOptions {
  // host (default 0.0.0.0), port (0: a free one), num_threads, max_body_bytes (default 4 MiB),
  // timeouts. error_response is set by the frontend (OpenAI error bodies).
  HttpServerOptions http;
  // tokenizer.json, tokenizer_config.json (chat template, bos/eos), config.json (context limit).
  std::string model_dir;
  // The name /v1/models lists and requests must use (or omit). Default: basename of model_dir.
  std::string served_model_name;
  // --chat-template and --generation-config (FrontendModelOptions).
  FrontendModelOptions model_options;
  // Context limit (prompt + generated tokens). 0: config.json max_position_embeddings.
  int max_model_len = 0;
  // Deadline given to the backend for each request.
  absl::Duration request_timeout = absl::InfiniteDuration();
  // Extra Prometheus text appended to /metrics (called on an io thread; may be empty).
  std::function<std::string()> extra_metrics;
  // API keys and accepted Host names (access_policy.h); bind_host is taken from http.host.
  AccessOptions access;
  // Parsing, chat templating and tokenizing run on this many threads, off the HTTP I/O threads
  // (a large prompt then never delays /health or another client's stream); at most
  // `max_pending_requests` wait for them, beyond that a request gets 429 with Retry-After.
  int prepare_threads = 2;
  int max_pending_requests = 4096;
  // Fairness: the choices of one request (`n`) that run at once; the next starts as one ends. A
  // request with n = 128 then holds at most this many batch slots.
  int max_parallel_choices = 4;
  // Called (on a backend thread, under a request's lock: must be quick and not call back) for
  // each choice that finished normally, with its prompt and output lengths in tokens: the
  // online planner's view of the workload (planning/online_planner.h). Null: none.
  std::function<void(int prompt_tokens, int output_tokens)> on_choice_done = nullptr;
};

// Sampling defaults from a generation_config.json (vLLM's --generation-config): used for a field
// the request does not give. max_new_tokens becomes the default max_tokens (clamped to the room
// the prompt leaves) on both endpoints.
struct GenerationDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::optional<int> max_tokens;
};

// What the frontend needs of the model.
struct FrontendModel {
  std::shared_ptr<const Tokenizer> tokenizer;  // required
  // Null when the model has none: chat requests then get 400 with `chat_template_error`.
  std::shared_ptr<const ChatTemplate> chat_template;
  std::string chat_template_error;
  int max_model_len = 0;  // required, > 0
  GenerationDefaults generation_defaults;
  // The tool-call parser for tool_choice "auto" (a kToolCallParsers name); "" for none.
  std::string tool_call_parser;
};

// Loads the tokenizer, chat template, config.json context limit and generation defaults of
// `model_dir`. Errors name the file: a --chat-template that does not compile, a
// generation_config.json with a value out of range, a --generation-config directory without one.
absl::StatusOr<FrontendModel> LoadFrontendModel(const std::string& model_dir,
                                                const FrontendModelOptions& options = {});

// generation_config.json's sampling fields (temperature, top_p, top_k, min_p,
// repetition_penalty, max_new_tokens); other fields are the model's business, not sampling's.
absl::StatusOr<GenerationDefaults> ReadGenerationDefaults(const std::string& file);

class RouterFrontend {
 public:
  // Loads the model files from options.model_dir.
  static absl::StatusOr<std::unique_ptr<RouterFrontend>> Create(RouterFrontendOptions options,
                                                                GenerationBackend* backend,
                                                                prometheus::Registry* registry);
  // With the model objects given (options.model_dir then only names the default served model;
  // options.max_model_len, when set, overrides model.max_model_len).
  static absl::StatusOr<std::unique_ptr<RouterFrontend>> Create(RouterFrontendOptions options,
                                                                FrontendModel model,
                                                                GenerationBackend* backend,
                                                                prometheus::Registry* registry);
  ~RouterFrontend();  // Stop()

  // Binds and starts serving.
  absl::Status Start();
  // The bound port (after Start).
  int port() const;
  const std::string& served_model_name() const;
  // The router metrics registered in `registry` (for the worker gauges of the pool).
  metrics::RouterMetrics& metrics();
  // Graceful shutdown, before Stop: new generation requests get 503 ("shutting down", with
  // Retry-After) at once; in-flight ones get up to `timeout` to finish; every one still running
  // then ends with a final error (an SSE error event and [DONE] for a stream, a 503 otherwise)
  // and its backend requests are cancelled. Returns once every response has its final event (or
  // 5 s after the timeout).
  void Drain(absl::Duration timeout);
  // Stops accepting, lets in-flight responses finish for http.shutdown_grace, then closes the
  // rest and cancels their backend requests, and waits (up to 5 s) for the backend's final
  // events. Idempotent; the frontend cannot be started again.
  void Stop();

  struct Core;

 private:
  RouterFrontend(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace tandem::router

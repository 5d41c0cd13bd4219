#include "runtime/router/frontend.h"

#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "prometheus/registry.h"
#include "runtime/base/call_executor.h"
#include "runtime/base/logging.h"
#include "runtime/metrics/metrics.h"
#include "runtime/model/model_config.h"
#include "runtime/router/openai_protocol.h"
#include "runtime/router/prompt_builder.h"

namespace tandem::router {

using json = nlohmann::json;

namespace {

constexpr absl::Duration kBackendDrainTimeout = absl::Seconds(5);
constexpr absl::string_view kCompletionsPath = "/v1/completions";
constexpr absl::string_view kChatPath = "/v1/chat/completions";
constexpr absl::string_view kModelsPath = "/v1/models";
constexpr absl::string_view kTokenizePath = "/tokenize";
constexpr absl::string_view kDetokenizePath = "/detokenize";
constexpr absl::string_view kVersionPath = "/version";
constexpr absl::string_view kEmbeddingsPath = "/v1/embeddings";

HttpResponse JsonResponse(int status, std::string body) {
  return HttpResponse{status, "application/json", {}, std::move(body)};
}

// Seconds a client should wait before retrying a 429 (the router is full) or a 503 (no healthy
// worker): the time the router needs to drain a little, or to see a restarted worker.
constexpr int kRetryAfterFullSeconds = 1;
constexpr int kRetryAfterUnavailableSeconds = 2;

HttpResponse ErrorResponse(const ApiError& e) {
  HttpResponse response = JsonResponse(e.http_status, ErrorJson(e));
  if (e.http_status == 429 || e.http_status == 503) {
    response.headers.emplace_back(
        "Retry-After", absl::StrCat(e.http_status == 429 ? kRetryAfterFullSeconds
                                                         : kRetryAfterUnavailableSeconds));
  }
  return response;
}

// Adds fixed headers (CORS) to whatever response the wrapped exchange sends.
class HeaderAddingExchange final : public HttpExchange {
 public:
  HeaderAddingExchange(std::shared_ptr<HttpExchange> inner, HttpHeaders headers)
      : inner_(std::move(inner)), headers_(std::move(headers)) {}
  void Respond(HttpResponse response) override {
    response.headers.insert(response.headers.end(), headers_.begin(), headers_.end());
    inner_->Respond(std::move(response));
  }
  void StartStream(int status, std::string content_type, HttpHeaders headers) override {
    headers.insert(headers.end(), headers_.begin(), headers_.end());
    inner_->StartStream(status, std::move(content_type), std::move(headers));
  }
  void WriteChunk(std::string data) override { inner_->WriteChunk(std::move(data)); }
  void EndStream() override { inner_->EndStream(); }
  void SetCloseHandler(std::function<void()> on_close) override {
    inner_->SetCloseHandler(std::move(on_close));
  }

 private:
  const std::shared_ptr<HttpExchange> inner_;
  const HttpHeaders headers_;
};

// Unicode code points in `s` (OpenAI text offsets count characters, not bytes).
int CodePoints(absl::string_view s) {
  int n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace

absl::StatusOr<GenerationDefaults> ReadGenerationDefaults(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", file));
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": not a JSON object"));
  }
  GenerationDefaults d;
  const auto number = [&](const char* key, double lo, double hi, bool lo_open,
                          std::optional<float>* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return absl::OkStatus();
    const double v = it->is_number() ? it->get<double>() : std::nan("");
    if (!std::isfinite(v) || (lo_open ? v <= lo : v < lo) || v > hi) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": \"", key, "\" must be a number in ",
                                                     lo_open ? "(" : "[", lo, ", ", hi, "]"));
    }
    *out = static_cast<float>(v);
    return absl::OkStatus();
  };
  const auto integer = [&](const char* key, int64_t lo, std::optional<int>* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number_integer() || it->get<int64_t>() < lo ||
        it->get<int64_t>() > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": \"", key, "\" must be an integer >= ", lo));
    }
    *out = static_cast<int>(it->get<int64_t>());
    return absl::OkStatus();
  };
  if (absl::Status s = number("temperature", 0, 2, false, &d.temperature); !s.ok()) return s;
  if (absl::Status s = number("top_p", 0, 1, true, &d.top_p); !s.ok()) return s;
  if (absl::Status s = number("min_p", 0, 1, false, &d.min_p); !s.ok()) return s;
  if (absl::Status s = number("repetition_penalty", 0, 1e9, true, &d.repetition_penalty); !s.ok()) {
    return s;
  }
  if (absl::Status s = integer("top_k", -1, &d.top_k); !s.ok()) return s;
  if (absl::Status s = integer("max_new_tokens", 1, &d.max_tokens); !s.ok()) return s;
  return d;
}

absl::StatusOr<FrontendModel> LoadFrontendModel(const std::string& model_dir,
                                                const FrontendModelOptions& options) {
  FrontendModel model;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromModelDir(model_dir);
  if (!tokenizer.ok()) return tokenizer.status();
  model.tokenizer = *std::move(tokenizer);
  if (!options.chat_template_file.empty()) {
    // The operator asked for this template: one that does not load is an error, not a fallback.
    absl::StatusOr<std::unique_ptr<ChatTemplate>> tmpl =
        ChatTemplate::FromFile(options.chat_template_file, model_dir);
    if (!tmpl.ok()) return tmpl.status();
    model.chat_template = *std::move(tmpl);
  } else if (absl::StatusOr<std::unique_ptr<ChatTemplate>> tmpl =
                 ChatTemplate::FromModelDir(model_dir);
             tmpl.ok()) {
    model.chat_template = *std::move(tmpl);
  } else {
    model.chat_template_error =
        absl::StrCat("the model has no usable chat template: ", tmpl.status().message());
  }
  const std::string& parser = options.tool_call_parser;
  if (parser == "auto") {
    if (model.chat_template != nullptr) {
      model.tool_call_parser = DetectToolCallParser(model.chat_template->source());
    }
  } else if (parser != "none") {
    bool known = false;
    for (absl::string_view name : kToolCallParsers) known |= parser == name;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("--tool-call-parser ", parser,
                                                     ": expected auto, none, ",
                                                     absl::StrJoin(kToolCallParsers, ", ")));
    }
    model.tool_call_parser = parser;
  }
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model_dir);
  if (!config.ok()) return config.status();
  model.max_model_len = config->max_position_embeddings;
  const std::string& g = options.generation_config;
  if (g == "auto") {
    const std::filesystem::path file = std::filesystem::path(model_dir) / "generation_config.json";
    if (std::filesystem::exists(file)) {
      absl::StatusOr<GenerationDefaults> d = ReadGenerationDefaults(file.string());
      if (!d.ok()) return d.status();
      model.generation_defaults = *d;
    }
  } else if (g != "vllm" && g != "none") {
    const std::filesystem::path file = std::filesystem::path(g) / "generation_config.json";
    absl::StatusOr<GenerationDefaults> d = ReadGenerationDefaults(file.string());
    if (!d.ok()) {
      return absl::Status(d.status().code(),
                          absl::StrCat("--generation-config ", g, ": ", d.status().message()));
    }
    model.generation_defaults = *d;
  }
  return model;
}

// An in-flight generation request, as Drain sees it.
class LiveRequest {
 public:
  virtual ~LiveRequest() = default;
  // Ends the response now with `status` (its final event) unless it already ended.
  virtual void Abort(const absl::Status& status) = 0;
};

// State shared by the HTTP handler and every in-flight request (kept alive by them).
struct RouterFrontend::Core : std::enable_shared_from_this<RouterFrontend::Core> {
  Core(RouterFrontendOptions o, FrontendModel m, AccessPolicy a, GenerationBackend* b,
       prometheus::Registry* r)
      : options(std::move(o)),
        model(std::move(m)),
        access(std::move(a)),
        backend(b),
        registry(r),
        metrics(*r),
        prepare_pool(std::make_shared<CallExecutor>(std::max(1, options.prepare_threads))) {
    created = absl::ToUnixSeconds(absl::Now());
  }

  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange);
  // POST /tokenize and /detokenize (vLLM's shapes), on the prepare pool.
  void HandleTokenize(const HttpRequest& request, HttpExchange& exchange);
  // `arrival`: when the I/O thread handed the request over (before the prepare pool's queue).
  void HandleGenerate(Endpoint endpoint, const HttpRequest& request,
                      std::shared_ptr<HttpExchange> exchange, absl::Time arrival);
  // 128 bits from the kernel's CSPRNG per request: nobody can guess another client's id (the
  // workers' Cancel takes it). A counter only if getrandom fails (it does not once booted).
  std::string NewId() {
    uint64_t words[2];
    if (getrandom(words, sizeof(words), 0) != static_cast<ssize_t>(sizeof(words))) {
      LOG(ERROR) << "router frontend: getrandom failed; request ids are not random";
      words[0] = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
      words[1] = next_id.fetch_add(1);
    }
    return absl::StrFormat("%016x%016x", words[0], words[1]);
  }
  void CountRequest(absl::string_view endpoint, int code) {
    WithMetrics([&](metrics::RouterMetrics& m) {
      m.requests.Add({{"endpoint", std::string(endpoint)}, {"code", absl::StrCat(code)}})
          .Increment();
    });
  }
  void Finish(absl::string_view endpoint, HttpExchange& exchange, HttpResponse response) {
    CountRequest(endpoint, response.status);
    exchange.Respond(std::move(response));
  }
  // The access log: one line per generation request, when it has ended.
  struct Access {
    absl::string_view endpoint = {};
    int status = 0;
    absl::string_view id = {};         // ours ("-" when refused before one was made)
    absl::string_view client_id = {};  // the client's X-Request-Id ("" when none)
    int prompt_tokens = 0;
    int completion_tokens = 0;
    absl::Duration ttft = absl::InfiniteDuration();  // infinite: no token
    absl::Duration e2e = {};
    // e2e less the time between the first backend call and the last backend event: what the
    // router itself added (parsing, templating, tokenizing, routing, detokenizing, writing).
    // Infinite: the request never reached a backend.
    absl::Duration router = absl::InfiniteDuration();
    absl::string_view error = {};
  };
  void LogAccess(const Access& a) {
    LOG(INFO) << "access " << a.endpoint << " status=" << a.status << " id=" << a.id
              << " client_request_id=" << (a.client_id.empty() ? "-" : a.client_id)
              << " prompt_tokens=" << a.prompt_tokens
              << " completion_tokens=" << a.completion_tokens << " ttft_ms="
              << (a.ttft == absl::InfiniteDuration()
                      ? std::string("-")
                      : absl::StrFormat("%.1f", absl::ToDoubleMilliseconds(a.ttft)))
              << " e2e_ms=" << absl::StrFormat("%.2f", absl::ToDoubleMilliseconds(a.e2e))
              << " router_ms="
              << (a.router == absl::InfiniteDuration()
                      ? std::string("-")
                      : absl::StrFormat("%.3f", absl::ToDoubleMilliseconds(a.router)))
              << (a.error.empty() ? "" : " error=\"") << a.error << (a.error.empty() ? "" : "\"");
  }
  // Runs `fn` unless the frontend stopped (the registry may then be gone).
  template <typename F>
  void WithMetrics(F fn) {
    absl::ReaderMutexLock lock(&gate_mu);
    if (!stopped) fn(metrics);
  }
  // Not under gate_mu: a backend may deliver the final event from inside Cancel.
  void CancelBackend(const std::vector<std::string>& ids) {
    {
      absl::ReaderMutexLock lock(&gate_mu);
      if (stopped) return;
    }
    for (const std::string& id : ids) backend->Cancel(id);
  }
  void RequestStarted(const std::shared_ptr<LiveRequest>& request) {
    absl::MutexLock lock(&flight_mu);
    ++in_flight;
    live[request.get()] = request;
  }
  void RequestDone(LiveRequest* request) {
    absl::MutexLock lock(&flight_mu);
    --in_flight;
    live.erase(request);
  }
  bool draining() {
    absl::MutexLock lock(&flight_mu);
    return drain_started;
  }
  void WaitForBackend(absl::Duration timeout) {
    absl::MutexLock lock(&flight_mu);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(flight_mu) { return in_flight == 0; };
    if (!flight_mu.AwaitWithTimeout(absl::Condition(&idle), timeout)) {
      LOG(WARNING) << "router frontend: " << in_flight
                   << " backend requests still without a final event at stop";
    }
  }

  RouterFrontendOptions options;
  FrontendModel model;
  const AccessPolicy access;
  GenerationBackend* backend;
  prometheus::Registry* registry;
  metrics::RouterMetrics metrics;
  std::atomic<uint64_t> next_id{0};
  int64_t created = 0;

  absl::Mutex gate_mu;
  bool stopped ABSL_GUARDED_BY(gate_mu) = false;
  std::shared_ptr<CallExecutor> prepare_pool;  // HandleGenerate runs here
  std::atomic<int> pending_prepares{0};
  absl::Mutex flight_mu;
  int in_flight ABSL_GUARDED_BY(flight_mu) = 0;
  absl::flat_hash_map<LiveRequest*, std::weak_ptr<LiveRequest>> live ABSL_GUARDED_BY(flight_mu);
  bool drain_started ABSL_GUARDED_BY(flight_mu) = false;
};

namespace {

// One generation request (n backend requests) from parse to the last byte.
class RequestState : public LiveRequest, public std::enable_shared_from_this<RequestState> {
 public:
  RequestState(std::shared_ptr<RouterFrontend::Core> core, std::shared_ptr<HttpExchange> exchange,
               const OpenAiRequest& req, ResponseMeta meta, std::string endpoint_label,
               std::vector<PreparedPrompt> prompts, std::string client_request_id,
               absl::Time arrival)
      : core_(std::move(core)),
        client_request_id_(std::move(client_request_id)),
        exchange_(std::move(exchange)),
        stream_(req.stream),
        include_usage_(req.include_usage),
        echo_(req.echo),
        logprobs_(req.logprobs),
        prompt_logprobs_(req.prompt_logprobs),
        scores_prompt_(req.params.prompt_logprobs.has_value()),
        tool_choice_(req.tools.choice),
        meta_(std::move(meta)),
        endpoint_label_(std::move(endpoint_label)),
        n_(req.n),
        prompts_(std::move(prompts)),
        start_(arrival),
        choices_(prompts_.size() * req.n),
        remaining_(static_cast<int>(prompts_.size()) * req.n) {
    for (size_t i = 0; i < choices_.size(); ++i) {
      choices_[i].backend_id = absl::StrCat(meta_.id, "-", i);
      backend_ids_.push_back(choices_[i].backend_id);
      if (req.tools.parses_output()) {
        // HandleGenerate made one already, so this one is made too.
        choices_[i].tool_parser = *CreateToolCallParser(req.tools, core_->model.tool_call_parser);
      }
    }
    for (const PreparedPrompt& p : prompts_) {
      prompt_tokens_ += static_cast<int>(p.token_ids.size());
    }
  }

  // Fixed at construction (before any concurrency), so readable without the lock.
  const std::string& backend_id(int i) const { return backend_ids_[i]; }

  // Starts the request's choices: at most `max_parallel` at a time, the next one as each ends
  // (a request with n = 128 then takes a bounded share of the workers, not 128 batch slots).
  void Launch(absl::Time deadline, int priority, int max_parallel) {
    deadline_ = deadline;
    priority_ = priority;
    int first;
    {
      absl::MutexLock lock(&mu_);
      backend_start_ = absl::Now();
      first = std::min<int>(static_cast<int>(choices_.size()), std::max(1, max_parallel));
      next_choice_ = first;
    }
    for (int i = 0; i < first; ++i) StartChoice(i);
  }

  void OnEvent(int i, absl::StatusOr<BackendChunk> event) {
    std::vector<std::string> to_cancel;
    int start = -1;
    {
      absl::MutexLock lock(&mu_);
      Choice& c = choices_[i];
      if (c.done) return;
      last_backend_event_ = absl::Now();
      if (!event.ok()) {
        c.done = true;
        --remaining_;
        if (!finished_) to_cancel = FailLocked(event.status());
      } else {
        HandleChunkLocked(i, *std::move(event), &to_cancel);
      }
      if (c.done && !finished_ && next_choice_ < static_cast<int>(choices_.size())) {
        start = next_choice_++;
      }
      if (remaining_ == 0) DoneLocked();
    }
    core_->CancelBackend(to_cancel);
    if (start >= 0) StartChoice(start);
  }

  void Abort(const absl::Status& status) override {
    std::vector<std::string> to_cancel;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      to_cancel = FailLocked(status);
      if (remaining_ == 0) DoneLocked();
    }
    core_->CancelBackend(to_cancel);
  }

  void OnClientGone() {
    std::vector<std::string> to_cancel;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      client_gone_ = true;
      core_->CountRequest(endpoint_label_, 499);  // nginx's "client closed request"
      status_code_ = 499;
      AbandonUnstartedLocked();
      if (remaining_ == 0) {
        DoneLocked();
        return;
      }
      for (const Choice& c : choices_) {
        if (!c.done) to_cancel.push_back(c.backend_id);
      }
    }
    core_->CancelBackend(to_cancel);
  }

 private:
  struct Choice {
    std::string backend_id;
    std::string text;
    std::vector<LogprobEntry> logprobs;
    std::string finish_reason;
    int text_chars = 0;  // code points of `text` (completions text_offset)
    bool started = false;
    bool done = false;
    bool prompt_scored = false;  // the prompt's logprobs arrived (when it is scored)
    PromptLogprobs prompt_logprobs;
    BackendUsage usage;
    int tokens = 0;
    absl::Time last_token;
    std::unique_ptr<ToolCallParser> tool_parser;  // chat with tools: the output's calls
    std::vector<ToolCall> tool_calls;
  };

  // The prompt's scores from the first chunk with a token: vLLM's prompt_logprobs, and echo's
  // leading logprob entries. False (nothing kept) when they do not describe this prompt.
  bool TakePromptScoresLocked(int i, const BackendChunk& chunk,
                              std::vector<LogprobEntry>* echo_entries)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Choice& c = choices_[i];
    const std::vector<int32_t>& prompt = prompts_[i / n_].token_ids;
    const std::vector<BackendTokenLogprobs>& scored = chunk.prompt_logprobs;
    if (prompt.empty() || scored.size() != prompt.size() - 1) return false;
    for (size_t k = 0; k < scored.size(); ++k) {
      if (scored[k].token_id != prompt[k + 1]) return false;
    }
    c.prompt_scored = true;
    const Tokenizer& tok = *core_->model.tokenizer;
    const auto text = [&](int32_t id) {
      return tok.Decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
    };
    if (prompt_logprobs_.has_value()) {
      const size_t top = static_cast<size_t>(*prompt_logprobs_);
      c.prompt_logprobs.assign(1, std::nullopt);
      for (const BackendTokenLogprobs& lp : scored) {
        std::vector<PromptLogprobToken> position = {
            {lp.token_id, lp.logprob, lp.rank, text(lp.token_id)}};
        for (size_t t = 0; t < std::min(top, lp.top.size()); ++t) {
          const BackendTopLogprob& alt = lp.top[t];
          if (alt.token_id == lp.token_id) continue;
          position.push_back(
              {alt.token_id, alt.logprob, static_cast<int>(t) + 1, text(alt.token_id)});
        }
        c.prompt_logprobs.push_back(std::move(position));
      }
    }
    if (echo_ && logprobs_.has_value()) {
      const size_t top = static_cast<size_t>(*logprobs_);
      LogprobEntry first;
      first.token = text(prompt[0]);
      first.null = true;
      echo_entries->push_back(std::move(first));
      for (const BackendTokenLogprobs& lp : scored) {
        LogprobEntry e;
        e.token = text(lp.token_id);
        e.logprob = lp.logprob;
        for (size_t t = 0; t < std::min(top, lp.top.size()); ++t) {
          e.top.push_back({text(lp.top[t].token_id), lp.top[t].logprob});
        }
        echo_entries->push_back(std::move(e));
      }
    }
    return true;
  }

  // `to_cancel`: the backend requests to cancel once the lock is released (the request failed).
  void HandleChunkLocked(int i, BackendChunk chunk, std::vector<std::string>* to_cancel)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Choice& c = choices_[i];
    const absl::Time now = absl::Now();
    const bool has_tokens = !chunk.token_ids.empty();
    std::vector<LogprobEntry> echo_entries;
    if (scores_prompt_ && has_tokens && !c.prompt_scored &&
        !TakePromptScoresLocked(i, chunk, &echo_entries)) {
      // A worker that does not score the prompt, or scores another one: nothing is made up.
      if (!finished_) {
        *to_cancel = FailLocked(
            absl::InternalError("the decode worker's prompt logprobs do not match the prompt"));
      }
      // This choice's stream is still running: cancel it too, and take nothing more from it.
      if (std::find(to_cancel->begin(), to_cancel->end(), c.backend_id) == to_cancel->end()) {
        to_cancel->push_back(c.backend_id);
      }
      c.done = true;
      --remaining_;
      return;
    }
    if (has_tokens) {
      const bool first = !first_token_seen_;
      if (first) first_token_at_ = now;
      const int tokens_before = c.tokens;
      const absl::Time last_token = c.last_token;
      core_->WithMetrics([&](metrics::RouterMetrics& m) {
        if (first) {
          m.ttft.Observe(absl::ToDoubleSeconds(now - start_));
        } else if (tokens_before > 0) {
          m.inter_token.Observe(absl::ToDoubleSeconds(now - last_token));
        }
        if (chunk.ttft.has_value()) {
          m.ttft_queue.Observe(chunk.ttft->queue_us * 1e-6);
          m.ttft_prefill.Observe(chunk.ttft->prefill_us * 1e-6);
          m.ttft_transfer.Observe(chunk.ttft->transfer_us * 1e-6);
          m.ttft_first_decode.Observe(chunk.ttft->first_decode_us * 1e-6);
        }
      });
      first_token_seen_ = true;
      c.last_token = now;
      c.tokens += static_cast<int>(chunk.token_ids.size());
    }
    std::string text = std::move(chunk.text);
    const std::string& prompt_text = prompts_[i / n_].text;
    if (echo_ && !c.started) text = prompt_text + text;
    std::vector<LogprobEntry> entries;
    if (meta_.logprobs) {
      const Tokenizer& tok = *core_->model.tokenizer;
      const size_t n = std::min(chunk.token_ids.size(), chunk.logprobs.size());
      for (size_t k = 0; k < n; ++k) {
        const BackendTokenLogprobs& lp = chunk.logprobs[k];
        LogprobEntry e;
        const int32_t id = chunk.token_ids[k];
        e.token = tok.Decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
        e.logprob = lp.logprob;
        for (const BackendTopLogprob& t : lp.top) {
          e.top.push_back({tok.Decode(std::span<const int32_t>(&t.token_id, 1), false), t.logprob});
        }
        entries.push_back(std::move(e));
      }
    }
    // Offsets follow the tokens' texts (which may differ from `text` at UTF-8 boundaries).
    int offset = 0;
    for (LogprobEntry& e : echo_entries) {
      e.text_offset = offset;
      offset += CodePoints(e.token);
    }
    offset = c.text_chars;
    if (echo_ && !c.started) offset += CodePoints(prompt_text);
    for (LogprobEntry& e : entries) {
      e.text_offset = offset;
      offset += CodePoints(e.token);
    }
    if (!echo_entries.empty()) {
      entries.insert(entries.begin(), std::make_move_iterator(echo_entries.begin()),
                     std::make_move_iterator(echo_entries.end()));
    }
    c.text_chars = entries.empty() ? c.text_chars + CodePoints(text) : offset;
    std::vector<ToolCallDelta> calls;
    if (c.tool_parser != nullptr) {
      // Tool calls leave the text; the content is what the parser passes on.
      ToolParseOutput out = c.tool_parser->Feed(text);
      if (chunk.finish_reason.has_value()) {
        ToolParseOutput rest = c.tool_parser->Finish();
        out.content += rest.content;
        out.calls.insert(out.calls.end(), rest.calls.begin(), rest.calls.end());
      }
      text = std::move(out.content);
      calls = std::move(out.calls);
      AppendToolCallDeltas(calls, &c.tool_calls);
    }
    c.text += text;
    c.logprobs.insert(c.logprobs.end(), entries.begin(), entries.end());
    c.usage = chunk.usage;
    const bool first = !c.started;
    c.started = true;
    if (chunk.finish_reason.has_value()) {
      c.finish_reason = *chunk.finish_reason;
      if (core_->options.on_choice_done && c.finish_reason != "abort") {
        core_->options.on_choice_done(static_cast<int>(prompts_[i / n_].token_ids.size()),
                                      std::max(c.usage.completion_tokens, c.tokens));
      }
      // OpenAI's reason for a turn that ended in calls (a named function's stays "stop").
      if (c.finish_reason == "stop" && c.tool_parser != nullptr && c.tool_parser->calls() > 0 &&
          tool_choice_ != ToolChoice::kFunction) {
        c.finish_reason = "tool_calls";
      }
      c.done = true;
      --remaining_;
    }
    if (finished_) return;

    if (!stream_) {
      if (remaining_ == 0) {
        std::vector<ChoiceResult> results;
        for (size_t k = 0; k < choices_.size(); ++k) {
          ChoiceResult r;
          r.index = static_cast<int>(k);
          r.text = std::move(choices_[k].text);
          r.tool_calls = std::move(choices_[k].tool_calls);
          r.content_null = r.text.empty() && !r.tool_calls.empty();
          r.logprobs = std::move(choices_[k].logprobs);
          r.prompt_logprobs = std::move(choices_[k].prompt_logprobs);
          r.finish_reason = choices_[k].finish_reason;
          results.push_back(std::move(r));
        }
        HttpResponse r = JsonResponse(200, ResponseJson(meta_, results, UsageLocked()));
        r.headers.emplace_back("X-Request-Id", response_id());
        status_code_ = 200;
        finished_ = true;
        core_->Finish(endpoint_label_, *exchange_, std::move(r));
      }
      return;
    }

    EnsureStreamLocked();
    const bool chat = meta_.endpoint == Endpoint::kChatCompletions;
    if (chat && first) {
      StreamDelta d;
      d.index = i;
      d.role = true;
      exchange_->WriteChunk(StreamChunkEvent(meta_, d, include_usage_));
    }
    // Every chunk that carries tokens is an event, also when they decode to no text yet (a
    // partial UTF-8 character, special tokens): clients time tokens by these events.
    if (has_tokens || !text.empty() || !entries.empty() || !calls.empty()) {
      StreamDelta d;
      d.index = i;
      if (!text.empty() || calls.empty()) d.text = std::move(text);
      d.tool_calls = std::move(calls);
      d.logprobs = std::move(entries);
      exchange_->WriteChunk(StreamChunkEvent(meta_, d, include_usage_));
    }
    if (c.done) {
      StreamDelta d;
      d.index = i;
      if (!chat) d.text = "";
      d.finish_reason = c.finish_reason;
      exchange_->WriteChunk(StreamChunkEvent(meta_, d, include_usage_));
    }
    if (remaining_ == 0) {
      if (include_usage_) exchange_->WriteChunk(UsageChunkEvent(meta_, UsageLocked()));
      exchange_->WriteChunk(std::string(kDoneEvent));
      exchange_->EndStream();
      finished_ = true;
      core_->CountRequest(endpoint_label_, 200);
      status_code_ = 200;
    }
  }

  // Choices not started yet end here (the request failed or its client went away).
  void AbandonUnstartedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int k = next_choice_; k < static_cast<int>(choices_.size()); ++k) {
      choices_[k].done = true;
      --remaining_;
    }
    next_choice_ = static_cast<int>(choices_.size());
  }

  void StartChoice(int i) {
    BackendRequest br;
    br.request_id = backend_ids_[i];
    const PreparedPrompt& prompt = prompts_[i / n_];
    br.prompt_token_ids = prompt.token_ids;
    br.params = prompt.params;
    // The j-th choice of every prompt draws with seed + j (a batch is its prompts' requests).
    if (br.params.seed.has_value()) *br.params.seed += static_cast<uint64_t>(i % n_);
    br.deadline = deadline_;
    br.priority = priority_;
    core_->backend->Generate(std::move(br),
                             [self = shared_from_this(), i](absl::StatusOr<BackendChunk> event) {
                               self->OnEvent(i, std::move(event));
                             });
  }

  // The response fails with `status`; returns the backend requests to cancel.
  std::vector<std::string> FailLocked(const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    AbandonUnstartedLocked();
    ApiError e = ToApiError(status);
    error_ = e.message;
    if (stream_started_) {
      exchange_->WriteChunk(ErrorEvent(e));
      exchange_->WriteChunk(std::string(kDoneEvent));
      exchange_->EndStream();
      core_->CountRequest(endpoint_label_, 200);
      status_code_ = 200;  // the status line was sent; the error went as an event
    } else {
      core_->Finish(endpoint_label_, *exchange_, ErrorResponse(e));
      status_code_ = e.http_status;
    }
    std::vector<std::string> to_cancel;
    for (const Choice& c : choices_) {
      if (!c.done) to_cancel.push_back(c.backend_id);
    }
    return to_cancel;
  }

  void EnsureStreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stream_started_) return;
    stream_started_ = true;
    exchange_->StartStream(200, "text/event-stream", {{"X-Request-Id", response_id()}});
  }

  Usage UsageLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Usage u;
    u.prompt_tokens = prompt_tokens_;  // each prompt once, whatever n is (as OpenAI counts)
    for (size_t p = 0; p < prompts_.size(); ++p) {
      int cached = 0;
      for (int j = 0; j < n_; ++j) {
        const Choice& c = choices_[p * n_ + j];
        u.completion_tokens += std::max(c.usage.completion_tokens, c.tokens);
        cached = std::max(cached, c.usage.cached_prompt_tokens);
      }
      u.cached_tokens += cached;
    }
    return u;
  }

  void DoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Usage u = UsageLocked();
    const absl::Duration e2e = absl::Now() - start_;
    core_->WithMetrics([&](metrics::RouterMetrics& m) {
      m.requests_running.Decrement();
      m.e2e.Observe(absl::ToDoubleSeconds(e2e));
      m.prompt_tokens.Increment(static_cast<double>(prompt_tokens_) * n_);
      m.generation_tokens.Increment(u.completion_tokens);
    });
    core_->LogAccess(
        {.endpoint = endpoint_label_,
         .status = status_code_,
         .id = meta_.id,
         .client_id = client_request_id_,
         .prompt_tokens = prompt_tokens_,
         .completion_tokens = u.completion_tokens,
         .ttft = first_token_seen_ ? first_token_at_ - start_ : absl::InfiniteDuration(),
         .e2e = e2e,
         .router = backend_start_.has_value() && last_backend_event_.has_value()
                       ? e2e - (*last_backend_event_ - *backend_start_)
                       : absl::InfiniteDuration(),
         .error = error_});
    core_->RequestDone(this);
  }

  // The response's X-Request-Id: the client's when it sent one, else ours.
  const std::string& response_id() const {
    return client_request_id_.empty() ? meta_.id : client_request_id_;
  }

  const std::shared_ptr<RouterFrontend::Core> core_;
  const std::string client_request_id_;
  const std::shared_ptr<HttpExchange> exchange_;
  const bool stream_;
  const bool include_usage_;
  const bool echo_;
  const std::optional<int> logprobs_;         // the client's `logprobs` (alternatives)
  const std::optional<int> prompt_logprobs_;  // the client's `prompt_logprobs`
  const bool scores_prompt_;                  // params.prompt_logprobs: the workers score it
  const ToolChoice tool_choice_;
  const ResponseMeta meta_;
  const std::string endpoint_label_;
  const int n_;                                // choices per prompt
  const std::vector<PreparedPrompt> prompts_;  // choice i is of prompt i / n_
  int prompt_tokens_ = 0;                      // written in the constructor only
  const absl::Time start_;  // the I/O thread handed the request over: e2e and TTFT start here
  std::vector<std::string> backend_ids_;  // written in the constructor only
  // Written by Launch before the first choice starts; read-only after.
  absl::Time deadline_ = absl::InfiniteFuture();
  int priority_ = 0;
  int next_choice_ ABSL_GUARDED_BY(mu_) = 0;  // choices [0, next_choice_) have started
  int status_code_ ABSL_GUARDED_BY(mu_) = 0;
  std::string error_ ABSL_GUARDED_BY(mu_);
  absl::Time first_token_at_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> backend_start_ ABSL_GUARDED_BY(mu_);       // Launch
  std::optional<absl::Time> last_backend_event_ ABSL_GUARDED_BY(mu_);  // any choice's

  absl::Mutex mu_;
  std::vector<Choice> choices_ ABSL_GUARDED_BY(mu_);
  int remaining_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // the response is complete or abandoned
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool stream_started_ ABSL_GUARDED_BY(mu_) = false;
  bool first_token_seen_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

void RouterFrontend::Core::Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
  const std::string& path = request.path;
  const bool known = path == kCompletionsPath || path == kChatPath || path == kModelsPath ||
                     path == "/health" || path == "/metrics" || path == kTokenizePath ||
                     path == kDetokenizePath || path == kVersionPath || path == kEmbeddingsPath;
  const absl::string_view label = known ? absl::string_view(path) : absl::string_view("other");
  if (std::optional<HttpResponse> preflight = access.Preflight(request)) {
    return Finish(label, *exchange, *std::move(preflight));
  }
  // CORS headers (a listed Origin) go on every response to this request, errors included.
  if (HttpHeaders extra = access.ResponseHeaders(request); !extra.empty()) {
    exchange = std::make_shared<HeaderAddingExchange>(std::move(exchange), std::move(extra));
  }
  if (std::optional<ApiError> denied = access.Check(request)) {
    HttpResponse r = ErrorResponse(*denied);
    if (denied->http_status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return Finish(label, *exchange, std::move(r));
  }
  auto method_not_allowed = [&](absl::string_view label, absl::string_view allow) {
    HttpResponse r = ErrorResponse(
        MakeApiError(405, absl::StrCat("method ", request.method, " is not allowed on ", path)));
    r.headers.emplace_back("Allow", std::string(allow));
    Finish(label, *exchange, std::move(r));
  };

  // The routes that tokenize run off the I/O thread, in a bounded queue: false (and a 429) when
  // it is full.
  auto admit_prepare = [&] {
    if (pending_prepares.fetch_add(1) < options.max_pending_requests) return true;
    pending_prepares.fetch_sub(1);
    Finish(label, *exchange,
           ErrorResponse(
               MakeApiError(429, absl::StrCat("the router has ", options.max_pending_requests,
                                              " requests waiting to be prepared; retry later"))));
    return false;
  };

  if (path == kCompletionsPath || path == kChatPath) {
    if (request.method != "POST") return method_not_allowed(path, "POST");
    if (!admit_prepare()) return;
    const Endpoint endpoint =
        path == kChatPath ? Endpoint::kChatCompletions : Endpoint::kCompletions;
    auto shared = std::make_shared<HttpRequest>(std::move(request));
    prepare_pool->Post(
        [self = shared_from_this(), endpoint, shared, exchange, arrival = absl::Now()] {
          self->pending_prepares.fetch_sub(1);
          self->HandleGenerate(endpoint, *shared, exchange, arrival);
        });
    return;
  }
  if (path == kTokenizePath || path == kDetokenizePath) {
    if (request.method != "POST") return method_not_allowed(path, "POST");
    if (!admit_prepare()) return;
    auto shared = std::make_shared<HttpRequest>(std::move(request));
    prepare_pool->Post([self = shared_from_this(), shared, exchange] {
      self->pending_prepares.fetch_sub(1);
      self->HandleTokenize(*shared, *exchange);
    });
    return;
  }
  if (path == kEmbeddingsPath) {
    // A decoder served for generation: its final hidden state was not trained as an embedding,
    // and pooling it would return vectors nobody should index. vLLM answers the same way for a
    // generation model (docs/api.md).
    if (request.method != "POST") return method_not_allowed(path, "POST");
    return Finish(path, *exchange,
                  ErrorResponse(MakeApiError(
                      400,
                      absl::StrCat("'", options.served_model_name,
                                   "' is served as a generation model; /v1/embeddings needs an "
                                   "embedding model, which this server does not run"),
                      "model", "model_not_supported")));
  }
  if (path == kVersionPath) {
    if (request.method != "GET") return method_not_allowed(path, "GET");
    return Finish(path, *exchange, JsonResponse(200, json{{"version", TANDEM_VERSION}}.dump()));
  }
  if (path == kModelsPath || absl::StartsWith(path, absl::StrCat(kModelsPath, "/"))) {
    if (request.method != "GET") return method_not_allowed(kModelsPath, "GET");
    const json card{{"id", options.served_model_name},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "tandem"},
                    {"max_model_len", model.max_model_len}};
    if (path == kModelsPath) {
      return Finish(kModelsPath, *exchange,
                    JsonResponse(200, json{{"object", "list"}, {"data", {card}}}.dump()));
    }
    const std::string name = path.substr(kModelsPath.size() + 1);
    if (name != options.served_model_name) {
      return Finish(
          kModelsPath, *exchange,
          ErrorResponse(MakeApiError(404, absl::StrCat("the model '", name, "' does not exist"),
                                     "model", "model_not_found")));
    }
    return Finish(kModelsPath, *exchange, JsonResponse(200, card.dump()));
  }
  if (path == "/health") {
    if (request.method != "GET") return method_not_allowed(path, "GET");
    const absl::Status ready = backend->Ready();
    if (!ready.ok()) {
      return Finish(path, *exchange,
                    ErrorResponse(MakeApiError(503, std::string(ready.message()))));
    }
    return Finish(path, *exchange, JsonResponse(200, R"({"status":"ok"})"));
  }
  if (path == "/metrics") {
    if (request.method != "GET") return method_not_allowed(path, "GET");
    std::string text;
    {
      absl::ReaderMutexLock lock(&gate_mu);
      if (!stopped) text = metrics::Serialize(*registry);
    }
    if (options.extra_metrics) text += options.extra_metrics();
    return Finish(path, *exchange,
                  HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", {}, text});
  }
  Finish(
      "other", *exchange,
      ErrorResponse(MakeApiError(404, absl::StrCat("no route for ", request.method, " ", path))));
}

void RouterFrontend::Core::HandleTokenize(const HttpRequest& request, HttpExchange& exchange) {
  const std::string& path = request.path;
  const Tokenizer& tok = *model.tokenizer;
  const auto fail = [&](const absl::Status& s) {
    Finish(path, exchange, ErrorResponse(ToApiError(s)));
  };
  const auto wrong_model = [&](const std::string& name) {
    if (name.empty() || name == options.served_model_name) return false;
    Finish(path, exchange,
           ErrorResponse(MakeApiError(
               404,
               absl::StrCat("the model '", name, "' does not exist; this server serves '",
                            options.served_model_name, "'"),
               "model", "model_not_found")));
    return true;
  };
  if (path == kTokenizePath) {
    absl::StatusOr<TokenizeRequest> t = ParseTokenizeRequest(request.body);
    if (!t.ok()) return fail(t.status());
    if (wrong_model(t->request.model)) return;
    absl::StatusOr<PreparedPrompt> p = TokenizePrompt(model, t->request);
    if (!p.ok()) return fail(p.status());
    json out{{"count", p->token_ids.size()},
             {"max_model_len", model.max_model_len},
             {"tokens", p->token_ids},
             {"token_strs", nullptr}};
    if (t->return_token_strs) {
      json strs = json::array();
      for (int32_t id : p->token_ids) strs.push_back(tok.IdToToken(id));
      out["token_strs"] = std::move(strs);
    }
    return Finish(path, exchange,
                  JsonResponse(200, out.dump(-1, ' ', false, json::error_handler_t::replace)));
  }
  absl::StatusOr<DetokenizeRequest> d = ParseDetokenizeRequest(request.body);
  if (!d.ok()) return fail(d.status());
  if (wrong_model(d->model)) return;
  for (int32_t id : d->tokens) {
    if (id >= tok.vocab_size()) {
      return fail(
          InvalidParam("tokens", absl::StrCat("token id ", id, " is outside the vocabulary (",
                                              tok.vocab_size(), " tokens)")));
    }
  }
  const std::string text = tok.Decode(d->tokens, /*skip_special_tokens=*/false);
  Finish(path, exchange,
         JsonResponse(200,
                      json{{"prompt", text}}.dump(-1, ' ', false, json::error_handler_t::replace)));
}

void RouterFrontend::Core::HandleGenerate(Endpoint endpoint, const HttpRequest& request,
                                          std::shared_ptr<HttpExchange> exchange,
                                          absl::Time arrival) {
  const std::string label(endpoint == Endpoint::kChatCompletions ? kChatPath : kCompletionsPath);
  std::string client_id = request.Header("X-Request-Id");
  // A request refused before it ran: its access line, then the response.
  const auto refuse = [&](HttpResponse response, absl::string_view error) {
    LogAccess({.endpoint = label,
               .status = response.status,
               .id = "-",
               .client_id = client_id,
               .e2e = absl::Now() - arrival,
               .error = error});
    Finish(label, *exchange, std::move(response));
  };
  if (client_id.size() > 128 ||
      std::any_of(client_id.begin(), client_id.end(), [](char c) { return c <= ' ' || c > '~'; })) {
    client_id = "(invalid)";
    return refuse(ErrorResponse(MakeApiError(400,
                                             "X-Request-Id: at most 128 printable characters "
                                             "without spaces")),
                  "invalid X-Request-Id");
  }
  absl::StatusOr<OpenAiRequest> parsed = endpoint == Endpoint::kChatCompletions
                                             ? ParseChatCompletionRequest(request.body)
                                             : ParseCompletionRequest(request.body);
  if (!parsed.ok()) {
    return refuse(ErrorResponse(ToApiError(parsed.status())), parsed.status().message());
  }
  OpenAiRequest& req = *parsed;
  if (!req.model.empty() && req.model != options.served_model_name) {
    return refuse(ErrorResponse(MakeApiError(404,
                                             absl::StrCat("the model '", req.model,
                                                          "' does not exist; this server serves '",
                                                          options.served_model_name, "'"),
                                             "model", "model_not_found")),
                  "model_not_found");
  }
  if (req.tools.parses_output()) {
    // Auto needs a parser for this model's format; each choice makes its own below.
    if (absl::StatusOr<std::unique_ptr<ToolCallParser>> parser =
            CreateToolCallParser(req.tools, model.tool_call_parser);
        !parser.ok()) {
      return refuse(ErrorResponse(ToApiError(parser.status())), parser.status().message());
    }
  }
  absl::StatusOr<std::vector<PreparedPrompt>> prompts = PreparePrompts(model, req);
  if (!prompts.ok()) {
    return refuse(ErrorResponse(ToApiError(prompts.status())), prompts.status().message());
  }
  if (absl::Status ready = backend->Ready(); !ready.ok()) {
    return refuse(ErrorResponse(MakeApiError(503, std::string(ready.message()))), ready.message());
  }
  if (draining()) {
    return refuse(
        ErrorResponse(MakeApiError(503, "the server is shutting down; retry on another replica")),
        "shutting down");
  }

  ResponseMeta meta;
  meta.endpoint = endpoint;
  meta.id = absl::StrCat(endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-", NewId());
  meta.created = absl::ToUnixSeconds(absl::Now());
  meta.model = options.served_model_name;
  meta.logprobs = req.logprobs.has_value();
  meta.prompt_logprobs = req.prompt_logprobs.has_value();
  auto state = std::make_shared<RequestState>(shared_from_this(), exchange, req, std::move(meta),
                                              label, *std::move(prompts), client_id, arrival);
  exchange->SetCloseHandler([weak = std::weak_ptr<RequestState>(state)] {
    if (auto s = weak.lock()) s->OnClientGone();
  });
  WithMetrics([](metrics::RouterMetrics& m) { m.requests_running.Increment(); });
  RequestStarted(state);
  const absl::Time deadline = options.request_timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + options.request_timeout;
  state->Launch(deadline, req.priority, options.max_parallel_choices);
}

RouterFrontend::RouterFrontend(std::shared_ptr<Core> core) : core_(std::move(core)) {}

RouterFrontend::~RouterFrontend() { Stop(); }

absl::StatusOr<std::unique_ptr<RouterFrontend>> RouterFrontend::Create(
    RouterFrontendOptions options, GenerationBackend* backend, prometheus::Registry* registry) {
  absl::StatusOr<FrontendModel> model = LoadFrontendModel(options.model_dir, options.model_options);
  if (!model.ok()) return model.status();
  return Create(std::move(options), *std::move(model), backend, registry);
}

absl::StatusOr<std::unique_ptr<RouterFrontend>> RouterFrontend::Create(
    RouterFrontendOptions options, FrontendModel model, GenerationBackend* backend,
    prometheus::Registry* registry) {
  if (backend == nullptr || registry == nullptr) {
    return absl::InvalidArgumentError("router frontend: backend and registry are required");
  }
  if (model.tokenizer == nullptr) {
    return absl::InvalidArgumentError("router frontend: a tokenizer is required");
  }
  if (options.max_model_len > 0) model.max_model_len = options.max_model_len;
  if (model.max_model_len <= 0) {
    return absl::InvalidArgumentError("router frontend: the context limit must be positive");
  }
  if (options.served_model_name.empty()) {
    std::filesystem::path dir(options.model_dir);
    if (!dir.has_filename()) dir = dir.parent_path();
    options.served_model_name = dir.filename().string();
  }
  if (options.served_model_name.empty()) {
    return absl::InvalidArgumentError("router frontend: no served model name (and no model dir)");
  }
  options.access.bind_host = options.http.host;
  absl::StatusOr<AccessPolicy> access = AccessPolicy::Create(options.access);
  if (!access.ok()) return access.status();
  return std::unique_ptr<RouterFrontend>(new RouterFrontend(std::make_shared<Core>(
      std::move(options), std::move(model), *std::move(access), backend, registry)));
}

absl::Status RouterFrontend::Start() {
  if (server_ != nullptr) return absl::FailedPreconditionError("router frontend already started");
  {
    absl::ReaderMutexLock lock(&core_->gate_mu);
    if (core_->stopped) return absl::FailedPreconditionError("router frontend was stopped");
  }
  HttpServerOptions http = core_->options.http;
  http.error_response = [](int status, const std::string& message) {
    return ErrorResponse(MakeApiError(status, message));
  };
  std::weak_ptr<Core> weak = core_;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      std::move(http), [weak](HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
        if (auto core = weak.lock()) core->Handle(std::move(request), std::move(exchange));
      });
  if (!server.ok()) return server.status();
  server_ = *std::move(server);
  LOG(INFO) << "router frontend: serving '" << core_->options.served_model_name << "' on port "
            << server_->port();
  return absl::OkStatus();
}

int RouterFrontend::port() const { return server_ == nullptr ? 0 : server_->port(); }

const std::string& RouterFrontend::served_model_name() const {
  return core_->options.served_model_name;
}

metrics::RouterMetrics& RouterFrontend::metrics() { return core_->metrics; }

void RouterFrontend::Drain(absl::Duration timeout) {
  Core& core = *core_;
  {
    absl::MutexLock lock(&core.flight_mu);
    core.drain_started = true;
    auto idle = [&core]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.flight_mu) { return core.in_flight == 0; };
    if (core.flight_mu.AwaitWithTimeout(absl::Condition(&idle), timeout)) return;
  }
  std::vector<std::shared_ptr<LiveRequest>> rest;
  {
    absl::MutexLock lock(&core.flight_mu);
    for (const auto& [ptr, weak] : core.live) {
      if (std::shared_ptr<LiveRequest> request = weak.lock()) rest.push_back(std::move(request));
    }
  }
  LOG(WARNING) << "router frontend: " << rest.size() << " requests still running after the "
               << absl::FormatDuration(timeout) << " drain; ending them with an error";
  for (const std::shared_ptr<LiveRequest>& request : rest) {
    request->Abort(absl::UnavailableError(
        "the server is shutting down and this request did not finish within its drain time"));
  }
  core.WaitForBackend(kBackendDrainTimeout);
}

void RouterFrontend::Stop() {
  if (server_ == nullptr) return;
  server_->Stop();
  server_.reset();
  // Requests still waiting to be prepared had their connections closed with the server.
  core_->prepare_pool->Stop();
  core_->WaitForBackend(kBackendDrainTimeout);
  absl::MutexLock lock(&core_->gate_mu);
  core_->stopped = true;
}

}  // namespace tandem::router

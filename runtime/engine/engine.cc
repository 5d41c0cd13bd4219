#include "runtime/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"

namespace tandem {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

struct Engine::Active {
  Active(GenerateRequest r, const Tokenizer* tokenizer)
      : request(std::move(r)), stops(request.params.stop) {
    if (tokenizer != nullptr) {
      detok =
          std::make_unique<IncrementalDetokenizer>(*tokenizer, request.params.skip_special_tokens);
    }
  }
  GenerateRequest request;  // prompt moved into the scheduler
  int num_prompt_tokens = 0;
  int max_tokens = 0;
  uint64_t seed = 0;
  std::unique_ptr<IncrementalDetokenizer> detok;
  StopStringBuffer stops;
  Usage usage;
};

namespace {

SchedulerConfig MakeSchedulerConfig(const ModelRunner& runner, const EngineOptions& options) {
  SchedulerConfig c;
  c.num_blocks = runner.num_blocks();
  c.block_size = runner.block_size();
  c.max_num_seqs = options.max_num_seqs;
  c.max_num_batched_tokens = options.max_num_batched_tokens;
  c.enable_prefix_caching = options.enable_prefix_caching;
  return c;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<ModelRunner> runner,
                                                       const Tokenizer* tokenizer,
                                                       const EngineOptions& options) {
  if (runner == nullptr) return absl::InvalidArgumentError("engine: no model runner");
  if (runner->num_blocks() <= 0 || runner->block_size() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("engine: the runner has ", runner->num_blocks(),
                                                   " KV blocks of ", runner->block_size(),
                                                   " tokens"));
  }
  if (runner->config().vocab_size <= 0) {
    return absl::InvalidArgumentError("engine: model config has no vocabulary");
  }
  if (options.max_num_seqs <= 0) {
    return absl::InvalidArgumentError("max_num_seqs: must be >= 1");
  }
  if (options.max_num_batched_tokens <= 0) {
    return absl::InvalidArgumentError("max_num_batched_tokens: must be >= 1");
  }
  if (options.max_model_len < 0) return absl::InvalidArgumentError("max_model_len: must be >= 0");
  int max_len =
      options.max_model_len > 0 ? options.max_model_len : runner->config().max_position_embeddings;
  const int kv_capacity = runner->num_blocks() * runner->block_size();
  if (max_len <= 0 || max_len > kv_capacity) max_len = kv_capacity;
  return std::unique_ptr<Engine>(new Engine(std::move(runner), tokenizer, options, max_len));
}

Engine::Engine(std::unique_ptr<ModelRunner> runner, const Tokenizer* tokenizer,
               const EngineOptions& options, int max_model_len)
    : runner_(std::move(runner)),
      tokenizer_(tokenizer),
      options_(options),
      max_model_len_(max_model_len),
      scheduler_(MakeSchedulerConfig(*runner_, options)),
      seed_rng_(std::random_device{}()) {
  for (int id : runner_->config().eos_token_ids) eos_ids_.insert(id);
  for (int32_t id : options.extra_eos_token_ids) eos_ids_.insert(id);
  if (tokenizer_ != nullptr && tokenizer_->eos_id().has_value()) {
    eos_ids_.insert(*tokenizer_->eos_id());
  }
  local_stats_.blocks_total = runner_->num_blocks();
  PublishStats();
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() { Shutdown(absl::ZeroDuration()); }

absl::Status Engine::Validate(const GenerateRequest& r) const {
  const int vocab = runner_->config().vocab_size;
  if (r.request_id.empty()) return absl::InvalidArgumentError("request_id: empty");
  if (!r.on_output) return absl::InvalidArgumentError("on_output: no callback");
  if (r.prompt_token_ids.empty()) return absl::InvalidArgumentError("prompt: empty");
  for (size_t i = 0; i < r.prompt_token_ids.size(); ++i) {
    const int32_t id = r.prompt_token_ids[i];
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: token id ", id, " at index ", i,
                                                     " is outside the vocabulary of ", vocab));
    }
  }
  const int prompt_len = static_cast<int>(r.prompt_token_ids.size());
  if (prompt_len >= max_model_len_) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", prompt_len,
                                                   " tokens leave no room to generate under the ",
                                                   "context limit of ", max_model_len_, " tokens"));
  }
  RETURN_IF_ERROR(ValidateSamplingParams(r.params, vocab));
  if (r.params.max_tokens.has_value() && prompt_len + *r.params.max_tokens > max_model_len_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_tokens: prompt (", prompt_len, " tokens) + max_tokens (", *r.params.max_tokens,
        ") exceeds the context limit of ", max_model_len_, " tokens"));
  }
  if (!r.params.stop.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError("stop: stop strings need a tokenizer");
  }
  return absl::OkStatus();
}

absl::Status Engine::Submit(GenerateRequest request) {
  RETURN_IF_ERROR(Validate(request));
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("engine is shutting down");
  if (!live_ids_.insert(request.request_id).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id: '", request.request_id, "' is already running"));
  }
  pending_.push_back(std::move(request));
  return absl::OkStatus();
}

void Engine::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  if (live_ids_.contains(request_id)) cancels_.push_back(request_id);
}

void Engine::Shutdown(absl::Duration drain_timeout) {
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    drain_deadline_ = std::min(drain_deadline_, absl::Now() + drain_timeout);
    // The loop ends by the drain deadline plus one step; a runner stuck longer is reported.
    if (!mu_.AwaitWithTimeout(absl::Condition(&loop_done_), drain_timeout + absl::Seconds(60))) {
      LOG(ERROR) << "engine: loop did not stop within the drain deadline + 60 s; waiting";
    }
  }
  thread_.join();
}

EngineStats Engine::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Engine::PublishStats() {
  const KvCacheManager& kv = scheduler_.kv();
  local_stats_.preemptions = scheduler_.num_preemptions();
  local_stats_.prefix_query_tokens = kv.counters().prefix_queries_tokens;
  local_stats_.prefix_hit_tokens = kv.counters().prefix_hit_tokens;
  local_stats_.blocks_used = kv.pool().NumUsed();
  local_stats_.blocks_free = kv.pool().NumAvailable();
  local_stats_.running = scheduler_.NumRunning();
  local_stats_.waiting = scheduler_.NumWaiting();
  absl::MutexLock lock(&mu_);
  stats_ = local_stats_;
}

void Engine::Loop() {
  while (true) {
    std::vector<GenerateRequest> incoming;
    std::vector<std::string> cancels;
    bool stopping;
    absl::Time deadline;
    {
      absl::MutexLock lock(&mu_);
      // Wait for input when idle, or when the last step could schedule nothing (no busy loop).
      if (!scheduler_.HasWork() || !last_step_ran_) {
        auto has_input = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !pending_.empty() || !cancels_.empty() || stopping_;
        };
        mu_.AwaitWithTimeout(absl::Condition(&has_input), options_.idle_poll);
      }
      incoming.swap(pending_);
      cancels.swap(cancels_);
      stopping = stopping_;
      deadline = drain_deadline_;
    }
    for (GenerateRequest& r : incoming) Admit(std::move(r));
    for (const std::string& id : cancels) {
      auto it = seq_by_request_.find(id);
      if (it != seq_by_request_.end()) {
        FinishRequest(it->second, FinishReason::kAbort, absl::OkStatus(), {});
      }
    }
    if (stopping && (!scheduler_.HasWork() || absl::Now() >= deadline)) {
      AbortAll();
      PublishStats();
      break;
    }
    last_step_ran_ = scheduler_.HasWork() && Step();
    PublishStats();
  }
  absl::MutexLock lock(&mu_);
  loop_done_ = true;
}

void Engine::Admit(GenerateRequest request) {
  const int64_t seq = next_seq_id_++;
  const int prompt_len = static_cast<int>(request.prompt_token_ids.size());
  std::vector<int32_t> prompt = std::move(request.prompt_token_ids);
  auto active = std::make_unique<Active>(std::move(request), tokenizer_);
  active->num_prompt_tokens = prompt_len;
  active->max_tokens = active->request.params.max_tokens.value_or(max_model_len_ - prompt_len);
  active->seed =
      active->request.params.seed.has_value() ? *active->request.params.seed : seed_rng_();
  active->usage.prompt_tokens = prompt_len;
  seq_by_request_[active->request.request_id] = seq;
  active_[seq] = std::move(active);
  scheduler_.Add(seq, std::move(prompt));
}

bool Engine::Step() {
  SchedulerStep plan = scheduler_.Schedule();
  if (plan.empty()) return false;
  ForwardBatch batch;
  int rows = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    const Sequence* seq = scheduler_.Get(c.seq_id);
    SequenceChunk chunk;
    chunk.tokens = std::span<const int32_t>(seq->tokens).subspan(c.start_pos, c.num_tokens);
    chunk.start_pos = c.start_pos;
    chunk.block_table = scheduler_.BlockTable(c.seq_id);
    chunk.need_logits = c.need_logits;
    rows += c.need_logits ? 1 : 0;
    batch.chunks.push_back(chunk);
  }
  ForwardOutput out;
  absl::Status status = runner_->Forward(batch, &out);
  const size_t vocab = static_cast<size_t>(runner_->config().vocab_size);
  if (status.ok() && (out.rows != rows || out.logits.size() != static_cast<size_t>(rows) * vocab)) {
    status = absl::InternalError(absl::StrCat("model runner returned ", out.rows, " rows and ",
                                              out.logits.size(), " logits for ", rows,
                                              " sequences of vocabulary ", vocab));
  }
  ++local_stats_.steps;
  if (!status.ok()) {
    LOG(ERROR) << "engine: forward pass failed: " << status;
    for (const ScheduledChunk& c : plan.chunks) {
      FinishRequest(c.seq_id, FinishReason::kError, status, {});
    }
    return true;
  }
  local_stats_.batched_tokens += plan.num_batched_tokens;
  scheduler_.OnStepComputed(plan);
  size_t row = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.need_logits) continue;
    const std::span<const float> logits =
        std::span<const float>(out.logits).subspan(row * vocab, vocab);
    ++row;
    if (std::any_of(logits.begin(), logits.end(), [](float x) { return std::isnan(x); })) {
      FinishRequest(c.seq_id, FinishReason::kError,
                    absl::InternalError("the model produced NaN logits"), {});
      continue;
    }
    OnLogits(c.seq_id, logits);
  }
  return true;
}

void Engine::OnLogits(int64_t seq_id, std::span<const float> logits) {
  Active& a = *active_.at(seq_id);
  const SamplingParams& params = a.request.params;
  const Sequence* seq = scheduler_.Get(seq_id);
  const std::span<const int32_t> all(seq->tokens);
  const SampleResult r =
      Sample(params, logits, all.first(a.num_prompt_tokens), all.subspan(a.num_prompt_tokens),
             a.seed, static_cast<uint64_t>(seq->num_output_tokens()));
  scheduler_.AppendToken(seq_id, r.token);
  ++local_stats_.generated_tokens;
  ++a.usage.completion_tokens;
  a.usage.cached_prompt_tokens = std::max(0, seq->num_cached_prompt_tokens);

  GenerationOutput out;
  out.token_ids.push_back(r.token);
  if (params.logprobs.has_value()) out.logprobs.push_back({r.token, r.logprob, r.top_logprobs});
  const bool stop_token = (!params.ignore_eos && eos_ids_.contains(r.token)) ||
                          std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                                    r.token) != params.stop_token_ids.end();
  std::optional<FinishReason> finish;
  if (stop_token) {
    finish = FinishReason::kStop;  // the stop token's text is not part of the output
  } else if (a.detok != nullptr) {
    out.text = a.stops.Append(a.detok->Push(r.token));
    if (a.stops.stopped()) finish = FinishReason::kStop;
  }
  if (!finish.has_value() && a.usage.completion_tokens >= a.max_tokens) {
    finish = FinishReason::kLength;
  }
  if (!finish.has_value()) {
    out.request_id = a.request.request_id;
    out.usage = a.usage;
    a.request.on_output(out);
    return;
  }
  if (a.detok != nullptr && !a.stops.stopped()) {
    out.text += a.stops.Append(a.detok->Flush());
    out.text += a.stops.Flush();
    if (a.stops.stopped()) finish = FinishReason::kStop;
  }
  FinishRequest(seq_id, *finish, absl::OkStatus(), std::move(out));
}

void Engine::FinishRequest(int64_t seq_id, FinishReason reason, absl::Status error,
                           GenerationOutput out) {
  auto it = active_.find(seq_id);
  CHECK(it != active_.end());
  std::unique_ptr<Active> a = std::move(it->second);
  active_.erase(it);
  seq_by_request_.erase(a->request.request_id);
  if (const Sequence* seq = scheduler_.Get(seq_id); seq != nullptr) {
    a->usage.cached_prompt_tokens = std::max(0, seq->num_cached_prompt_tokens);
    scheduler_.Finish(seq_id);
  }
  out.request_id = a->request.request_id;
  out.finish_reason = reason;
  out.error = std::move(error);
  out.usage = a->usage;
  ++local_stats_.finished_requests;
  {
    absl::MutexLock lock(&mu_);
    live_ids_.erase(a->request.request_id);
  }
  a->request.on_output(out);
}

void Engine::AbortAll() {
  std::vector<int64_t> ids;
  for (const auto& [id, a] : active_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids) FinishRequest(id, FinishReason::kAbort, absl::OkStatus(), {});
}

}  // namespace tandem

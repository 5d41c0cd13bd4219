#include "runtime/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/grammar/grammar_cache.h"
#include "runtime/grammar/mask_prefetcher.h"

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
      : request(std::move(r)),
        stops(request.params.stop, request.params.include_stop_str_in_output) {
    if (tokenizer != nullptr) {
      detok =
          std::make_unique<IncrementalDetokenizer>(*tokenizer, request.params.skip_special_tokens);
    }
  }
  GenerateRequest request;  // prompt moved into the scheduler
  int num_prompt_tokens = 0;
  int resumed = 0;              // request.resumed_output_tokens
  std::string resumed_text;     // resumed output's text the client does not have yet
  int64_t skip_text_bytes = 0;  // text still to drop (the client has it)
  int max_tokens = 0;
  uint64_t seed = 0;
  std::unique_ptr<IncrementalDetokenizer> detok;
  StopStringBuffer stops;
  // Guided decoding: the constraint and where the output is in its automaton.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  int grammar_state = 0;
  Usage usage;
  // Remote prefill: the prompt until blocks are reserved, on_reserved until called.
  bool remote = false;
  std::vector<int32_t> prompt;
  ReservedCallback on_reserved;
  absl::Time reserve_deadline = absl::InfiniteFuture();
  // First-token timings: submitted -> queued_until (first scheduled, or reserved) -> kv_ready
  // (prompt logits computed, or remote KV arrived) -> first token emitted.
  absl::Time submitted;
  std::optional<absl::Time> queued_until;
  std::optional<absl::Time> kv_ready;
  // params.prompt_logprobs: prompt token i + 1 scored at index i (filled as chunks compute,
  // again after a preemption) until the first output carries them.
  std::vector<ScoredToken> prompt_logprobs;
  int prompt_scored = 0;  // entries filled (each index once)
  std::vector<char> prompt_scored_at;
  bool prompt_logprobs_sent = false;
  // Speculative decoding: drafts to ask for next (adapted from the acceptance; -1: not yet set).
  int spec_k = -1;
  // Whether the chunk starting at `start` needs its prompt positions' logits.
  bool ScoresPrompt(int start) const {
    return request.params.prompt_logprobs.has_value() && !prompt_logprobs_sent &&
           start < num_prompt_tokens - 1;
  }
};

namespace {

SchedulerConfig MakeSchedulerConfig(const ModelRunner& runner, const EngineOptions& options) {
  SchedulerConfig c;
  c.num_blocks = runner.num_blocks();
  c.block_size = runner.block_size();
  c.max_num_seqs = options.max_num_seqs;
  c.max_num_batched_tokens = options.max_num_batched_tokens;
  c.long_prefill_token_threshold = options.long_prefill_token_threshold;
  c.enable_prefix_caching = options.enable_prefix_caching;
  c.record_prefix_cache_events = options.enable_prefix_caching;
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
  if (options.long_prefill_token_threshold < 0) {
    return absl::InvalidArgumentError("long_prefill_token_threshold: must be >= 0");
  }
  if (options.max_model_len < 0) return absl::InvalidArgumentError("max_model_len: must be >= 0");
  if (options.num_speculative_tokens < 0 || options.num_speculative_tokens > 64) {
    return absl::InvalidArgumentError("num_speculative_tokens: must be in [0, 64]");
  }
  if (options.num_speculative_tokens > 0 && options.drafter == nullptr) {
    return absl::InvalidArgumentError("num_speculative_tokens: set, but there is no drafter");
  }
  if (options.drafter_deadline < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("drafter_deadline: must be >= 0");
  }
  int max_len =
      options.max_model_len > 0 ? options.max_model_len : runner->config().max_position_embeddings;
  const int kv_capacity = runner->num_blocks() * runner->block_size();
  if (max_len <= 0 || max_len > kv_capacity) max_len = kv_capacity;
  bool reports_kv_chunks = false;
  if (options.kv_layer_progress) {
    // Before the loop thread exists, so this thread may still call the runner.
    const absl::Status progress = runner->EnableKvProgress();
    if (!progress.ok() && !absl::IsUnimplemented(progress)) return progress;
    reports_kv_chunks = progress.ok();
  }
  std::unique_ptr<Engine> engine(
      new Engine(std::move(runner), tokenizer, options, max_len, reports_kv_chunks));
  return engine;
}

Engine::Engine(std::unique_ptr<ModelRunner> runner, const Tokenizer* tokenizer,
               const EngineOptions& options, int max_model_len, bool reports_kv_chunks)
    : runner_(std::move(runner)),
      tokenizer_(tokenizer),
      options_(options),
      max_model_len_(max_model_len),
      kv_layout_(runner_->kv_layout()),
      reports_kv_chunks_(reports_kv_chunks),
      scheduler_(MakeSchedulerConfig(*runner_, options)),
      seed_rng_(std::random_device{}()) {
  for (int id : runner_->config().eos_token_ids) eos_ids_.insert(id);
  for (int32_t id : options.extra_eos_token_ids) eos_ids_.insert(id);
  if (tokenizer_ != nullptr && tokenizer_->eos_id().has_value()) {
    eos_ids_.insert(*tokenizer_->eos_id());
  }
  local_stats_.blocks_total = runner_->num_blocks();
  PublishStats();
  if (options_.prefetch_grammar_masks) {
    mask_prefetcher_ = std::make_unique<grammar::MaskPrefetcher>();
  }
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
  if (!r.params.guided.empty()) {
    if (tokenizer_ == nullptr) {
      return absl::InvalidArgumentError("guided: guided decoding needs a tokenizer");
    }
    RETURN_IF_ERROR(Grammar(r.params.guided).status());
  }
  if (r.resumed_output_tokens < 0 || r.resumed_output_tokens >= prompt_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("resumed_output_tokens: ", r.resumed_output_tokens, " is not in [0, ",
                     prompt_len, ") (the prompt's length)"));
  }
  if (r.resumed_text_bytes < 0) {
    return absl::InvalidArgumentError("resumed_text_bytes: negative");
  }
  if (r.params.prompt_logprobs.has_value() &&
      (r.hold_kv_after_prefill || r.resumed_output_tokens > 0)) {
    return absl::InvalidArgumentError(
        r.hold_kv_after_prefill
            ? "prompt_logprobs: scored where the first token is emitted, not on a prefill worker"
            : "prompt_logprobs: a resumed request's prompt was already scored");
  }
  if (r.resumed_output_tokens > 0 && r.params.temperature > 0 && !r.params.seed.has_value()) {
    return absl::InvalidArgumentError(
        "seed: a resumed sampled request must carry the seed it was started with");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> Engine::Grammar(
    const SamplingParams::Guided& guided) const {
  grammar::GrammarCache* cache;
  {
    absl::MutexLock lock(&grammar_mu_);
    if (grammars_ == nullptr) {
      std::vector<std::string> token_bytes(tokenizer_->vocab_size());
      for (int id = 0; id < tokenizer_->vocab_size(); ++id) {
        token_bytes[id] = tokenizer_->TokenBytes(id);
      }
      grammars_ = std::make_unique<grammar::GrammarCache>(token_bytes);
    }
    cache = grammars_.get();  // lives as long as the engine; thread-safe itself
  }
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> g =
      cache->Get(guided.regex, guided.choices, guided.grammar);
  if (!g.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(!guided.grammar.empty() ? "guided_grammar: "
                                                   : guided.regex.empty()  ? "guided_choice: "
                                                                           : "guided_regex: ",
                                                   g.status().message()));
  }
  return g;
}

absl::StatusOr<KvCacheLayout> Engine::transfer_layout() {
  absl::MutexLock lock(&transfer_mu_);
  if (transfer_layout_.has_value()) return *transfer_layout_;
  ASSIGN_OR_RETURN(KvCacheLayout t, runner_->transfer_layout());
  const KvCacheLayout& kv = kv_layout_;
  if (t.base == nullptr || t.bytes != kv.bytes || t.num_layers != kv.num_layers ||
      t.num_blocks != kv.num_blocks || t.block_size != kv.block_size ||
      t.block_bytes != kv.block_bytes || t.layer_stride != kv.layer_stride ||
      t.kv_stride != kv.kv_stride || t.block_stride != kv.block_stride) {
    return absl::InvalidArgumentError(
        "engine: the runner's transfer_layout() differs from kv_layout() in more than its base");
  }
  transfer_layout_ = t;
  stages_kv_.store(t.base != kv.base, std::memory_order_release);
  return t;
}

absl::Status Engine::Submit(GenerateRequest request) {
  RETURN_IF_ERROR(Validate(request));
  if (request.hold_kv_after_prefill && !request.on_prefilled) {
    return absl::InvalidArgumentError("on_prefilled: hold_kv_after_prefill needs a callback");
  }
  std::shared_ptr<const grammar::CompiledGrammar> g;
  if (!request.params.guided.empty()) {
    ASSIGN_OR_RETURN(g, Grammar(request.params.guided));
  }
  return Enqueue({std::move(request), nullptr, absl::Now(), std::move(g)});
}

absl::Status Engine::SubmitRemotePrefill(GenerateRequest request, ReservedCallback on_reserved) {
  RETURN_IF_ERROR(Validate(request));
  if (!on_reserved) return absl::InvalidArgumentError("on_reserved: no callback");
  if (request.params.prompt_logprobs.has_value()) {
    return absl::InvalidArgumentError(
        "prompt_logprobs: a remote prefill's prompt is not computed here; prefill it locally");
  }
  if (request.hold_kv_after_prefill) {
    return absl::InvalidArgumentError(
        "hold_kv_after_prefill: a remote prefill cannot also hold its KV");
  }
  std::shared_ptr<const grammar::CompiledGrammar> g;
  if (!request.params.guided.empty()) {
    ASSIGN_OR_RETURN(g, Grammar(request.params.guided));
  }
  return Enqueue({std::move(request), std::move(on_reserved), absl::Now(), std::move(g)});
}

absl::Status Engine::Enqueue(Incoming incoming) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("engine is shutting down");
  if (!live_ids_.insert(incoming.request.request_id).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id: '", incoming.request.request_id, "' is already running"));
  }
  pending_.push_back(std::move(incoming));
  return absl::OkStatus();
}

void Engine::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  if (live_ids_.contains(request_id)) cancels_.push_back(request_id);
}

void Engine::CompleteRemotePrefill(const std::string& request_id,
                                   absl::StatusOr<RemotePrefillResult> result) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (live_ids_.contains(request_id)) {
    completions_.push_back({request_id, std::move(result), now});
  }
}

void Engine::ReleaseHeldKv(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  if (live_ids_.contains(request_id)) releases_.push_back(request_id);
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
  EngineStats s;
  {
    absl::MutexLock lock(&mu_);
    s = stats_;
  }
  s.queued_outside = queued_outside_.load(std::memory_order_relaxed);
  s.waiting += s.queued_outside;
  s.waiting_prompt_tokens += queued_outside_tokens_.load(std::memory_order_relaxed);
  return s;
}

void Engine::SetQueuedOutside(int requests, int64_t prompt_tokens) {
  queued_outside_.store(requests, std::memory_order_relaxed);
  queued_outside_tokens_.store(prompt_tokens, std::memory_order_relaxed);
}

void Engine::PublishStats() {
  const KvCacheManager& kv = scheduler_.kv();
  local_stats_.preemptions = scheduler_.num_preemptions();
  local_stats_.prefix_query_tokens = kv.counters().prefix_queries_tokens;
  local_stats_.prefix_hit_tokens = kv.counters().prefix_hit_tokens;
  local_stats_.blocks_used = kv.pool().NumUsed();
  local_stats_.blocks_free = kv.pool().NumAvailable();
  local_stats_.blocks_cached_idle = kv.pool().NumCachedIdle();
  local_stats_.running = scheduler_.NumRunning();
  local_stats_.waiting = scheduler_.NumWaiting() + static_cast<int>(reservations_.size());
  local_stats_.awaiting_kv = scheduler_.NumAwaitingKv();
  local_stats_.held_kv = static_cast<int>(held_.size());
  local_stats_.waiting_prompt_tokens = scheduler_.WaitingPromptTokens();
  const std::vector<PrefixCacheEvent> events = scheduler_.TakePrefixCacheEvents();
  prefix_cache_events_.Append(events);
  absl::MutexLock lock(&mu_);
  stats_ = local_stats_;
}

void Engine::Loop() {
  while (true) {
    std::vector<Incoming> incoming;
    std::vector<std::string> cancels;
    std::vector<Completion> completions;
    std::vector<std::string> releases;
    bool stopping;
    absl::Time deadline;
    // Backlogged: the last step ran and work remains, so this iteration starts without waiting
    // and the time since the last step finished is a gap between steps (EngineStats).
    const bool backlogged = scheduler_.HasWork() && last_step_ran_;
    {
      absl::MutexLock lock(&mu_);
      // Wait for input when idle, or when the last step could schedule nothing (no busy loop).
      // Reservation and lease deadlines are checked at least every idle_poll.
      if (!backlogged) {
        auto has_input = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !pending_.empty() || !cancels_.empty() || !completions_.empty() ||
                 !releases_.empty() || stopping_;
        };
        mu_.AwaitWithTimeout(absl::Condition(&has_input), options_.idle_poll);
      }
      incoming.swap(pending_);
      cancels.swap(cancels_);
      completions.swap(completions_);
      releases.swap(releases_);
      stopping = stopping_;
      deadline = drain_deadline_;
    }
    const absl::Time iteration_start = absl::Now();
    if (backlogged) {
      ++local_stats_.backlogged_steps;
      local_stats_.gap_seconds += absl::ToDoubleSeconds(iteration_start - last_step_end_);
    }
    for (Incoming& r : incoming) Admit(std::move(r));
    for (Completion& c : completions) OnRemotePrefillDone(std::move(c));
    for (const std::string& id : releases) ReleaseHeld(id, "");
    for (const std::string& id : cancels) CancelRequest(id);
    const absl::Time now = absl::Now();
    ExpireHeldLeases(now);
    ProcessReservations(now);
    if (stopping && (!HasLiveWork() || now >= deadline)) {
      AbortAll();
      PublishStats();
      break;
    }
    last_step_ran_ = scheduler_.HasWork() && Step();
    // Blocks freed by the step go to queued reservations before the next step's admissions.
    if (last_step_ran_ && !reservations_.empty()) ProcessReservations(absl::Now());
    if (last_step_ran_) {
      last_step_end_ = absl::Now();
      local_stats_.busy_seconds += absl::ToDoubleSeconds(last_step_end_ - iteration_start);
    }
    PublishStats();
  }
  absl::MutexLock lock(&mu_);
  loop_done_ = true;
}

bool Engine::HasLiveWork() const {
  return scheduler_.HasWork() || scheduler_.NumAwaitingKv() > 0 || !reservations_.empty() ||
         !held_.empty();
}

void Engine::Admit(Incoming incoming) {
  GenerateRequest& request = incoming.request;
  const int64_t seq = next_seq_id_++;
  const int prompt_len = static_cast<int>(request.prompt_token_ids.size());
  std::vector<int32_t> prompt = std::move(request.prompt_token_ids);
  auto active = std::make_unique<Active>(std::move(request), tokenizer_);
  active->num_prompt_tokens = prompt_len;
  active->resumed = active->request.resumed_output_tokens;
  active->grammar = std::move(incoming.grammar);
  if (active->grammar != nullptr) {
    // The resumed output already went through the automaton on the first engine.
    for (int i = prompt_len - active->resumed; i < prompt_len; ++i) {
      const int s = active->grammar->automaton().Walk(active->grammar_state,
                                                      tokenizer_->TokenBytes(prompt[i]));
      if (s != grammar::kDeadState) active->grammar_state = s;
    }
  }
  if (active->resumed > 0 && active->detok != nullptr) {
    // Replay the earlier attempt's text pipeline over its tokens: the detokenizer and the stop
    // buffer end up where they were, and what it held back is due to the client.
    std::string text;
    for (int i = prompt_len - active->resumed; i < prompt_len; ++i) {
      text += PushText(*active, prompt[i], i - (prompt_len - active->resumed) + 1);
    }
    const int64_t delivered = active->request.resumed_text_bytes;
    if (static_cast<int64_t>(text.size()) >= delivered) {
      active->resumed_text = text.substr(static_cast<size_t>(delivered));
    } else {
      active->skip_text_bytes = delivered - static_cast<int64_t>(text.size());
    }
  }
  active->max_tokens = active->request.params.max_tokens.value_or(max_model_len_ - prompt_len);
  active->seed =
      active->request.params.seed.has_value() ? *active->request.params.seed : seed_rng_();
  active->usage.prompt_tokens = prompt_len;
  active->submitted = incoming.submitted;
  seq_by_request_[active->request.request_id] = seq;
  if (incoming.on_reserved) {
    active->remote = true;
    active->prompt = std::move(prompt);
    active->on_reserved = std::move(incoming.on_reserved);
    active->reserve_deadline =
        std::min(active->request.deadline, incoming.submitted + options_.reserve_timeout);
    const int priority = active->request.priority;
    active_[seq] = std::move(active);
    // Behind every queued reservation of the same or a more urgent priority.
    auto pos = std::find_if(reservations_.begin(), reservations_.end(), [&](int64_t other) {
      return active_.at(other)->request.priority > priority;
    });
    reservations_.insert(pos, seq);
    return;
  }
  const int priority = active->request.priority;
  const bool skip_prefix_cache = active->request.params.prompt_logprobs.has_value();
  if (skip_prefix_cache) {
    active->prompt_logprobs.resize(static_cast<size_t>(prompt_len - 1));
    active->prompt_scored_at.assign(static_cast<size_t>(prompt_len - 1), 0);
  }
  active_[seq] = std::move(active);
  scheduler_.Add(seq, std::move(prompt), priority, skip_prefix_cache);
}

void Engine::ProcessReservations(absl::Time now) {
  std::deque<int64_t> still_waiting;
  bool blocked = false;  // FCFS: once one does not fit, later ones wait too
  while (!reservations_.empty()) {
    const int64_t seq_id = reservations_.front();
    reservations_.pop_front();
    Active& a = *active_.at(seq_id);
    if (!blocked && scheduler_.CanAddAwaitingKv(seq_id, a.prompt)) {
      const KvReservation r = scheduler_.AddAwaitingKv(seq_id, std::move(a.prompt));
      a.queued_until = now;
      a.usage.cached_prompt_tokens = r.num_cached_tokens;
      ReservedCallback on_reserved = std::move(a.on_reserved);
      on_reserved(RemoteKvReservation{r.block_ids, r.num_cached_tokens});
      continue;
    }
    blocked = true;
    if (now >= a.reserve_deadline) {
      RejectReservation(
          seq_id, absl::ResourceExhaustedError(absl::StrCat(
                      "no KV blocks for a ", a.prompt.size(), "-token prompt within the deadline (",
                      scheduler_.kv().pool().NumAvailable(), " of ",
                      scheduler_.kv().pool().num_blocks(), " blocks available)")));
      continue;
    }
    still_waiting.push_back(seq_id);
  }
  reservations_.swap(still_waiting);
}

void Engine::RejectReservation(int64_t seq_id, absl::Status status) {
  auto it = active_.find(seq_id);
  CHECK(it != active_.end());
  std::unique_ptr<Active> a = std::move(it->second);
  active_.erase(it);
  seq_by_request_.erase(a->request.request_id);
  {
    absl::MutexLock lock(&mu_);
    live_ids_.erase(a->request.request_id);
  }
  a->on_reserved(std::move(status));
}

void Engine::OnRemotePrefillDone(Completion c) {
  auto it = seq_by_request_.find(c.request_id);
  if (it == seq_by_request_.end()) return;
  const int64_t seq_id = it->second;
  Active& a = *active_.at(seq_id);
  const Sequence* seq = scheduler_.Get(seq_id);
  if (!a.remote || seq == nullptr || seq->state != SequenceState::kAwaitingKv) {
    LOG(WARNING) << "engine: CompleteRemotePrefill for '" << c.request_id
                 << "', which is not awaiting its KV; ignored";
    return;
  }
  absl::Status status = c.result.status();
  std::optional<TokenLogprobs> logprobs;
  if (status.ok()) {
    const RemotePrefillResult& r = *c.result;
    const bool want_logprobs = a.request.params.logprobs.has_value();
    if (r.first_token < 0 || r.first_token >= runner_->config().vocab_size) {
      status = absl::InvalidArgumentError(
          absl::StrCat("first token ", r.first_token, " is outside the vocabulary"));
    } else if (want_logprobs && (!r.first_token_logprobs.has_value() ||
                                 r.first_token_logprobs->token != r.first_token)) {
      status = absl::InvalidArgumentError("the first token's logprobs are missing");
    } else if (want_logprobs) {
      logprobs = r.first_token_logprobs;
    }
  }
  if (!status.ok()) {
    LOG(WARNING) << "engine: remote prefill of '" << c.request_id << "' failed (" << status
                 << "); prefilling locally";
    scheduler_.FailKv(seq_id);
    return;
  }
  // The KV arrived in the transfer memory: into the KV cache before decoding reads it (the
  // blocks wholly inside the prefix-cache hit were not written and stay as they are).
  if (absl::Status staged = StagePromptKv(
          seq_id, seq->num_cached_prompt_tokens / runner_->block_size(), KvStage::kFromMirror);
      !staged.ok()) {
    LOG(WARNING) << "engine: staging the received KV of '" << c.request_id << "' failed (" << staged
                 << "); prefilling locally";
    scheduler_.FailKv(seq_id);
    return;
  }
  a.kv_ready = c.arrived;
  scheduler_.CompleteKv(seq_id, c.result->first_token);
  EmitToken(seq_id, c.result->first_token, std::move(logprobs));
}

void Engine::CancelRequest(const std::string& request_id) {
  auto it = seq_by_request_.find(request_id);
  if (it != seq_by_request_.end()) {
    const int64_t seq_id = it->second;
    auto pos = std::find(reservations_.begin(), reservations_.end(), seq_id);
    if (pos != reservations_.end()) {
      reservations_.erase(pos);
      RejectReservation(seq_id, absl::CancelledError("cancelled before blocks were reserved"));
    } else {
      FinishRequest(seq_id, FinishReason::kAbort, absl::OkStatus(), {});
    }
    return;
  }
  ReleaseHeld(request_id, "");
}

void Engine::ReleaseHeld(const std::string& request_id, const char* reason) {
  auto it = held_.find(request_id);
  if (it == held_.end()) return;
  if (reason[0] != '\0') {
    LOG(WARNING) << "engine: freeing the KV held for '" << request_id << "': " << reason;
  }
  CHECK(scheduler_.Abort(it->second.seq_id));
  held_.erase(it);
  absl::MutexLock lock(&mu_);
  live_ids_.erase(request_id);
}

void Engine::ExpireHeldLeases(absl::Time now) {
  std::vector<std::string> expired;
  for (const auto& [id, held] : held_) {
    if (now >= held.expiry) expired.push_back(id);
  }
  for (const std::string& id : expired) ReleaseHeld(id, "lease expired before ReleaseHeldKv");
}

namespace {

// Drafter fallbacks are logged at the 1st, 2nd, 4th, 8th ... (the metric counts them all).
bool LogFallback(int64_t n) { return (n & (n - 1)) == 0; }

}  // namespace

void Engine::ProposeDrafts() {
  if (options_.drafter == nullptr || options_.num_speculative_tokens <= 0) return;
  std::vector<speculative::DraftRequest> requests;
  for (int64_t id : scheduler_.running()) {
    const Sequence* seq = scheduler_.Get(id);
    // Decoding (one token left to compute), no drafts yet, not a prefill-role request.
    if (seq->num_draft > 0 || seq->num_computed + 1 != static_cast<int>(seq->tokens.size())) {
      continue;
    }
    Active& a = *active_.at(id);
    if (a.request.hold_kv_after_prefill || a.ScoresPrompt(seq->num_computed)) continue;
    if (a.spec_k < 0) a.spec_k = options_.num_speculative_tokens;
    // This step emits at most drafts + 1 tokens, and never past max_tokens.
    const int left = a.max_tokens - (seq->num_output_tokens() + a.resumed);
    const int k = std::min(a.spec_k, left - 1);
    if (k < 1) continue;
    speculative::DraftRequest r;
    r.key = id;
    r.tokens = seq->tokens;
    r.num_prompt_tokens = a.num_prompt_tokens;
    r.max_tokens = k;
    requests.push_back(r);
  }
  if (requests.empty()) return;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.drafter_deadline;
  absl::StatusOr<std::vector<std::vector<int32_t>>> drafts =
      options_.drafter->Propose(requests, deadline);
  const absl::Time done = absl::Now();
  local_stats_.drafter_seconds += absl::ToDoubleSeconds(done - start);
  if (!drafts.ok() || drafts->size() != requests.size() || done > deadline) {
    // Plain decoding this step; the drafter is not trusted to be up, fast or right.
    if (LogFallback(++local_stats_.spec_fallbacks)) {
      LOG(WARNING) << "engine: drafter " << options_.drafter->name() << " gave no usable answer ("
                   << (!drafts.ok() ? drafts.status().ToString()
                       : drafts->size() != requests.size()
                           ? absl::StrCat(drafts->size(), " answers for ", requests.size(),
                                          " sequences")
                           : absl::StrCat("late by ", absl::FormatDuration(done - deadline)))
                   << "); decoding without drafts (fallback " << local_stats_.spec_fallbacks << ")";
    }
    return;
  }
  const int vocab = runner_->config().vocab_size;
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::vector<int32_t>& d = (*drafts)[i];
    if (d.empty()) continue;
    if (static_cast<int>(d.size()) > requests[i].max_tokens ||
        std::any_of(d.begin(), d.end(), [&](int32_t t) { return t < 0 || t >= vocab; })) {
      if (LogFallback(++local_stats_.spec_fallbacks)) {
        LOG(WARNING) << "engine: drafter " << options_.drafter->name() << " proposed "
                     << (static_cast<int>(d.size()) > requests[i].max_tokens
                             ? absl::StrCat(d.size(), " tokens, ", requests[i].max_tokens, " asked")
                             : std::string("a token outside the vocabulary"))
                     << "; dropped (fallback " << local_stats_.spec_fallbacks << ")";
      }
      continue;
    }
    scheduler_.SetDrafts(requests[i].key, d);
  }
}

bool Engine::Step() {
  ProposeDrafts();
  SchedulerStep plan = scheduler_.Schedule();
  // A plan that only preempted (blocks pinned by awaiting or held KV) still made progress.
  if (plan.empty()) return !plan.preempted.empty();
  ForwardBatch batch;
  int rows = 0;
  // Chunks that carry drafts (plan order): scored row by row on the host.
  std::vector<int> chunk_drafts(plan.chunks.size(), 0);
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    const Sequence* seq = scheduler_.Get(c.seq_id);
    if (c.need_logits && seq->num_draft > 0) {
      CHECK_EQ(c.num_tokens, 1 + seq->num_draft);
      chunk_drafts[i] = seq->num_draft;
    }
  }
  // Rows the runner may sample itself (model_runner.h); reserved up front (a request per row at
  // most) so that the chunks' pointers stay valid. A chunk verifying drafts gets a request per
  // row, each with the seed step its row has if the drafts before it hold, so the runner samples
  // every row exactly as plain decoding would one after another.
  const bool runner_samples = runner_->SupportsDeviceSampling();
  std::vector<SampleRequest> requests;
  size_t max_rows = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) max_rows += 1 + chunk_drafts[i];
  requests.reserve(max_rows);
  // Guided rows the runner samples under their grammar mask: the words, written by
  // batch.masks_ready while the forward pass runs (reserved: the chunks' spans stay valid).
  const size_t vocab_words = (static_cast<size_t>(runner_->config().vocab_size) + 63) / 64;
  std::vector<std::vector<uint64_t>> masks;
  masks.reserve(plan.chunks.size());
  std::vector<int64_t> mask_seq;  // masks[i] is of sequence mask_seq[i]
  std::vector<int> row_mask;      // logits row -> index in masks, or -1
  std::vector<char> mask_empty;   // masks[i] allows no token
  for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
    const ScheduledChunk& c = plan.chunks[ci];
    const Sequence* seq = scheduler_.Get(c.seq_id);
    SequenceChunk chunk;
    chunk.tokens = std::span<const int32_t>(seq->tokens).subspan(c.start_pos, c.num_tokens);
    chunk.start_pos = c.start_pos;
    chunk.block_table = scheduler_.BlockTable(c.seq_id);
    chunk.need_logits = c.need_logits;
    const Active& a = *active_.at(c.seq_id);
    if (a.ScoresPrompt(c.start_pos)) {
      // Prompt logprobs: a row per token of the chunk; never sampled by the runner.
      chunk.need_logits = true;
      chunk.num_logits = c.num_tokens;
      rows += c.num_tokens;
      row_mask.insert(row_mask.end(), static_cast<size_t>(c.num_tokens), -1);
    } else if (chunk_drafts[ci] > 0) {
      // The last token and its drafts: a row each.
      chunk.num_logits = c.num_tokens;
      rows += c.num_tokens;
      row_mask.insert(row_mask.end(), static_cast<size_t>(c.num_tokens), -1);
      if (runner_samples && SamplesFromLogitsOnly(a.request.params)) {
        const uint64_t first_step =
            static_cast<uint64_t>(seq->num_output_tokens() - seq->num_draft + a.resumed);
        chunk.sample = requests.data() + requests.size();
        for (int j = 0; j < c.num_tokens; ++j) {
          requests.push_back(MakeSampleRequest(a.request.params, a.seed, first_step + j));
        }
      }
    } else if (c.need_logits) {
      ++rows;
      row_mask.push_back(-1);
      const bool plain = SamplesFromLogitsOnly(a.request.params);
      const bool masked =
          !plain && a.grammar != nullptr && SamplesFromLogitsAndGrammarOnly(a.request.params);
      if (runner_samples && (plain || masked)) {
        // The same seed and step OnLogits would use.
        requests.push_back(MakeSampleRequest(
            a.request.params, a.seed, static_cast<uint64_t>(seq->num_output_tokens() + a.resumed)));
        chunk.sample = &requests.back();
        if (masked) {
          row_mask.back() = static_cast<int>(masks.size());
          masks.emplace_back(vocab_words, 0);
          mask_seq.push_back(c.seq_id);
          chunk.allowed = masks.back();
        }
      }
    }
    batch.chunks.push_back(chunk);
  }
  const absl::Time step_start = absl::Now();
  const KvProgress progress = reports_kv_chunks_ ? runner_->kv_progress() : KvProgress{};
  for (const ScheduledChunk& c : plan.chunks) {
    Active& a = *active_.at(c.seq_id);
    if (!a.queued_until.has_value()) a.queued_until = step_start;
    // Layer-wise streaming: the chunk's KV is reported before it is computed.
    if (reports_kv_chunks_ && a.request.hold_kv_after_prefill && a.request.on_kv_chunk) {
      const int block_size = runner_->block_size();
      const int end = c.start_pos + c.num_tokens;
      const std::span<const int32_t> table = scheduler_.BlockTable(c.seq_id);
      KvChunk chunk;
      chunk.request_id = a.request.request_id;
      chunk.block_ids.assign(table.begin(), table.begin() + (end + block_size - 1) / block_size);
      chunk.begin = c.start_pos;
      chunk.end = end;
      chunk.progress = progress.counter;
      chunk.first_value = progress.next;
      a.request.on_kv_chunk(chunk);
    }
  }
  if (mask_prefetcher_ != nullptr) {
    // Each guided row's mask is needed after the forward pass; start the uncached ones now.
    for (const ScheduledChunk& c : plan.chunks) {
      if (!c.need_logits) continue;
      const Active& a = *active_.at(c.seq_id);
      if (a.grammar != nullptr) mask_prefetcher_->Prefetch(a.grammar, a.grammar_state);
    }
  }
  if (!masks.empty()) {
    // Runs inside Forward, after the forward pass is queued: the masks the prefetcher started.
    mask_empty.assign(masks.size(), 0);
    batch.masks_ready = [&]() {
      for (size_t i = 0; i < masks.size(); ++i) {
        mask_empty[i] = !GrammarMask(*active_.at(mask_seq[i]), masks[i]);
      }
      return absl::OkStatus();
    };
  }
  ForwardOutput out;
  const absl::Time forward_start = absl::Now();
  absl::Status status = runner_->Forward(batch, &out);
  const absl::Time forward_done = absl::Now();
  const size_t vocab = static_cast<size_t>(runner_->config().vocab_size);
  // Sampled by the runner: only allowed when every row asked for it.
  const bool sampled = !out.tokens.empty();
  if (status.ok() && sampled &&
      (out.rows != rows || static_cast<int>(requests.size()) != rows ||
       out.tokens.size() != static_cast<size_t>(rows) ||
       out.logprobs.size() != static_cast<size_t>(rows) ||
       std::any_of(out.tokens.begin(), out.tokens.end(),
                   [&](int32_t t) { return t < 0 || static_cast<size_t>(t) >= vocab; }))) {
    status = absl::InternalError(absl::StrCat(
        "model runner returned ", out.rows, " rows and ", out.tokens.size(), " sampled tokens (",
        out.logprobs.size(), " logprobs) for ", rows, " sequences, ", requests.size(),
        " of which asked to be sampled, vocabulary ", vocab));
  }
  if (status.ok() && !sampled &&
      (out.rows != rows || out.logits.size() != static_cast<size_t>(rows) * vocab)) {
    status = absl::InternalError(absl::StrCat("model runner returned ", out.rows, " rows and ",
                                              out.logits.size(), " logits for ", rows,
                                              " sequences of vocabulary ", vocab));
  }
  ++local_stats_.steps;
  local_stats_.forward_seconds += absl::ToDoubleSeconds(forward_done - forward_start);
  const mlp::MlpBackendStats mlp = runner_->mlp_stats();
  local_stats_.mlp_calls = mlp.calls;
  local_stats_.mlp_failovers = mlp.failovers;
  local_stats_.mlp_failures = mlp.failures;
  local_stats_.mlp_plane_calls = mlp.plane_calls;
  // A decode chunk is one token with logits; a prompt chunk anything else (a one-token prompt
  // tail counts as a decode: rare, and the same cost).
  const auto is_decode = [](const ScheduledChunk& c) { return c.num_tokens == 1 && c.need_logits; };
  const bool no_drafts =
      std::all_of(chunk_drafts.begin(), chunk_drafts.end(), [](int d) { return d == 0; });
  if (status.ok() && std::all_of(plan.chunks.begin(), plan.chunks.end(), is_decode)) {
    ++local_stats_.decode_steps;
    local_stats_.decode_forward_seconds += absl::ToDoubleSeconds(forward_done - forward_start);
    local_stats_.decode_sequences += static_cast<int64_t>(plan.chunks.size());
    for (const ScheduledChunk& c : plan.chunks) local_stats_.decode_context_tokens += c.start_pos;
  } else if (status.ok() && no_drafts &&
             std::none_of(plan.chunks.begin(), plan.chunks.end(), is_decode)) {
    ++local_stats_.prefill_steps;
    local_stats_.prefill_forward_seconds += absl::ToDoubleSeconds(forward_done - forward_start);
    local_stats_.prefill_chunks += static_cast<int64_t>(plan.chunks.size());
    for (const ScheduledChunk& c : plan.chunks) {
      local_stats_.prefill_tokens += c.num_tokens;
      local_stats_.prefill_cached_tokens += c.start_pos;
    }
  }
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
  for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
    const ScheduledChunk& c = plan.chunks[ci];
    if (chunk_drafts[ci] > 0) {
      const size_t first = row;
      row += static_cast<size_t>(c.num_tokens);
      if (sampled) {
        VerifyDrafts(c.seq_id, [&](size_t i) -> std::optional<int32_t> {
          if (std::isnan(out.logprobs[first + i])) return std::nullopt;
          OnSampled(c.seq_id, SampleResult{out.tokens[first + i], out.logprobs[first + i], {}});
          return out.tokens[first + i];
        });
      } else {
        const std::span<const float> rows_logits =
            std::span<const float>(out.logits)
                .subspan(first * vocab, static_cast<size_t>(c.num_tokens) * vocab);
        VerifyDrafts(c.seq_id, [&](size_t i) -> std::optional<int32_t> {
          const std::span<const float> logits = rows_logits.subspan(i * vocab, vocab);
          if (std::any_of(logits.begin(), logits.end(), [](float x) { return std::isnan(x); })) {
            return std::nullopt;
          }
          return OnLogits(c.seq_id, logits);
        });
      }
      continue;
    }
    Active& a = *active_.at(c.seq_id);
    if (a.ScoresPrompt(c.start_pos)) {
      // Logits rows of positions start_pos.. (sampled is false: the runner had no sample for
      // them): row j scores the prompt token after position start_pos + j.
      const size_t first = row;
      row += static_cast<size_t>(c.num_tokens);
      const std::span<const float> chunk_logits =
          std::span<const float>(out.logits).subspan(first * vocab, c.num_tokens * vocab);
      if (std::any_of(chunk_logits.begin(), chunk_logits.end(),
                      [](float x) { return std::isnan(x); })) {
        FinishRequest(c.seq_id, FinishReason::kError,
                      absl::InternalError("the model produced NaN logits"), {});
        continue;
      }
      const Sequence* seq = scheduler_.Get(c.seq_id);
      for (int j = 0; j < c.num_tokens; ++j) {
        const int pos = c.start_pos + j;
        if (pos + 1 >= a.num_prompt_tokens) break;
        a.prompt_logprobs[pos] =
            ScoreToken(chunk_logits.subspan(j * vocab, vocab), seq->tokens[pos + 1],
                       *a.request.params.prompt_logprobs);
        if (!a.prompt_scored_at[pos]) {
          a.prompt_scored_at[pos] = 1;
          ++a.prompt_scored;
        }
      }
      if (!c.need_logits) continue;
      if (!a.kv_ready.has_value()) a.kv_ready = forward_done;
      OnLogits(c.seq_id, chunk_logits.subspan((c.num_tokens - 1) * vocab, vocab));
      continue;
    }
    if (!c.need_logits) continue;
    if (!a.kv_ready.has_value()) a.kv_ready = forward_done;
    const size_t r = row++;
    if (sampled) {
      if (row_mask[r] >= 0 && mask_empty[row_mask[r]]) {
        FinishRequest(c.seq_id, FinishReason::kError,
                      absl::InvalidArgumentError(
                          "guided decoding: no token of the vocabulary can continue the output"),
                      {});
        continue;
      }
      if (std::isnan(out.logprobs[r])) {
        FinishRequest(c.seq_id, FinishReason::kError,
                      absl::InternalError("the model produced NaN logits"), {});
        continue;
      }
      OnSampled(c.seq_id, SampleResult{out.tokens[r], out.logprobs[r], {}});
      continue;
    }
    const std::span<const float> logits =
        std::span<const float>(out.logits).subspan(r * vocab, vocab);
    if (std::any_of(logits.begin(), logits.end(), [](float x) { return std::isnan(x); })) {
      FinishRequest(c.seq_id, FinishReason::kError,
                    absl::InternalError("the model produced NaN logits"), {});
      continue;
    }
    OnLogits(c.seq_id, logits);
  }
  return true;
}

void Engine::VerifyDrafts(int64_t seq_id,
                          const std::function<std::optional<int32_t>(size_t)>& sample_row) {
  const std::vector<int32_t> drafts = scheduler_.TakeDrafts(seq_id);
  ++local_stats_.spec_verifications;
  local_stats_.spec_draft_tokens += static_cast<int64_t>(drafts.size());
  // Row i follows the last token and drafts[0, i): it is sampled exactly as plain decoding would
  // (same history, seed, step, penalties and grammar state); while the sampled token is the draft
  // the step computed next, its KV is already there and row i + 1 is valid.
  int accepted = 0;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    const std::optional<int32_t> token = sample_row(i);
    if (!token.has_value()) {
      FinishRequest(seq_id, FinishReason::kError,
                    absl::InternalError("the model produced NaN logits"), {});
      break;
    }
    const bool agrees = i < drafts.size() && *token == drafts[i];
    accepted += agrees ? 1 : 0;
    if (!active_.contains(seq_id)) break;  // finished: a stop, its length, or an error
    if (!agrees) break;
    scheduler_.AcceptDraftKv(seq_id);
  }
  local_stats_.spec_accepted_tokens += accepted;
  if (auto it = active_.find(seq_id); it != active_.end()) {
    // Ask for more while every draft holds, else for what held (and one more).
    Active& a = *it->second;
    const int asked = static_cast<int>(drafts.size());
    a.spec_k = std::clamp(accepted == asked ? std::max(a.spec_k, asked) + 1 : accepted + 1, 1,
                          options_.num_speculative_tokens);
  }
}

int32_t Engine::OnLogits(int64_t seq_id, std::span<const float> logits) {
  Active& a = *active_.at(seq_id);
  const SamplingParams& params = a.request.params;
  const Sequence* seq = scheduler_.Get(seq_id);
  const std::span<const int32_t> all(seq->tokens);
  // A resumed request's earlier output counts as output (penalties, seed position).
  const size_t split = static_cast<size_t>(a.num_prompt_tokens - a.resumed);
  const int output_len = seq->num_output_tokens() + a.resumed;
  const std::vector<int32_t> suppressed = SuppressedTokens(a, output_len);
  std::vector<uint64_t> allowed;
  if (a.grammar != nullptr) {
    allowed.assign((logits.size() + 63) / 64, 0);
    if (!GrammarMask(a, allowed)) {
      FinishRequest(seq_id, FinishReason::kError,
                    absl::InvalidArgumentError(
                        "guided decoding: no token of the vocabulary can continue the output"),
                    {});
      return -1;
    }
  }
  const SampleResult r = Sample(params, logits, all.first(split), all.subspan(split), a.seed,
                                static_cast<uint64_t>(output_len), suppressed, allowed);
  OnSampled(seq_id, r);
  return r.token;
}

void Engine::OnSampled(int64_t seq_id, const SampleResult& r) {
  Active& a = *active_.at(seq_id);
  const SamplingParams& params = a.request.params;
  if (a.request.hold_kv_after_prefill) {
    HoldAfterPrefill(seq_id, r);
    return;
  }
  scheduler_.AppendToken(seq_id, r.token);
  std::optional<TokenLogprobs> logprobs;
  if (params.logprobs.has_value()) logprobs = TokenLogprobs{r.token, r.logprob, r.top_logprobs};
  EmitToken(seq_id, r.token, std::move(logprobs));
}

namespace {

int64_t Micros(absl::Time from, absl::Time to) {
  return std::max<int64_t>(0, absl::ToInt64Microseconds(to - from));
}

}  // namespace

absl::Status Engine::StagePromptKv(int64_t seq_id, int first_block, KvStage dir) {
  const Active& a = *active_.at(seq_id);
  if (!a.request.stage_kv || !stages_kv_.load(std::memory_order_acquire)) return absl::OkStatus();
  const int block_size = runner_->block_size();
  const int prompt_blocks = (a.num_prompt_tokens + block_size - 1) / block_size;
  const std::span<const int32_t> table = scheduler_.BlockTable(seq_id);
  CHECK_GE(static_cast<int>(table.size()), prompt_blocks);
  if (first_block >= prompt_blocks) return absl::OkStatus();
  return runner_->StageKv(table.subspan(first_block, prompt_blocks - first_block), dir);
}

void Engine::HoldAfterPrefill(int64_t seq_id, const SampleResult& sampled) {
  Active& a = *active_.at(seq_id);
  // The transfer reads transfer_layout(): the prompt's KV goes there before anyone is told.
  if (absl::Status staged = StagePromptKv(seq_id, 0, KvStage::kToMirror); !staged.ok()) {
    LOG(ERROR) << "engine: staging the KV of '" << a.request.request_id
               << "' for transfer failed: " << staged;
    FinishRequest(seq_id, FinishReason::kError,
                  absl::Status(staged.code(), absl::StrCat("staging the prompt's KV for transfer: ",
                                                           staged.message())),
                  {});
    return;
  }
  const Sequence* seq = scheduler_.Get(seq_id);
  ++local_stats_.generated_tokens;
  ++a.usage.completion_tokens;
  a.usage.cached_prompt_tokens = std::max(0, seq->num_cached_prompt_tokens);
  PrefilledKv kv;
  kv.request_id = a.request.request_id;
  const std::span<const int32_t> table = scheduler_.BlockTable(seq_id);
  kv.block_ids.assign(table.begin(), table.end());
  kv.num_tokens = a.num_prompt_tokens;
  kv.first_token = sampled.token;
  if (a.request.params.logprobs.has_value()) {
    kv.first_token_logprobs = TokenLogprobs{sampled.token, sampled.logprob, sampled.top_logprobs};
  }
  kv.prefix_cached_tokens = a.usage.cached_prompt_tokens;
  scheduler_.Hold(seq_id);
  held_[kv.request_id] = HeldKv{seq_id, absl::Now() + options_.held_kv_lease};
  a.request.on_prefilled(kv);

  GenerationOutput out;
  out.token_ids.push_back(sampled.token);
  if (kv.first_token_logprobs.has_value()) out.logprobs.push_back(*kv.first_token_logprobs);
  if (a.detok != nullptr) out.text = a.detok->Push(sampled.token) + a.detok->Flush();
  const absl::Time now = absl::Now();
  out.first_token_timings =
      FirstTokenTimings{Micros(a.submitted, a.queued_until.value_or(now)),
                        Micros(a.queued_until.value_or(now), a.kv_ready.value_or(now)),
                        Micros(a.kv_ready.value_or(now), now)};
  FinishRequest(seq_id, FinishReason::kLength, absl::OkStatus(), std::move(out));
}

void Engine::EmitToken(int64_t seq_id, int32_t token, std::optional<TokenLogprobs> logprobs) {
  Active& a = *active_.at(seq_id);
  const SamplingParams& params = a.request.params;
  const Sequence* seq = scheduler_.Get(seq_id);
  ++local_stats_.generated_tokens;
  ++a.usage.completion_tokens;
  a.usage.cached_prompt_tokens = std::max(0, seq->num_cached_prompt_tokens);

  GenerationOutput out;
  out.token_ids.push_back(token);
  if (logprobs.has_value()) out.logprobs.push_back(std::move(*logprobs));
  if (a.request.params.prompt_logprobs.has_value() && !a.prompt_logprobs_sent) {
    a.prompt_logprobs_sent = true;
    if (a.prompt_scored != a.num_prompt_tokens - 1) {
      FinishRequest(
          seq_id, FinishReason::kError,
          absl::InternalError(absl::StrCat("prompt logprobs: ", a.prompt_scored, " of ",
                                           a.num_prompt_tokens - 1, " prompt tokens were scored")),
          {});
      return;
    }
    out.prompt_logprobs = std::move(a.prompt_logprobs);
  }
  if (a.usage.completion_tokens == 1) {
    const absl::Time now = absl::Now();
    out.first_token_timings =
        FirstTokenTimings{Micros(a.submitted, a.queued_until.value_or(now)),
                          Micros(a.queued_until.value_or(now), a.kv_ready.value_or(now)),
                          Micros(a.kv_ready.value_or(now), now)};
  }
  // Below min_tokens a stop token can only come from allowed_token_ids leaving nothing else
  // (sampler.h); it ends the request then, as it would have.
  const bool stop_token = (!params.ignore_eos && eos_ids_.contains(token)) ||
                          std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                                    token) != params.stop_token_ids.end();
  std::optional<FinishReason> finish;
  bool grammar_done = false;
  if (a.grammar != nullptr && !stop_token) {
    const int s = a.grammar->automaton().Walk(a.grammar_state, tokenizer_->TokenBytes(token));
    if (s == grammar::kDeadState) {
      // Only a token sampled elsewhere (a peer's first token) can get here.
      FinishRequest(seq_id, FinishReason::kError,
                    absl::InvalidArgumentError(absl::StrCat("guided decoding: token ", token,
                                                            " does not continue the output")),
                    {});
      return;
    }
    a.grammar_state = s;
    // A whole match that nothing can extend: the output is complete.
    grammar_done = a.grammar->automaton().accepting(s) && !a.grammar->automaton().can_continue(s);
  }
  if (stop_token) {
    finish = FinishReason::kStop;  // the stop token's text is not part of the output
  } else if (a.detok != nullptr) {
    out.text = PushText(a, token, a.resumed + a.usage.completion_tokens);
    if (a.stops.stopped()) finish = FinishReason::kStop;
  }
  if (a.resumed > 0) TrimResumedText(a, &out.text);
  if (!finish.has_value() && grammar_done) finish = FinishReason::kStop;
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
    std::string tail = a.stops.Append(a.detok->Flush());
    tail += a.stops.Flush();
    if (a.resumed > 0) TrimResumedText(a, &tail);
    out.text += tail;
    if (a.stops.stopped()) finish = FinishReason::kStop;
  }
  FinishRequest(seq_id, *finish, absl::OkStatus(), std::move(out));
}

std::string Engine::PushText(Active& a, int32_t token, int output_index) {
  std::string delta = a.detok->Push(token);
  // Before the min_tokens-th token no stop string is matched (vLLM's order); the stop buffer has
  // seen nothing yet, so its text goes out as it comes.
  if (output_index < a.request.params.min_tokens) return delta;
  return a.stops.Append(delta);
}

bool Engine::GrammarMask(const Active& a, std::span<uint64_t> words) const {
  // The automaton's mask, and EOS where the output so far is a whole match.
  // Held while copied: the masker's cache may drop its own reference meanwhile.
  const std::shared_ptr<const grammar::TokenBitmask> held =
      a.grammar->masker().Mask(a.grammar_state);
  const std::vector<uint64_t>& mask = held->words();
  const size_t n = std::min(mask.size(), words.size());
  std::copy(mask.begin(), mask.begin() + n, words.begin());
  std::fill(words.begin() + n, words.end(), 0);
  // EOS ends the output whatever its bytes: allowed exactly where the output is a whole match.
  const bool accepting = a.grammar->automaton().accepting(a.grammar_state);
  const size_t vocab = words.size() * 64;
  for (int32_t eos : eos_ids_) {
    if (eos < 0 || static_cast<size_t>(eos) >= vocab) continue;
    const uint64_t bit = uint64_t{1} << (eos & 63);
    words[eos >> 6] = accepting ? (words[eos >> 6] | bit) : (words[eos >> 6] & ~bit);
  }
  return std::any_of(words.begin(), words.end(), [](uint64_t w) { return w != 0; });
}

std::vector<int32_t> Engine::SuppressedTokens(const Active& a, int output_len) const {
  std::vector<int32_t> out;
  const SamplingParams& params = a.request.params;
  if (output_len >= params.min_tokens) return out;
  if (!params.ignore_eos) out.assign(eos_ids_.begin(), eos_ids_.end());
  out.insert(out.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
  return out;
}

void Engine::TrimResumedText(Active& a, std::string* text) {
  if (!a.resumed_text.empty()) {
    *text = absl::StrCat(a.resumed_text, *text);
    a.resumed_text.clear();
  }
  if (a.skip_text_bytes > 0) {
    const size_t drop = std::min(text->size(), static_cast<size_t>(a.skip_text_bytes));
    text->erase(0, drop);
    a.skip_text_bytes -= static_cast<int64_t>(drop);
  }
}

void Engine::FinishRequest(int64_t seq_id, FinishReason reason, absl::Status error,
                           GenerationOutput out) {
  auto it = active_.find(seq_id);
  CHECK(it != active_.end());
  std::unique_ptr<Active> a = std::move(it->second);
  active_.erase(it);
  seq_by_request_.erase(a->request.request_id);
  // A held sequence keeps its blocks and its request id until ReleaseHeld.
  const bool held = held_.contains(a->request.request_id);
  if (const Sequence* seq = scheduler_.Get(seq_id); seq != nullptr) {
    a->usage.cached_prompt_tokens = std::max(0, seq->num_cached_prompt_tokens);
    if (options_.drafter != nullptr && options_.num_speculative_tokens > 0) {
      const std::span<const int32_t> tokens(seq->tokens);
      options_.drafter->Release(seq_id, tokens.first(tokens.size() - seq->num_draft),
                                seq->num_prompt_tokens);
    }
    if (!held) scheduler_.Finish(seq_id);
  }
  out.request_id = a->request.request_id;
  out.finish_reason = reason;
  out.error = std::move(error);
  out.usage = a->usage;
  ++local_stats_.finished_requests;
  if (!held) {
    absl::MutexLock lock(&mu_);
    live_ids_.erase(a->request.request_id);
  }
  a->request.on_output(out);
}

void Engine::AbortAll() {
  std::vector<int64_t> ids;
  for (const auto& [id, a] : active_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids) {
    auto pos = std::find(reservations_.begin(), reservations_.end(), id);
    if (pos != reservations_.end()) {
      reservations_.erase(pos);
      RejectReservation(id, absl::UnavailableError("engine is shutting down"));
    } else {
      FinishRequest(id, FinishReason::kAbort, absl::OkStatus(), {});
    }
  }
  std::vector<std::string> held;
  for (const auto& [request_id, h] : held_) held.push_back(request_id);
  for (const std::string& request_id : held) ReleaseHeld(request_id, "");
}

}  // namespace tandem

#pragma once
// The engine loop: ONE thread owns the ModelRunner, the scheduler (with its KV block manager) and
// the sampler, and runs step after step (schedule -> forward -> sample -> emit), llama.cpp
// server-queue style.
//
// Threads: Submit, Cancel, Shutdown and stats may be called from any thread; they only touch the
// request queue under `mu_` and never wait on a forward pass. Output callbacks run on the engine
// thread, outside `mu_`: they must return quickly and must not call Shutdown (Cancel and Submit
// are fine).
//
// Per request, the callback receives zero or more outputs followed by exactly one final output
// (finish_reason set): stop (EOS, a stop token id or a stop string), length (max_tokens or the
// context limit), abort (Cancel or Shutdown) or error (the forward pass failed; `error` says why).
// A request rejected by Submit gets no callback at all.
//
// Ownership: the engine owns the runner; the tokenizer (optional) must outlive the engine.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/engine/stop_strings.h"
#include "runtime/model/model_runner.h"
#include "runtime/model/tokenizer.h"
#include "runtime/sampling/sampler.h"
#include "runtime/sampling/sampling_params.h"
#include "runtime/scheduler/scheduler.h"

namespace tandem {

enum class FinishReason { kStop, kLength, kAbort, kError };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", "abort", "error"

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
};

struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // params.logprobs entries, most likely first
};

struct GenerationOutput {
  std::string request_id;
  std::vector<int32_t> token_ids;             // tokens generated since the previous output
  std::vector<TokenLogprobs> logprobs;        // parallel to token_ids when params.logprobs is set
  std::string text;                           // text delta (empty without a tokenizer)
  std::optional<FinishReason> finish_reason;  // set on the final output only
  absl::Status error;                         // why, when finish_reason is kError
  Usage usage;                                // running totals
};

using OutputCallback = std::function<void(const GenerationOutput&)>;

struct GenerateRequest {
  std::string request_id;  // unique among the engine's live requests
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
  OutputCallback on_output;
};

struct EngineOptions {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  int max_model_len = 0;  // 0: the model's max_position_embeddings
  bool enable_prefix_caching = true;
  // Stop tokens besides the model config's eos_token_ids and the tokenizer's EOS.
  std::vector<int32_t> extra_eos_token_ids;
  absl::Duration idle_poll = absl::Milliseconds(50);  // loop wake-up when idle
};

struct EngineStats {
  int64_t steps = 0;
  int64_t batched_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t finished_requests = 0;
  int blocks_total = 0;
  int blocks_used = 0;
  int blocks_free = 0;  // free + cached-idle
  int running = 0;
  int waiting = 0;
};

class Engine {
 public:
  // Starts the loop thread. `tokenizer` may be null (no text, no stop strings).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<ModelRunner> runner,
                                                        const Tokenizer* tokenizer,
                                                        const EngineOptions& options);
  ~Engine();  // Shutdown(absl::ZeroDuration()) if not done yet
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and enqueues; returns at once. InvalidArgument (naming the field) for an empty
  // prompt, token ids outside the vocabulary, a prompt that leaves no room under the context
  // limit, prompt + max_tokens over it, bad sampling parameters, stop strings without a
  // tokenizer; AlreadyExists for a live request id; Unavailable after Shutdown began.
  absl::Status Submit(GenerateRequest request);
  // Aborts a live request (its final output has finish_reason kAbort); no-op for unknown ids.
  void Cancel(const std::string& request_id);
  // Stops accepting requests, lets live ones run for up to `drain_timeout`, aborts the rest and
  // joins the loop. Idempotent.
  void Shutdown(absl::Duration drain_timeout);

  EngineStats stats() const;
  int max_model_len() const { return max_model_len_; }
  const ModelConfig& config() const { return runner_->config(); }

 private:
  struct Active;
  Engine(std::unique_ptr<ModelRunner> runner, const Tokenizer* tokenizer,
         const EngineOptions& options, int max_model_len);
  absl::Status Validate(const GenerateRequest& request) const;
  void Loop();
  void Admit(GenerateRequest request);
  // Runs one scheduled step; false when nothing could be scheduled.
  bool Step();
  // Samples one token for `seq_id` from `logits` and emits its output; may finish the request.
  void OnLogits(int64_t seq_id, std::span<const float> logits);
  void FinishRequest(int64_t seq_id, FinishReason reason, absl::Status error, GenerationOutput out);
  void AbortAll();
  void PublishStats();

  // Fixed at construction.
  const std::unique_ptr<ModelRunner> runner_;
  const Tokenizer* const tokenizer_;
  const EngineOptions options_;
  const int max_model_len_;
  absl::flat_hash_set<int32_t> eos_ids_;

  // Engine thread only.
  Scheduler scheduler_;
  absl::flat_hash_map<int64_t, std::unique_ptr<Active>> active_;
  absl::flat_hash_map<std::string, int64_t> seq_by_request_;
  int64_t next_seq_id_ = 0;
  std::mt19937_64 seed_rng_;
  EngineStats local_stats_;
  bool last_step_ran_ = true;

  // Shared with callers.
  mutable absl::Mutex mu_;
  std::vector<GenerateRequest> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> cancels_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> live_ids_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time drain_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool loop_done_ ABSL_GUARDED_BY(mu_) = false;
  EngineStats stats_ ABSL_GUARDED_BY(mu_);

  absl::Mutex shutdown_mu_;  // serializes Shutdown callers
  std::thread thread_;
};

}  // namespace tandem

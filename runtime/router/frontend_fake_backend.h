#pragma once
// A GenerationBackend test double for the router frontend: every request runs on its own thread
// and emits deterministic tokens, with configurable delays, failures and an endless mode; it
// records requests and cancels so tests can check what the frontend asked for.
//
// Tokens: position j of a request whose seed is s (0 when unseeded) is the byte
// 'a' + (s + j) % 26, and its text is that one character, so the frontend's test tokenizer must
// map token id b to byte b (a byte-level vocabulary). Logprobs: the sampled token's is
// -0.125 * (j + 1); alternative t (t < params.logprobs) is token 'A' + t with -0.5 * (t + 1).
// A request ends after max_tokens tokens (finish "length"), or after `default_tokens` when
// max_tokens is unset (finish "stop"), or "abort" once cancelled. With `script` set, the tokens
// are that text's bytes instead. Prompt logprobs (params.prompt_logprobs): on the first token's
// chunk, prompt token k (k >= 1) with PromptLogprobAt(k), rank k, and the same alternatives.
// `misscore_prompt` scores a prompt that is one token off (a broken worker).
//
// Thread-safety: all methods are thread-safe. The destructor cancels and joins every request
// thread; callbacks never run after it returns.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "runtime/router/generation_backend.h"

namespace tandem::router {

struct FakeBackendBehavior {
  absl::Duration first_token_delay = absl::ZeroDuration();
  absl::Duration token_delay = absl::ZeroDuration();
  int default_tokens = 8;
  bool endless = false;  // never finishes on its own (until cancelled)
  // When not OK, the request's final event is this status after `fail_after_tokens` tokens.
  absl::Status fail_status;
  int fail_after_tokens = 0;
  std::string fail_only_suffix;  // non-empty: only requests whose id ends with it fail
  int cached_tokens = 0;         // reported as usage.cached_prompt_tokens
  // Non-empty: every request emits these bytes, one token each, then finishes "stop" (the
  // seeded letters and max_tokens no longer apply), so a test can script the model's text.
  std::string script;
  bool misscore_prompt = false;
};

class FakeGenerationBackend : public GenerationBackend {
 public:
  explicit FakeGenerationBackend(FakeBackendBehavior behavior = {});
  ~FakeGenerationBackend() override;

  void set_behavior(FakeBackendBehavior behavior);
  void set_ready(absl::Status status);

  void Generate(BackendRequest request, BackendEventCallback on_event) override;
  void Cancel(const std::string& request_id) override;
  absl::Status Ready() const override;

  std::vector<BackendRequest> requests() const;
  std::vector<std::string> cancelled() const;
  int active() const;  // requests whose final event has not been sent
  // The most requests at once between Generate and their final event so far.
  int max_generating() const;
  // True once a request whose id starts with `prefix` was cancelled (or `count` of them).
  bool WaitForCancel(const std::string& prefix, absl::Duration timeout, int count = 1) const;
  bool WaitForIdle(absl::Duration timeout) const;

  static int32_t TokenAt(uint64_t seed, int position);
  static float LogprobAt(int position);
  static int32_t AlternativeToken(int rank);
  static float AlternativeLogprob(int rank);
  static float PromptLogprobAt(int position);

 private:
  struct Running {
    std::string id;
    absl::Notification cancelled;
  };
  // Delivers a request's final event (counted out of generating_ first).
  void Final(const BackendEventCallback& on_event, absl::StatusOr<BackendChunk> event);
  void Run(BackendRequest request, BackendEventCallback on_event, FakeBackendBehavior behavior,
           std::shared_ptr<Running> running);

  mutable absl::Mutex mu_;
  FakeBackendBehavior behavior_ ABSL_GUARDED_BY(mu_);
  absl::Status ready_ ABSL_GUARDED_BY(mu_);
  std::vector<BackendRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> cancelled_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Running>> running_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  int generating_ ABSL_GUARDED_BY(mu_) = 0;
  int max_generating_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::router

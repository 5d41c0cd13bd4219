#pragma once
// Test-only: OutputCollector gathers an engine's streamed outputs per request id (the engine calls
// OutputCallback from its own thread) so a test can wait for a number of finished requests, with a
// deadline, and then read what each request received. Thread-safe.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/engine/engine.h"

namespace tandem {

class OutputCollector {
 public:
  // Everything one request received, in arrival order.
  struct Result {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;
    std::string text;
    std::optional<FinishReason> finish;
    absl::Status error;  // of the finishing output
    Usage usage;         // of the latest output
    int outputs = 0;
    int outputs_after_finish = 0;  // must stay 0: nothing follows a finish
    std::optional<FirstTokenTimings> timings;
    int outputs_with_timings = 0;
    std::vector<ScoredToken> prompt_logprobs;
    int outputs_with_prompt_logprobs = 0;
  };

  OutputCallback Callback() {
    return [this](const GenerationOutput& out) {
      absl::MutexLock lock(&mu_);
      Result& r = results_[out.request_id];
      if (r.finish.has_value()) ++r.outputs_after_finish;
      ++r.outputs;
      r.tokens.insert(r.tokens.end(), out.token_ids.begin(), out.token_ids.end());
      r.logprobs.insert(r.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      r.text += out.text;
      r.usage = out.usage;
      if (!out.prompt_logprobs.empty()) {
        r.prompt_logprobs = out.prompt_logprobs;
        ++r.outputs_with_prompt_logprobs;
      }
      if (out.first_token_timings.has_value()) {
        r.timings = out.first_token_timings;
        ++r.outputs_with_timings;
      }
      if (out.finish_reason.has_value()) {
        r.finish = out.finish_reason;
        r.error = out.error;
        ++finished_;
      }
    };
  }
  // Whether n requests (in all) have finished before `timeout`.
  bool WaitFinished(int n, absl::Duration timeout = absl::Seconds(30)) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  Result Get(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return results_[id];
  }
  std::map<std::string, Result> results() {
    absl::MutexLock lock(&mu_);
    return results_;
  }
  int finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, Result> results_ ABSL_GUARDED_BY(mu_);
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem

#include "runtime/router/frontend_fake_backend.h"

#include <algorithm>
#include <limits>

#include "absl/strings/match.h"

namespace tandem::router {

FakeGenerationBackend::FakeGenerationBackend(FakeBackendBehavior behavior)
    : behavior_(std::move(behavior)) {}

FakeGenerationBackend::~FakeGenerationBackend() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (auto& r : running_) {
      if (!r->cancelled.HasBeenNotified()) r->cancelled.Notify();
    }
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void FakeGenerationBackend::set_behavior(FakeBackendBehavior behavior) {
  absl::MutexLock lock(&mu_);
  behavior_ = std::move(behavior);
}

void FakeGenerationBackend::set_ready(absl::Status status) {
  absl::MutexLock lock(&mu_);
  ready_ = std::move(status);
}

absl::Status FakeGenerationBackend::Ready() const {
  absl::MutexLock lock(&mu_);
  return ready_;
}

int32_t FakeGenerationBackend::TokenAt(uint64_t seed, int position) {
  return static_cast<int32_t>('a' + (seed + static_cast<uint64_t>(position)) % 26);
}
float FakeGenerationBackend::LogprobAt(int position) { return -0.125f * (position + 1); }
int32_t FakeGenerationBackend::AlternativeToken(int rank) { return 'A' + rank; }
float FakeGenerationBackend::AlternativeLogprob(int rank) { return -0.5f * (rank + 1); }
float FakeGenerationBackend::PromptLogprobAt(int position) { return -0.25f * position; }

void FakeGenerationBackend::Generate(BackendRequest request, BackendEventCallback on_event) {
  absl::MutexLock lock(&mu_);
  requests_.push_back(request);
  auto running = std::make_shared<Running>();
  running->id = request.request_id;
  running_.push_back(running);
  ++active_;
  ++generating_;
  max_generating_ = std::max(max_generating_, generating_);
  threads_.emplace_back(&FakeGenerationBackend::Run, this, std::move(request), std::move(on_event),
                        behavior_, std::move(running));
}

void FakeGenerationBackend::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  cancelled_.push_back(request_id);
  for (auto& r : running_) {
    if (r->id == request_id && !r->cancelled.HasBeenNotified()) r->cancelled.Notify();
  }
}

void FakeGenerationBackend::Run(BackendRequest request, BackendEventCallback on_event,
                                FakeBackendBehavior b, std::shared_ptr<Running> running) {
  const uint64_t seed = request.params.seed.value_or(0);
  const int prompt = static_cast<int>(request.prompt_token_ids.size());
  const int limit = !b.script.empty() ? static_cast<int>(b.script.size())
                    : b.endless       ? std::numeric_limits<int>::max()
                                      : request.params.max_tokens.value_or(b.default_tokens);
  const char* limit_reason =
      request.params.max_tokens.has_value() && b.script.empty() ? "length" : "stop";
  auto usage = [&](int n) { return BackendUsage{prompt, n, b.cached_tokens}; };

  running->cancelled.WaitForNotificationWithTimeout(b.first_token_delay);
  for (int j = 0;; ++j) {
    if (running->cancelled.HasBeenNotified()) {
      BackendChunk c;
      c.finish_reason = "abort";
      c.usage = usage(j);
      Final(on_event, std::move(c));
      break;
    }
    if (!b.fail_status.ok() && j == b.fail_after_tokens &&
        absl::EndsWith(request.request_id, b.fail_only_suffix)) {
      Final(on_event, b.fail_status);
      break;
    }
    BackendChunk c;
    const int32_t token =
        b.script.empty() ? TokenAt(seed, j) : static_cast<unsigned char>(b.script[j]);
    c.token_ids.push_back(token);
    c.text = std::string(1, static_cast<char>(token));
    if (request.params.logprobs.has_value()) {
      BackendTokenLogprobs lp{token, LogprobAt(j), {}};
      for (int t = 0; t < *request.params.logprobs; ++t) {
        lp.top.push_back({AlternativeToken(t), AlternativeLogprob(t)});
      }
      c.logprobs.push_back(std::move(lp));
    }
    c.usage = usage(j + 1);
    if (j == 0) c.ttft = TtftParts{1000, 2000, 3000, 4000};
    if (j == 0 && request.params.prompt_logprobs.has_value()) {
      const std::vector<int32_t>& prompt = request.prompt_token_ids;
      const size_t scored = prompt.size() - (b.misscore_prompt ? 0 : 1);
      for (size_t k = 1; k <= scored; ++k) {
        const int position = static_cast<int>(k);
        BackendTokenLogprobs lp{
            k < prompt.size() ? prompt[k] : 0, PromptLogprobAt(position), {}, position};
        for (int t = 0; t < *request.params.prompt_logprobs; ++t) {
          lp.top.push_back({AlternativeToken(t), AlternativeLogprob(t)});
        }
        c.prompt_logprobs.push_back(std::move(lp));
      }
    }
    const bool last = j + 1 >= limit;
    if (last) {
      c.finish_reason = limit_reason;
      Final(on_event, std::move(c));
      break;
    }
    on_event(std::move(c));
    running->cancelled.WaitForNotificationWithTimeout(b.token_delay);
  }
  absl::MutexLock lock(&mu_);
  --active_;
  running_.erase(std::find(running_.begin(), running_.end(), running));
}

std::vector<BackendRequest> FakeGenerationBackend::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

std::vector<std::string> FakeGenerationBackend::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

int FakeGenerationBackend::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

int FakeGenerationBackend::max_generating() const {
  absl::MutexLock lock(&mu_);
  return max_generating_;
}

void FakeGenerationBackend::Final(const BackendEventCallback& on_event,
                                  absl::StatusOr<BackendChunk> event) {
  {
    absl::MutexLock lock(&mu_);
    --generating_;
  }
  on_event(std::move(event));
}

bool FakeGenerationBackend::WaitForCancel(const std::string& prefix, absl::Duration timeout,
                                          int count) const {
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::count_if(cancelled_.begin(), cancelled_.end(), [&](const std::string& id) {
             return absl::StartsWith(id, prefix);
           }) >= count;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

bool FakeGenerationBackend::WaitForIdle(absl::Duration timeout) const {
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_ == 0; };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

}  // namespace tandem::router

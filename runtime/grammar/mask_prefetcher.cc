#include "runtime/grammar/mask_prefetcher.h"

#include <utility>

namespace tandem::grammar {

MaskPrefetcher::MaskPrefetcher(size_t max_queued)
    : max_queued_(max_queued), worker_([this] { Run(); }) {}

MaskPrefetcher::~MaskPrefetcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  worker_.join();
}

void MaskPrefetcher::Prefetch(std::shared_ptr<const CompiledGrammar> grammar, int state) {
  if (grammar == nullptr || grammar->masker().CachedOrPending(state)) return;
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= max_queued_) {
    ++dropped_;
    return;
  }
  queue_.emplace_back(std::move(grammar), state);
}

int64_t MaskPrefetcher::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

void MaskPrefetcher::Run() {
  while (true) {
    std::pair<std::shared_ptr<const CompiledGrammar>, int> job;
    {
      absl::MutexLock lock(&mu_);
      // Woken by a request or by the destructor; the timeout is only a backstop.
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](MaskPrefetcher* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
                                 return p->stop_ || !p->queue_.empty();
                               },
                               this),
                           absl::Seconds(1));
      if (queue_.empty()) {
        if (stop_) return;
        continue;
      }
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job.first->masker().Mask(job.second);
  }
}

}  // namespace tandem::grammar

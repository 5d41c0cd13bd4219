#include "runtime/base/call_executor.h"

#include <algorithm>
#include <utility>

namespace tandem {

CallExecutor::CallExecutor(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

CallExecutor::~CallExecutor() { Stop(); }

void CallExecutor::PostAt(absl::Time when, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  tasks_.push(Timed{when, next_order_++, std::move(task)});
}

void CallExecutor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  absl::MutexLock lock(&mu_);
  while (!tasks_.empty()) tasks_.pop();
}

void CallExecutor::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      while (true) {
        if (stopped_) return;
        if (!tasks_.empty() && tasks_.top().when <= absl::Now()) break;
        // Sleep until the earliest task is due or a new one arrives (PostAt changes the queue).
        const size_t size = tasks_.size();
        const absl::Time due = tasks_.empty() ? absl::InfiniteFuture() : tasks_.top().when;
        const auto changed = [this, size, due]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopped_ || tasks_.size() != size || (!tasks_.empty() && tasks_.top().when != due);
        };
        mu_.AwaitWithDeadline(absl::Condition(&changed), due);
      }
      task = std::move(const_cast<Timed&>(tasks_.top()).task);
      tasks_.pop();
    }
    task();
  }
}

void Strand::Poke() {
  {
    absl::MutexLock lock(&mu_);
    if (running_) {
      again_ = true;
      return;
    }
    running_ = true;
  }
  executor_->Post([self = shared_from_this()] { self->Run(); });
}

void Strand::PokeAt(absl::Time when) {
  executor_->PostAt(when, [self = shared_from_this()] { self->Poke(); });
}

void Strand::Run() {
  while (true) {
    step_();
    absl::MutexLock lock(&mu_);
    if (!again_) {
      running_ = false;
      return;
    }
    again_ = false;
  }
}

}  // namespace tandem

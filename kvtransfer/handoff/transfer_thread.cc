#include "kvtransfer/handoff/transfer_thread.h"

#include <utility>

#include "absl/synchronization/notification.h"

namespace tandem::kvtransfer {

TransferThread::TransferThread(std::unique_ptr<TransferBackend> backend, absl::Duration busy_tick,
                               absl::Duration idle_tick)
    : backend_name_(backend->name()),
      busy_tick_(busy_tick),
      idle_tick_(idle_tick),
      backend_(std::move(backend)) {
  thread_ = std::thread([this] { Loop(); });
}

TransferThread::~TransferThread() { Stop(); }

bool TransferThread::Post(Task task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  return true;
}

bool TransferThread::AddPoller(Poller poller) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  new_pollers_.push_back(std::move(poller));
  return true;
}

absl::Status TransferThread::Run(std::function<absl::Status(TransferBackend&)> fn,
                                 absl::Duration timeout) {
  struct Result {
    absl::Notification done;
    absl::Status status;
  };
  auto result = std::make_shared<Result>();
  const bool posted = Post([result, fn = std::move(fn)](TransferBackend& backend) {
    result->status = fn(backend);
    result->done.Notify();
  });
  if (!posted) return absl::UnavailableError("the transfer thread has stopped");
  if (!result->done.WaitForNotificationWithTimeout(timeout)) {
    return absl::DeadlineExceededError("the transfer thread did not run the task in time");
  }
  return result->status;
}

void TransferThread::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void TransferThread::Loop() {
  std::vector<Poller> pollers;
  while (true) {
    std::deque<Task> tasks;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !tasks_.empty() || !new_pollers_.empty();
      };
      // Without pollers nothing is waiting on us, but the backend still needs regular progress
      // (target side); with pollers, tick fast.
      mu_.AwaitWithTimeout(absl::Condition(&ready), pollers.empty() ? idle_tick_ : busy_tick_);
      stopping = stopping_;
      tasks.swap(tasks_);
      for (Poller& p : new_pollers_) pollers.push_back(std::move(p));
      new_pollers_.clear();
    }
    if (stopping) {
      for (Poller& p : pollers) p(*backend_, /*stopping=*/true);
      pollers.clear();
      backend_.reset();
      return;
    }
    for (Task& task : tasks) task(*backend_);
    backend_->Progress();
    for (size_t i = 0; i < pollers.size();) {
      if (pollers[i](*backend_, /*stopping=*/false)) {
        pollers[i] = std::move(pollers.back());
        pollers.pop_back();
      } else {
        ++i;
      }
    }
  }
}

}  // namespace tandem::kvtransfer

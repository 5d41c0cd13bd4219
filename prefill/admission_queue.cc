#include "prefill/admission_queue.h"

#include <algorithm>
#include <utility>

#include "runtime/base/secrets.h"

namespace tandem::prefill {

AdmissionQueue::Slot::~Slot() { queue_->Release(tokens_); }

AdmissionQueue::AdmissionQueue(AdmissionOptions options, Observer on_change)
    : options_(options), on_change_(std::move(on_change)) {}

void AdmissionQueue::PublishLocked() const {
  if (on_change_) on_change_(StatsLocked());
}

void AdmissionQueue::Run(Answers& answers) {
  for (auto& [answer, result] : answers) answer(std::move(result));
  answers.clear();
}

void AdmissionQueue::AdmitLocked(Answers& out) {
  while (!waiting_.empty()) {
    auto it = waiting_.begin();
    Waiter& w = it->second;
    const bool fits =
        options_.window_tokens <= 0 || used_ == 0 || used_ + w.tokens <= options_.window_tokens;
    if (!fits) break;
    absl::StatusOr<std::string> ticket = RandomHex(16);
    if (ticket.ok()) {
      tickets_[*ticket] = Ticket{.request_id = std::move(w.request_id),
                                 .tokens = w.tokens,
                                 .lapses_at = absl::Now() + options_.ticket_lease};
      used_ += w.tokens;
      ++admitted_;
    }
    waiting_tokens_ -= w.tokens;
    out.emplace_back(std::move(w.answer), std::move(ticket));
    keys_.erase(w.id);
    waiting_.erase(it);
  }
  PublishLocked();
}

int64_t AdmissionQueue::Wait(std::string request_id, int priority, int64_t tokens,
                             absl::Time deadline, Answer answer) {
  Answers answers;
  int64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_id_++;
    if (closed_) {
      answers.emplace_back(std::move(answer),
                           absl::UnavailableError("prefill worker shutting down"));
    } else {
      const Key key{priority, id};
      waiting_.emplace(key, Waiter{.id = id,
                                   .request_id = std::move(request_id),
                                   .tokens = std::max<int64_t>(1, tokens),
                                   .deadline = deadline,
                                   .answer = std::move(answer)});
      keys_[id] = key;
      waiting_tokens_ += std::max<int64_t>(1, tokens);
      AdmitLocked(answers);
    }
  }
  Run(answers);
  return id;
}

bool AdmissionQueue::Cancel(int64_t waiter) {
  Answers answers;
  {
    absl::MutexLock lock(&mu_);
    auto key = keys_.find(waiter);
    if (key == keys_.end()) return false;
    auto it = waiting_.find(key->second);
    waiting_tokens_ -= it->second.tokens;
    waiting_.erase(it);
    keys_.erase(key);
    // A waiter that blocked the front no longer does.
    AdmitLocked(answers);
  }
  Run(answers);
  return true;
}

std::unique_ptr<AdmissionQueue::Slot> AdmissionQueue::Claim(const std::string& ticket,
                                                            const std::string& request_id,
                                                            int64_t tokens) {
  absl::MutexLock lock(&mu_);
  auto it = ticket.empty() ? tickets_.end() : tickets_.find(ticket);
  if (it != tickets_.end() && it->second.request_id == request_id) {
    const int64_t held = it->second.tokens;
    tickets_.erase(it);
    PublishLocked();
    return std::unique_ptr<Slot>(new Slot(shared_from_this(), held));
  }
  // No live ticket of this request: served anyway, and counted from now on.
  used_ += tokens;
  PublishLocked();
  return std::unique_ptr<Slot>(new Slot(shared_from_this(), tokens));
}

void AdmissionQueue::Drop(const std::string& ticket) {
  int64_t tokens = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return;
    tokens = it->second.tokens;
    tickets_.erase(it);
  }
  Release(tokens);
}

void AdmissionQueue::Release(int64_t tokens) {
  Answers answers;
  {
    absl::MutexLock lock(&mu_);
    used_ -= tokens;
    AdmitLocked(answers);
  }
  Run(answers);
}

absl::Time AdmissionQueue::Expire(absl::Time now) {
  Answers answers;
  absl::Time next = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&mu_);
    for (auto it = tickets_.begin(); it != tickets_.end();) {
      if (it->second.lapses_at <= now) {
        used_ -= it->second.tokens;
        ++lapsed_;
        tickets_.erase(it++);
      } else {
        next = std::min(next, it->second.lapses_at);
        ++it;
      }
    }
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->second.deadline <= now) {
        waiting_tokens_ -= it->second.tokens;
        answers.emplace_back(
            std::move(it->second.answer),
            absl::DeadlineExceededError("not admitted to the prefill worker's window before the "
                                        "deadline"));
        keys_.erase(it->second.id);
        waiting_.erase(it++);
      } else {
        next = std::min(next, it->second.deadline);
        ++it;
      }
    }
    AdmitLocked(answers);
  }
  Run(answers);
  return next;
}

void AdmissionQueue::Close() {
  Answers answers;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (auto& [key, w] : waiting_) {
      answers.emplace_back(std::move(w.answer),
                           absl::UnavailableError("prefill worker shutting down"));
    }
    waiting_.clear();
    keys_.clear();
    waiting_tokens_ = 0;
    PublishLocked();
  }
  Run(answers);
}

AdmissionStats AdmissionQueue::stats() const {
  absl::MutexLock lock(&mu_);
  return StatsLocked();
}

AdmissionStats AdmissionQueue::StatsLocked() const {
  return AdmissionStats{.waiting = static_cast<int>(waiting_.size()),
                        .waiting_tokens = waiting_tokens_,
                        .window_used_tokens = used_,
                        .admitted = admitted_,
                        .lapsed = lapsed_};
}

}  // namespace tandem::prefill

#pragma once
// AdmissionQueue: the prefill worker's admission window (two-phase reservation, DESIGN.md "A
// request, end to end", step 3). A decode worker asks to be admitted (Prefill.Admit) before it
// reserves KV blocks for a prompt, and reserves them only once admitted, so its blocks are not
// tied up by prompts still queued here.
//
// Contract:
//   - The window holds the prompt tokens of admitted requests: admitted but not yet claimed
//     (tickets) plus claimed ones (slots of Prefill calls in progress). A waiter is admitted when
//     the window is empty or its tokens fit under `window_tokens`; a prompt longer than the
//     window is admitted alone, so nothing waits forever for room that cannot exist.
//   - Waiters are admitted in priority order (lower is more urgent), FCFS within a priority; a
//     waiter that does not fit blocks those behind it (no overtaking that could starve it).
//   - Admission hands out a ticket (unguessable) bound to the request id. Claim with the same
//     request id turns it into a slot the caller holds until its prefill is over (the slot's
//     destruction releases its tokens). A ticket not claimed within `ticket_lease` lapses (its
//     tokens go back to the window); claiming a lapsed, unknown or foreign ticket still gives a
//     slot (the prefill is served; it counts in the window from then on), so a slow decode worker
//     is never refused.
//   - Every waiter gets exactly one answer: a ticket, or an error (Cancel's caller answers it
//     itself; Close answers UNAVAILABLE; Expire answers DEADLINE_EXCEEDED). Answers run outside
//     the lock, on the thread that made room (Release, Lapse, Close, Expire or Wait itself).
//
// Threading: every method is thread-safe. Ownership: always held by shared_ptr (Create); a slot
// keeps its queue alive (a prefill's last callback may come after the service is gone).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::prefill {

// Bounds on what a peer's Admit and Prefill calls may carry (checked by the service before
// anything reaches the queue). Tickets are 32 hex characters; anything much longer is not ours.
inline constexpr size_t kMaxAdmissionTicketBytes = 64;
inline constexpr size_t kMaxAdmitRequestIdBytes = 1024;

struct AdmissionOptions {
  // Prompt tokens admitted at once (about two prefill steps of the default 8192-token budget):
  // enough that the engine never idles while a decode worker reserves; 0 disables the window
  // (everyone is admitted at once).
  int64_t window_tokens = 16384;
  // An unclaimed ticket gives its tokens back after this.
  absl::Duration ticket_lease = absl::Seconds(30);
};

struct AdmissionStats {
  int waiting = 0;                 // requests not admitted yet
  int64_t waiting_tokens = 0;      // their prompt tokens
  int64_t window_used_tokens = 0;  // tickets + slots
  int64_t admitted = 0;            // since start
  int64_t lapsed = 0;              // tickets never claimed in time
};

class AdmissionQueue : public std::enable_shared_from_this<AdmissionQueue> {
 public:
  // Called once per waiter, outside the lock: the ticket, or why not.
  using Answer = std::function<void(absl::StatusOr<std::string> ticket)>;

  // Releases its tokens on destruction.
  class Slot {
   public:
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    friend class AdmissionQueue;
    Slot(std::shared_ptr<AdmissionQueue> queue, int64_t tokens)
        : queue_(std::move(queue)), tokens_(tokens) {}
    const std::shared_ptr<AdmissionQueue> queue_;
    const int64_t tokens_;
  };

  // `on_change` (optional) sees the stats after every change, under the queue's lock: it must be
  // quick and must not call back into the queue (the worker hands it to
  // Engine::SetQueuedOutside, so the worker's load includes the queue).
  using Observer = std::function<void(const AdmissionStats&)>;
  static std::shared_ptr<AdmissionQueue> Create(AdmissionOptions options,
                                                Observer on_change = nullptr) {
    return std::shared_ptr<AdmissionQueue>(new AdmissionQueue(options, std::move(on_change)));
  }
  AdmissionQueue(const AdmissionQueue&) = delete;
  AdmissionQueue& operator=(const AdmissionQueue&) = delete;

  // Queues `request_id` (tokens >= 1) until `deadline`; returns its waiter id (for Cancel). If it
  // fits now, `answer` runs before Wait returns. After Close, answers UNAVAILABLE at once.
  int64_t Wait(std::string request_id, int priority, int64_t tokens, absl::Time deadline,
               Answer answer);
  // Removes a waiter that was not answered yet: true if removed (no answer will come), false if
  // it was answered already (or never existed).
  bool Cancel(int64_t waiter);
  // Turns `ticket` of `request_id` into a slot holding `tokens` (the ticket's own tokens if it is
  // live; otherwise `tokens` are counted from now on).
  std::unique_ptr<Slot> Claim(const std::string& ticket, const std::string& request_id,
                              int64_t tokens);
  // Gives back a live ticket's tokens at once (its holder went away).
  void Drop(const std::string& ticket);
  // Lapses the tickets older than their lease and answers the waiters past their deadline;
  // returns the earliest time anything else would lapse or expire (InfiniteFuture if nothing).
  absl::Time Expire(absl::Time now);
  // Answers every waiter UNAVAILABLE and every later Wait too (the worker is shutting down).
  void Close();

  AdmissionStats stats() const;

 private:
  AdmissionQueue(AdmissionOptions options, Observer on_change);

  struct Waiter {
    int64_t id;
    std::string request_id;
    int64_t tokens;
    absl::Time deadline;
    Answer answer;
  };
  struct Ticket {
    std::string request_id;
    int64_t tokens;
    absl::Time lapses_at;
  };
  using Key = std::tuple<int, int64_t>;  // (priority, arrival): the order of admission
  using Answers = std::vector<std::pair<Answer, absl::StatusOr<std::string>>>;

  // Admits from the front while the window allows; collects the answers to run unlocked.
  void AdmitLocked(Answers& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(int64_t tokens);
  AdmissionStats StatsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Run(Answers& answers);

  const AdmissionOptions options_;
  const Observer on_change_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<Key, Waiter> waiting_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, Key> keys_ ABSL_GUARDED_BY(mu_);  // waiter id -> its key
  absl::flat_hash_map<std::string, Ticket> tickets_ ABSL_GUARDED_BY(mu_);
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waiting_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t admitted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lapsed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::prefill

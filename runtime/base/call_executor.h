#pragma once
// CallExecutor: a small, fixed pool of threads that runs posted tasks, now or at a given time.
// It drives the workers' per-call state machines (gRPC callback reactors whose steps must not
// run on gRPC's or the engine's threads, and must not block them) and the router's request
// preparation (tokenizing off the HTTP I/O threads): the number of threads is fixed however many
// calls are in flight, and nothing polls.
//
// Strand: runs one object's steps one at a time on the executor. Poke() from any thread (an engine
// callback, a gRPC reaction, a timer) asks for one more run of `step`; runs never overlap, and a
// Poke during a run causes one more run after it. Always held by shared_ptr (Create): a posted
// run keeps the strand alive; `step` should hold its object weakly.
//
// Threading: all methods are thread-safe. Tasks run on the pool's threads, timed ones no earlier
// than their time. Stop() (also the destructor) drops tasks not yet started and joins; posting
// after Stop runs nothing.

#include <functional>
#include <memory>
#include <queue>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

class CallExecutor {
 public:
  explicit CallExecutor(int threads);
  ~CallExecutor();
  CallExecutor(const CallExecutor&) = delete;
  CallExecutor& operator=(const CallExecutor&) = delete;

  void Post(std::function<void()> task) { PostAt(absl::InfinitePast(), std::move(task)); }
  void PostAt(absl::Time when, std::function<void()> task);
  void Stop();

 private:
  struct Timed {
    absl::Time when;
    uint64_t order;  // FIFO among equal times
    std::function<void()> task;
    bool operator>(const Timed& other) const {
      return when != other.when ? when > other.when : order > other.order;
    }
  };
  void Loop();

  absl::Mutex mu_;
  std::priority_queue<Timed, std::vector<Timed>, std::greater<Timed>> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

class Strand : public std::enable_shared_from_this<Strand> {
 public:
  // `executor` is shared: a strand poked after the executor's owner is gone (and the executor
  // stopped) runs nothing, safely.
  static std::shared_ptr<Strand> Create(std::shared_ptr<CallExecutor> executor,
                                        std::function<void()> step) {
    return std::shared_ptr<Strand>(new Strand(executor, std::move(step)));
  }
  // One more run of `step` on the executor (now, or at `when`).
  void Poke();
  void PokeAt(absl::Time when);

 private:
  Strand(std::shared_ptr<CallExecutor> executor, std::function<void()> step)
      : executor_(std::move(executor)), step_(std::move(step)) {}
  void Run();
  const std::shared_ptr<CallExecutor> executor_;
  const std::function<void()> step_;
  absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool again_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem

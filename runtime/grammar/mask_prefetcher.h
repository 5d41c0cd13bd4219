#pragma once
// MaskPrefetcher: computes token masks ahead of need, on a thread of its own, so that the engine's
// step does not. The engine knows each guided sequence's automaton state before it runs the
// forward pass, and needs the state's mask only after it (to sample); it hands the states whose
// masks are not cached to Prefetch, runs the forward pass, and its Mask() then finds the mask
// cached or waits for the computation already under way (TokenMasker). So a first-visit mask
// (up to milliseconds on a 128K vocabulary) overlaps the forward pass instead of following it.
//
// The queue is bounded (`max_queued`); a request past it is dropped, which costs only the
// overlap: Mask() computes the state when it is needed.
//
// Thread-safety: Prefetch from any thread; the destructor stops the worker after the queue
// drains.

#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "runtime/grammar/grammar_cache.h"

namespace tandem::grammar {

class MaskPrefetcher {
 public:
  explicit MaskPrefetcher(size_t max_queued = 1024);
  ~MaskPrefetcher();
  MaskPrefetcher(const MaskPrefetcher&) = delete;
  MaskPrefetcher& operator=(const MaskPrefetcher&) = delete;

  // Computes `grammar`'s mask for `state` soon (unless cached or under way already).
  void Prefetch(std::shared_ptr<const CompiledGrammar> grammar, int state);
  // Requests dropped because the queue was full.
  int64_t dropped() const;

 private:
  void Run();

  const size_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<std::pair<std::shared_ptr<const CompiledGrammar>, int>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread worker_;
};

}  // namespace tandem::grammar

#pragma once
// OnlinePlanner: the router's recommended replicas per pool from the planner's model
// (planner.h, docs/planning.md) and the traffic it actually serves. Finished requests are recorded
// (prompt and output lengths); Recommend() takes the requests of the last `window` as the
// workload (their count over the window as the rate, the latest `max_samples` lengths as the
// distribution) and returns the smallest
// layout that sustains that rate under the SLOs, up to `max_workers` workers.
//
// Cost: at most max_workers * (max_workers + 1) / 2 simulations of `sim.num_requests` requests
// per call (smallest layouts first, stopping at the first size that sustains the rate): a
// background thread calls it every few seconds, never a request path.
//
// Thread-safety: Record and Recommend may be called from any thread.

#include <deque>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "planning/planner.h"

namespace tandem::planning {

struct OnlinePlannerOptions {
  absl::Duration window = absl::Seconds(60);
  size_t max_samples = 2048;  // lengths kept for the distribution (the most recent)
  int max_workers = 16;
  Slo slo;
  EngineLimits limits;
  SimOptions sim = {.num_requests = 400, .warmup_fraction = 0.1, .seed = 1};
};

struct Recommendation {
  Layout layout;
  double rate = 0;         // requests/s over the window
  bool sustained = false;  // the layout meets the SLOs at that rate
  Prediction at_rate;
};

class OnlinePlanner {
 public:
  OnlinePlanner(DeviceProfile prefill, DeviceProfile decode, OnlinePlannerOptions options);

  // A request finished with `prompt_tokens` and `output_tokens` (>= 1 each, else ignored).
  void Record(int prompt_tokens, int output_tokens, absl::Time finished);
  // nullopt while no request finished within the window.
  std::optional<Recommendation> Recommend(absl::Time now);

 private:
  const DeviceProfile prefill_, decode_;
  const OnlinePlannerOptions options_;
  absl::Mutex mu_;
  std::deque<absl::Time> finished_ ABSL_GUARDED_BY(mu_);          // within the window
  std::deque<std::pair<int, int>> samples_ ABSL_GUARDED_BY(mu_);  // the latest max_samples
};

// The smallest disaggregated layout (1 prefill + 1 decode upward, at most `max_workers`) meeting
// the SLOs at input.workload.rate, the one with the best attainment among those of its size; past
// the budget, the best of the largest size (sustained false).
Recommendation SmallestSustaining(const PlanInput& input, int max_workers);

}  // namespace tandem::planning

#include "planning/online_planner.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace tandem::planning {

Recommendation SmallestSustaining(const PlanInput& input, int max_workers) {
  const double target = input.slo.percentile / 100.0;
  Recommendation best;
  for (int n = 2; n <= std::max(2, max_workers); ++n) {
    Recommendation of_size;
    of_size.at_rate.attainment = -1;
    for (int p = 1; p < n; ++p) {
      const Layout layout{p, n - p, 0};
      const Prediction at = Predict(input, layout, input.workload.rate);
      if (at.attainment > of_size.at_rate.attainment) {
        of_size.layout = layout;
        of_size.at_rate = at;
      }
    }
    of_size.rate = input.workload.rate;
    of_size.sustained = of_size.at_rate.attainment >= target;
    best = of_size;
    if (best.sustained) break;
  }
  return best;
}

OnlinePlanner::OnlinePlanner(DeviceProfile prefill, DeviceProfile decode,
                             OnlinePlannerOptions options)
    : prefill_(std::move(prefill)), decode_(std::move(decode)), options_(std::move(options)) {}

void OnlinePlanner::Record(int prompt_tokens, int output_tokens, absl::Time finished) {
  if (prompt_tokens < 1 || output_tokens < 1) return;
  absl::MutexLock lock(&mu_);
  finished_.push_back(finished);
  while (!finished_.empty() && finished - finished_.front() > options_.window) {
    finished_.pop_front();
  }
  samples_.push_back({prompt_tokens, output_tokens});
  while (samples_.size() > options_.max_samples) samples_.pop_front();
}

std::optional<Recommendation> OnlinePlanner::Recommend(absl::Time now) {
  PlanInput input;
  {
    absl::MutexLock lock(&mu_);
    while (!finished_.empty() && now - finished_.front() > options_.window) finished_.pop_front();
    const int64_t in_window =
        std::count_if(finished_.begin(), finished_.end(), [&](absl::Time t) { return t <= now; });
    if (in_window == 0) return std::nullopt;
    input.workload.rate = static_cast<double>(in_window) / absl::ToDoubleSeconds(options_.window);
    input.workload.requests.assign(samples_.begin(), samples_.end());
  }
  input.prefill = prefill_;
  input.decode = decode_;
  input.slo = options_.slo;
  input.limits = options_.limits;
  input.sim = options_.sim;
  return SmallestSustaining(input, options_.max_workers);
}

}  // namespace tandem::planning

#include "planning/planner.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::planning {
namespace {

bool Meets(const RequestOutcome& r, const Slo& slo) {
  return r.ttft_ms <= slo.ttft_ms && r.tpot_ms <= slo.tpot_ms;
}

}  // namespace

double Attainment(const SimResult& result, const Slo& slo) {
  if (result.requests.empty()) return 0;
  int good = 0;
  for (const RequestOutcome& r : result.requests) good += Meets(r, slo);
  return static_cast<double>(good) / static_cast<double>(result.requests.size());
}

Prediction Predict(const PlanInput& input, const Layout& layout, double rate) {
  Workload w = input.workload;
  w.rate = rate;
  const SimResult result =
      Simulate(input.prefill, input.decode, layout, w, input.limits, input.sim);
  Prediction p;
  p.rate = rate;
  p.attainment = Attainment(result, input.slo);
  std::vector<double> ttft, tpot;
  for (const RequestOutcome& r : result.requests) {
    ttft.push_back(r.ttft_ms);
    if (r.output > 1) tpot.push_back(r.tpot_ms);
  }
  p.ttft_p50 = Percentile(ttft, 50);
  p.ttft_p90 = Percentile(ttft, 90);
  p.ttft_p99 = Percentile(ttft, 99);
  p.tpot_p50 = Percentile(tpot, 50);
  p.tpot_p90 = Percentile(tpot, 90);
  p.tpot_p99 = Percentile(tpot, 99);
  return p;
}

double Goodput(const PlanInput& input, const Layout& layout) {
  const double target = input.slo.percentile / 100.0;
  const auto ok = [&](double rate) { return Predict(input, layout, rate).attainment >= target; };
  double lo = 0.05;
  if (!ok(lo)) return 0;
  double hi = lo * 2;
  while (hi < 1e5 && ok(hi)) {
    lo = hi;
    hi *= 2;
  }
  for (int i = 0; i < 12; ++i) {
    const double mid = (lo + hi) / 2;
    (ok(mid) ? lo : hi) = mid;
  }
  return lo;
}

absl::StatusOr<Plan> MakePlan(const PlanInput& input) {
  if (input.workload.requests.empty()) return absl::InvalidArgumentError("workload: no requests");
  for (const auto& [in, out] : input.workload.requests) {
    if (in < 1 || out < 1) {
      return absl::InvalidArgumentError("workload: lengths must be at least 1 token");
    }
  }
  if (input.device_budget < 1 || input.device_budget > 64) {
    return absl::InvalidArgumentError("devices: the budget must be in [1, 64]");
  }
  if (!(input.slo.ttft_ms > 0) || !(input.slo.tpot_ms > 0) || !(input.slo.percentile > 0) ||
      input.slo.percentile > 100) {
    return absl::InvalidArgumentError(
        "slo: TTFT and TPOT must be > 0 ms and the percentile in (0, 100]");
  }
  if (input.workload.rate < 0 || !std::isfinite(input.workload.rate)) {
    return absl::InvalidArgumentError("rate: must be finite and >= 0");
  }
  Plan plan;
  for (int p = 1; p < input.device_budget; ++p) {
    for (int d = 1; p + d <= input.device_budget; ++d) {
      Candidate c;
      c.layout.prefill = p;
      c.layout.decode = d;
      plan.candidates.push_back(c);
    }
  }
  for (int n = 1; n <= input.device_budget; ++n) {
    Candidate c;
    c.layout.aggregated = n;
    plan.candidates.push_back(c);
  }
  const double rate = input.workload.rate;
  for (Candidate& c : plan.candidates) {
    c.goodput = Goodput(input, c.layout);
    c.goodput_per_device = c.goodput / c.layout.devices();
    c.at_goodput = Predict(input, c.layout, std::max(c.goodput, 0.05));
    if (rate > 0) c.at_rate = Predict(input, c.layout, rate);
  }
  // Better: more goodput per device, then fewer devices.
  const auto better = [&](int a, int b) {
    if (b < 0) return true;
    const Candidate& x = plan.candidates[a];
    const Candidate& y = plan.candidates[b];
    if (x.goodput_per_device != y.goodput_per_device) {
      return x.goodput_per_device > y.goodput_per_device;
    }
    return x.layout.devices() < y.layout.devices();
  };
  // Sustaining the rate: fewer devices, then more goodput per device.
  const auto smaller = [&](int a, int b) {
    if (b < 0) return true;
    const Candidate& x = plan.candidates[a];
    const Candidate& y = plan.candidates[b];
    if (x.layout.devices() != y.layout.devices()) return x.layout.devices() < y.layout.devices();
    return x.goodput_per_device > y.goodput_per_device;
  };
  int any = -1, sustaining = -1;
  for (int i = 0; i < static_cast<int>(plan.candidates.size()); ++i) {
    const Candidate& c = plan.candidates[i];
    int& best = c.layout.disaggregated() ? plan.best_disaggregated : plan.best_aggregated;
    if (better(i, best)) best = i;
    if (better(i, any)) any = i;
    if (rate > 0 && c.goodput >= rate && smaller(i, sustaining)) sustaining = i;
  }
  plan.rate_sustained = sustaining >= 0;
  plan.recommended = sustaining >= 0 ? sustaining : any;
  if (plan.best_disaggregated >= 0 && plan.best_aggregated >= 0) {
    const double agg = plan.candidates[plan.best_aggregated].goodput_per_device;
    const double dis = plan.candidates[plan.best_disaggregated].goodput_per_device;
    plan.disaggregation_gain = agg > 0 ? dis / agg : (dis > 0 ? INFINITY : 0);
  }
  return plan;
}

std::string ReplicaPatch(const Layout& layout, const std::string& prefill_deployment,
                         const std::string& decode_deployment) {
  const int prefill = layout.disaggregated() ? layout.prefill : 0;
  const int decode = layout.disaggregated() ? layout.decode : layout.aggregated;
  const auto one = [](const std::string& name, int replicas) {
    return absl::StrCat("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: ", name,
                        "\nspec:\n  replicas: ", replicas, "\n");
  };
  const std::string what =
      layout.disaggregated()
          ? absl::StrCat(layout.prefill, " prefill + ", layout.decode, " decode")
          : absl::StrCat(layout.aggregated, " aggregated (decode workers, no prefill workers)");
  return absl::StrCat("# tandem plan: ", what, "\n", one(prefill_deployment, prefill), "---\n",
                      one(decode_deployment, decode));
}

}  // namespace tandem::planning

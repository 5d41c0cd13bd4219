#pragma once
// The prefill:decode planner behind `tandem plan` (docs/planning.md). For every layout a device
// budget allows (P prefill + D decode workers, and N aggregated replicas), it finds the goodput:
// the highest Poisson request rate at which the simulator (simulator.h) predicts that at least
// `slo.percentile` percent of requests meet both the TTFT and the TPOT objective. With a
// requested rate, the recommendation is the smallest layout that sustains it (the most goodput
// per device among those of that size); with none, or when no layout in the budget sustains it,
// the layout with the most goodput per device (fewer devices on a tie).
//
// Goodput search: doubling from 0.05 requests/s while the objective holds, then 12 bisection
// steps (a relative precision of about 1/4096 of the bracket). Attainment falls with the rate
// for these queues, and every rate sees the same request stream (simulator.h), so the search
// is stable.
//
// Thread-safety: pure functions.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planning/profile.h"
#include "planning/simulator.h"

namespace tandem::planning {

struct Slo {
  double ttft_ms = 400;
  double tpot_ms = 25;
  double percentile = 90;  // percent of requests that must meet both
};

struct PlanInput {
  DeviceProfile prefill;  // prefill workers and aggregated replicas
  DeviceProfile decode;   // decode workers
  Workload workload;      // rate: the rate to sustain (0: none given)
  Slo slo;
  int device_budget = 2;
  EngineLimits limits;
  SimOptions sim;
};

struct Prediction {
  double rate = 0;
  double attainment = 0;  // fraction meeting both objectives
  double ttft_p50 = 0, ttft_p90 = 0, ttft_p99 = 0;
  double tpot_p50 = 0, tpot_p90 = 0, tpot_p99 = 0;
};

struct Candidate {
  Layout layout;
  double goodput = 0;             // requests/s
  double goodput_per_device = 0;  // requests/s per device
  Prediction at_goodput;
  Prediction at_rate;  // at the workload's rate (when given)
};

struct Plan {
  std::vector<Candidate> candidates;  // disaggregated first (by P, then D), then aggregated
  int recommended = -1;               // index into candidates
  int best_disaggregated = -1;
  int best_aggregated = -1;
  bool rate_sustained = false;  // the recommendation sustains the requested rate
  // Best disaggregated goodput per device over best aggregated (> 1: disaggregation pays).
  double disaggregation_gain = 0;
};

// Fraction of `result`'s requests meeting both objectives.
double Attainment(const SimResult& result, const Slo& slo);
Prediction Predict(const PlanInput& input, const Layout& layout, double rate);
double Goodput(const PlanInput& input, const Layout& layout);

// InvalidArgument for an empty workload, a budget < 1 or > 64, or objectives that are not
// positive.
absl::StatusOr<Plan> MakePlan(const PlanInput& input);

// Strategic-merge patches setting the Deployments' replicas (what `kustomize` takes in
// `patchesStrategicMerge`); an aggregated layout gives the decode Deployment the replicas and
// the prefill Deployment none.
std::string ReplicaPatch(const Layout& layout, const std::string& prefill_deployment,
                         const std::string& decode_deployment);

}  // namespace tandem::planning

#pragma once
// How loaded a worker pool is, and how many workers it should have: the per-pool saturation
// signal and recommended replica count the router exports (tandem_pool_saturation,
// tandem_pool_recommended_replicas) for autoscalers (an HPA on each pool, deploy/).
//
// The model (docs/metrics.md "Pool load"): each healthy worker's saturation is
//   decode:  KV blocks in use / KV blocks  +  requests waiting / max(1, requests running)
//            (KV is what a decode worker runs out of; a queue means it already has)
//   prefill: prompt tokens waiting / PoolLoadOptions::prefill_tokens_per_worker
//            (the backlog of prompt tokens, against what one worker clears in a step or so)
// The pool's saturation is their mean; 1 means "exactly full". The recommendation is
// ceil(healthy * saturation / target_saturation), at least 1 (and at least 1 more than the healthy
// count when the pool has none healthy but some known). It only reads the snapshots: no state.

#include <string_view>
#include <vector>

#include "runtime/router/routing_policy.h"

namespace tandem::router {

struct PoolLoadOptions {
  double target_saturation = 0.8;
  double prefill_tokens_per_worker = 8192;
};

struct PoolLoad {
  int known = 0;
  int healthy = 0;
  double saturation = 0;  // mean over healthy workers; 0 with none
  int recommended = 1;
};

// `role`: "decode" or "prefill".
PoolLoad EstimatePoolLoad(const std::vector<WorkerSnapshot>& workers, std::string_view role,
                          const PoolLoadOptions& options = {});

}  // namespace tandem::router

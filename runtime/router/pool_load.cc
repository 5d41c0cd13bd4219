#include "runtime/router/pool_load.h"

#include <algorithm>
#include <cmath>

namespace tandem::router {

PoolLoad EstimatePoolLoad(const std::vector<WorkerSnapshot>& workers, std::string_view role,
                          const PoolLoadOptions& options) {
  PoolLoad load;
  load.known = static_cast<int>(workers.size());
  double sum = 0;
  for (const WorkerSnapshot& w : workers) {
    if (!w.healthy) continue;
    ++load.healthy;
    if (role == "prefill") {
      sum += static_cast<double>(w.prompt_tokens_waiting) /
             std::max(1.0, options.prefill_tokens_per_worker);
    } else {
      const double kv =
          w.kv_blocks_total > 0
              ? static_cast<double>(w.kv_blocks_total - w.kv_blocks_free) / w.kv_blocks_total
              : 0.0;
      sum += kv + static_cast<double>(w.queue_depth) / std::max(1, w.running);
    }
  }
  if (load.healthy == 0) {
    // Nothing healthy: at least one more than now (a restarted worker counts once healthy).
    load.recommended = std::max(1, load.known);
    return load;
  }
  load.saturation = sum / load.healthy;
  const double target = options.target_saturation > 0 ? options.target_saturation : 1.0;
  load.recommended =
      std::max(1, static_cast<int>(std::ceil(load.healthy * load.saturation / target - 1e-9)));
  return load;
}

}  // namespace tandem::router

#include "runtime/router/routing_policy.h"

#include <algorithm>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::router {
namespace {

// Visits workers starting at `cursor` (mod size) and returns the healthy one with the smallest
// key; the first visited wins ties.
template <typename KeyFn>
int PickMin(std::span<const WorkerSnapshot> workers, uint64_t cursor, KeyFn key) {
  const size_t n = workers.size();
  int best = kNoWorker;
  for (size_t i = 0; i < n; ++i) {
    const size_t index = (cursor + i) % n;
    if (!workers[index].healthy) continue;
    if (best == kNoWorker || key(workers[index]) < key(workers[best])) {
      best = static_cast<int>(index);
    }
  }
  return best;
}

int RoundRobin(std::span<const WorkerSnapshot> workers, uint64_t cursor) {
  return PickMin(workers, cursor, [](const WorkerSnapshot&) { return 0; });
}

}  // namespace

absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(std::string_view name) {
  if (name == "round-robin") return RoutingPolicy::kRoundRobin;
  if (name == "least-loaded") return RoutingPolicy::kLeastLoaded;
  if (name == "kv-aware") return RoutingPolicy::kKvAware;
  return absl::InvalidArgumentError(absl::StrCat("unknown routing policy '", std::string(name),
                                                 "' (round-robin, least-loaded or kv-aware)"));
}

std::string_view RoutingPolicyName(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kRoundRobin:
      return "round-robin";
    case RoutingPolicy::kLeastLoaded:
      return "least-loaded";
    case RoutingPolicy::kKvAware:
      return "kv-aware";
  }
  return "unknown";
}

int BlocksForTokens(int prompt_tokens, int block_size) {
  if (block_size <= 0 || prompt_tokens <= 0) return 0;
  return (prompt_tokens + block_size - 1) / block_size;
}

bool PrefillLocallyForLength(int uncached_prompt_tokens, int local_prefill_threshold) {
  return local_prefill_threshold > 0 && uncached_prompt_tokens < local_prefill_threshold;
}

namespace {

int Load(const WorkerSnapshot& w) { return std::max(w.running + w.queue_depth, w.router_inflight); }

double UncachedTokens(const WorkerSnapshot& w, int prompt_tokens) {
  return std::max(0, prompt_tokens - w.cached_prefix_tokens);
}

// Free blocks that hold nothing (the stats come from another process: clamp them).
int EmptyBlocks(const WorkerSnapshot& w) {
  return std::max(0, w.kv_blocks_free - std::clamp(w.kv_blocks_cached_idle, 0, w.kv_blocks_free));
}

int CachedPrefix(const WorkerSnapshot& w, int prompt_tokens) {
  return std::clamp(w.cached_prefix_tokens, 0, std::max(0, prompt_tokens));
}

}  // namespace

int PickDecodeWorker(RoutingPolicy policy, std::span<const WorkerSnapshot> workers,
                     int prompt_tokens, uint64_t cursor, const KvAwareOptions& kv_aware) {
  switch (policy) {
    case RoutingPolicy::kRoundRobin:
      return RoundRobin(workers, cursor);
    case RoutingPolicy::kLeastLoaded:
      return PickMin(workers, cursor, [prompt_tokens](const WorkerSnapshot& w) {
        const bool fits = w.kv_blocks_free >= BlocksForTokens(prompt_tokens, w.block_size);
        const int load = std::max(w.running + w.queue_depth, w.router_inflight);
        return std::make_tuple(fits ? 0 : 1, load, -w.kv_blocks_free);
      });
    case RoutingPolicy::kKvAware: {
      int cached_best = 0;
      for (const WorkerSnapshot& w : workers) {
        if (w.healthy) cached_best = std::max(cached_best, CachedPrefix(w, prompt_tokens));
      }
      const double replicate_weight = std::clamp(kv_aware.replicate_weight, 0.0, 1.0);
      return PickMin(workers, cursor, [&](const WorkerSnapshot& w) {
        const int cached = CachedPrefix(w, prompt_tokens);
        const int needed = BlocksForTokens(prompt_tokens - cached, w.block_size);
        const bool fits = w.kv_blocks_free >= needed;
        const double miss_weight = EmptyBlocks(w) >= needed ? replicate_weight : 1.0;
        const double cost =
            miss_weight * (cached_best - cached) + kv_aware.request_cost_tokens * Load(w);
        return std::make_tuple(fits ? 0 : 1, cost, -w.kv_blocks_free);
      });
    }
  }
  return kNoWorker;
}

int PickPrefillWorker(RoutingPolicy policy, std::span<const WorkerSnapshot> workers,
                      uint64_t cursor, int prompt_tokens, const KvAwareOptions& kv_aware) {
  switch (policy) {
    case RoutingPolicy::kRoundRobin:
      return RoundRobin(workers, cursor);
    case RoutingPolicy::kLeastLoaded:
      return PickMin(workers, cursor, [](const WorkerSnapshot& w) {
        const int queue = std::max(w.queue_depth + w.running, w.router_inflight);
        return std::make_tuple(w.prompt_tokens_waiting, queue);
      });
    case RoutingPolicy::kKvAware:
      return PickMin(workers, cursor, [&](const WorkerSnapshot& w) {
        return UncachedTokens(w, prompt_tokens) + static_cast<double>(w.prompt_tokens_waiting) +
               kv_aware.request_cost_tokens * Load(w);
      });
  }
  return kNoWorker;
}

}  // namespace tandem::router

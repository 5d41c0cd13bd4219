#pragma once
// Routing policies: which decode worker D and which prefill worker P serve a request, and whether
// D prefills the prompt itself (conditional disaggregation). Pure functions over plain snapshots
// of the pools: no gRPC, no threads, no clocks, so their tests run in microseconds. The caller
// (GrpcGenerationBackend) takes the snapshots from its WorkerPools and owns the round-robin cursor.
//
// Thread-safety: everything here is stateless; call from any thread.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::router {

// One worker as the router sees it right now (from its stats stream and health checks).
struct WorkerSnapshot {
  std::string address;   // "host:port"
  bool healthy = false;  // stats fresh, stream live, health check serving, not draining
  // The worker answers: its stats stream is connected and fresh (a worker draining with
  // NOT_SERVING is live but not healthy; a hung or unreachable one is neither).
  bool live = false;
  int queue_depth = 0;            // requests waiting on the worker
  int running = 0;                // sequences in its running batch
  int kv_blocks_free = 0;         // free + cached-idle
  int kv_blocks_cached_idle = 0;  // of kv_blocks_free: cached prefixes, evicted when taken
  int kv_blocks_total = 0;
  int block_size = 0;  // tokens per KV block (0: unknown)
  int64_t prompt_tokens_waiting = 0;
  // Streams this router has open to the worker now. Exact and current for this router, whereas the
  // worker's stats are a few hundred milliseconds old: it keeps a burst from piling onto one
  // worker.
  int router_inflight = 0;
  // Leading prompt tokens the worker holds in its prefix cache, per the router's index of its
  // prefix-cache events (WorkerPool::Snapshot(prompt)); 0 without an index.
  int cached_prefix_tokens = 0;
};

enum class RoutingPolicy { kRoundRobin, kLeastLoaded, kKvAware };

// KV-aware routing's cost model (docs/routing.md). Every term is in prompt tokens of prefill work,
// so a candidate's cost estimates the computation standing between the request and its first
// token there:
//   decode worker:  miss_weight * (cached_best - cached_prefix_tokens)
//                   + request_cost_tokens * load
//   prefill worker: (prompt - cached_prefix_tokens) + prompt_tokens_waiting
//                   + request_cost_tokens * load
// where load = max(running + waiting, the router's own open streams) and cached_best is the
// longest cached prefix among the healthy decode workers. miss_weight is 1, or
// replicate_weight on a worker whose empty blocks (free, holding no cached prefix) take the
// uncached part without evicting anything: there a miss also replicates a hot prefix into room
// that costs nothing, so later requests have two places to go. Workers whose free KV blocks hold
// the prompt still come first on the decode side. With no reuse anywhere every miss term is 0
// and the policy is least-loaded, decision for decision.
struct KvAwareOptions {
  // What one request already on a worker costs a new one, in prompt tokens. Larger: spread load
  // more, follow cached prefixes less. The default is measured (bench/RESULTS.md, "KV-aware
  // routing").
  double request_cost_tokens = 64;
  // The weight of missed prefix tokens on a decode worker with empty room for them (0..1).
  // 1: stick to where a prefix is cached; smaller: replicate it sooner while there is room.
  double replicate_weight = 0.25;
};

// "round-robin" | "least-loaded" | "kv-aware"; InvalidArgument otherwise.
absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(std::string_view name);
std::string_view RoutingPolicyName(RoutingPolicy policy);

inline constexpr int kNoWorker = -1;

// Index into `workers` of the decode worker for a prompt of `prompt_tokens`, or kNoWorker when
// none is healthy. Round-robin: the first healthy worker at or after `cursor` (mod size).
// Least-loaded: prefer workers whose free KV blocks hold the prompt, then the fewest requests
// (running + waiting, or the router's own open streams when larger), then the most free blocks;
// ties go to the first at or after `cursor`, so equal workers share the load. KV-aware: prompt
// fits first, then the lowest KvAwareOptions cost, ties as above.
int PickDecodeWorker(RoutingPolicy policy, std::span<const WorkerSnapshot> workers,
                     int prompt_tokens, uint64_t cursor, const KvAwareOptions& kv_aware = {});

// Index of the prefill worker, or kNoWorker when none is healthy. Least-loaded: the fewest prompt
// tokens waiting, then the shortest queue (waiting + running, or the router's open requests).
// KV-aware: the lowest KvAwareOptions cost.
int PickPrefillWorker(RoutingPolicy policy, std::span<const WorkerSnapshot> workers,
                      uint64_t cursor, int prompt_tokens = 0, const KvAwareOptions& kv_aware = {});

// Conditional disaggregation: true when the decode worker should prefill the prompt itself
// because the part it must compute (the whole prompt, or what its prefix cache lacks) is shorter
// than `local_prefill_threshold` tokens (0 = never for that reason).
bool PrefillLocallyForLength(int uncached_prompt_tokens, int local_prefill_threshold);

// KV blocks a prompt needs (ceil(prompt_tokens / block_size)); 0 when block_size is unknown.
int BlocksForTokens(int prompt_tokens, int block_size);

}  // namespace tandem::router

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
  int queue_depth = 0;  // requests waiting on the worker
  int running = 0;      // sequences in its running batch
  int kv_blocks_free = 0;
  int kv_blocks_total = 0;
  int block_size = 0;  // tokens per KV block (0: unknown)
  int64_t prompt_tokens_waiting = 0;
  // Streams this router has open to the worker now. Exact and current for this router, whereas the
  // worker's stats are a few hundred milliseconds old: it keeps a burst from piling onto one
  // worker.
  int router_inflight = 0;
};

enum class RoutingPolicy { kRoundRobin, kLeastLoaded };

// "round-robin" | "least-loaded"; InvalidArgument otherwise.
absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(std::string_view name);
std::string_view RoutingPolicyName(RoutingPolicy policy);

inline constexpr int kNoWorker = -1;

// Index into `workers` of the decode worker for a prompt of `prompt_tokens`, or kNoWorker when
// none is healthy. Round-robin: the first healthy worker at or after `cursor` (mod size).
// Least-loaded: prefer workers whose free KV blocks hold the prompt, then the fewest requests
// (running + waiting, or the router's own open streams when larger), then the most free blocks;
// ties go to the first at or after `cursor`, so equal workers share the load.
int PickDecodeWorker(RoutingPolicy policy, std::span<const WorkerSnapshot> workers,
                     int prompt_tokens, uint64_t cursor);

// Index of the prefill worker, or kNoWorker when none is healthy. Least-loaded: the fewest prompt
// tokens waiting, then the shortest queue (waiting + running, or the router's open requests).
int PickPrefillWorker(RoutingPolicy policy, std::span<const WorkerSnapshot> workers,
                      uint64_t cursor);

// Conditional disaggregation: true when the decode worker should prefill the prompt itself
// because the prompt is shorter than `local_prefill_threshold` tokens (0 = never for that reason).
bool PrefillLocallyForLength(int prompt_tokens, int local_prefill_threshold);

// KV blocks a prompt needs (ceil(prompt_tokens / block_size)); 0 when block_size is unknown.
int BlocksForTokens(int prompt_tokens, int block_size);

}  // namespace tandem::router

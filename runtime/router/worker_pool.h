#pragma once
// The router's live view of one worker pool (prefill or decode): for each member a gRPC channel,
// a Worker.StreamStats consumer and grpc.health.v1 checks, turned into plain WorkerSnapshots for
// the routing policies.
//
// A worker is healthy when its stats stream is connected, its latest stats are younger than
// `stats_stale_after`, and its last health check did not say NOT_SERVING or time out. The stats
// stream reconnects with exponential backoff. Health checks go through gRPC's generic stub
// (Debian's grpc++ ships no generated grpc.health.v1 stub; the two tiny messages are encoded by
// hand): first for the role's service ("tandem.v1.Decode" / "tandem.v1.Prefill"), falling back to
// the server-wide "" status when the worker registered no per-service status. A worker without
// the Health service (UNIMPLEMENTED) is judged by its stats stream alone.
//
// Membership comes from Discovery (SetMembers). A removed worker takes no new requests; requests
// already on it keep its channel alive through their shared_ptr<WorkerChannel> and finish there
// (draining); its stats consumer stops and its metrics are removed at once.
//
// With track_prefix_cache, the stats stream also carries the worker's prefix-cache events; the
// pool keeps one WorkerPrefixIndex per member. A gap in the events clears that index and reopens
// the stream at once (its first message is a snapshot); a broken stream clears it too, so a
// restarted worker's empty cache is never mistaken for its predecessor's.
//
// Threading: all methods are thread-safe. One stats thread per member plus one health thread per
// pool; Stop (and the destructor) cancel the streams and join every thread.

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "runtime/auth/service_identity.h"
#include "runtime/metrics/metrics.h"
#include "runtime/router/routing_policy.h"

namespace grpc {
class Channel;
}
namespace tandem::v1 {
class WorkerStats;
}

namespace tandem::router {

struct WorkerPoolOptions {
  std::string role = "decode";  // "decode" | "prefill": metrics label and health service name
  absl::Duration stats_stale_after = absl::Seconds(3);
  int stats_interval_ms = 200;  // asked of the worker
  absl::Duration health_interval = absl::Seconds(1);
  absl::Duration health_timeout = absl::Seconds(1);
  absl::Duration reconnect_min = absl::Milliseconds(100);
  absl::Duration reconnect_max = absl::Seconds(2);
  metrics::RouterMetrics* metrics = nullptr;  // optional (or SetMetrics); must outlive the pool
  // What the router presents to the workers on every call (stats, health, Generate, Cancel);
  // null: no credential (in-process tests only: `tandem router` always sets one).
  std::shared_ptr<const auth::ServiceIdentity> identity = nullptr;
  // Ask each worker for its prefix-cache events and keep an index of them (prefix_index.h), so
  // Snapshot(prompt) can report each worker's cached overlap (KV-aware routing).
  bool track_prefix_cache = false;
  // How long a prompt routed to a worker counts as cached there before the worker's events
  // confirm it (prefix_index.h NoteRouted).
  absl::Duration prefix_pending_ttl = absl::Seconds(2);
  // Publish tandem_pool_recommended_replicas from the pool's saturation (pool_load.h). False when
  // the router's online planner publishes it instead (tandem router --plan-profile).
  bool publish_recommended = true;
};

// One worker's channel, shared by the pool and the requests on it.
class WorkerChannel {
 public:
  WorkerChannel(std::string address, std::shared_ptr<grpc::Channel> channel)
      : address_(std::move(address)), channel_(std::move(channel)) {}
  const std::string& address() const { return address_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  int inflight() const { return inflight_.load(std::memory_order_relaxed); }
  void AddInflight(int delta) { inflight_.fetch_add(delta, std::memory_order_relaxed); }

 private:
  const std::string address_;
  const std::shared_ptr<grpc::Channel> channel_;
  std::atomic<int> inflight_{0};
};

// A channel with the router's settings (fast reconnect backoff, large messages) presenting
// `identity` (null: none).
std::shared_ptr<grpc::Channel> MakeWorkerChannel(const std::string& address,
                                                 const auth::ServiceIdentity* identity);

class WorkerPool {
 public:
  explicit WorkerPool(WorkerPoolOptions options);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Publishes the per-worker gauges into `metrics` (must outlive the pool) from now on; for a
  // pool built before the frontend that owns the RouterMetrics. Call before SetMembers.
  void SetMetrics(metrics::RouterMetrics* metrics);
  // Replaces the membership ("host:port" list): starts consumers for new workers, removes the
  // ones not listed. Ignored after Stop.
  void SetMembers(const std::vector<std::string>& addresses);
  // The members now, in address order, with health evaluated at this instant.
  std::vector<WorkerSnapshot> Snapshot() const;
  // The same, with each worker's cached_prefix_tokens for `prompt` from its prefix-cache index
  // (0 for all without track_prefix_cache). At most prompt length - 1: the worker computes the
  // last prompt token whatever it holds.
  std::vector<WorkerSnapshot> Snapshot(std::span<const int32_t> prompt) const;
  // With track_prefix_cache: `prompt` was just sent to the member at `address`, so its blocks
  // count as cached there until the worker's events settle them or prefix_pending_ttl passes.
  void NoteRouted(const std::string& address, std::span<const int32_t> prompt);
  // The member's channel, or nullptr when it is not (or no longer) a member.
  std::shared_ptr<WorkerChannel> Get(const std::string& address) const;
  int size() const;
  int HealthyCount() const;
  const std::string& role() const { return options_.role; }
  void Stop();

 private:
  struct Worker;
  void StatsLoop(Worker* worker);
  void HealthLoop();
  void CheckHealthOnce();
  void Publish(Worker& worker, bool healthy);
  bool IsHealthy(Worker& worker, absl::Time now) const;
  void RemoveMetrics(Worker& worker);
  // Applies the prefix-cache part of one stats message to the worker's index; false on a gap.
  bool ApplyPrefixCacheEvents(Worker& worker, const v1::WorkerStats& stats);

  const WorkerPoolOptions options_;
  std::atomic<metrics::RouterMetrics*> metrics_;
  absl::Notification stop_;
  std::thread health_thread_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

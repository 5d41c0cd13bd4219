#pragma once
// GenerationBackend over the worker pools (DESIGN.md "A request, end to end", steps 2-3, 5-7):
// picks a decode worker D (routing policy over the decode pool's snapshot) and a prefill worker P
// (or none: D prefills locally when the part of the prompt D must compute is shorter than
// `local_prefill_threshold` tokens, or the prefill pool has no healthy worker), opens
// Decode.Generate on D naming P, and turns each GenerateResponse into a BackendChunk. With the
// kv-aware policy the pools' prefix-cache indexes give each candidate's cached overlap with the
// prompt (docs/routing.md); "the part D must compute" is then the prompt minus D's cached prefix.
//
// A frozen prefill worker (its stats stale for `unresponsive_timeout`) is left the same way:
// requests waiting on it before their first token are retried, prefilling on a decode worker.
// Each attempt has its own id on the decode worker (the request's, then "id#2", ...), so an
// abandoned attempt still winding down there never collides with the next.
// Failures: if D fails before any token reached the client (stream broken, UNAVAILABLE, an
// "error" finish, or D unresponsive for `unresponsive_timeout` per the pool), the request is
// retried on another healthy D, up to `max_attempts` workers in all. After the first token the
// request is migrated (up to `max_migrations` times): its prompt plus the tokens delivered so far
// go to another D as resumed output (decode.proto GenerateRequest.resumed_output_tokens, with the
// text bytes the client has), and that D prefills them itself and continues exactly where the
// client is: the same seed position (a sampled request without a seed gets one here, in
// Generate), the same penalties, stop strings spanning the seam, held-back text released; usage
// stays the client's; no token is duplicated or missing. One out of migrations ends with a final
// Internal error naming D. INVALID_ARGUMENT and the like
// from D are passed on with D's message. The request deadline becomes the gRPC deadline
// (DeadlineExceeded).
//
// Threading: no thread per request. Each request is one state object (Stream) and each attempt
// one gRPC client read reactor (AttemptCall): gRPC's callback threads drive it, and on_event is
// called from them (never concurrently for one request; it must not block). A retry starts from
// the failed attempt's OnDone. At most `max_streams` requests at once; beyond that Generate
// answers ResourceExhausted (HTTP 429) at once, on the caller's thread (with no backend lock held).
// One watchdog thread in all. Cancel is thread-safe: it marks the request, cancels its live call
// and sends Decode.Cancel (with the request's cancel token) to D; the request ends with a
// finish_reason "abort" chunk. Exactly one final event per Generate, always. Ownership: the pools
// are not owned and must outlive the backend. The destructor cancels every request still running
// and waits until each has delivered its final event.

#include <atomic>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/support/status.h"
#include "runtime/router/generation_backend.h"
#include "runtime/router/routing_policy.h"
#include "runtime/router/worker_pool.h"

namespace tandem::router {

struct GrpcBackendOptions {
  RoutingPolicy policy = RoutingPolicy::kLeastLoaded;
  // Prompts whose uncached part on D (the whole prompt unless the policy is kv-aware) is shorter
  // than this prefill on D; 0: never.
  int local_prefill_threshold = 0;
  KvAwareOptions kv_aware;
  int max_attempts = 3;  // decode workers tried before the first token
  // Mid-stream moves of a greedy request to another decode worker when its own fails.
  int max_migrations = 2;
  int max_streams = 4096;                            // concurrent requests
  absl::Duration cancel_timeout = absl::Seconds(2);  // of the Decode.Cancel call
  // A request whose decode worker has not been live (stats stream up and fresh) for this long is
  // taken off it: retried elsewhere before its first token, else ended with an error. Catches
  // hung or partitioned workers, whose streams would otherwise wait for the request deadline.
  absl::Duration unresponsive_timeout = absl::Seconds(10);
  absl::Duration watchdog_interval = absl::Milliseconds(500);
};

class GrpcGenerationBackend final : public GenerationBackend {
 public:
  // `prefill_pool` may be null: every prompt is prefilled on its decode worker (aggregated).
  GrpcGenerationBackend(WorkerPool* decode_pool, WorkerPool* prefill_pool,
                        GrpcBackendOptions options);
  ~GrpcGenerationBackend() override;

  void Generate(BackendRequest request, BackendEventCallback on_event) override;
  void Cancel(const std::string& request_id) override;
  absl::Status Ready() const override;

  int active_requests() const;
  // Counts routing decisions into `metrics` (must outlive the backend) from now on.
  void SetMetrics(metrics::RouterMetrics* metrics) { metrics_ = metrics; }

 private:
  struct Stream;
  class AttemptCall;
  // How one Decode.Generate call ended.
  struct AttemptOutcome {
    std::optional<BackendChunk> final_chunk;
    std::string worker_error;  // an "error" finish
    bool delivered = false;    // some token reached the client: no retry from here on
    grpc::Status status;
  };
  // Picks a decode (and prefill) worker and starts a call, or delivers the final event.
  void StartAttempt(const std::shared_ptr<Stream>& stream);
  // From an attempt's OnDone: the final event, or the next attempt.
  void AttemptDone(const std::shared_ptr<Stream>& stream, const std::string& decode_address,
                   AttemptOutcome outcome);
  // Delivers the final event and forgets the request; nothing touches `stream` after it.
  void Finish(const std::shared_ptr<Stream>& stream, absl::StatusOr<BackendChunk> event);
  // The prefill worker for `prompt`, or "" to prefill on D, which holds `decode_cached_tokens`
  // of it.
  std::string ChoosePrefill(std::span<const int32_t> prompt, int decode_cached_tokens);
  void SendCancel(const std::shared_ptr<WorkerChannel>& decode, const std::string& request_id,
                  const std::string& cancel_token);
  void Watchdog();

  WorkerPool* const decode_pool_;
  WorkerPool* const prefill_pool_;
  const GrpcBackendOptions options_;
  std::atomic<metrics::RouterMetrics*> metrics_{nullptr};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // requests without their final event yet
  uint64_t decode_cursor_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t prefill_cursor_ ABSL_GUARDED_BY(mu_) = 0;
  bool prefill_down_logged_ ABSL_GUARDED_BY(mu_) = false;
  // Since when each decode worker has not been live (absent: live, or unknown).
  absl::flat_hash_map<std::string, absl::Time> not_live_since_ ABSL_GUARDED_BY(mu_);

  absl::Notification stop_watchdog_;
  std::thread watchdog_;
};

}  // namespace tandem::router

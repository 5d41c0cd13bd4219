#pragma once
// Worker.StreamStats for both roles: streams the engine's load (queue, running sequences, KV
// blocks) every interval until the client goes away or the service is stopped. The router's
// load-aware policies and discovery read it. When asked (StatsRequest.prefix_cache_events), each
// message also carries the prefix-cache events since the previous one (worker.proto): the first
// message of a stream is a full snapshot, and so is any message after the stream fell further
// behind than the engine's event log reaches. A delta carries at most kMaxEventsPerMessage events;
// the rest follow in the next messages.
//
// Every call is authenticated first (runtime/auth/service_identity.h).
// Threading: StreamStats runs on a gRPC thread and only reads Engine::stats() (thread-safe).
// Stop() may be called from any thread; open streams then end within one interval.
// Ownership: `engine` is not owned and must outlive the service.

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/auth/service_identity.h"
#include "runtime/engine/engine.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::server {

class WorkerStatsService final : public v1::Worker::Service {
 public:
  static constexpr absl::Duration kDefaultInterval = absl::Milliseconds(200);
  static constexpr absl::Duration kMinInterval = absl::Milliseconds(10);
  static constexpr size_t kMaxEventsPerMessage = 16384;

  WorkerStatsService(std::string role, std::string model, const Engine* engine,
                     std::shared_ptr<const auth::ServiceIdentity> identity);

  grpc::Status StreamStats(grpc::ServerContext* context, const v1::StatsRequest* request,
                           grpc::ServerWriter<v1::WorkerStats>* writer) override;
  void Stop();

  // One snapshot (also what each streamed message holds).
  v1::WorkerStats Snapshot() const;

 private:
  const std::string role_;
  const std::string model_;
  const Engine* const engine_;
  const std::shared_ptr<const auth::ServiceIdentity> identity_;
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::server

#include "runtime/server/worker_stats_service.h"

#include <algorithm>
#include <utility>

namespace tandem::server {

WorkerStatsService::WorkerStatsService(std::string role, std::string model, const Engine* engine,
                                       std::shared_ptr<const auth::ServiceIdentity> identity)
    : role_(std::move(role)),
      model_(std::move(model)),
      engine_(engine),
      identity_(std::move(identity)) {}

v1::WorkerStats WorkerStatsService::Snapshot() const {
  const EngineStats stats = engine_->stats();
  v1::WorkerStats out;
  out.set_role(role_);
  out.set_model(model_);
  out.set_queue_depth(stats.waiting);
  out.set_running_sequences(stats.running);
  out.set_kv_blocks_used(stats.blocks_used);
  out.set_kv_blocks_free(stats.blocks_free);
  out.set_kv_blocks_total(stats.blocks_total);
  out.set_block_size(engine_->kv_layout().block_size);
  out.set_timestamp_ms(absl::ToUnixMillis(absl::Now()));
  return out;
}

grpc::Status WorkerStatsService::StreamStats(grpc::ServerContext* context,
                                             const v1::StatsRequest* request,
                                             grpc::ServerWriter<v1::WorkerStats>* writer) {
  if (grpc::Status s = identity_->Authenticate(*context); !s.ok()) return s;
  const absl::Duration interval =
      request->interval_ms() <= 0
          ? kDefaultInterval
          : std::max(kMinInterval, absl::Milliseconds(request->interval_ms()));
  // Sleeps in short slices so cancellation and Stop are noticed quickly.
  const absl::Duration slice = std::min(interval, absl::Milliseconds(50));
  while (true) {
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    if (!writer->Write(Snapshot())) return grpc::Status::OK;  // the client went away
    const absl::Time next = absl::Now() + interval;
    absl::MutexLock lock(&mu_);
    while (absl::Now() < next) {
      if (stopped_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker shutting down");
      mu_.AwaitWithTimeout(absl::Condition(&stopped_), std::min(slice, next - absl::Now()));
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
    }
  }
}

void WorkerStatsService::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

}  // namespace tandem::server

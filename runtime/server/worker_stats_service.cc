#include "runtime/server/worker_stats_service.h"

#include <algorithm>
#include <optional>
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
  out.set_kv_blocks_cached_idle(stats.blocks_cached_idle);
  out.set_block_size(engine_->kv_layout().block_size);
  out.set_prompt_tokens_waiting(stats.waiting_prompt_tokens);
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
  std::optional<uint64_t> cursor;  // this stream's prefix-cache position; the first read resets
  while (true) {
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    v1::WorkerStats stats = Snapshot();
    if (request->prefix_cache_events()) {
      const PrefixCacheDelta delta =
          engine_->prefix_cache_events().ReadSince(cursor, kMaxEventsPerMessage);
      cursor = delta.last_seq;
      v1::PrefixCacheEvents* out = stats.mutable_prefix_cache();
      out->set_reset(delta.reset);
      out->set_first_seq(delta.first_seq);
      out->set_last_seq(delta.last_seq);
      out->mutable_events()->Reserve(static_cast<int>(delta.events.size()));
      for (const PrefixCacheEvent& e : delta.events) {
        v1::PrefixCacheEvent* event = out->add_events();
        event->set_block_hash(e.block_hash);
        event->set_removed(e.kind == PrefixCacheEvent::Kind::kRemoved);
      }
    }
    if (!writer->Write(stats)) return grpc::Status::OK;  // the client went away
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

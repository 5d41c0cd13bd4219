#include "runtime/server/worker_metrics.h"

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::server {

// Refreshes the engine-derived metrics before the exposer collects the registry.
class WorkerMetricsReporter::RefreshingCollectable : public prometheus::Collectable {
 public:
  explicit RefreshingCollectable(WorkerMetricsReporter* reporter) : reporter_(reporter) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    reporter_->Refresh();
    return reporter_->registry_->Collect();
  }

 private:
  WorkerMetricsReporter* const reporter_;
};

WorkerMetricsReporter::WorkerMetricsReporter(const Engine* engine)
    : engine_(engine),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(*registry_),
      collectable_(std::make_shared<RefreshingCollectable>(this)) {
  Refresh();
}

WorkerMetricsReporter::~WorkerMetricsReporter() { exposer_.reset(); }

absl::Status WorkerMetricsReporter::Serve(const std::string& host, int port) {
  if (port <= 0) return absl::InvalidArgumentError(absl::StrCat("metrics port ", port));
  if (exposer_ != nullptr) return absl::FailedPreconditionError("metrics are already served");
  const std::string address = absl::StrCat(host, ":", port);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  exposer_->RegisterCollectable(collectable_);
  return absl::OkStatus();
}

void WorkerMetricsReporter::Refresh() {
  const EngineStats stats = engine_->stats();
  absl::MutexLock lock(&mu_);
  metrics_.requests_running.Set(stats.running);
  metrics_.requests_waiting.Set(stats.waiting);
  metrics_.kv_blocks_used.Set(stats.blocks_used);
  metrics_.kv_blocks_total.Set(stats.blocks_total);
  // Counters advance by the engine's deltas (engine counters only grow).
  auto advance = [](prometheus::Counter& counter, int64_t now, int64_t* last) {
    if (now > *last) counter.Increment(static_cast<double>(now - *last));
    *last = now;
  };
  advance(metrics_.prefix_cache_queries, stats.prefix_query_tokens, &last_prefix_query_tokens_);
  advance(metrics_.prefix_cache_hits, stats.prefix_hit_tokens, &last_prefix_hit_tokens_);
  advance(metrics_.generation_tokens, stats.generated_tokens, &last_generated_tokens_);
}

std::string WorkerMetricsReporter::Scrape() {
  Refresh();
  return metrics::Serialize(*registry_);
}

}  // namespace tandem::server

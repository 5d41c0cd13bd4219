#pragma once
// A worker's Prometheus metrics (runtime/metrics WorkerMetrics) and their /metrics endpoint.
// Engine-derived metrics (running, waiting, KV blocks, generated tokens, prefix cache) are
// refreshed from Engine::stats() at every scrape, so they are never stale; transfer metrics and
// prompt tokens (computed here, which only the role knows) are updated by the worker.
//
// Threading: metrics() may be used from any thread (prometheus-cpp metrics are thread-safe);
// Refresh/Scrape may run concurrently (serialized inside). Serve starts a small HTTP server
// (runtime/router/http_server.h) whose io thread scrapes. (Not prometheus-cpp's civetweb
// Exposer: civetweb creates threads with a fixed small stack, which fails with EINVAL once
// libraries with large static TLS, such as cuBLASLt in CUDA builds, are loaded.)
// Ownership: `engine` is not owned and must outlive the reporter; the reporter owns the registry
// and the HTTP server (stopped first on destruction).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/registry.h"
#include "runtime/engine/engine.h"
#include "runtime/metrics/metrics.h"
#include "runtime/router/http_server.h"

namespace tandem::server {

class WorkerMetricsReporter {
 public:
  // `count_generation`: false on prefill workers, whose one token per prompt the decode worker
  // delivers and counts (summing every worker's tandem_generation_tokens_total then counts each
  // token once). `model_name`: the vLLM-compatible gauges' label.
  explicit WorkerMetricsReporter(const Engine* engine, bool count_generation = true,
                                 const std::string& model_name = "");
  ~WorkerMetricsReporter();
  WorkerMetricsReporter(const WorkerMetricsReporter&) = delete;
  WorkerMetricsReporter& operator=(const WorkerMetricsReporter&) = delete;

  metrics::WorkerMetrics& metrics() { return metrics_; }

  // Serves GET /metrics on host:port (0: any free port; port() tells which). InvalidArgument for
  // port < 0; Unavailable when the port cannot be bound. At most once.
  absl::Status Serve(const std::string& host, int port);
  int port() const;  // the bound metrics port; 0 before Serve

  // Copies the engine's stats into the metrics.
  void Refresh();
  // Refresh, then the Prometheus text format of every metric.
  std::string Scrape();

 private:
  const Engine* const engine_;
  const bool count_generation_;
  std::shared_ptr<prometheus::Registry> registry_;
  metrics::WorkerMetrics metrics_;
  std::unique_ptr<router::HttpServer> http_;

  absl::Mutex mu_;  // serializes Refresh (counter deltas)
  int64_t last_generated_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_prefix_query_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_prefix_hit_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_steps_ ABSL_GUARDED_BY(mu_) = 0;
  double last_forward_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double last_busy_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_decode_steps_ ABSL_GUARDED_BY(mu_) = 0;
  double last_decode_forward_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_decode_sequences_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_decode_context_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_prefill_steps_ ABSL_GUARDED_BY(mu_) = 0;
  double last_prefill_forward_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_prefill_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_prefill_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_prefill_cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_backlogged_steps_ ABSL_GUARDED_BY(mu_) = 0;
  double last_gap_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_spec_draft_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_spec_accepted_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_spec_verifications_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_spec_fallbacks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_mlp_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_mlp_failovers_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_mlp_failures_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_mlp_plane_calls_ ABSL_GUARDED_BY(mu_) = 0;
  double last_drafter_seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::server

#include "runtime/server/worker_metrics.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::server {

WorkerMetricsReporter::WorkerMetricsReporter(const Engine* engine, bool count_generation,
                                             const std::string& model_name)
    : engine_(engine),
      count_generation_(count_generation),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(*registry_, model_name) {
  Refresh();
}

WorkerMetricsReporter::~WorkerMetricsReporter() {
  if (http_ != nullptr) http_->Stop();
}

absl::Status WorkerMetricsReporter::Serve(const std::string& host, int port) {
  if (port < 0) return absl::InvalidArgumentError(absl::StrCat("metrics port ", port));
  if (http_ != nullptr) return absl::FailedPreconditionError("metrics are already served");
  router::HttpServerOptions options;
  options.host = host;
  options.port = port;
  options.num_threads = 1;
  auto server = router::HttpServer::Start(
      options, [this](router::HttpRequest request, std::shared_ptr<router::HttpExchange> exchange) {
        router::HttpResponse response;
        response.content_type = "text/plain; version=0.0.4";
        if (request.path != "/metrics") {
          response.status = 404;
          response.body = "not found: only GET /metrics is served here\n";
        } else if (request.method != "GET") {
          response.status = 405;
          response.headers.emplace_back("Allow", "GET");
          response.body = "method not allowed\n";
        } else {
          response.body = Scrape();
        }
        exchange->Respond(std::move(response));
      });
  if (!server.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", host, ":", port, ": ", server.status().message()));
  }
  http_ = *std::move(server);
  return absl::OkStatus();
}

int WorkerMetricsReporter::port() const { return http_ == nullptr ? 0 : http_->port(); }

void WorkerMetricsReporter::Refresh() {
  const EngineStats stats = engine_->stats();
  absl::MutexLock lock(&mu_);
  metrics_.requests_running.Set(stats.running);
  metrics_.requests_waiting.Set(stats.waiting);
  metrics_.kv_blocks_used.Set(stats.blocks_used);
  metrics_.kv_blocks_capacity.Set(stats.blocks_total);
  const double usage =
      stats.blocks_total > 0 ? static_cast<double>(stats.blocks_used) / stats.blocks_total : 0.0;
  metrics_.kv_cache_usage.Set(usage);
  metrics_.vllm_requests_running.Set(stats.running);
  metrics_.vllm_requests_waiting.Set(stats.waiting);
  metrics_.vllm_kv_cache_usage.Set(usage);
  // Counters advance by the engine's deltas (engine counters only grow).
  auto advance = [](prometheus::Counter& counter, int64_t now, int64_t* last) {
    if (now > *last) counter.Increment(static_cast<double>(now - *last));
    *last = now;
  };
  advance(metrics_.prefix_cache_queries, stats.prefix_query_tokens, &last_prefix_query_tokens_);
  advance(metrics_.prefix_cache_hits, stats.prefix_hit_tokens, &last_prefix_hit_tokens_);
  advance(metrics_.engine_steps, stats.steps, &last_steps_);
  auto advance_seconds = [](prometheus::Counter& counter, double now, double* last) {
    if (now > *last) counter.Increment(now - *last);
    *last = now;
  };
  advance_seconds(metrics_.engine_forward_seconds, stats.forward_seconds, &last_forward_seconds_);
  advance_seconds(metrics_.engine_busy_seconds, stats.busy_seconds, &last_busy_seconds_);
  advance(metrics_.engine_decode_steps, stats.decode_steps, &last_decode_steps_);
  advance_seconds(metrics_.engine_decode_forward_seconds, stats.decode_forward_seconds,
                  &last_decode_forward_seconds_);
  advance(metrics_.engine_decode_sequences, stats.decode_sequences, &last_decode_sequences_);
  advance(metrics_.engine_decode_context_tokens, stats.decode_context_tokens,
          &last_decode_context_tokens_);
  advance(metrics_.engine_prefill_steps, stats.prefill_steps, &last_prefill_steps_);
  advance_seconds(metrics_.engine_prefill_forward_seconds, stats.prefill_forward_seconds,
                  &last_prefill_forward_seconds_);
  advance(metrics_.engine_prefill_chunks, stats.prefill_chunks, &last_prefill_chunks_);
  advance(metrics_.engine_prefill_tokens, stats.prefill_tokens, &last_prefill_tokens_);
  advance(metrics_.engine_prefill_cached_tokens, stats.prefill_cached_tokens,
          &last_prefill_cached_tokens_);
  advance(metrics_.engine_backlogged_steps, stats.backlogged_steps, &last_backlogged_steps_);
  advance_seconds(metrics_.engine_gap_seconds, stats.gap_seconds, &last_gap_seconds_);
  advance(metrics_.spec_draft_tokens, stats.spec_draft_tokens, &last_spec_draft_tokens_);
  advance(metrics_.spec_accepted_tokens, stats.spec_accepted_tokens, &last_spec_accepted_tokens_);
  advance(metrics_.spec_verifications, stats.spec_verifications, &last_spec_verifications_);
  advance(metrics_.spec_fallbacks, stats.spec_fallbacks, &last_spec_fallbacks_);
  advance_seconds(metrics_.spec_drafter_seconds, stats.drafter_seconds, &last_drafter_seconds_);
  advance(metrics_.mlp_calls, stats.mlp_calls, &last_mlp_calls_);
  advance(metrics_.mlp_failovers, stats.mlp_failovers, &last_mlp_failovers_);
  advance(metrics_.mlp_failures, stats.mlp_failures, &last_mlp_failures_);
  advance(metrics_.mlp_plane_calls, stats.mlp_plane_calls, &last_mlp_plane_calls_);
  if (count_generation_) {
    advance(metrics_.generation_tokens, stats.generated_tokens, &last_generated_tokens_);
  }
}

std::string WorkerMetricsReporter::Scrape() {
  Refresh();
  return metrics::Serialize(*registry_);
}

}  // namespace tandem::server

#include "runtime/metrics/metrics.h"

#include <sstream>

#include "prometheus/text_serializer.h"

namespace tandem::metrics {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

prometheus::Counter& Counter(prometheus::Registry& r, const std::string& name,
                             const std::string& help) {
  return BuildCounter().Name(name).Help(help).Register(r).Add({});
}
prometheus::Gauge& Gauge(prometheus::Registry& r, const std::string& name,
                         const std::string& help) {
  return BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Histogram& Histogram(prometheus::Registry& r, const std::string& name,
                                 const std::string& help, std::vector<double> buckets) {
  return BuildHistogram().Name(name).Help(help).Register(r).Add({}, std::move(buckets));
}
prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& r, const std::string& name,
                                                   const std::string& help) {
  return BuildGauge().Name(name).Help(help).Register(r);
}

}  // namespace

std::vector<double> TtftBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> InterTokenBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,
          0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
}
std::vector<double> E2eBuckets() {
  return {0.01, 0.025, 0.05, 0.1,  0.3,  0.5,  0.8,   1.0,   1.5,   2.0,   2.5,    5.0,   10.0,
          15.0, 20.0,  30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}
std::vector<double> TransferBuckets() {
  return {1e-5,  5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01,
          0.025, 0.05, 0.1,  0.25,   0.5,  1.0,  2.5,    5.0,  10.0};
}

std::string Serialize(prometheus::Registry& registry) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry.Collect());
  return out.str();
}

RouterMetrics::RouterMetrics(prometheus::Registry& r)
    : requests(BuildCounter()
                   .Name("tandem_requests_total")
                   .Help("HTTP requests finished, by endpoint and status code")
                   .Register(r)),
      requests_running(
          Gauge(r, "tandem_requests_running", "Generation requests in flight through the router")),
      prompt_tokens(Counter(r, "tandem_prompt_tokens_total", "Prompt tokens of finished requests")),
      generation_tokens(
          Counter(r, "tandem_generation_tokens_total", "Tokens generated for clients")),
      ttft(Histogram(r, "tandem_time_to_first_token_seconds",
                     "Time from request arrival to the first token sent", TtftBuckets())),
      inter_token(Histogram(r, "tandem_inter_token_latency_seconds",
                            "Time between consecutive streamed tokens", InterTokenBuckets())),
      e2e(Histogram(r, "tandem_e2e_request_latency_seconds",
                    "Time from request arrival to the last byte sent", E2eBuckets())),
      ttft_queue(Histogram(r, "tandem_ttft_queue_seconds",
                           "TTFT part: waiting on the decode worker before prefill",
                           TtftBuckets())),
      ttft_prefill(
          Histogram(r, "tandem_ttft_prefill_seconds", "TTFT part: prefill compute", TtftBuckets())),
      ttft_transfer(Histogram(r, "tandem_ttft_transfer_seconds",
                              "TTFT part: KV transfer from prefill to decode worker",
                              TtftBuckets())),
      ttft_first_decode(Histogram(r, "tandem_ttft_first_decode_seconds",
                                  "TTFT part: from KV arrival to the first token leaving decode",
                                  TtftBuckets())),
      worker_running(GaugeFamily(r, "tandem_worker_requests_running",
                                 "Sequences running on each worker (from its stats stream)")),
      worker_waiting(GaugeFamily(r, "tandem_worker_requests_waiting",
                                 "Requests waiting on each worker (from its stats stream)")),
      worker_kv_blocks_used(GaugeFamily(r, "tandem_worker_kv_blocks_used",
                                        "KV blocks in use on each worker (from its stats stream)")),
      worker_kv_blocks_total(GaugeFamily(r, "tandem_worker_kv_blocks_total",
                                         "KV blocks on each worker (from its stats stream)")),
      worker_healthy(GaugeFamily(r, "tandem_worker_healthy",
                                 "1 when the worker's stats stream is live, else 0")) {}

WorkerMetrics::WorkerMetrics(prometheus::Registry& r)
    : requests_running(Gauge(r, "tandem_requests_running", "Sequences in the running batch")),
      requests_waiting(Gauge(r, "tandem_requests_waiting", "Requests waiting to be scheduled")),
      kv_blocks_used(Gauge(r, "tandem_kv_blocks_used", "KV cache blocks in use")),
      kv_blocks_total(Gauge(r, "tandem_kv_blocks_total", "KV cache blocks in the pool")),
      prefix_cache_queries(Counter(r, "tandem_prefix_cache_queries_total",
                                   "Prompt tokens looked up in the prefix cache")),
      prefix_cache_hits(
          Counter(r, "tandem_prefix_cache_hits_total", "Prompt tokens found in the prefix cache")),
      kv_transfer_bytes(
          Counter(r, "tandem_kv_transfer_bytes_total",
                  "KV bytes moved by kvtransfer (sent on prefill, received on decode)")),
      kv_transfers(Counter(r, "tandem_kv_transfers_total", "KV transfers completed")),
      kv_transfer_failures(
          Counter(r, "tandem_kv_transfer_failures_total", "KV transfers that failed")),
      kv_transfer_latency(Histogram(r, "tandem_kv_transfer_latency_seconds",
                                    "KV transfer time from post to completion", TransferBuckets())),
      kv_transfer_fallbacks(BuildCounter()
                                .Name("tandem_kv_transfer_fallbacks_total")
                                .Help("KV transfer endpoints a pair handshake skipped, by backend "
                                      "and reason")
                                .Register(r)),
      kv_transfer_streamed_bytes(
          Counter(r, "tandem_kv_transfer_streamed_bytes_total",
                  "KV bytes whose writes were posted while the prompt was still computed")),
      kv_quarantined_blocks(Gauge(r, "tandem_kv_quarantined_blocks",
                                  "KV blocks held back after a failed transfer until fenced")),
      kv_fences(BuildCounter()
                    .Name("tandem_kv_fences_total")
                    .Help("Quarantines of failed-transfer KV blocks, by how they ended")
                    .Register(r)),
      prompt_tokens(Counter(r, "tandem_prompt_tokens_total", "Prompt tokens computed")),
      generation_tokens(
          Counter(r, "tandem_generation_tokens_total", "Tokens generated by this worker")) {}

}  // namespace tandem::metrics

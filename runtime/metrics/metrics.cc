#include "runtime/metrics/metrics.h"

#include <algorithm>
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

std::vector<double> BandwidthBuckets() {
  return {1e7, 1e8, 5e8, 1e9, 2.5e9, 5e9, 1e10, 2.5e10, 5e10, 1e11, 2.5e11, 5e11, 1e12, 2e12, 4e12};
}

std::vector<double> RatioBuckets() { return {0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1}; }

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
      worker_kv_blocks_capacity(GaugeFamily(r, "tandem_worker_kv_blocks_capacity",
                                            "KV blocks on each worker (from its stats stream)")),
      pool_saturation(GaugeFamily(r, "tandem_pool_saturation",
                                  "Mean saturation of the pool's healthy workers (1: full)")),
      pool_replicas(GaugeFamily(r, "tandem_pool_replicas", "Healthy workers in the pool")),
      pool_recommended_replicas(GaugeFamily(r, "tandem_pool_recommended_replicas",
                                            "Workers the pool should have at the target "
                                            "saturation (0.8)")),
      worker_healthy(GaugeFamily(r, "tandem_worker_healthy",
                                 "1 when the worker's stats stream is live, else 0")),
      worker_prefix_cache_blocks(
          GaugeFamily(r, "tandem_worker_prefix_cache_blocks",
                      "Block hashes the router's index holds for each worker's prefix cache")),
      routing_prefix_hit_tokens(BuildCounter()
                                    .Name("tandem_routing_prefix_hit_tokens_total")
                                    .Help("Prompt tokens the chosen worker held in its prefix "
                                          "cache, per the router's index")
                                    .Register(r)),
      prefix_index_resyncs(BuildCounter()
                               .Name("tandem_prefix_index_resyncs_total")
                               .Help("Prefix-cache event gaps that forced a full resync")
                               .Register(r)),
      routing_prefills(BuildCounter()
                           .Name("tandem_routing_prefills_total")
                           .Help("Prompts routed, by where they are prefilled")
                           .Register(r)) {}

namespace {

prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& r,
                                                       const std::string& name,
                                                       const std::string& help) {
  return BuildCounter().Name(name).Help(help).Register(r);
}

prometheus::Family<prometheus::Histogram>& HistogramFamily(prometheus::Registry& r,
                                                           const std::string& name,
                                                           const std::string& help) {
  return BuildHistogram().Name(name).Help(help).Register(r);
}

double Sum(const absl::node_hash_map<std::string, KvTransferMetrics::Backend>& backends,
           prometheus::Counter* KvTransferMetrics::Backend::*series) {
  double sum = 0;
  for (const auto& [name, backend] : backends) sum += (backend.*series)->Value();
  return sum;
}

}  // namespace

KvTransferMetrics::KvTransferMetrics(prometheus::Registry& r)
    : bytes_(CounterFamily(r, "tandem_kv_transfer_bytes_total",
                           "KV bytes moved by kvtransfer (sent on prefill, received on decode)")),
      transfers_(CounterFamily(r, "tandem_kv_transfers_total", "KV transfers completed")),
      ops_(CounterFamily(
          r, "tandem_kv_transfer_ops_total",
          "Copy operations posted for KV transfers (/ transfers = ops per transfer)")),
      streamed_bytes_(
          CounterFamily(r, "tandem_kv_transfer_streamed_bytes_total",
                        "KV bytes whose writes were posted while the prompt was still computed")),
      failures_(CounterFamily(r, "tandem_kv_transfer_failures_total",
                              "KV transfers that failed, by the stage where they stopped")),
      latency_(HistogramFamily(r, "tandem_kv_transfer_latency_seconds",
                               "KV transfer time from its first post to its last write landing")),
      exposed_(HistogramFamily(r, "tandem_kv_transfer_exposed_seconds",
                               "KV transfer time after the prompt's KV was complete (not hidden "
                               "under compute)")),
      bandwidth_(HistogramFamily(r, "tandem_kv_transfer_bandwidth_bytes_per_second",
                                 "Effective bandwidth of each KV transfer (bytes / latency)")),
      hidden_(HistogramFamily(r, "tandem_kv_transfer_hidden_ratio",
                              "Fraction of each KV transfer's time hidden under compute")) {}

const KvTransferMetrics::Backend& KvTransferMetrics::For(const std::string& backend) {
  absl::MutexLock lock(&mu_);
  auto it = backends_.find(backend);
  if (it != backends_.end()) return it->second;
  const prometheus::Labels labels = {{"backend", backend}};
  Backend series{.bytes = &bytes_.Add(labels),
                 .transfers = &transfers_.Add(labels),
                 .ops = &ops_.Add(labels),
                 .streamed_bytes = &streamed_bytes_.Add(labels),
                 .latency = &latency_.Add(labels, TransferBuckets()),
                 .exposed = &exposed_.Add(labels, TransferBuckets()),
                 .bandwidth = &bandwidth_.Add(labels, BandwidthBuckets()),
                 .hidden = &hidden_.Add(labels, RatioBuckets())};
  return backends_.emplace(backend, series).first->second;
}

void KvTransferMetrics::CountFailure(const std::string& backend, const std::string& stage) {
  prometheus::Counter* counter;
  {
    absl::MutexLock lock(&mu_);
    prometheus::Counter*& slot = failure_series_[backend + "\n" + stage];
    if (slot == nullptr) slot = &failures_.Add({{"backend", backend}, {"stage", stage}});
    counter = slot;
  }
  counter->Increment();
}

void KvTransferMetrics::CountTransfer(const std::string& backend, double bytes, double ops,
                                      double streamed_bytes, absl::Duration latency,
                                      absl::Duration exposed) {
  const Backend& series = For(backend);
  series.bytes->Increment(bytes);
  series.transfers->Increment();
  series.ops->Increment(ops);
  series.streamed_bytes->Increment(streamed_bytes);
  if (latency <= absl::ZeroDuration()) return;
  const double seconds = absl::ToDoubleSeconds(latency);
  series.latency->Observe(seconds);
  series.exposed->Observe(absl::ToDoubleSeconds(exposed));
  series.bandwidth->Observe(bytes / seconds);
  series.hidden->Observe(std::clamp(1.0 - absl::ToDoubleSeconds(exposed) / seconds, 0.0, 1.0));
}

double KvTransferMetrics::bytes() const {
  absl::MutexLock lock(&mu_);
  return Sum(backends_, &Backend::bytes);
}
double KvTransferMetrics::transfers() const {
  absl::MutexLock lock(&mu_);
  return Sum(backends_, &Backend::transfers);
}
double KvTransferMetrics::streamed_bytes() const {
  absl::MutexLock lock(&mu_);
  return Sum(backends_, &Backend::streamed_bytes);
}
double KvTransferMetrics::failures() const {
  absl::MutexLock lock(&mu_);
  double sum = 0;
  for (const auto& [key, counter] : failure_series_) sum += counter->Value();
  return sum;
}

WorkerMetrics::WorkerMetrics(prometheus::Registry& r, const std::string& model_name)
    : requests_running(Gauge(r, "tandem_requests_running", "Sequences in the running batch")),
      requests_waiting(Gauge(r, "tandem_requests_waiting", "Requests waiting to be scheduled")),
      kv_blocks_used(Gauge(r, "tandem_kv_blocks_used", "KV cache blocks in use")),
      kv_blocks_capacity(Gauge(r, "tandem_kv_blocks_capacity", "KV cache blocks in the pool")),
      kv_cache_usage(Gauge(r, "tandem_kv_cache_usage_perc",
                           "Fraction of the KV cache blocks in use (0 to 1)")),
      vllm_requests_running(GaugeFamily(r, "vllm:num_requests_running",
                                        "Requests running (vLLM's name; Tandem: sequences in "
                                        "the running batch)")
                                .Add({{"model_name", model_name}})),
      vllm_requests_waiting(
          GaugeFamily(r, "vllm:num_requests_waiting", "Requests waiting (vLLM's name)")
              .Add({{"model_name", model_name}})),
      vllm_kv_cache_usage(
          GaugeFamily(r, "vllm:kv_cache_usage_perc", "KV cache usage, 0 to 1 (vLLM's name)")
              .Add({{"model_name", model_name}})),
      prefix_cache_queries(Counter(r, "tandem_prefix_cache_queries_total",
                                   "Prompt tokens looked up in the prefix cache")),
      prefix_cache_hits(
          Counter(r, "tandem_prefix_cache_hits_total", "Prompt tokens found in the prefix cache")),
      kv_transfer(r),
      kv_transfer_fallbacks(BuildCounter()
                                .Name("tandem_kv_transfer_fallbacks_total")
                                .Help("KV transfer endpoints a pair handshake skipped, by backend "
                                      "and reason")
                                .Register(r)),
      kv_quarantined_blocks(Gauge(r, "tandem_kv_quarantined_blocks",
                                  "KV blocks held back after a failed transfer until fenced")),
      kv_fences(BuildCounter()
                    .Name("tandem_kv_fences_total")
                    .Help("Quarantines of failed-transfer KV blocks, by how they ended")
                    .Register(r)),
      prompt_tokens(Counter(r, "tandem_prompt_tokens_total", "Prompt tokens computed")),
      generation_tokens(
          Counter(r, "tandem_generation_tokens_total", "Tokens generated by this worker")),
      engine_steps(Counter(r, "tandem_engine_steps_total", "Engine steps (forward passes) run")),
      engine_forward_seconds(Counter(r, "tandem_engine_forward_seconds_total",
                                     "Seconds the engine thread spent in forward passes")),
      engine_busy_seconds(Counter(r, "tandem_engine_busy_seconds_total",
                                  "Seconds of engine loop iterations that ran a step (forward "
                                  "pass plus host work)")),
      engine_decode_steps(Counter(r, "tandem_engine_decode_steps_total",
                                  "Engine steps that only decoded (one token per sequence)")),
      engine_decode_forward_seconds(
          Counter(r, "tandem_engine_decode_forward_seconds_total",
                  "Seconds of forward passes in engine steps that only decoded")),
      engine_decode_sequences(Counter(r, "tandem_engine_decode_sequences_total",
                                      "Sequences decoded in engine steps that only decoded")),
      engine_decode_context_tokens(
          Counter(r, "tandem_engine_decode_context_tokens_total",
                  "Tokens already cached of the sequences of decode-only steps")),
      engine_prefill_steps(Counter(r, "tandem_engine_prefill_steps_total",
                                   "Engine steps that only computed prompt tokens")),
      engine_prefill_forward_seconds(
          Counter(r, "tandem_engine_prefill_forward_seconds_total",
                  "Seconds of forward passes in engine steps that only computed prompt tokens")),
      engine_prefill_chunks(
          Counter(r, "tandem_engine_prefill_chunks_total", "Prompt chunks of prefill-only steps")),
      engine_prefill_tokens(Counter(r, "tandem_engine_prefill_tokens_total",
                                    "Prompt tokens computed in prefill-only steps")),
      engine_prefill_cached_tokens(
          Counter(r, "tandem_engine_prefill_cached_tokens_total",
                  "Tokens already cached before the chunks of prefill-only steps")),
      engine_backlogged_steps(
          Counter(r, "tandem_engine_backlogged_steps_total",
                  "Steps after which the engine still had work and went on without waiting")),
      engine_gap_seconds(Counter(r, "tandem_engine_gap_seconds_total",
                                 "Wall seconds between those steps and the next iteration")),
      spec_draft_tokens(Counter(r, "tandem_spec_draft_tokens_total",
                                "Speculative draft tokens scored by the target model")),
      spec_accepted_tokens(
          Counter(r, "tandem_spec_accepted_tokens_total", "Speculative draft tokens accepted")),
      spec_verifications(Counter(r, "tandem_spec_verifications_total",
                                 "Sequences whose drafts were scored in a step")),
      spec_fallbacks(Counter(r, "tandem_spec_fallbacks_total",
                             "Drafter answers dropped (failed, late or invalid): plain decoding")),
      spec_drafter_seconds(Counter(r, "tandem_spec_drafter_seconds_total",
                                   "Seconds the engine waited for the drafter")),
      mlp_calls(Counter(r, "tandem_mlp_calls_total", "Layer calls to the MLP backend")),
      mlp_failovers(Counter(r, "tandem_mlp_failovers_total",
                            "MLP layer calls moved to another shard or the fallback")),
      mlp_failures(Counter(r, "tandem_mlp_failures_total",
                           "MLP layer calls that failed (their step's requests failed)")),
      mlp_plane_calls(Counter(r, "tandem_mlp_plane_calls_total",
                              "MLP layer calls whose rows moved through the host data plane")) {}

}  // namespace tandem::metrics

#pragma once
// Every Tandem metric is named in this one file (prefix `tandem_`); docs/metrics.md lists them.
// Router metrics describe requests as clients see them; worker metrics describe one worker's
// engine and KV transfers. Histogram buckets follow vLLM's so dashboards carry over.
//
// Thread-safety: prometheus-cpp metrics are thread-safe; the structs are built once at start-up
// and then only their metrics are touched.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem::metrics {

std::vector<double> TtftBuckets();        // seconds, 1 ms .. 2560 s
std::vector<double> InterTokenBuckets();  // seconds, 10 ms .. 80 s (plus 1/2.5/5 ms for CPU)
std::vector<double> E2eBuckets();         // seconds, 0.3 .. 7680 s (plus sub-0.3 for small models)
std::vector<double> TransferBuckets();    // seconds, 10 us .. 10 s
std::vector<double> BandwidthBuckets();   // bytes per second, 10 MB/s .. 4 TB/s
std::vector<double> RatioBuckets();       // 0 .. 1

// Prometheus text exposition format of everything in `registry`.
std::string Serialize(prometheus::Registry& registry);

struct RouterMetrics {
  explicit RouterMetrics(prometheus::Registry& registry);

  // tandem_requests_total{endpoint, code}: finished HTTP requests by route and status code.
  prometheus::Family<prometheus::Counter>& requests;
  // tandem_requests_running: generation requests in flight through the router.
  prometheus::Gauge& requests_running;
  prometheus::Counter& prompt_tokens;      // tandem_prompt_tokens_total
  prometheus::Counter& generation_tokens;  // tandem_generation_tokens_total
  prometheus::Histogram& ttft;             // tandem_time_to_first_token_seconds
  prometheus::Histogram& inter_token;      // tandem_inter_token_latency_seconds
  prometheus::Histogram& e2e;              // tandem_e2e_request_latency_seconds
  // The TTFT split reported by the decode worker: tandem_ttft_{queue,prefill,transfer,
  // first_decode}_seconds.
  prometheus::Histogram& ttft_queue;
  prometheus::Histogram& ttft_prefill;
  prometheus::Histogram& ttft_transfer;
  prometheus::Histogram& ttft_first_decode;
  // Per-worker view from the stats streams: tandem_worker_{requests_running,requests_waiting,
  // kv_blocks_used,kv_blocks_capacity}{worker, role}, tandem_worker_healthy{worker, role}.
  prometheus::Family<prometheus::Gauge>& worker_running;
  prometheus::Family<prometheus::Gauge>& worker_waiting;
  prometheus::Family<prometheus::Gauge>& worker_kv_blocks_used;
  prometheus::Family<prometheus::Gauge>& worker_kv_blocks_capacity;
  // tandem_pool_{saturation,replicas,recommended_replicas}{pool}: each pool's load and the
  // workers it should have (runtime/router/pool_load.h), for autoscalers.
  prometheus::Family<prometheus::Gauge>& pool_saturation;
  prometheus::Family<prometheus::Gauge>& pool_replicas;
  prometheus::Family<prometheus::Gauge>& pool_recommended_replicas;
  prometheus::Family<prometheus::Gauge>& worker_healthy;
  // KV-aware routing (docs/routing.md): tandem_worker_prefix_cache_blocks{worker, role}, the
  // block hashes the router's index holds for each worker; tandem_routing_prefix_hit_tokens_total
  // {pool}, prompt tokens the chosen worker held per the index; tandem_prefix_index_resyncs_total
  // {pool}, event gaps that forced a full resync; tandem_routing_prefills_total{where}, where
  // prompts were prefilled ("prefill_worker" or "decode_worker").
  prometheus::Family<prometheus::Gauge>& worker_prefix_cache_blocks;
  prometheus::Family<prometheus::Counter>& routing_prefix_hit_tokens;
  prometheus::Family<prometheus::Counter>& prefix_index_resyncs;
  prometheus::Family<prometheus::Counter>& routing_prefills;
};

// KV transfer metrics with the backend as a label. The label values are this worker's own backend
// names and fixed stage names, never a peer's words, so no peer can mint series.
//   tandem_kv_transfer_bytes_total{backend}          bytes moved (sent / received)
//   tandem_kv_transfers_total{backend}                transfers completed
//   tandem_kv_transfer_ops_total{backend}             copy ops posted (/ transfers = ops per one)
//   tandem_kv_transfer_streamed_bytes_total{backend}  bytes posted while the prompt was computed
//   tandem_kv_transfer_failures_total{backend,stage}  failed transfers by where they stopped
//   tandem_kv_transfer_latency_seconds{backend}       first post -> last write landed
//   tandem_kv_transfer_exposed_seconds{backend}       KV complete -> last write landed (what the
//                                                     first token waited for)
//   tandem_kv_transfer_bandwidth_bytes_per_second{backend}  bytes / latency, per transfer
//   tandem_kv_transfer_hidden_ratio{backend}          1 - exposed / latency, per transfer: the
//                                                     fraction of its time under compute
class KvTransferMetrics {
 public:
  explicit KvTransferMetrics(prometheus::Registry& registry);

  struct Backend {
    prometheus::Counter* bytes;
    prometheus::Counter* transfers;
    prometheus::Counter* ops;
    prometheus::Counter* streamed_bytes;
    prometheus::Histogram* latency;
    prometheus::Histogram* exposed;
    prometheus::Histogram* bandwidth;
    prometheus::Histogram* hidden;
  };
  // The series of `backend`, created on first use (thread-safe; the reference stays valid).
  const Backend& For(const std::string& backend);
  void CountFailure(const std::string& backend, const std::string& stage);
  // One completed transfer: its bytes, ops, streamed bytes, and its latencies when it wrote
  // anything (zero durations are not observed).
  void CountTransfer(const std::string& backend, double bytes, double ops, double streamed_bytes,
                     absl::Duration latency, absl::Duration exposed);

  // Sums over every backend (and stage): tests and logs.
  double bytes() const;
  double transfers() const;
  double failures() const;
  double streamed_bytes() const;

 private:
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Counter>& transfers_;
  prometheus::Family<prometheus::Counter>& ops_;
  prometheus::Family<prometheus::Counter>& streamed_bytes_;
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Histogram>& exposed_;
  prometheus::Family<prometheus::Histogram>& bandwidth_;
  prometheus::Family<prometheus::Histogram>& hidden_;
  mutable absl::Mutex mu_;
  absl::node_hash_map<std::string, Backend> backends_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Counter*> failure_series_ ABSL_GUARDED_BY(mu_);
};

struct WorkerMetrics {
  // `model_name`: the label of the vLLM-compatible gauges below.
  explicit WorkerMetrics(prometheus::Registry& registry, const std::string& model_name = "");

  prometheus::Gauge& requests_running;    // tandem_requests_running
  prometheus::Gauge& requests_waiting;    // tandem_requests_waiting
  prometheus::Gauge& kv_blocks_used;      // tandem_kv_blocks_used
  prometheus::Gauge& kv_blocks_capacity;  // tandem_kv_blocks_capacity
  prometheus::Gauge& kv_cache_usage;      // tandem_kv_cache_usage_perc (0..1)
  // The names vLLM exports, with a model_name label, so a Gateway API Inference Extension pool,
  // KEDA or an HPA rule written for vLLM reads them unchanged: vllm:num_requests_running,
  // vllm:num_requests_waiting, vllm:kv_cache_usage_perc (0..1).
  prometheus::Gauge& vllm_requests_running;
  prometheus::Gauge& vllm_requests_waiting;
  prometheus::Gauge& vllm_kv_cache_usage;
  prometheus::Counter& prefix_cache_queries;  // tandem_prefix_cache_queries_total (tokens)
  prometheus::Counter& prefix_cache_hits;     // tandem_prefix_cache_hits_total (tokens)
  // tandem_kv_transfer_*{backend}: KV transfers by this worker's backend (sent on prefill,
  // received on decode).
  KvTransferMetrics kv_transfer;
  // tandem_kv_transfer_fallbacks_total{backend, reason}: endpoints a pair handshake skipped
  // (backend: ours, or "other"; reason: the status code name of why, e.g. FAILED_PRECONDITION for
  // cuda_ipc across hosts).
  prometheus::Family<prometheus::Counter>& kv_transfer_fallbacks;
  // tandem_kv_quarantined_blocks: decode-side KV blocks of failed or abandoned transfers, held back
  // until the prefill worker confirms no write of theirs is in flight or their lease expires.
  prometheus::Gauge& kv_quarantined_blocks;
  // tandem_kv_fences_total{result}: how quarantines ended: "confirmed" (the prefill worker said
  // nothing is in flight) or "lease" (no confirmation; the lease expired).
  prometheus::Family<prometheus::Counter>& kv_fences;
  prometheus::Counter& prompt_tokens;  // tandem_prompt_tokens_total (computed here)
  // tandem_generation_tokens_total: tokens this worker delivers (decode and aggregated workers;
  // a prefill worker's first token is delivered, and counted, by its decode worker).
  prometheus::Counter& generation_tokens;
  // Where the engine thread's time goes (docs/metrics.md): steps run, seconds inside the model
  // runner's forward pass, and seconds of loop iterations that ran a step (forward plus the
  // host work around it: scheduling, sampling, stop checks, output callbacks). busy - forward is
  // the per-step host overhead.
  prometheus::Counter& engine_steps;                   // tandem_engine_steps_total
  prometheus::Counter& engine_forward_seconds;         // tandem_engine_forward_seconds_total
  prometheus::Counter& engine_busy_seconds;            // tandem_engine_busy_seconds_total
  prometheus::Counter& engine_decode_steps;            // tandem_engine_decode_steps_total
  prometheus::Counter& engine_decode_forward_seconds;  // tandem_engine_decode_forward_seconds_total
  prometheus::Counter& engine_decode_sequences;        // tandem_engine_decode_sequences_total
  prometheus::Counter& engine_decode_context_tokens;   // tandem_engine_decode_context_tokens_total
  prometheus::Counter& engine_prefill_steps;           // tandem_engine_prefill_steps_total
  prometheus::Counter&
      engine_prefill_forward_seconds;                 // tandem_engine_prefill_forward_seconds_total
  prometheus::Counter& engine_prefill_chunks;         // tandem_engine_prefill_chunks_total
  prometheus::Counter& engine_prefill_tokens;         // tandem_engine_prefill_tokens_total
  prometheus::Counter& engine_prefill_cached_tokens;  // tandem_engine_prefill_cached_tokens_total
  prometheus::Counter& engine_backlogged_steps;       // tandem_engine_backlogged_steps_total
  prometheus::Counter& engine_gap_seconds;            // tandem_engine_gap_seconds_total
  // Speculative decoding (docs/speculative.md): draft tokens scored, of them accepted,
  // verifications (a sequence's drafts scored in one step), drafter calls that failed or came
  // late (the step ran without drafts), seconds waiting for the drafter.
  prometheus::Counter& spec_draft_tokens;     // tandem_spec_draft_tokens_total
  prometheus::Counter& spec_accepted_tokens;  // tandem_spec_accepted_tokens_total
  prometheus::Counter& spec_verifications;    // tandem_spec_verifications_total
  prometheus::Counter& spec_fallbacks;        // tandem_spec_fallbacks_total
  prometheus::Counter& spec_drafter_seconds;  // tandem_spec_drafter_seconds_total
  // MLP offload (docs/mlp.md).
  prometheus::Counter& mlp_calls;        // tandem_mlp_calls_total
  prometheus::Counter& mlp_failovers;    // tandem_mlp_failovers_total
  prometheus::Counter& mlp_failures;     // tandem_mlp_failures_total
  prometheus::Counter& mlp_plane_calls;  // tandem_mlp_plane_calls_total
};

}  // namespace tandem::metrics

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
  // kv_blocks_used,kv_blocks_total}{worker, role}, tandem_worker_healthy{worker, role}.
  prometheus::Family<prometheus::Gauge>& worker_running;
  prometheus::Family<prometheus::Gauge>& worker_waiting;
  prometheus::Family<prometheus::Gauge>& worker_kv_blocks_used;
  prometheus::Family<prometheus::Gauge>& worker_kv_blocks_total;
  prometheus::Family<prometheus::Gauge>& worker_healthy;
};

struct WorkerMetrics {
  explicit WorkerMetrics(prometheus::Registry& registry);

  prometheus::Gauge& requests_running;         // tandem_requests_running
  prometheus::Gauge& requests_waiting;         // tandem_requests_waiting
  prometheus::Gauge& kv_blocks_used;           // tandem_kv_blocks_used
  prometheus::Gauge& kv_blocks_total;          // tandem_kv_blocks_total
  prometheus::Counter& prefix_cache_queries;   // tandem_prefix_cache_queries_total (tokens)
  prometheus::Counter& prefix_cache_hits;      // tandem_prefix_cache_hits_total (tokens)
  prometheus::Counter& kv_transfer_bytes;      // tandem_kv_transfer_bytes_total (sent or received)
  prometheus::Counter& kv_transfers;           // tandem_kv_transfers_total
  prometheus::Counter& kv_transfer_failures;   // tandem_kv_transfer_failures_total
  prometheus::Histogram& kv_transfer_latency;  // tandem_kv_transfer_latency_seconds (post->done)
  // tandem_kv_transfer_fallbacks_total{backend, reason}: endpoints a pair handshake skipped
  // (backend: ours, or "other"; reason: the status code name of why, e.g. FAILED_PRECONDITION for
  // cuda_ipc across hosts).
  prometheus::Family<prometheus::Counter>& kv_transfer_fallbacks;
  // tandem_kv_transfer_streamed_bytes_total: bytes whose writes were posted while their prompt
  // was still being computed (layer-wise streaming); / tandem_kv_transfer_bytes_total = the
  // fraction of KV sent under compute.
  prometheus::Counter& kv_transfer_streamed_bytes;
  // tandem_kv_quarantined_blocks: decode-side KV blocks of failed or abandoned transfers, held back
  // until the prefill worker confirms no write of theirs is in flight or their lease expires.
  prometheus::Gauge& kv_quarantined_blocks;
  // tandem_kv_fences_total{result}: how quarantines ended: "confirmed" (the prefill worker said
  // nothing is in flight) or "lease" (no confirmation; the lease expired).
  prometheus::Family<prometheus::Counter>& kv_fences;
  prometheus::Counter& prompt_tokens;      // tandem_prompt_tokens_total (computed here)
  prometheus::Counter& generation_tokens;  // tandem_generation_tokens_total
};

}  // namespace tandem::metrics

#pragma once
// Output of a serving benchmark: the text summary (laid out like vLLM's benchmark_serving), the
// sweep table, and the JSON results file (vLLM's field names where they overlap: `completed`,
// `request_throughput`, `mean_ttft_ms`, `ttfts`, `itls`, `input_lens`, ...). Times in per-request
// arrays are seconds (as vLLM's `ttfts`/`itls`); summary latencies are milliseconds.
//
// Pure functions returning strings; the caller writes them.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/serving/stats.h"

namespace tandem::bench {

struct RunInfo {
  std::string backend;  // "openai-chat" or "openai" (vLLM's names for the two endpoints)
  std::string model;
  std::string url;
  std::string date;         // YYYYMMDD-HHMMSS, local time
  double request_rate = 0;  // infinity for a burst
  std::string arrival;      // "poisson" or "constant"
  int max_concurrency = 0;  // 0: unlimited
  int num_prompts = 0;
  double duration_limit_s = 0;
  uint64_t seed = 0;
  Slo slo;
  int max_concurrent = 0;  // observed peak of requests in flight
  bool interrupted = false;
};

std::string FormatSummary(const RunInfo& info, const Summary& s);

// Sweep mode: one fixed-width line per request rate.
std::string SweepHeader();
std::string SweepLine(const RunInfo& info, const Summary& s);

// One run's results object (summary and every per-request record), as compact JSON text.
std::string ResultJson(const RunInfo& info, const Summary& s,
                       const std::vector<RequestRecord>& records);
// Several runs (sweep): {"runs": [ResultJson, ...]}.
std::string SweepJson(const std::vector<std::string>& run_jsons);

}  // namespace tandem::bench

#pragma once
// Per-request records of a serving benchmark and the summary computed from them (the metrics of
// vLLM's benchmark_serving: TTFT, ITL, TPOT, E2E latency, throughputs, goodput under SLOs).
//
// Pure functions over plain data: no I/O, no threads. Times are seconds unless a name says `_ms`.
// Percentiles interpolate linearly between closest ranks (numpy.percentile's default), so numbers
// match vLLM's on the same samples.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::bench {

// Why a request failed. kCancelled marks requests cut short by the user (Ctrl-C, end of
// --duration is not a cancel): they are neither completed nor failed.
enum class ErrorKind {
  kNone,
  kConnect,      // connection refused, unreachable, name resolution
  kHttpStatus,   // a non-200 response
  kReset,        // the connection was closed or reset before the stream ended
  kTruncated,    // the HTTP body ended without `data: [DONE]`
  kMalformed,    // unparsable HTTP, SSE or JSON chunk
  kStreamError,  // the server sent an error object inside the stream
  kTimeout,      // --request-timeout passed
  kCancelled,
};
absl::string_view ErrorKindName(ErrorKind kind);

struct RequestRecord {
  double start_s = 0;          // when the request was sent, since the benchmark start
  double ttft_s = 0;           // to the first non-empty content chunk; 0 when none arrived
  std::vector<double> itls_s;  // gaps between consecutive content chunks
  double e2e_s = 0;            // send to end of stream (or to the failure)
  int prompt_tokens = 0;       // from `usage` when reported, else the client's estimate
  int completion_tokens = 0;   // from `usage` when reported, else the content chunk count
  bool usage_reported = false;
  int http_status = 0;
  ErrorKind error = ErrorKind::kNone;
  std::string error_message;

  bool ok() const { return error == ErrorKind::kNone; }
};

// TPOT of one request: (e2e - ttft) / (completion_tokens - 1); nullopt below two tokens.
std::optional<double> Tpot(const RequestRecord& r);

// Service-level objectives for goodput (vLLM's --goodput): a completed request is "good" when
// every given bound holds.
struct Slo {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
};
// Parses "ttft=MS,tpot=MS,e2el=MS" (any subset; `:` also accepted for `=`).
absl::StatusOr<Slo> ParseSlo(absl::string_view text);
bool MeetsSlo(const RequestRecord& r, const Slo& slo);

// numpy.percentile(values, p) with linear interpolation; `sorted` ascending, non-empty.
double Percentile(const std::vector<double>& sorted, double p);

struct Distribution {
  size_t count = 0;
  double mean = 0, median = 0, std = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};
// Zeros when `values` is empty. Population standard deviation (numpy.std).
Distribution Describe(std::vector<double> values);

struct Summary {
  double duration_s = 0;
  int completed = 0;
  int failed = 0;
  int cancelled = 0;
  int64_t total_input_tokens = 0;   // over completed requests
  int64_t total_output_tokens = 0;  // over completed requests
  double request_throughput = 0;    // completed / duration
  double input_throughput = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  int good_completed = 0;  // completed requests meeting the SLO (all completed when no SLO)
  double request_goodput = 0;
  Distribution ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::map<std::string, int> errors_by_kind;  // ErrorKindName -> count (failed requests)
  std::map<int, int> http_status_counts;      // non-200 statuses seen
  double max_output_tokens_per_s = 0;  // busiest 1 s window (duration/10 for runs under 10 s)
};

// `duration_s`: benchmark wall time (first send to last completion). Only completed requests enter
// latency and token statistics, as in vLLM.
Summary Summarize(const std::vector<RequestRecord>& records, double duration_s, const Slo& slo);

// Output tokens per `bin_s` window over the run, each request's tokens spread evenly over its
// content chunks (index i covers [i*bin_s, (i+1)*bin_s)).
std::vector<double> OutputTokensPerSecond(const std::vector<RequestRecord>& records, double bin_s);

}  // namespace tandem::bench

#pragma once
// The load-generating client of `tandem bench`: sends OpenAI streaming requests
// (/v1/chat/completions or /v1/completions, `stream_options.include_usage`) on an arrival schedule
// with bounded concurrency, and times every streamed chunk.
//
// One I/O thread (Boost.Asio, private to client.cc) runs every connection: HTTP/1.1 keep-alive
// pool, incremental SSE parsing, one deadline per request. It is built so that the client is
// never the bottleneck (thousands of concurrent streams on one core).
//
// Failures of the endpoint (refused connections, HTTP errors, resets, malformed streams,
// timeouts) are recorded per request by kind; RunLoad itself fails only on bad options or an
// unresolvable host. Thread-safety: RunLoad blocks its caller; `stop` and the progress callback
// are the only things shared with other threads (the callback runs on the I/O thread).

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/serving/stats.h"
#include "bench/serving/workload.h"

namespace tandem::bench {

enum class ApiEndpoint { kChat, kCompletions };

// "http://host:port/base" split up; https is not supported.
struct ParsedUrl {
  std::string host;
  std::string port;
  std::string base_path;  // without trailing '/', e.g. "/v1"
};
absl::StatusOr<ParsedUrl> ParseUrl(const std::string& url);

struct LoadOptions {
  std::string url;  // e.g. http://127.0.0.1:8000/v1
  std::string model;
  ApiEndpoint endpoint = ApiEndpoint::kChat;
  std::string api_key;  // sent as "Authorization: Bearer" when non-empty
  bool ignore_eos = false;
  double temperature = 0;
  // `--extra-body`: JSON object members merged into every request body (vLLM bench's flag), e.g.
  // a response_format; a member named like one of ours replaces it. "" for none.
  std::string extra_body;
  double request_rate = std::numeric_limits<double>::infinity();
  Arrival arrival = Arrival::kPoisson;
  uint64_t seed = 0;
  int max_concurrency = 0;  // 0: unlimited
  // Requests to send; items are used in order and cycled. With duration_s > 0, sending stops
  // at whichever of the two comes first (num_requests 0: no count limit): requests scheduled
  // before duration_s are sent, those still waiting for a concurrency slot then are dropped.
  // An infinite rate is a closed loop (a new request as each one finishes, max_concurrency in
  // flight); with only a duration it needs max_concurrency.
  int num_requests = 0;
  double duration_s = 0;
  double request_timeout_s = 600;
};

struct Progress {
  int sent = 0;
  int finished = 0;  // completed + failed
  int failed = 0;
  int in_flight = 0;
  int total = 0;  // 0 when the run is bounded by time only
  double elapsed_s = 0;
  double duration_s = 0;  // the --duration bound, 0 when none
};

struct LoadResult {
  std::vector<RequestRecord> records;  // in send order
  double duration_s = 0;               // start to the last request's end
  int max_concurrent = 0;
  bool interrupted = false;  // `stop` was raised; in-flight requests are marked cancelled
};

// Runs the load against `items` (non-empty). When `*stop` becomes true (polled every 50 ms),
// nothing more is sent and in-flight requests are cancelled; what finished is returned.
// `on_progress`, when set, is called about every 100 ms and once at the end.
absl::StatusOr<LoadResult> RunLoad(const LoadOptions& options, const std::vector<WorkItem>& items,
                                   const std::atomic<bool>* stop,
                                   const std::function<void(const Progress&)>& on_progress);

// GET {url}/models and return the first model id (what vLLM's client does without --model).
absl::StatusOr<std::string> FetchFirstModel(const std::string& url, const std::string& api_key,
                                            double timeout_s);

// GET http://host:port{path}, returning the body of a 200 response (used by tests and to read
// /metrics); other statuses are errors.
absl::StatusOr<std::string> HttpGet(const std::string& host, const std::string& port,
                                    const std::string& path, double timeout_s,
                                    const std::string& api_key = "");

// The JSON body of one request (exposed for tests).
std::string RequestBody(const LoadOptions& options, const WorkItem& item);

}  // namespace tandem::bench

#pragma once
// The router's view of "something that generates tokens": the OpenAI frontend (http_server,
// openai_*) talks only to this interface; GrpcGenerationBackend implements it over the decode
// and prefill pools (discovery, routing policy, Decode.Generate streams), and tests use fakes.
//
// Threading: Generate and Cancel may be called from any thread. `on_event` is called from a
// backend thread, never concurrently for one request, never after the final event. The final
// event is either a chunk with finish_reason set or an error status (Unavailable: no healthy
// worker; DeadlineExceeded; Internal: a worker failed mid-stream). Exactly one final event per
// Generate call, always — a request is never silently dropped.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/sampling/sampling_params.h"

namespace tandem::router {

struct BackendTopLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct BackendTokenLogprobs {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<BackendTopLogprob> top;
  int rank = 0;  // prompt logprobs: 1 + tokens with a higher logprob; 0 for sampled tokens
};

struct BackendUsage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;
};

// Where the time to first token went (microseconds), as the decode worker reports it.
struct TtftParts {
  int64_t queue_us = 0;
  int64_t prefill_us = 0;
  int64_t transfer_us = 0;
  int64_t first_decode_us = 0;
};

struct BackendRequest {
  std::string request_id;  // unique per Generate call (the router suffixes choice indexes)
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
  absl::Time deadline = absl::InfiniteFuture();
  int priority = 0;  // the request's `priority`: lower is scheduled first on the workers
};

struct BackendChunk {
  std::vector<int32_t> token_ids;              // tokens since the previous chunk
  std::vector<BackendTokenLogprobs> logprobs;  // parallel to token_ids when requested
  std::string text;                            // detokenized delta
  std::optional<std::string> finish_reason;    // "stop" | "length" | "abort" on the final chunk
  BackendUsage usage;                          // running totals
  std::optional<TtftParts> ttft;               // on the first chunk carrying a token
  // params.prompt_logprobs: on the first chunk carrying a token, prompt tokens 1..n-1 (n - 1
  // entries), each scored against the logits before it.
  std::vector<BackendTokenLogprobs> prompt_logprobs = {};
};

using BackendEventCallback = std::function<void(absl::StatusOr<BackendChunk>)>;

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  virtual void Generate(BackendRequest request, BackendEventCallback on_event) = 0;
  // Best effort; the request still gets its final event (finish_reason "abort" or an error).
  virtual void Cancel(const std::string& request_id) = 0;
  // OK when a request could be served now; Unavailable (with the reason) when a pool has no
  // healthy worker. The frontend answers 503 then.
  virtual absl::Status Ready() const = 0;
};

}  // namespace tandem::router

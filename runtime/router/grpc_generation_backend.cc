#include "runtime/router/grpc_generation_backend.h"

#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"
#include "runtime/base/logging.h"
#include "runtime/base/secrets.h"
#include "runtime/server/sampling_convert.h"
#include "tandem/v1/decode.grpc.pb.h"

namespace tandem::router {
namespace {

BackendChunk ChunkFromProto(const v1::GenerateResponse& r) {
  BackendChunk chunk;
  chunk.token_ids.assign(r.token_ids().begin(), r.token_ids().end());
  for (const v1::TokenLogprobs& lp : r.logprobs()) {
    BackendTokenLogprobs out{lp.token_id(), lp.logprob(), {}};
    for (const v1::TopLogprob& top : lp.top()) out.top.push_back({top.token_id(), top.logprob()});
    chunk.logprobs.push_back(std::move(out));
  }
  for (const v1::TokenLogprobs& lp : r.prompt_logprobs()) {
    BackendTokenLogprobs out{lp.token_id(), lp.logprob(), {}, lp.rank()};
    for (const v1::TopLogprob& top : lp.top()) out.top.push_back({top.token_id(), top.logprob()});
    chunk.prompt_logprobs.push_back(std::move(out));
  }
  chunk.text = r.text();
  if (!r.finish_reason().empty()) chunk.finish_reason = r.finish_reason();
  chunk.usage.prompt_tokens = r.usage().prompt_tokens();
  chunk.usage.completion_tokens = r.usage().completion_tokens();
  chunk.usage.cached_prompt_tokens = r.usage().cached_prompt_tokens();
  if (r.has_ttft()) {
    chunk.ttft = TtftParts{r.ttft().queue_us(), r.ttft().prefill_us(), r.ttft().transfer_us(),
                           r.ttft().first_decode_us()};
  }
  return chunk;
}

// Codes that say the request itself is at fault: another worker would answer the same.
bool IsRequestError(grpc::StatusCode code) {
  return code == grpc::StatusCode::INVALID_ARGUMENT || code == grpc::StatusCode::OUT_OF_RANGE ||
         code == grpc::StatusCode::FAILED_PRECONDITION || code == grpc::StatusCode::UNIMPLEMENTED ||
         code == grpc::StatusCode::PERMISSION_DENIED || code == grpc::StatusCode::UNAUTHENTICATED ||
         code == grpc::StatusCode::ALREADY_EXISTS;
}

}  // namespace

// One request: its state across attempts. `tried` and `last_error` are touched only by the
// request's current step (Generate, then each attempt's OnDone, one after another); the fields
// under `mu` also by Cancel and the watchdog.
struct GrpcGenerationBackend::Stream {
  BackendRequest request;
  BackendEventCallback on_event;
  bool duplicate = false;
  BackendUsage usage;  // latest running totals
  // Sent with Generate; Decode.Cancel must present it (the decode worker honours no other).
  std::string cancel_token;
  absl::flat_hash_set<std::string> tried;  // decode workers attempted
  absl::Status last_error;                 // of the last failed attempt
  int attempts = 0;                        // Decode.Generate calls made
  bool force_local = false;                // the next attempt prefills on its decode worker
  std::vector<int32_t> generated;          // tokens delivered to the client so far
  int migrations = 0;                      // times moved to another decode worker mid-stream
  int migrated_tokens = 0;                 // of `generated`, those in the live attempt's prompt
  int64_t delivered_text_bytes = 0;        // text delivered to the client so far
  int64_t migrated_text_bytes = 0;         // of it, the part the live attempt resumes after

  absl::Mutex mu;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  bool worker_lost ABSL_GUARDED_BY(mu) = false;  // the watchdog took it off an unresponsive D
  grpc::ClientContext* context ABSL_GUARDED_BY(mu) = nullptr;  // the live attempt's
  std::shared_ptr<WorkerChannel> decode ABSL_GUARDED_BY(mu);
  // The live attempt's request id on its decode worker (the request's id, then "id#2", ...: an
  // abandoned attempt may linger there) and its prefill worker ("" = none).
  std::string attempt_id ABSL_GUARDED_BY(mu);
  std::string prefill ABSL_GUARDED_BY(mu);
  bool delivered ABSL_GUARDED_BY(mu) = false;     // a token reached the client
  bool prefill_lost ABSL_GUARDED_BY(mu) = false;  // the watchdog gave up on its prefill worker

  bool is_cancelled() {
    absl::MutexLock lock(&mu);
    return cancelled;
  }
  // The final "abort" chunk of a cancelled request.
  BackendChunk AbortChunk() const {
    BackendChunk chunk;
    chunk.finish_reason = "abort";
    chunk.usage = usage;
    return chunk;
  }
};

// One Decode.Generate call of a request: a client read reactor that gRPC drives (no thread of
// its own). Reads chunks and passes them on until the final one, then reports how the call ended
// to AttemptDone from OnDone and deletes itself.
class GrpcGenerationBackend::AttemptCall final
    : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  AttemptCall(GrpcGenerationBackend* backend, std::shared_ptr<Stream> stream,
              std::shared_ptr<WorkerChannel> decode, std::shared_ptr<WorkerChannel> prefill,
              v1::GenerateRequest request)
      : backend_(backend),
        stream_(std::move(stream)),
        decode_(std::move(decode)),
        prefill_(std::move(prefill)),
        stub_(v1::Decode::NewStub(decode_->channel())),
        request_(std::move(request)) {
    if (stream_->request.deadline != absl::InfiniteFuture()) {
      context_.set_deadline(absl::ToChronoTime(stream_->request.deadline));
    }
  }

  grpc::ClientContext* context() { return &context_; }

  // Counts the call on its workers and starts it; OnDone follows, always. (A call never started
  // may simply be deleted.)
  void Start() {
    decode_->AddInflight(1);
    if (prefill_ != nullptr) prefill_->AddInflight(1);
    stub_->async()->Generate(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    BackendChunk chunk = ChunkFromProto(response_);
    if (const int moved = stream_->migrated_tokens; moved > 0) {
      // A migrated request: the tokens already delivered are in this attempt's prompt.
      chunk.usage.prompt_tokens -= moved;
      chunk.usage.completion_tokens += moved;
      chunk.ttft.reset();
    }
    stream_->usage = chunk.usage;
    if (!chunk.token_ids.empty()) PrefillDone();
    if (response_.finish_reason() == "error") {
      outcome_.worker_error =
          response_.error_message().empty() ? "worker error" : response_.error_message();
      context_.TryCancel();
      return;
    }
    if (chunk.finish_reason.has_value()) {
      outcome_.final_chunk = std::move(chunk);
      context_.TryCancel();  // nothing follows a final chunk
      return;
    }
    if (!chunk.token_ids.empty() || !chunk.text.empty()) {
      if (!outcome_.delivered) {
        absl::MutexLock lock(&stream_->mu);
        stream_->delivered = true;
      }
      outcome_.delivered = true;
      stream_->generated.insert(stream_->generated.end(), chunk.token_ids.begin(),
                                chunk.token_ids.end());
      stream_->delivered_text_bytes += static_cast<int64_t>(chunk.text.size());
      stream_->on_event(std::move(chunk));
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    PrefillDone();
    decode_->AddInflight(-1);
    outcome_.status = status;
    backend_->AttemptDone(stream_, decode_->address(), std::move(outcome_));
    delete this;
  }

 private:
  void PrefillDone() {
    if (prefill_ != nullptr) prefill_->AddInflight(-1);
    prefill_ = nullptr;
  }

  GrpcGenerationBackend* const backend_;
  const std::shared_ptr<Stream> stream_;
  const std::shared_ptr<WorkerChannel> decode_;
  std::shared_ptr<WorkerChannel> prefill_;  // until the first token (its in-flight count)
  std::unique_ptr<v1::Decode::Stub> stub_;
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  AttemptOutcome outcome_;
};

GrpcGenerationBackend::GrpcGenerationBackend(WorkerPool* decode_pool, WorkerPool* prefill_pool,
                                             GrpcBackendOptions options)
    : decode_pool_(decode_pool), prefill_pool_(prefill_pool), options_(std::move(options)) {
  watchdog_ = std::thread([this] { Watchdog(); });
}

GrpcGenerationBackend::~GrpcGenerationBackend() {
  stop_watchdog_.Notify();
  watchdog_.join();
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, stream] : streams_) ids.push_back(id);
  }
  for (const std::string& id : ids) Cancel(id);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* active) { return *active == 0; }, &active_));
}

int GrpcGenerationBackend::active_requests() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

absl::Status GrpcGenerationBackend::Ready() const {
  const int healthy = decode_pool_->HealthyCount();
  if (healthy > 0) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("no healthy decode worker (", decode_pool_->size(), " known)"));
}

void GrpcGenerationBackend::Generate(BackendRequest request, BackendEventCallback on_event) {
  auto stream = std::make_shared<Stream>();
  stream->usage.prompt_tokens = static_cast<int>(request.prompt_token_ids.size());
  stream->request = std::move(request);
  stream->on_event = std::move(on_event);
  if (absl::StatusOr<std::string> token = RandomBytes(16); token.ok()) {
    stream->cancel_token = *std::move(token);
  } else {
    stream->on_event(token.status());
    return;
  }
  SamplingParams& params = stream->request.params;
  if (params.temperature > 0 && !params.seed.has_value()) {
    // Fixed here, not by the worker, so that a migrated request draws exactly the tokens it
    // would have drawn on its first worker (engine.h GenerateRequest::resumed_output_tokens).
    absl::StatusOr<std::string> seed = RandomBytes(8);
    if (!seed.ok()) {
      stream->on_event(seed.status());
      return;
    }
    uint64_t value = 0;
    std::memcpy(&value, seed->data(), sizeof(value));
    params.seed = value;
  }
  bool at_capacity = false;
  {
    absl::MutexLock lock(&mu_);
    at_capacity = active_ >= options_.max_streams;
    if (!at_capacity) {
      ++active_;
      stream->duplicate = !streams_.emplace(stream->request.request_id, stream).second;
    }
  }
  if (at_capacity) {
    // Answered on the caller's thread, with no lock held (the callback may call Cancel): the one
    // event of a request refused outright.
    stream->on_event(absl::ResourceExhaustedError(absl::StrCat(
        "router at capacity (", options_.max_streams, " requests in flight); retry later")));
    return;
  }
  if (stream->duplicate) {
    Finish(stream, absl::InvalidArgumentError(absl::StrCat(
                       "request id ", stream->request.request_id, " is already in flight")));
    return;
  }
  StartAttempt(stream);
}

void GrpcGenerationBackend::Cancel(const std::string& request_id) {
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(request_id);
    if (it == streams_.end()) return;
    stream = it->second;
  }
  std::shared_ptr<WorkerChannel> decode;
  std::string attempt_id;
  {
    absl::MutexLock lock(&stream->mu);
    if (stream->cancelled) return;
    stream->cancelled = true;
    if (stream->context != nullptr) stream->context->TryCancel();
    decode = stream->decode;
    attempt_id = stream->attempt_id;
  }
  if (decode != nullptr) SendCancel(decode, attempt_id, stream->cancel_token);
}

void GrpcGenerationBackend::SendCancel(const std::shared_ptr<WorkerChannel>& decode,
                                       const std::string& request_id,
                                       const std::string& cancel_token) {
  // Cancelling the stream already tells D; Decode.Cancel also reaches a D whose stream has not
  // seen the cancellation yet. Fire and forget: the callback owns everything it touches.
  struct Call {
    std::unique_ptr<v1::Decode::Stub> stub;
    grpc::ClientContext context;
    v1::CancelRequest request;
    v1::CancelResponse response;
  };
  auto* call = new Call;
  call->stub = v1::Decode::NewStub(decode->channel());
  call->request.set_request_id(request_id);
  call->request.set_cancel_token(cancel_token);
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + options_.cancel_timeout));
  call->stub->async()->Cancel(&call->context, &call->request, &call->response,
                              [call](grpc::Status) { delete call; });
}

void GrpcGenerationBackend::Watchdog() {
  while (!stop_watchdog_.WaitForNotificationWithTimeout(options_.watchdog_interval)) {
    const absl::Time now = absl::Now();
    std::vector<WorkerSnapshot> workers = decode_pool_->Snapshot();
    if (prefill_pool_ != nullptr) {
      for (WorkerSnapshot& w : prefill_pool_->Snapshot()) workers.push_back(std::move(w));
    }
    absl::flat_hash_set<std::string> lost;  // decode and prefill addresses
    std::vector<std::shared_ptr<Stream>> streams;
    {
      absl::MutexLock lock(&mu_);
      absl::flat_hash_map<std::string, absl::Time> not_live;
      for (const WorkerSnapshot& w : workers) {
        if (w.live) continue;
        auto it = not_live_since_.find(w.address);
        const absl::Time since = it == not_live_since_.end() ? now : it->second;
        not_live[w.address] = since;
        if (now - since >= options_.unresponsive_timeout) lost.insert(w.address);
      }
      not_live_since_ = std::move(not_live);
      if (!lost.empty()) {
        for (const auto& [id, stream] : streams_) streams.push_back(stream);
      }
    }
    for (const std::shared_ptr<Stream>& stream : streams) {
      absl::MutexLock lock(&stream->mu);
      if (stream->context == nullptr || stream->decode == nullptr) continue;
      if (lost.contains(stream->decode->address())) {
        stream->worker_lost = true;
        stream->context->TryCancel();
      } else if (!stream->prefill.empty() && !stream->delivered && lost.contains(stream->prefill)) {
        // Its prefill worker froze: leave it and prefill on a decode worker instead.
        stream->prefill_lost = true;
        stream->context->TryCancel();
      }
    }
  }
}

std::string GrpcGenerationBackend::ChoosePrefill(std::span<const int32_t> prompt,
                                                 int decode_cached_tokens) {
  const int prompt_tokens = static_cast<int>(prompt.size());
  if (prefill_pool_ == nullptr || PrefillLocallyForLength(prompt_tokens - decode_cached_tokens,
                                                          options_.local_prefill_threshold)) {
    return "";
  }
  const std::vector<WorkerSnapshot> workers = options_.policy == RoutingPolicy::kKvAware
                                                  ? prefill_pool_->Snapshot(prompt)
                                                  : prefill_pool_->Snapshot();
  absl::MutexLock lock(&mu_);
  const int index = PickPrefillWorker(options_.policy, workers, prefill_cursor_++, prompt_tokens,
                                      options_.kv_aware);
  if (index != kNoWorker && workers[index].cached_prefix_tokens > 0) {
    if (metrics::RouterMetrics* m = metrics_.load()) {
      m->routing_prefix_hit_tokens.Add({{"pool", "prefill"}})
          .Increment(workers[index].cached_prefix_tokens);
    }
  }
  if (index == kNoWorker) {
    if (!prefill_down_logged_) {
      prefill_down_logged_ = true;
      LOG(WARNING) << "router: no healthy prefill worker (" << workers.size()
                   << " known); decode workers prefill locally until one is back";
    }
    return "";
  }
  if (prefill_down_logged_) {
    prefill_down_logged_ = false;
    LOG(INFO) << "router: prefill worker " << workers[index].address
              << " healthy again; disaggregated prefill resumes";
  }
  return workers[index].address;
}

void GrpcGenerationBackend::Finish(const std::shared_ptr<Stream>& stream,
                                   absl::StatusOr<BackendChunk> event) {
  {
    absl::MutexLock lock(&stream->mu);
    stream->context = nullptr;
  }
  stream->on_event(std::move(event));
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream->request.request_id);
  if (!stream->duplicate && it != streams_.end() && it->second == stream) streams_.erase(it);
  --active_;
}

void GrpcGenerationBackend::StartAttempt(const std::shared_ptr<Stream>& stream) {
  const BackendRequest& request = stream->request;
  if (stream->is_cancelled()) return Finish(stream, stream->AbortChunk());
  if (absl::Now() >= request.deadline) {
    return Finish(stream,
                  absl::DeadlineExceededError("request deadline passed before it was sent"));
  }
  if (static_cast<int>(stream->tried.size()) >= options_.max_attempts) {
    return Finish(stream, absl::UnavailableError(absl::StrCat(
                              "request failed on ", stream->tried.size(),
                              " decode workers; last: ", stream->last_error.message())));
  }
  // What D is asked to take as its prompt: the request's, plus (after a migration) the tokens the
  // client already has.
  std::vector<int32_t> prompt = request.prompt_token_ids;
  prompt.insert(prompt.end(), stream->generated.begin(),
                stream->generated.begin() + stream->migrated_tokens);
  const int prompt_tokens = static_cast<int>(prompt.size());
  std::vector<WorkerSnapshot> workers = options_.policy == RoutingPolicy::kKvAware
                                            ? decode_pool_->Snapshot(prompt)
                                            : decode_pool_->Snapshot();
  for (WorkerSnapshot& w : workers) {
    if (stream->tried.contains(w.address)) w.healthy = false;
  }
  int index;
  {
    absl::MutexLock lock(&mu_);
    index = PickDecodeWorker(options_.policy, workers, prompt_tokens, decode_cursor_++,
                             options_.kv_aware);
  }
  std::shared_ptr<WorkerChannel> decode =
      index == kNoWorker ? nullptr : decode_pool_->Get(workers[index].address);
  if (decode == nullptr) {
    return Finish(stream, stream->tried.empty()
                              ? absl::UnavailableError(absl::StrCat("no healthy decode worker (",
                                                                    workers.size(), " known)"))
                              : absl::UnavailableError(absl::StrCat(
                                    stream->generated.empty()
                                        ? "decode worker failed before the first token and no "
                                          "other is healthy: "
                                        : "decode worker failed mid-stream and no other is "
                                          "healthy to continue it: ",
                                    stream->last_error.message())));
  }
  stream->tried.insert(decode->address());
  const int decode_cached = workers[index].cached_prefix_tokens;
  // A migrated attempt samples its next token on D (at its seed position), and a request scoring
  // its prompt is prefilled where its first token is sampled: no prefill worker.
  const std::string prefill = stream->force_local || stream->migrated_tokens > 0 ||
                                      request.params.prompt_logprobs.has_value()
                                  ? std::string()
                                  : ChoosePrefill(prompt, decode_cached);
  if (options_.policy == RoutingPolicy::kKvAware) {
    // Until their events arrive, the chosen workers count as holding this prompt.
    decode_pool_->NoteRouted(decode->address(), prompt);
    if (!prefill.empty() && prefill_pool_ != nullptr) prefill_pool_->NoteRouted(prefill, prompt);
  }
  if (metrics::RouterMetrics* m = metrics_.load()) {
    if (decode_cached > 0) {
      m->routing_prefix_hit_tokens.Add({{"pool", "decode"}}).Increment(decode_cached);
    }
    m->routing_prefills.Add({{"where", prefill.empty() ? "decode_worker" : "prefill_worker"}})
        .Increment();
  }
  const std::string attempt_id = stream->attempts == 0
                                     ? request.request_id
                                     : absl::StrCat(request.request_id, "#", stream->attempts + 1);
  ++stream->attempts;

  v1::GenerateRequest proto;
  proto.set_request_id(attempt_id);
  proto.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
  SamplingParams params = request.params;
  if (stream->migrated_tokens > 0) {
    // Continue where the client is: its tokens so far joined the prompt, as resumed output.
    proto.set_resumed_output_tokens(stream->migrated_tokens);
    proto.set_resumed_text_bytes(stream->migrated_text_bytes);
    params.prompt_logprobs.reset();  // they went out with the first token
    if (params.max_tokens.has_value()) {
      params.max_tokens = std::max(1, *params.max_tokens - stream->migrated_tokens);
    }
  }
  *proto.mutable_sampling() = server::SamplingParamsToProto(params);
  proto.set_prefill_worker(prefill);
  proto.set_cancel_token(stream->cancel_token);
  proto.set_priority(request.priority);
  std::shared_ptr<WorkerChannel> prefill_channel =
      prefill.empty() || prefill_pool_ == nullptr ? nullptr : prefill_pool_->Get(prefill);

  auto* call = new AttemptCall(this, stream, decode, std::move(prefill_channel), std::move(proto));
  bool cancelled;
  {
    absl::MutexLock lock(&stream->mu);
    cancelled = stream->cancelled;
    if (!cancelled) {
      stream->context = call->context();
      stream->decode = decode;
      stream->worker_lost = false;
      stream->prefill_lost = false;
      stream->attempt_id = attempt_id;
      stream->prefill = prefill;
    }
  }
  if (cancelled) {
    delete call;  // never started
    return Finish(stream, stream->AbortChunk());
  }
  call->Start();
}

void GrpcGenerationBackend::AttemptDone(const std::shared_ptr<Stream>& stream,
                                        const std::string& decode_address, AttemptOutcome outcome) {
  const BackendRequest& request = stream->request;
  bool cancelled;
  bool worker_lost;
  bool prefill_lost;
  std::string prefill;
  {
    absl::MutexLock lock(&stream->mu);
    stream->context = nullptr;
    cancelled = stream->cancelled;
    worker_lost = stream->worker_lost;
    prefill_lost = stream->prefill_lost;
    prefill = stream->prefill;
  }
  if (outcome.final_chunk.has_value()) return Finish(stream, *std::move(outcome.final_chunk));
  if (cancelled) return Finish(stream, stream->AbortChunk());
  const std::string where = absl::StrCat("decode worker ", decode_address);
  if (prefill_lost && !outcome.delivered) {
    // The decode worker is fine: try it again, prefilling there.
    LOG(WARNING) << "router: request " << request.request_id << ": prefill worker " << prefill
                 << " unresponsive (no fresh stats) for "
                 << absl::FormatDuration(options_.unresponsive_timeout)
                 << "; prefilling on a decode worker instead";
    stream->tried.erase(decode_address);
    stream->force_local = true;
    stream->last_error =
        absl::UnavailableError(absl::StrCat("prefill worker ", prefill, " unresponsive"));
    return StartAttempt(stream);
  }
  std::string worker_error = std::move(outcome.worker_error);
  if (worker_lost) {
    worker_error = absl::StrCat("unresponsive (no fresh stats) for ",
                                absl::FormatDuration(options_.unresponsive_timeout));
  }
  const grpc::Status& status = outcome.status;
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      absl::Now() >= request.deadline) {
    return Finish(stream,
                  absl::DeadlineExceededError(absl::StrCat(where, ": request deadline exceeded")));
  }
  if (worker_error.empty() && IsRequestError(status.error_code())) {
    return Finish(stream, absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                       status.error_message()));
  }
  const std::string why = !worker_error.empty() ? worker_error
                          : status.ok()
                              ? std::string("stream ended without a finish reason")
                              : absl::StrCat("gRPC ", static_cast<int>(status.error_code()), ": ",
                                             status.error_message());
  if (!stream->generated.empty()) {
    // Mid-stream (the client has tokens, from this attempt or an earlier one).
    if (stream->migrations < options_.max_migrations) {
      // Continue exactly from the tokens the client has: replay the prompt and them on another
      // decode worker (the failed one counts as tried) as resumed output, with the request's
      // seed, so sampling, penalties and stop strings carry on where they were.
      ++stream->migrations;
      stream->migrated_tokens = static_cast<int>(stream->generated.size());
      stream->migrated_text_bytes = stream->delivered_text_bytes;
      LOG(WARNING) << "router: request " << request.request_id << ": " << where
                   << " failed mid-stream (" << why << "); migrating its "
                   << stream->migrated_tokens << " tokens to another decode worker (migration "
                   << stream->migrations << " of at most " << options_.max_migrations << ")";
      stream->last_error = absl::UnavailableError(absl::StrCat(where, ": ", why));
      return StartAttempt(stream);
    }
    return Finish(stream, absl::InternalError(absl::StrCat(where, " failed mid-stream: ", why,
                                                           " (migrations exhausted)")));
  }
  LOG(WARNING) << "router: request " << request.request_id << " failed on " << where
               << " before its first token (" << why << "); retrying elsewhere";
  stream->last_error = absl::UnavailableError(absl::StrCat(where, ": ", why));
  StartAttempt(stream);
}

}  // namespace tandem::router

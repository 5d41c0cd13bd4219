#include "decode/decode_service.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/auth/kv_grant.h"
#include "runtime/base/logging.h"
#include "runtime/base/secrets.h"
#include "runtime/server/grpc_status.h"
#include "runtime/server/kv_layout_convert.h"
#include "runtime/server/proto_convert.h"

namespace tandem::decode {
namespace {

// A cancel token shorter than this is refused (a guessable one would protect nothing).
constexpr size_t kMinCancelTokenBytes = 16;

grpc::Status Error(grpc::StatusCode code, std::string message) {
  return grpc::Status(code, std::move(message));
}

// A Generate refused before anything started: finishes at once with its status.
class Refusal final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit Refusal(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

// One Prefill.Connect to a prefill worker, shared by every call that waits for that pair.
struct DecodeService::PairingAttempt {
  std::string address;
  std::shared_ptr<v1::Prefill::Stub> stub;
  grpc::ClientContext context;
  v1::ConnectRequest request;
  v1::ConnectResponse response;
  std::string grant_key;

  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<Pairing> result ABSL_GUARDED_BY(mu) = absl::UnknownError("pairing");
  std::vector<std::weak_ptr<GenerateCall>> waiters ABSL_GUARDED_BY(mu);
};

// One Decode.Generate: the request's state object and its server write reactor. Events (engine
// outputs, the reservation, Prefill/Fence/Connect answers, writes done, cancellation, timers)
// land in the mailbox under `mu_` and poke the strand; Step() runs on the service's executor, one
// at a time, and is the only code that touches the rest of the state.
class DecodeService::GenerateCall final : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                                          public std::enable_shared_from_this<GenerateCall> {
 public:
  GenerateCall(DecodeService* service, grpc::CallbackServerContext* context,
               const v1::GenerateRequest* request, SamplingParams params)
      : service_(service),
        context_(context),
        request_(request),
        params_(std::move(params)),
        want_logprobs_(params_.logprobs.has_value()),
        id_(request->request_id()),
        arrival_(absl::Now()),
        cancel_token_(request->cancel_token()),
        owner_(service->identity_->Peer(*context)) {}

  // Keeps itself alive until OnDone and runs its first step.
  void Start() {
    self_ = shared_from_this();
    std::weak_ptr<GenerateCall> weak = self_;
    strand_ = Strand::Create(service_->executor_, [weak] {
      if (std::shared_ptr<GenerateCall> call = weak.lock()) call->Step();
    });
    strand_->Poke();
  }

  void Poke() { strand_->Poke(); }

  // Decode.Cancel from the request's owner (token and peer checked by the caller).
  bool OwnedBy(const std::string& token, const std::string& peer) const {
    return !cancel_token_.empty() && ConstantTimeEquals(token, cancel_token_) && owner_ == peer;
  }
  void RequestCancel() {
    {
      absl::MutexLock lock(&mu_);
      cancel_requested_ = true;
    }
    Poke();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (!ok) write_failed_ = true;
    }
    Poke();
  }
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      client_cancelled_ = true;
    }
    Poke();
  }
  void OnDone() override {
    // Nothing of gRPC's refers to this call any more; the engine's and the Prefill/Fence
    // callbacks hold it through shared_ptr and only touch the mailbox.
    self_.reset();
  }

 private:
  enum class Phase {
    kStarting,
    kPairing,
    kAdmitting,
    kReserving,
    kPrefilling,
    kFencing,
    kStreaming,
    kDone
  };

  void Step();
  void Begin();
  // The pair is known (or failed): ask the prefill worker to admit the prompt first (two-phase
  // reservation), or submit to the engine at once.
  void Submit(std::optional<Pairing> pairing);
  void SendAdmit();
  // Submits to the engine: remotely prefilled (reserving blocks) unless prefill_worker_ is empty.
  void SubmitToEngine();
  void SendPrefill(const RemoteKvReservation& reservation, absl::Time now);
  void AfterPrefill(const grpc::Status& status, absl::Time now, bool cancel_rpc);
  void HandleOutput(GenerationOutput& out, absl::Time now);
  void RequestCancelLocally(grpc::Status why);
  bool BlocksFenced() const { return phase_ != Phase::kPrefilling && phase_ != Phase::kFencing; }
  // Ends the call with `status` once the queued writes are out (only an OK status waits for
  // them); forgets it in the service.
  void End(grpc::Status status);
  void FlushWrites();
  void ScheduleWake(absl::Time when);

  DecodeService* const service_;
  grpc::CallbackServerContext* const context_;
  const v1::GenerateRequest* const request_;
  const SamplingParams params_;
  const bool want_logprobs_;
  const std::string id_;  // request_ is not read after Finish: gRPC may free it
  const absl::Time arrival_;
  const std::string cancel_token_;
  const std::string owner_;
  std::shared_ptr<GenerateCall> self_;  // until OnDone
  std::shared_ptr<Strand> strand_;

  // The mailbox.
  absl::Mutex mu_;
  std::deque<GenerationOutput> outputs_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::StatusOr<RemoteKvReservation>> reservation_ ABSL_GUARDED_BY(mu_);
  bool prefill_done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status prefill_status_ ABSL_GUARDED_BY(mu_);
  bool admit_done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status admit_status_ ABSL_GUARDED_BY(mu_);
  bool fence_done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status fence_status_ ABSL_GUARDED_BY(mu_);
  bool cancel_requested_ ABSL_GUARDED_BY(mu_) = false;  // Decode.Cancel
  bool client_cancelled_ ABSL_GUARDED_BY(mu_) = false;  // the RPC was cancelled
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;

  // The step's own state.
  Phase phase_ = Phase::kStarting;
  std::string prefill_worker_;
  Pairing pairing_;
  std::shared_ptr<PairingAttempt> pairing_attempt_;
  absl::Time reserve_deadline_ = absl::InfiniteFuture();
  absl::Time submitted_at_;  // to the engine (after pairing and admission)
  std::string admission_ticket_;
  absl::Time engine_request_deadline_ = absl::InfiniteFuture();
  bool remote_ok_ = false;
  bool first_token_sent_ = false;
  absl::Time last_output_;
  // Once cancelled, the call only waits for the engine's final output (or the Prefill call, if
  // one is in flight: the prefill worker may still be writing into our blocks until it answers).
  bool cancelled_ = false;
  bool cancel_rpc_applied_ = false;  // Decode.Cancel has reached the engine
  grpc::Status cancel_status_;
  absl::Time cancel_deadline_ = absl::InfiniteFuture();
  std::unique_ptr<kvtransfer::KvReceiver::Expected> expected_;
  grpc::Status failed_prefill_;
  absl::Time quarantined_at_ = absl::InfiniteFuture();
  bool fence_answered_ = false;
  grpc::Status fence_answer_;
  // Writes: at most one in flight (gRPC's rule); the rest wait here.
  std::deque<v1::GenerateResponse> pending_writes_;
  v1::GenerateResponse writing_;
  bool ended_ = false;  // End called
  grpc::Status end_status_;
  bool finished_ = false;  // Finish called
  absl::Time wake_at_ = absl::InfiniteFuture();
  bool registered_ = false;  // in service_->live_

  // The Prefill and Fence calls' state lives here so it outlives them.
  std::shared_ptr<v1::Prefill::Stub> prefill_stub_;
  grpc::ClientContext prefill_context_;
  v1::PrefillRequest prefill_request_;
  v1::PrefillResponse prefill_response_;
  grpc::ClientContext admit_context_;
  v1::AdmitRequest admit_request_;
  v1::AdmitResponse admit_response_;
  grpc::ClientContext fence_context_;
  v1::FenceRequest fence_request_;
  v1::FenceResponse fence_response_;
};

void DecodeService::GenerateCall::Begin() {
  const std::string& id = id_;
  {
    absl::MutexLock lock(&service_->mu_);
    if (service_->shutting_down_) {
      return End(Error(grpc::StatusCode::UNAVAILABLE, "decode worker shutting down"));
    }
    if (!service_->live_.emplace(id, shared_from_this()).second) {
      return End(
          Error(grpc::StatusCode::ALREADY_EXISTS, absl::StrCat("request_id '", id, "' is live")));
    }
    registered_ = true;
  }
  last_output_ = arrival_;
  // A resumed (migrated) request samples its first token here, at its seed position.
  // So does a request scoring its prompt: the engine that emits the first token scores it.
  prefill_worker_ =
      request_->resumed_output_tokens() > 0 || request_->sampling().has_prompt_logprobs()
          ? ""
          : request_->prefill_worker();
  if (prefill_worker_.empty()) return Submit(std::nullopt);
  auto paired = service_->PairWith(prefill_worker_, shared_from_this());
  if (Pairing* pairing = std::get_if<Pairing>(&paired)) return Submit(*pairing);
  pairing_attempt_ = std::get<std::shared_ptr<PairingAttempt>>(paired);
  phase_ = Phase::kPairing;
}

void DecodeService::GenerateCall::Submit(std::optional<Pairing> pairing) {
  if (pairing.has_value()) {
    pairing_ = *std::move(pairing);
  } else {
    prefill_worker_.clear();
  }
  if (!prefill_worker_.empty() && service_->options_.two_phase_admission) {
    return SendAdmit();
  }
  SubmitToEngine();
}

void DecodeService::GenerateCall::SendAdmit() {
  admit_request_.set_pair_id(pairing_.pair_id);
  admit_request_.set_request_id(id_);
  admit_request_.set_num_prompt_tokens(request_->prompt_token_ids_size());
  admit_request_.set_priority(request_->priority());
  // Waiting to be admitted is queueing, like waiting for blocks: the same bound.
  admit_context_.set_deadline(absl::ToChronoTime(std::min(
      arrival_ + service_->options_.reserve_timeout, absl::FromChrono(context_->deadline()))));
  phase_ = Phase::kAdmitting;
  prefill_stub_ = service_->PrefillStub(prefill_worker_);
  std::shared_ptr<GenerateCall> self = shared_from_this();
  prefill_stub_->async()->Admit(&admit_context_, &admit_request_, &admit_response_,
                                [self](grpc::Status status) {
                                  {
                                    absl::MutexLock lock(&self->mu_);
                                    self->admit_status_ = std::move(status);
                                    self->admit_done_ = true;
                                  }
                                  self->Poke();
                                });
}

void DecodeService::GenerateCall::SubmitToEngine() {
  const std::string& id = id_;
  submitted_at_ = absl::Now();
  GenerateRequest engine_request;
  engine_request.request_id = id;
  engine_request.prompt_token_ids.assign(request_->prompt_token_ids().begin(),
                                         request_->prompt_token_ids().end());
  engine_request.params = params_;
  engine_request.priority = request_->priority();
  engine_request.resumed_output_tokens = request_->resumed_output_tokens();
  engine_request.resumed_text_bytes = request_->resumed_text_bytes();
  engine_request.deadline = std::min(arrival_ + service_->options_.reserve_timeout,
                                     absl::FromChrono(context_->deadline()));
  engine_request_deadline_ = engine_request.deadline;
  std::weak_ptr<GenerateCall> weak = shared_from_this();
  // Engine callbacks run on the engine thread: they only fill the mailbox and poke. The call
  // stays alive until the engine's final output (it is what ends the call).
  std::shared_ptr<GenerateCall> self = shared_from_this();
  engine_request.on_output = [self](const GenerationOutput& out) {
    {
      absl::MutexLock lock(&self->mu_);
      self->outputs_.push_back(out);
    }
    self->Poke();
  };
  if (!prefill_worker_.empty()) engine_request.stage_kv = pairing_.staged;
  phase_ = prefill_worker_.empty() ? Phase::kStreaming : Phase::kReserving;
  absl::Status submitted =
      prefill_worker_.empty()
          ? service_->engine_->Submit(std::move(engine_request))
          : service_->engine_->SubmitRemotePrefill(std::move(engine_request),
                                                   [self](absl::StatusOr<RemoteKvReservation> r) {
                                                     {
                                                       absl::MutexLock lock(&self->mu_);
                                                       self->reservation_ = std::move(r);
                                                     }
                                                     self->Poke();
                                                   });
  if (!submitted.ok()) return End(server::ToGrpcStatus(submitted));
  // The engine answers on_reserved(ResourceExhausted) at the request's deadline; this is a
  // backstop in case that answer never comes.
  if (phase_ == Phase::kReserving) {
    reserve_deadline_ = engine_request_deadline_ + absl::Seconds(5);
  }
}

void DecodeService::GenerateCall::SendPrefill(const RemoteKvReservation& reservation,
                                              absl::Time now) {
  const std::string& id = id_;
  v1::PrefillRequest& pr = prefill_request_;
  pr.set_request_id(id);
  *pr.mutable_prompt_token_ids() = request_->prompt_token_ids();
  *pr.mutable_sampling() = request_->sampling();
  pr.set_priority(request_->priority());
  pr.set_pair_id(pairing_.pair_id);
  pr.set_admission_ticket(admission_ticket_);
  expected_ =
      service_->receiver_->Expect(pairing_.endpoint, reservation.block_ids,
                                  reservation.num_cached_tokens, request_->prompt_token_ids_size());
  pr.set_transfer_epoch(expected_->epoch());
  pr.set_want_kv_checksum(service_->options_.verify_kv && expected_->verifiable());
  v1::KvTarget* target = pr.mutable_target();
  for (int32_t block : reservation.block_ids) target->add_block_ids(block);
  target->set_num_cached_tokens(reservation.num_cached_tokens);
  absl::StatusOr<std::string> grant =
      auth::KvGrant(pairing_.grant_key, pairing_.pair_id, expected_->epoch(), id,
                    reservation.num_cached_tokens, reservation.block_ids);
  // Without a grant the prefill worker refuses the request: the usual failure path follows.
  if (grant.ok()) {
    pr.set_grant(*std::move(grant));
  } else {
    LOG(ERROR) << "decode: request " << id << ": " << grant.status();
  }
  absl::Time deadline = now + service_->options_.prefill_timeout;
  deadline = std::min(deadline, absl::FromChrono(context_->deadline()));
  prefill_context_.set_deadline(absl::ToChronoTime(deadline));
  phase_ = Phase::kPrefilling;
  prefill_stub_ = service_->PrefillStub(prefill_worker_);
  std::shared_ptr<GenerateCall> self = shared_from_this();
  prefill_stub_->async()->Prefill(&prefill_context_, &prefill_request_, &prefill_response_,
                                  [self](grpc::Status status) {
                                    {
                                      absl::MutexLock lock(&self->mu_);
                                      self->prefill_status_ = std::move(status);
                                      self->prefill_done_ = true;
                                    }
                                    self->Poke();
                                  });
}

// The Prefill call is over and its blocks are safe to use: complete the remote prefill (or, when
// cancelled, let the engine free them).
void DecodeService::GenerateCall::AfterPrefill(const grpc::Status& status, absl::Time now,
                                               bool cancel_rpc) {
  const std::string& id = id_;
  Engine* engine = service_->engine_;
  metrics::WorkerMetrics* metrics = service_->metrics_;
  phase_ = Phase::kStreaming;
  last_output_ = now;
  if (cancelled_ || cancel_rpc) {
    cancel_rpc_applied_ = cancel_rpc;
    engine->Cancel(id);  // the prefill worker is done with our blocks now
  } else if (status.ok()) {
    const v1::PrefillResponse& response = prefill_response_;
    const absl::Status verified =
        expected_->Landed(prefill_request_.want_kv_checksum() && response.has_kv_checksum()
                              ? std::optional<uint64_t>(response.kv_checksum())
                              : std::nullopt);
    if (!verified.ok()) {
      // Every write has landed (the call succeeded): nothing to fence; recompute into them.
      LOG(WARNING) << "decode: request " << id << ": " << verified << "; prefilling locally";
      metrics->kv_transfer.CountFailure(pairing_.backend, "checksum");
      engine->CompleteRemotePrefill(id, verified);
      return;
    }
    RemotePrefillResult result;
    result.first_token = response.first_token_id();
    if (want_logprobs_ && response.has_first_token_logprobs()) {
      result.first_token_logprobs = server::TokenLogprobsFromProto(response.first_token_logprobs());
    }
    engine->CompleteRemotePrefill(id, std::move(result));
    remote_ok_ = true;
    // Received: bytes and count (the prefill worker times the writes it posted).
    metrics->kv_transfer.CountTransfer(pairing_.backend,
                                       static_cast<double>(response.kv_bytes_written()), 0, 0,
                                       absl::ZeroDuration(), absl::ZeroDuration());
  } else {
    // The prefill worker restarted: pair again next time.
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      service_->ForgetPair(prefill_worker_, pairing_.pair_id);
    }
    // The engine logs the fallback with this status (which names what failed).
    metrics->kv_transfer.CountFailure(
        pairing_.backend, status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? "deadline"
                          : status.error_code() == grpc::StatusCode::CANCELLED       ? "cancelled"
                                                                                     : "remote");
    engine->CompleteRemotePrefill(id, server::FromGrpcStatus(status));
  }
}

void DecodeService::GenerateCall::RequestCancelLocally(grpc::Status why) {
  if (cancelled_) return;
  cancelled_ = true;
  cancel_status_ = std::move(why);
  cancel_deadline_ = absl::Now() + service_->options_.cancel_timeout;
  if (!BlocksFenced()) {
    if (phase_ == Phase::kPrefilling && service_->shutting_down()) prefill_context_.TryCancel();
  } else if (phase_ != Phase::kStarting && phase_ != Phase::kPairing &&
             phase_ != Phase::kAdmitting) {
    service_->engine_->Cancel(id_);
  }
}

void DecodeService::GenerateCall::HandleOutput(GenerationOutput& out, absl::Time now) {
  last_output_ = now;
  const bool final = out.finish_reason.has_value();
  if (final && !remote_ok_) {
    service_->metrics_->prompt_tokens.Increment(
        std::max(0, out.usage.prompt_tokens - out.usage.cached_prompt_tokens));
  }
  if (cancelled_) {
    if (final) End(cancel_status_);
    return;
  }
  if (out.token_ids.empty() && out.text.empty() && !final) return;
  v1::GenerateResponse response;
  for (int32_t token : out.token_ids) response.add_token_ids(token);
  if (want_logprobs_) {
    for (const TokenLogprobs& lp : out.logprobs) {
      server::TokenLogprobsToProto(lp, response.add_logprobs());
    }
  }
  for (const ScoredToken& scored : out.prompt_logprobs) {
    server::ScoredTokenToProto(scored, response.add_prompt_logprobs());
  }
  response.set_text(out.text);
  server::UsageToProto(out.usage, response.mutable_usage());
  if (!first_token_sent_ && !out.token_ids.empty()) {
    first_token_sent_ = true;
    v1::TtftBreakdown* ttft = response.mutable_ttft();
    const FirstTokenTimings timings = out.first_token_timings.value_or(FirstTokenTimings{});
    // Pairing and admission come before the engine's own queue.
    const int64_t before_engine_us =
        std::max<int64_t>(0, absl::ToInt64Microseconds(submitted_at_ - arrival_));
    if (remote_ok_) {
      // The engine's "prefill" spans reserved -> CompleteRemotePrefill; the prefill worker knows
      // its compute and transfer parts, the rest (its queue, RPC) counts as queueing.
      const v1::PrefillResponse& pr = prefill_response_;
      ttft->set_queue_us(
          before_engine_us + timings.queue_us +
          std::max<int64_t>(0, timings.prefill_us - pr.prefill_us() - pr.transfer_us()));
      ttft->set_prefill_us(pr.prefill_us());
      ttft->set_transfer_us(pr.transfer_us());
    } else {
      ttft->set_queue_us(before_engine_us + timings.queue_us);
      ttft->set_prefill_us(timings.prefill_us);
    }
    ttft->set_first_decode_us(timings.first_decode_us);
    response.set_prefilled_remotely(remote_ok_);
  }
  if (final) {
    response.set_finish_reason(FinishReasonName(*out.finish_reason));
    if (*out.finish_reason == FinishReason::kError) {
      response.set_error_message(std::string(out.error.message()));
    }
  }
  pending_writes_.push_back(std::move(response));
  if (final) End(grpc::Status::OK);
}

void DecodeService::GenerateCall::End(grpc::Status status) {
  if (ended_) return;
  ended_ = true;
  end_status_ = std::move(status);
  phase_ = Phase::kDone;
  if (!end_status_.ok()) pending_writes_.clear();  // an error ends the stream now
  if (registered_) {
    absl::MutexLock lock(&service_->mu_);
    auto it = service_->live_.find(id_);
    if (it != service_->live_.end() && it->second.get() == this) service_->live_.erase(it);
    registered_ = false;
  }
}

void DecodeService::GenerateCall::FlushWrites() {
  bool in_flight;
  bool failed;
  {
    absl::MutexLock lock(&mu_);
    in_flight = write_in_flight_;
    failed = write_failed_;
  }
  if (in_flight || finished_) return;
  if (failed) pending_writes_.clear();  // the client is gone: nothing more reaches it
  if (!pending_writes_.empty()) {
    writing_ = std::move(pending_writes_.front());
    pending_writes_.pop_front();
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = true;
    }
    StartWrite(&writing_);
    return;
  }
  if (ended_) {
    finished_ = true;
    Finish(end_status_);
  }
}

void DecodeService::GenerateCall::ScheduleWake(absl::Time when) {
  if (when == absl::InfiniteFuture() || when >= wake_at_) return;
  wake_at_ = when;
  strand_->PokeAt(when);
}

void DecodeService::GenerateCall::Step() {
  // After Finish gRPC may free the context and the request: nothing is left to do anyway.
  if (finished_) return;
  const std::string& id = id_;
  std::deque<GenerationOutput> outputs;
  std::optional<absl::StatusOr<RemoteKvReservation>> reservation;
  bool prefill_done = false;
  grpc::Status prefill_status;
  bool admit_done = false;
  grpc::Status admit_status;
  bool cancel_rpc = false;
  bool client_cancelled = false;
  bool write_failed = false;
  {
    absl::MutexLock lock(&mu_);
    outputs.swap(outputs_);
    cancel_rpc = cancel_requested_;
    client_cancelled = client_cancelled_;
    write_failed = write_failed_;
    if (phase_ == Phase::kReserving && reservation_.has_value()) {
      reservation = std::move(reservation_);
      reservation_.reset();
    }
    if (phase_ == Phase::kAdmitting && admit_done_) {
      admit_done = true;
      admit_status = admit_status_;
      admit_done_ = false;
    }
    if (phase_ == Phase::kPrefilling && prefill_done_) {
      prefill_done = true;
      prefill_status = prefill_status_;
      prefill_done_ = false;
    }
    if (phase_ == Phase::kFencing && fence_done_ && !fence_answered_) {
      fence_answered_ = true;
      fence_answer_ = fence_status_;
    }
  }
  const absl::Time now = absl::Now();
  if (now >= wake_at_) wake_at_ = absl::InfiniteFuture();

  if (phase_ == Phase::kStarting) Begin();
  if (phase_ == Phase::kPairing) {
    absl::StatusOr<Pairing> result = absl::UnknownError("pairing");
    bool done;
    {
      absl::MutexLock lock(&pairing_attempt_->mu);
      done = pairing_attempt_->done;
      if (done) result = pairing_attempt_->result;
    }
    if (cancelled_ || client_cancelled || cancel_rpc) {
      End(cancelled_ ? cancel_status_
                     : Error(grpc::StatusCode::CANCELLED, "cancelled before it was submitted"));
    } else if (done) {
      if (!result.ok()) {
        LOG(WARNING) << "decode: request " << id << ": " << result.status()
                     << "; prefilling locally";
        service_->metrics_->kv_transfer.CountFailure(
            service_->endpoints_.empty() ? std::string("other") : service_->endpoints_[0].backend(),
            "connect");
        Submit(std::nullopt);
      } else {
        Submit(*std::move(result));
      }
    }
  }

  if (phase_ == Phase::kAdmitting) {
    if (cancelled_ || client_cancelled || cancel_rpc || write_failed) {
      // Nothing is reserved yet: the call may end now (the Admit callback holds the call).
      admit_context_.TryCancel();
      End(cancelled_ ? cancel_status_
                     : Error(grpc::StatusCode::CANCELLED, "cancelled before it was submitted"));
    } else if (admit_done) {
      if (admit_status.ok()) {
        admission_ticket_ = admit_response_.ticket();
        SubmitToEngine();
      } else if (admit_status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        // The request's own queueing bound: prefilling here now would only fail the same way.
        End(Error(grpc::StatusCode::RESOURCE_EXHAUSTED,
                  absl::StrCat("prefill worker ", prefill_worker_,
                               " did not admit the prompt before the deadline: ",
                               admit_status.error_message())));
      } else if (admit_status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        SubmitToEngine();  // a prefill worker without admission: reserve at once
      } else {
        if (admit_status.error_code() == grpc::StatusCode::NOT_FOUND) {
          service_->ForgetPair(prefill_worker_, pairing_.pair_id);
        }
        LOG(WARNING) << "decode: request " << id << ": prefill worker " << prefill_worker_
                     << " did not admit it (" << admit_status.error_message()
                     << "); prefilling locally";
        prefill_worker_.clear();
        SubmitToEngine();
      }
    } else if (service_->shutting_down()) {
      admit_context_.TryCancel();  // its answer makes the prompt prefill here
    }
  }

  if (reservation.has_value()) {
    // No other engine callback follows a failed reservation.
    if (!reservation->ok()) {
      End(server::ToGrpcStatus(reservation->status()));
    } else {
      SendPrefill(**reservation, now);
    }
  }

  if (prefill_done && !ended_) {
    if (prefill_status.ok()) {
      AfterPrefill(prefill_status, now, cancel_rpc);
    } else {
      // Writes of the failed transfer may still be in flight: quarantine the blocks and ask.
      phase_ = Phase::kFencing;
      failed_prefill_ = prefill_status;
      expected_->Quarantine(now);
      quarantined_at_ = now;
      fence_request_.set_pair_id(pairing_.pair_id);
      fence_request_.set_transfer_epoch(expected_->epoch());
      fence_context_.set_deadline(absl::ToChronoTime(now + service_->options_.fence_timeout));
      prefill_stub_ = service_->PrefillStub(prefill_worker_);
      std::shared_ptr<GenerateCall> self = shared_from_this();
      prefill_stub_->async()->Fence(&fence_context_, &fence_request_, &fence_response_,
                                    [self](grpc::Status status) {
                                      {
                                        absl::MutexLock lock(&self->mu_);
                                        self->fence_status_ = std::move(status);
                                        self->fence_done_ = true;
                                      }
                                      self->Poke();
                                    });
    }
  }
  if (phase_ == Phase::kFencing) {
    const bool confirmed = fence_answered_ && fence_answer_.ok() && fence_response_.quiescent();
    if (expected_->Release(confirmed, now) || service_->shutting_down()) {
      expected_->Drop();
      service_->metrics_->kv_fences.Add({{"result", confirmed ? "confirmed" : "lease"}})
          .Increment();
      if (!confirmed) {
        LOG(WARNING) << "decode: request " << id << ": prefill worker " << prefill_worker_
                     << " did not confirm its transfer stopped ("
                     << (fence_answered_ ? fence_answer_.error_message() : "no answer")
                     << "); reusing its blocks after the lease";
      }
      AfterPrefill(failed_prefill_, now, cancel_rpc);
    }
  }

  for (GenerationOutput& out : outputs) {
    if (ended_) break;
    HandleOutput(out, now);
  }

  if (!ended_ && !cancelled_) {
    if (client_cancelled || write_failed) {
      RequestCancelLocally(Error(grpc::StatusCode::CANCELLED, write_failed
                                                                  ? "the client went away"
                                                                  : "cancelled by the client"));
    } else if (cancel_rpc && !cancel_rpc_applied_ && BlocksFenced() && phase_ != Phase::kStarting &&
               phase_ != Phase::kPairing && phase_ != Phase::kAdmitting) {
      // Decode.Cancel: the stream ends with finish_reason "abort". While a Prefill call is in
      // flight this waits for its answer (the prefill worker may still be writing our blocks).
      cancel_rpc_applied_ = true;
      service_->engine_->Cancel(id);
    } else if (phase_ == Phase::kReserving && now > reserve_deadline_) {
      RequestCancelLocally(
          Error(grpc::StatusCode::RESOURCE_EXHAUSTED,
                absl::StrCat("no KV blocks for the prompt within ",
                             absl::FormatDuration(service_->options_.reserve_timeout))));
    } else if (phase_ == Phase::kStreaming &&
               now - last_output_ > service_->options_.stall_timeout) {
      RequestCancelLocally(Error(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("no output for ", absl::FormatDuration(service_->options_.stall_timeout))));
    }
  }
  if (cancelled_ && !ended_) {
    // Reserving: the engine's callbacks only touch the mailbox, so the call may end now.
    if (phase_ == Phase::kReserving) End(cancel_status_);
    if (phase_ == Phase::kPrefilling && service_->shutting_down()) prefill_context_.TryCancel();
    if (phase_ == Phase::kStreaming && now > cancel_deadline_) End(cancel_status_);
  }

  FlushWrites();
  if (ended_) return;
  // Wake up for the next deadline of this phase (events poke on their own).
  if (cancelled_) ScheduleWake(cancel_deadline_ + absl::Milliseconds(1));
  if (phase_ == Phase::kReserving) ScheduleWake(reserve_deadline_ + absl::Milliseconds(1));
  if (phase_ == Phase::kStreaming) {
    ScheduleWake(last_output_ + service_->options_.stall_timeout + absl::Milliseconds(1));
  }
  if (phase_ == Phase::kFencing) {
    ScheduleWake(quarantined_at_ + service_->options_.fence_lease + absl::Milliseconds(1));
  }
}

DecodeService::DecodeService(Engine* engine, metrics::WorkerMetrics* metrics,
                             kvtransfer::KvReceiver* receiver,
                             std::shared_ptr<const auth::ServiceIdentity> identity,
                             DecodeServiceOptions options)
    : engine_(engine),
      metrics_(metrics),
      receiver_(receiver),
      identity_(std::move(identity)),
      options_(std::move(options)),
      executor_(std::make_shared<CallExecutor>(options_.executor_threads)) {
  for (const kvtransfer::ReceiverEndpoint& e : receiver_->endpoints()) {
    (void)metrics_->kv_transfer.For(e.backend);
    v1::KvEndpoint& endpoint = endpoints_.emplace_back();
    endpoint.set_backend(e.backend);
    endpoint.set_agent_name(e.agent_name);
    endpoint.set_agent_address(e.agent_address);
    endpoint.set_region(e.region);
    server::KvLayoutToProto(e.layout, endpoint.mutable_layout());
  }
}

DecodeService::~DecodeService() {
  // Handshakes still in flight end on the executor (FinishPairing): cancel them and wait, so no
  // Connect callback outlives the service.
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [address, attempt] : pairing_) attempt->context.TryCancel();
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](absl::flat_hash_map<std::string, std::shared_ptr<PairingAttempt>>* pairing) {
              return pairing->empty();
            },
            &pairing_),
        options_.connect_timeout + absl::Seconds(5));
  }
  executor_->Stop();
}

std::variant<DecodeService::Pairing, std::shared_ptr<DecodeService::PairingAttempt>>
DecodeService::PairWith(const std::string& address, const std::shared_ptr<GenerateCall>& call) {
  std::shared_ptr<PairingAttempt> attempt;
  {
    absl::MutexLock lock(&mu_);
    auto it = pairs_.find(address);
    if (it != pairs_.end()) return it->second;
    auto in_flight = pairing_.find(address);
    if (in_flight != pairing_.end()) {
      absl::MutexLock attempt_lock(&in_flight->second->mu);
      in_flight->second->waiters.push_back(call);
      return in_flight->second;
    }
    attempt = std::make_shared<PairingAttempt>();
    attempt->address = address;
    {
      absl::MutexLock attempt_lock(&attempt->mu);
      attempt->waiters.push_back(call);
    }
    pairing_[address] = attempt;
  }
  v1::ConnectRequest& request = attempt->request;
  request.set_decode_worker(endpoints_.empty() ? "" : endpoints_[0].agent_name());
  for (const v1::KvEndpoint& e : endpoints_) *request.add_endpoints() = e;
  server::CompatibilityToProto(engine_->config(), request.mutable_compatibility());
  absl::StatusOr<std::string> grant_key = auth::NewGrantKey();
  if (!grant_key.ok()) {
    FinishPairing(attempt, server::ToGrpcStatus(grant_key.status()));
    return attempt;
  }
  attempt->grant_key = *grant_key;
  request.set_grant_key(*grant_key);
  attempt->context.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout));
  attempt->stub = PrefillStub(address);
  attempt->stub->async()->Connect(
      &attempt->context, &attempt->request, &attempt->response,
      [this, attempt](grpc::Status status) {
        // Accepting a two-sided backend's connection may block: on
        // the executor, not on gRPC's thread.
        executor_->Post([this, attempt, status] { FinishPairing(attempt, status); });
      });
  return attempt;
}

void DecodeService::FinishPairing(const std::shared_ptr<PairingAttempt>& attempt,
                                  const grpc::Status& status) {
  const std::string& address = attempt->address;
  const v1::ConnectResponse& response = attempt->response;
  absl::StatusOr<Pairing> result = [&]() -> absl::StatusOr<Pairing> {
    if (!status.ok()) {
      return absl::Status(
          server::FromGrpcStatus(status).code(),
          absl::StrCat("pairing with prefill worker ", address, ": ", status.error_message()));
    }
    Pairing pairing;
    pairing.pair_id = response.pair_id();
    pairing.backend = response.backend();
    pairing.grant_key = attempt->grant_key;
    const std::optional<size_t> chosen = receiver_->FindEndpoint(response.backend());
    if (!chosen.has_value() || pairing.pair_id.empty()) {
      return absl::InternalError(
          absl::StrCat("prefill worker ", address, " answered the handshake with backend '",
                       response.backend(), "', which this worker did not offer"));
    }
    pairing.endpoint = *chosen;
    pairing.staged = receiver_->endpoints()[*chosen].staged;
    if (!response.connect_reply().empty()) {
      // A two-sided backend (nccl): this side joins the connection the prefill worker started.
      if (response.agent_name().empty()) {
        return absl::InternalError(absl::StrCat("prefill worker ", address,
                                                " sent a connect reply without its agent name"));
      }
      absl::Status accepted = receiver_->Accept(*chosen, response.agent_name(),
                                                response.connect_reply(), options_.connect_timeout);
      if (!accepted.ok()) {
        return absl::Status(accepted.code(), absl::StrCat("pairing with prefill worker ", address,
                                                          ": accepting its ", response.backend(),
                                                          " connection: ", accepted.message()));
      }
    }
    for (const std::string& fallback : response.fallbacks()) {
      LOG(WARNING) << "decode: prefill worker " << address << " skipped " << fallback;
    }
    LOG(INFO) << "decode: paired with prefill worker " << address << " over " << response.backend();
    return pairing;
  }();
  {
    absl::MutexLock lock(&mu_);
    if (result.ok()) pairs_[address] = *result;
    auto it = pairing_.find(address);
    if (it != pairing_.end() && it->second == attempt) pairing_.erase(it);
  }
  std::vector<std::weak_ptr<GenerateCall>> waiters;
  {
    absl::MutexLock lock(&attempt->mu);
    attempt->done = true;
    attempt->result = std::move(result);
    waiters.swap(attempt->waiters);
  }
  for (const std::weak_ptr<GenerateCall>& weak : waiters) {
    if (std::shared_ptr<GenerateCall> call = weak.lock()) call->Poke();
  }
}

void DecodeService::ForgetPair(const std::string& address, const std::string& pair_id) {
  absl::MutexLock lock(&mu_);
  auto it = pairs_.find(address);
  if (it != pairs_.end() && it->second.pair_id == pair_id) pairs_.erase(it);
}

void DecodeService::BeginShutdown() {
  std::vector<std::shared_ptr<GenerateCall>> calls;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    for (const auto& [id, call] : live_) calls.push_back(call);
  }
  // Each looks at shutting_down() again: a Prefill call in flight is cancelled, a quarantine
  // released.
  for (const std::shared_ptr<GenerateCall>& call : calls) call->Poke();
}

bool DecodeService::shutting_down() {
  absl::MutexLock lock(&mu_);
  return shutting_down_;
}

std::shared_ptr<v1::Prefill::Stub> DecodeService::PrefillStub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<v1::Prefill::Stub>& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::Prefill::NewStub(identity_->Dial(address));
    stub_order_.push_back(address);
    while (stub_order_.size() > kMaxPrefillChannels) {
      stubs_.erase(stub_order_.front());
      stub_order_.pop_front();
    }
  }
  return stub;
}

grpc::ServerUnaryReactor* DecodeService::Cancel(grpc::CallbackServerContext* context,
                                                const v1::CancelRequest* request,
                                                v1::CancelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = identity_->Authenticate(*context); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  std::shared_ptr<GenerateCall> call;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(request->request_id());
    // Only the owner: the same peer, presenting the token it chose (compared in constant time).
    // A miss looks like an unknown id.
    if (it != live_.end() &&
        it->second->OwnedBy(request->cancel_token(), identity_->Peer(*context))) {
      call = it->second;
    }
  }
  if (call != nullptr) call->RequestCancel();
  response->set_found(call != nullptr);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* DecodeService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  if (grpc::Status s = identity_->Authenticate(*context); !s.ok()) return new Refusal(s);
  const std::string& id = request->request_id();
  if (id.empty()) {
    return new Refusal(Error(grpc::StatusCode::INVALID_ARGUMENT, "request_id: must not be empty"));
  }
  if (request->prompt_token_ids().empty()) {
    return new Refusal(
        Error(grpc::StatusCode::INVALID_ARGUMENT, "prompt_token_ids: must not be empty"));
  }
  SamplingParams params = server::SamplingParamsFromProto(request->sampling());
  if (absl::Status s = ValidateSamplingParams(params, engine_->config().vocab_size); !s.ok()) {
    return new Refusal(server::ToGrpcStatus(s));
  }
  // Only known prefill workers are dialed: a request cannot make this worker connect (and send
  // its transfer endpoints) to an address of its choosing.
  if (!request->prefill_worker().empty() && !options_.allowed_prefill_workers.empty() &&
      !options_.allowed_prefill_workers.contains(request->prefill_worker())) {
    return new Refusal(Error(grpc::StatusCode::PERMISSION_DENIED,
                             absl::StrCat("prefill_worker: '", request->prefill_worker(),
                                          "' is not one of this decode worker's prefill workers")));
  }
  if (!request->cancel_token().empty() && request->cancel_token().size() < kMinCancelTokenBytes) {
    return new Refusal(
        Error(grpc::StatusCode::INVALID_ARGUMENT,
              absl::StrCat("cancel_token: at least ", kMinCancelTokenBytes, " bytes")));
  }
  auto call = std::make_shared<GenerateCall>(this, context, request, std::move(params));
  call->Start();
  return call.get();
}

}  // namespace tandem::decode

#include "decode/decode_service.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "runtime/auth/kv_grant.h"
#include "runtime/base/logging.h"
#include "runtime/base/secrets.h"
#include "runtime/server/grpc_status.h"
#include "runtime/server/kv_layout_convert.h"
#include "runtime/server/proto_convert.h"

namespace tandem::decode {
namespace {

// How often a waiting handler looks at its client (cancellation) and its deadlines.
constexpr absl::Duration kSlice = absl::Milliseconds(20);

// A cancel token shorter than this is refused (a guessable one would protect nothing).
constexpr size_t kMinCancelTokenBytes = 16;

grpc::Status Error(grpc::StatusCode code, std::string message) {
  return grpc::Status(code, std::move(message));
}

}  // namespace

// One Generate call's mailbox: engine callbacks and the Prefill completion write it, the handler
// thread reads it.
struct DecodeService::Call {
  std::string cancel_token;  // GenerateRequest.cancel_token; empty: not cancellable by Cancel
  std::string owner;         // ServiceIdentity::Peer of the caller
  absl::Mutex mu;
  std::deque<GenerationOutput> outputs ABSL_GUARDED_BY(mu);
  std::optional<absl::StatusOr<RemoteKvReservation>> reservation ABSL_GUARDED_BY(mu);
  bool prefill_done ABSL_GUARDED_BY(mu) = false;
  grpc::Status prefill_status ABSL_GUARDED_BY(mu);
  // Set by Decode.Cancel. The handler cancels like a client disconnect: while a Prefill call is in
  // flight it waits for its answer first (the prefill worker may still be writing our blocks).
  bool cancel_requested ABSL_GUARDED_BY(mu) = false;
  // The Prefill call's state lives here so it outlives the call even if the handler returns.
  std::shared_ptr<v1::Prefill::Stub> prefill_stub;
  grpc::ClientContext prefill_context;
  v1::PrefillRequest prefill_request;
  v1::PrefillResponse prefill_response;
  // Prefill.Fence after a failed Prefill call (same lifetime rule).
  bool fence_done ABSL_GUARDED_BY(mu) = false;
  grpc::Status fence_status ABSL_GUARDED_BY(mu);
  grpc::ClientContext fence_context;
  v1::FenceRequest fence_request;
  v1::FenceResponse fence_response;
};

DecodeService::DecodeService(Engine* engine, metrics::WorkerMetrics* metrics,
                             kvtransfer::KvReceiver* receiver,
                             std::shared_ptr<const auth::ServiceIdentity> identity,
                             DecodeServiceOptions options)
    : engine_(engine),
      metrics_(metrics),
      receiver_(receiver),
      identity_(std::move(identity)),
      options_(std::move(options)) {
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

absl::StatusOr<DecodeService::Pairing> DecodeService::PairWith(const std::string& address,
                                                               absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    auto it = pairs_.find(address);
    if (it != pairs_.end()) return it->second;
  }
  v1::ConnectRequest request;
  request.set_decode_worker(endpoints_.empty() ? "" : endpoints_[0].agent_name());
  for (const v1::KvEndpoint& e : endpoints_) *request.add_endpoints() = e;
  server::CompatibilityToProto(engine_->config(), request.mutable_compatibility());
  absl::StatusOr<std::string> grant_key = auth::NewGrantKey();
  if (!grant_key.ok()) return grant_key.status();
  request.set_grant_key(*grant_key);
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(std::min(deadline, absl::Now() + options_.connect_timeout)));
  v1::ConnectResponse response;
  const grpc::Status status = PrefillStub(address)->Connect(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(
        server::FromGrpcStatus(status).code(),
        absl::StrCat("pairing with prefill worker ", address, ": ", status.error_message()));
  }
  Pairing pairing;
  pairing.pair_id = response.pair_id();
  pairing.backend = response.backend();
  pairing.grant_key = *std::move(grant_key);
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
      return absl::InternalError(
          absl::StrCat("prefill worker ", address, " sent a connect reply without its agent name"));
    }
    absl::Status accepted = receiver_->Accept(*chosen, response.agent_name(),
                                              response.connect_reply(), options_.connect_timeout);
    if (!accepted.ok()) {
      return absl::Status(accepted.code(),
                          absl::StrCat("pairing with prefill worker ", address, ": accepting its ",
                                       response.backend(), " connection: ", accepted.message()));
    }
  }
  for (const std::string& fallback : response.fallbacks()) {
    LOG(WARNING) << "decode: prefill worker " << address << " skipped " << fallback;
  }
  LOG(INFO) << "decode: paired with prefill worker " << address << " over " << response.backend();
  absl::MutexLock lock(&mu_);
  pairs_[address] = pairing;
  return pairing;
}

void DecodeService::ForgetPair(const std::string& address, const std::string& pair_id) {
  absl::MutexLock lock(&mu_);
  auto it = pairs_.find(address);
  if (it != pairs_.end() && it->second.pair_id == pair_id) pairs_.erase(it);
}

void DecodeService::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
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

grpc::Status DecodeService::Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                                   v1::CancelResponse* response) {
  if (grpc::Status s = identity_->Authenticate(*context); !s.ok()) return s;
  std::shared_ptr<Call> call;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(request->request_id());
    // Only the owner: the same peer, presenting the token it chose (compared in constant time).
    // A miss looks like an unknown id.
    if (it != live_.end() && !it->second->cancel_token.empty() &&
        ConstantTimeEquals(request->cancel_token(), it->second->cancel_token) &&
        it->second->owner == identity_->Peer(*context)) {
      call = it->second;
    }
  }
  if (call != nullptr) {
    absl::MutexLock lock(&call->mu);
    call->cancel_requested = true;
  }
  response->set_found(call != nullptr);
  return grpc::Status::OK;
}

grpc::Status DecodeService::Generate(grpc::ServerContext* context,
                                     const v1::GenerateRequest* request,
                                     grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (grpc::Status s = identity_->Authenticate(*context); !s.ok()) return s;
  const absl::Time arrival = absl::Now();
  const std::string& id = request->request_id();
  if (id.empty()) return Error(grpc::StatusCode::INVALID_ARGUMENT, "request_id: must not be empty");
  if (request->prompt_token_ids().empty()) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT, "prompt_token_ids: must not be empty");
  }
  const SamplingParams params = server::SamplingParamsFromProto(request->sampling());
  if (absl::Status s = ValidateSamplingParams(params, engine_->config().vocab_size); !s.ok()) {
    return server::ToGrpcStatus(s);
  }
  const bool want_logprobs = params.logprobs.has_value();
  // Only known prefill workers are dialed: a request cannot make this worker connect (and send
  // its transfer endpoints) to an address of its choosing.
  if (!request->prefill_worker().empty() && !options_.allowed_prefill_workers.empty() &&
      !options_.allowed_prefill_workers.contains(request->prefill_worker())) {
    return Error(grpc::StatusCode::PERMISSION_DENIED,
                 absl::StrCat("prefill_worker: '", request->prefill_worker(),
                              "' is not one of this decode worker's prefill workers"));
  }

  if (!request->cancel_token().empty() && request->cancel_token().size() < kMinCancelTokenBytes) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("cancel_token: at least ", kMinCancelTokenBytes, " bytes"));
  }
  auto call = std::make_shared<Call>();
  call->cancel_token = request->cancel_token();
  call->owner = identity_->Peer(*context);
  GenerateRequest engine_request;
  engine_request.request_id = id;
  engine_request.prompt_token_ids.assign(request->prompt_token_ids().begin(),
                                         request->prompt_token_ids().end());
  engine_request.params = params;
  engine_request.deadline = arrival + options_.reserve_timeout;
  engine_request.on_output = [call](const GenerationOutput& out) {
    absl::MutexLock lock(&call->mu);
    call->outputs.push_back(out);
  };

  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return Error(grpc::StatusCode::UNAVAILABLE, "decode worker shutting down");
    if (!live_.emplace(id, call).second) {
      return Error(grpc::StatusCode::ALREADY_EXISTS, absl::StrCat("request_id '", id, "' is live"));
    }
  }
  absl::Cleanup forget = [this, &id] {
    absl::MutexLock lock(&mu_);
    live_.erase(id);
  };

  std::string prefill_worker = request->prefill_worker();
  Pairing pairing;
  if (!prefill_worker.empty()) {
    absl::StatusOr<Pairing> paired = PairWith(
        prefill_worker,
        std::min(arrival + options_.prefill_timeout, absl::FromChrono(context->deadline())));
    if (paired.ok()) {
      pairing = *std::move(paired);
      engine_request.stage_kv = pairing.staged;
    } else {
      LOG(WARNING) << "decode: request " << id << ": " << paired.status() << "; prefilling locally";
      metrics_->kv_transfer.CountFailure(
          endpoints_.empty() ? std::string("other") : endpoints_[0].backend(), "connect");
      prefill_worker.clear();
    }
  }
  enum class Phase { kReserving, kPrefilling, kFencing, kStreaming };
  Phase phase = prefill_worker.empty() ? Phase::kStreaming : Phase::kReserving;
  absl::Status submitted =
      prefill_worker.empty()
          ? engine_->Submit(std::move(engine_request))
          : engine_->SubmitRemotePrefill(std::move(engine_request),
                                         [call](absl::StatusOr<RemoteKvReservation> r) {
                                           absl::MutexLock lock(&call->mu);
                                           call->reservation = std::move(r);
                                         });
  if (!submitted.ok()) return server::ToGrpcStatus(submitted);

  // The engine answers on_reserved(ResourceExhausted) at the request's deadline; this is a
  // backstop in case that answer never comes.
  const absl::Time reserve_deadline = arrival + options_.reserve_timeout + absl::Seconds(5);
  bool remote_ok = false;
  bool first_token_sent = false;
  absl::Time last_output = arrival;
  // Once cancelled, the handler only waits for the engine's final output (or the Prefill call, if
  // one is in flight: the prefill worker may still be writing into our blocks until it answers).
  bool cancelled = false;
  bool cancel_rpc_applied = false;  // Decode.Cancel has reached the engine
  grpc::Status cancel_status;
  absl::Time cancel_deadline = absl::InfiniteFuture();
  // While a Prefill call is in flight or its blocks are quarantined, cancelling waits: the engine
  // is told only once nothing of the prefill worker may still write into the blocks.
  const auto blocks_fenced = [&phase] {
    return phase != Phase::kPrefilling && phase != Phase::kFencing;
  };
  auto request_cancel = [&](grpc::Status why) {
    if (cancelled) return;
    cancelled = true;
    cancel_status = std::move(why);
    cancel_deadline = absl::Now() + options_.cancel_timeout;
    if (!blocks_fenced()) {
      if (phase == Phase::kPrefilling && shutting_down()) call->prefill_context.TryCancel();
    } else {
      engine_->Cancel(id);
    }
  };
  // The remote prefill's blocks: what the receiver expects in them, and their quarantine after a
  // failed Prefill call.
  std::unique_ptr<kvtransfer::KvReceiver::Expected> expected;
  grpc::Status failed_prefill;
  // The Prefill call is over and its blocks are safe to use: complete the remote prefill (or, when
  // cancelled, let the engine free them).
  bool fence_answered = false;
  grpc::Status fence_status;
  auto after_prefill = [&](const grpc::Status& status, absl::Time now, bool cancel_rpc) {
    phase = Phase::kStreaming;
    last_output = now;
    if (cancelled || cancel_rpc) {
      cancel_rpc_applied = cancel_rpc;
      engine_->Cancel(id);  // the prefill worker is done with our blocks now
    } else if (status.ok()) {
      const v1::PrefillResponse& response = call->prefill_response;
      const v1::PrefillRequest& sent = call->prefill_request;
      const absl::Status verified =
          expected->Landed(sent.want_kv_checksum() && response.has_kv_checksum()
                               ? std::optional<uint64_t>(response.kv_checksum())
                               : std::nullopt);
      if (!verified.ok()) {
        // Every write has landed (the call succeeded): nothing to fence; recompute into them.
        LOG(WARNING) << "decode: request " << id << ": " << verified << "; prefilling locally";
        metrics_->kv_transfer.CountFailure(pairing.backend, "checksum");
        engine_->CompleteRemotePrefill(id, verified);
        return;
      }
      RemotePrefillResult result;
      result.first_token = response.first_token_id();
      if (want_logprobs && response.has_first_token_logprobs()) {
        result.first_token_logprobs =
            server::TokenLogprobsFromProto(response.first_token_logprobs());
      }
      engine_->CompleteRemotePrefill(id, std::move(result));
      remote_ok = true;
      // Received: bytes and count (the prefill worker times the writes it posted).
      metrics_->kv_transfer.CountTransfer(pairing.backend,
                                          static_cast<double>(response.kv_bytes_written()), 0, 0,
                                          absl::ZeroDuration(), absl::ZeroDuration());
    } else {
      // The prefill worker restarted: pair again next time.
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        ForgetPair(prefill_worker, pairing.pair_id);
      }
      // The engine logs the fallback with this status (which names what failed).
      metrics_->kv_transfer.CountFailure(
          pairing.backend, status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? "deadline"
                           : status.error_code() == grpc::StatusCode::CANCELLED       ? "cancelled"
                                                                                      : "remote");
      engine_->CompleteRemotePrefill(id, server::FromGrpcStatus(status));
    }
  };

  while (true) {
    std::deque<GenerationOutput> outputs;
    std::optional<absl::StatusOr<RemoteKvReservation>> reservation;
    bool prefill_done = false;
    grpc::Status prefill_status;
    bool cancel_rpc = false;
    {
      absl::MutexLock lock(&call->mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(call->mu) {
        return !call->outputs.empty() ||
               (phase == Phase::kReserving && call->reservation.has_value()) ||
               (phase == Phase::kPrefilling && call->prefill_done) ||
               (phase == Phase::kFencing && call->fence_done && !fence_answered) ||
               (call->cancel_requested && !cancel_rpc_applied && blocks_fenced());
      };
      call->mu.AwaitWithTimeout(absl::Condition(&ready), kSlice);
      outputs.swap(call->outputs);
      cancel_rpc = call->cancel_requested;
      if (phase == Phase::kReserving && call->reservation.has_value()) {
        reservation = std::move(call->reservation);
        call->reservation.reset();
      }
      if (phase == Phase::kPrefilling && call->prefill_done) {
        prefill_done = true;
        prefill_status = call->prefill_status;
      }
      if (phase == Phase::kFencing && call->fence_done && !fence_answered) {
        fence_answered = true;
        fence_status = call->fence_status;
      }
    }
    const absl::Time now = absl::Now();

    if (reservation.has_value()) {
      // No other engine callback follows a failed reservation.
      if (!reservation->ok()) return server::ToGrpcStatus(reservation->status());
      v1::PrefillRequest& pr = call->prefill_request;
      pr.set_request_id(id);
      *pr.mutable_prompt_token_ids() = request->prompt_token_ids();
      *pr.mutable_sampling() = request->sampling();
      pr.set_pair_id(pairing.pair_id);
      expected =
          receiver_->Expect(pairing.endpoint, (*reservation)->block_ids,
                            (*reservation)->num_cached_tokens, request->prompt_token_ids_size());
      pr.set_transfer_epoch(expected->epoch());
      pr.set_want_kv_checksum(options_.verify_kv && expected->verifiable());
      v1::KvTarget* target = pr.mutable_target();
      for (int32_t block : (*reservation)->block_ids) target->add_block_ids(block);
      target->set_num_cached_tokens((*reservation)->num_cached_tokens);
      absl::StatusOr<std::string> grant =
          auth::KvGrant(pairing.grant_key, pairing.pair_id, expected->epoch(), id,
                        (*reservation)->num_cached_tokens, (*reservation)->block_ids);
      // Without a grant the prefill worker refuses the request: the usual failure path follows.
      if (grant.ok()) {
        pr.set_grant(*std::move(grant));
      } else {
        LOG(ERROR) << "decode: request " << id << ": " << grant.status();
      }
      absl::Time deadline = now + options_.prefill_timeout;
      deadline = std::min(deadline, absl::FromChrono(context->deadline()));
      call->prefill_context.set_deadline(absl::ToChronoTime(deadline));
      phase = Phase::kPrefilling;
      call->prefill_stub = PrefillStub(prefill_worker);
      call->prefill_stub->async()->Prefill(&call->prefill_context, &call->prefill_request,
                                           &call->prefill_response, [call](grpc::Status status) {
                                             absl::MutexLock lock(&call->mu);
                                             call->prefill_status = std::move(status);
                                             call->prefill_done = true;
                                           });
    }

    if (prefill_done) {
      if (prefill_status.ok()) {
        after_prefill(prefill_status, now, cancel_rpc);
      } else {
        // Writes of the failed transfer may still be in flight: quarantine the blocks and ask.
        phase = Phase::kFencing;
        failed_prefill = prefill_status;
        expected->Quarantine(now);
        call->fence_request.set_pair_id(pairing.pair_id);
        call->fence_request.set_transfer_epoch(expected->epoch());
        call->fence_context.set_deadline(absl::ToChronoTime(now + options_.fence_timeout));
        call->prefill_stub = PrefillStub(prefill_worker);
        call->prefill_stub->async()->Fence(&call->fence_context, &call->fence_request,
                                           &call->fence_response, [call](grpc::Status status) {
                                             absl::MutexLock lock(&call->mu);
                                             call->fence_status = std::move(status);
                                             call->fence_done = true;
                                           });
      }
    }
    if (phase == Phase::kFencing) {
      const bool confirmed =
          fence_answered && fence_status.ok() && call->fence_response.quiescent();
      if (expected->Release(confirmed, now) || shutting_down()) {
        expected->Drop();
        metrics_->kv_fences.Add({{"result", confirmed ? "confirmed" : "lease"}}).Increment();
        if (!confirmed) {
          LOG(WARNING) << "decode: request " << id << ": prefill worker " << prefill_worker
                       << " did not confirm its transfer stopped ("
                       << (fence_answered ? fence_status.error_message() : "no answer")
                       << "); reusing its blocks after the lease";
        }
        after_prefill(failed_prefill, now, cancel_rpc);
      }
    }

    for (GenerationOutput& out : outputs) {
      last_output = now;
      const bool final = out.finish_reason.has_value();
      if (final && !remote_ok) {
        metrics_->prompt_tokens.Increment(
            std::max(0, out.usage.prompt_tokens - out.usage.cached_prompt_tokens));
      }
      if (cancelled) {
        if (final) return cancel_status;
        continue;
      }
      if (out.token_ids.empty() && out.text.empty() && !final) continue;
      v1::GenerateResponse response;
      for (int32_t token : out.token_ids) response.add_token_ids(token);
      if (want_logprobs) {
        for (const TokenLogprobs& lp : out.logprobs) {
          server::TokenLogprobsToProto(lp, response.add_logprobs());
        }
      }
      response.set_text(out.text);
      server::UsageToProto(out.usage, response.mutable_usage());
      if (!first_token_sent && !out.token_ids.empty()) {
        first_token_sent = true;
        v1::TtftBreakdown* ttft = response.mutable_ttft();
        const FirstTokenTimings timings = out.first_token_timings.value_or(FirstTokenTimings{});
        if (remote_ok) {
          // The engine's "prefill" spans reserved -> CompleteRemotePrefill; the prefill worker
          // knows its compute and transfer parts, the rest (its queue, RPC) counts as queueing.
          const v1::PrefillResponse& pr = call->prefill_response;
          ttft->set_queue_us(
              timings.queue_us +
              std::max<int64_t>(0, timings.prefill_us - pr.prefill_us() - pr.transfer_us()));
          ttft->set_prefill_us(pr.prefill_us());
          ttft->set_transfer_us(pr.transfer_us());
        } else {
          ttft->set_queue_us(timings.queue_us);
          ttft->set_prefill_us(timings.prefill_us);
        }
        ttft->set_first_decode_us(timings.first_decode_us);
        response.set_prefilled_remotely(remote_ok);
      }
      if (final) {
        response.set_finish_reason(FinishReasonName(*out.finish_reason));
        if (*out.finish_reason == FinishReason::kError) {
          response.set_error_message(std::string(out.error.message()));
        }
      }
      if (!writer->Write(response)) {
        request_cancel(Error(grpc::StatusCode::CANCELLED, "the client went away"));
        if (final) return cancel_status;
        continue;
      }
      if (final) return grpc::Status::OK;
    }

    if (!cancelled) {
      if (context->IsCancelled()) {
        request_cancel(Error(grpc::StatusCode::CANCELLED, "cancelled by the client"));
      } else if (cancel_rpc && !cancel_rpc_applied && blocks_fenced()) {
        // Decode.Cancel: the stream ends with finish_reason "abort". While a Prefill call is in
        // flight this waits for its answer (the prefill worker may still be writing our blocks).
        cancel_rpc_applied = true;
        engine_->Cancel(id);
      } else if (phase == Phase::kReserving && now > reserve_deadline) {
        request_cancel(Error(grpc::StatusCode::RESOURCE_EXHAUSTED,
                             absl::StrCat("no KV blocks for the prompt within ",
                                          absl::FormatDuration(options_.reserve_timeout))));
      } else if (phase == Phase::kStreaming && now - last_output > options_.stall_timeout) {
        request_cancel(
            Error(grpc::StatusCode::DEADLINE_EXCEEDED,
                  absl::StrCat("no output for ", absl::FormatDuration(options_.stall_timeout))));
      }
    }
    if (cancelled) {
      if (phase == Phase::kReserving) return cancel_status;  // callbacks only touch `call`
      if (phase == Phase::kPrefilling && shutting_down()) call->prefill_context.TryCancel();
      if (phase == Phase::kStreaming && now > cancel_deadline) return cancel_status;
    }
  }
}

}  // namespace tandem::decode

#include "prefill/prefill_service.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/auth/kv_grant.h"
#include "runtime/base/logging.h"
#include "runtime/base/secrets.h"
#include "runtime/base/status.h"
#include "runtime/server/grpc_status.h"
#include "runtime/server/kv_layout_convert.h"
#include "runtime/server/proto_convert.h"

namespace tandem::prefill {
namespace {

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

// Epochs of a pair accepted out of order below the highest one seen (anti-replay window).
constexpr uint64_t kEpochWindow = 4096;

// (decode worker, backend) fallbacks logged at most once each, for this many pairs of names.
constexpr size_t kMaxLoggedFallbacks = 1024;

// 128 bits from the kernel's CSPRNG, hex: a pair id nobody can guess.
absl::StatusOr<std::string> NewPairId() { return RandomHex(16); }

grpc::Status Error(grpc::StatusCode code, std::string message) {
  return grpc::Status(code, std::move(message));
}

}  // namespace

// One Prefill call: what the handler waits for. The send (kv_sender.h) owns the handoff; the
// engine's callbacks and the send's report fill this in.
struct PrefillService::Job {
  std::string request_id;
  std::shared_ptr<kvtransfer::KvSend> send;

  absl::Mutex mu;
  std::optional<PrefilledKv> kv ABSL_GUARDED_BY(mu);
  absl::Time prefilled_at ABSL_GUARDED_BY(mu);
  std::optional<FirstTokenTimings> timings ABSL_GUARDED_BY(mu);
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  int64_t bytes ABSL_GUARDED_BY(mu) = 0;
  absl::Duration transfer_time ABSL_GUARDED_BY(mu);
  std::optional<uint64_t> checksum ABSL_GUARDED_BY(mu);
  // The call's share of the admission window, given back by the first Finish.
  std::unique_ptr<AdmissionQueue::Slot> slot ABSL_GUARDED_BY(mu);

  // Set before anything can finish the job; called once, by the first Finish, outside the lock.
  std::function<void()> on_done;

  // The first call wins.
  void Finish(absl::Status s, int64_t written = 0, absl::Duration time = absl::ZeroDuration(),
              std::optional<uint64_t> sum = std::nullopt) {
    std::function<void()> notify;
    std::unique_ptr<AdmissionQueue::Slot> share;
    {
      absl::MutexLock lock(&mu);
      if (done) return;
      done = true;
      status = std::move(s);
      bytes = written;
      transfer_time = time;
      checksum = sum;
      notify = std::move(on_done);
      share = std::move(slot);
    }
    share.reset();  // may admit others: outside the lock
    if (notify) notify();
  }
};

// One Prefill.Prefill call: a unary reactor finished once, by Complete (from the job's first
// Finish) or not at all before the handler hands it to gRPC. OnCancel gives up on the job.
class PrefillService::PrefillCall final : public grpc::ServerUnaryReactor {
 public:
  PrefillCall(PrefillService* service, v1::PrefillResponse* response)
      : service_(service), response_(response) {}

  void Refuse(const grpc::Status& status) { Finish(status); }

  // Wires the job to this call; from here on the job's first Finish completes it.
  void Watch(std::shared_ptr<Job> job, absl::Time arrival, bool want_logprobs, int num_tokens) {
    job_ = job;
    arrival_ = arrival;
    want_logprobs_ = want_logprobs;
    num_tokens_ = num_tokens;
    absl::MutexLock lock(&job->mu);
    job->on_done = [this] { Complete(); };
  }
  void Submitted(absl::Time at) {
    absl::MutexLock lock(&mu_);
    submitted_ = at;
  }

  void OnCancel() override {
    if (std::shared_ptr<Job> job = job_) {
      service_->GiveUp(job, absl::CancelledError("cancelled by the client"));
    }
  }
  void OnDone() override { delete this; }

 private:
  void Complete() {
    absl::Time submitted;
    {
      absl::MutexLock lock(&mu_);
      submitted = submitted_;
    }
    std::shared_ptr<Job> job = job_;
    absl::MutexLock lock(&job->mu);
    if (!job->status.ok()) return Finish(server::ToGrpcStatus(job->status));
    const PrefilledKv& kv = *job->kv;
    response_->set_first_token_id(kv.first_token);
    if (want_logprobs_ && kv.first_token_logprobs.has_value()) {
      server::TokenLogprobsToProto(*kv.first_token_logprobs,
                                   response_->mutable_first_token_logprobs());
    }
    response_->set_kv_bytes_written(job->bytes);
    response_->set_prefix_cached_tokens(kv.prefix_cached_tokens);
    if (job->timings.has_value()) {
      response_->set_queue_us(Micros(submitted - arrival_) + job->timings->queue_us);
      response_->set_prefill_us(job->timings->prefill_us);
    } else {  // the engine's final output has not arrived yet: no finer split than ours
      response_->set_queue_us(Micros(submitted - arrival_));
      response_->set_prefill_us(Micros(job->prefilled_at - submitted));
    }
    response_->set_transfer_us(Micros(job->transfer_time));
    if (job->checksum.has_value()) response_->set_kv_checksum(*job->checksum);
    service_->metrics_->prompt_tokens.Increment(std::max(0, num_tokens_ - kv.prefix_cached_tokens));
    Finish(grpc::Status::OK);
  }

  PrefillService* const service_;
  v1::PrefillResponse* const response_;
  std::shared_ptr<Job> job_;
  absl::Time arrival_;
  bool want_logprobs_ = false;
  int num_tokens_ = 0;
  absl::Mutex mu_;
  absl::Time submitted_ ABSL_GUARDED_BY(mu_) = absl::Now();
};

// One Prefill.Admit call: a unary reactor finished once, by the admission queue's answer or, if
// the call goes away first and the queue still held it, by OnCancel.
class PrefillService::AdmitCall final : public grpc::ServerUnaryReactor {
 public:
  AdmitCall(PrefillService* service, v1::AdmitResponse* response)
      : service_(service), response_(response), arrival_(absl::Now()) {}

  void Refuse(const grpc::Status& status) { Finish(status); }

  // Queues the call; the answer may come before this returns.
  void Wait(const v1::AdmitRequest& request, absl::Time deadline) {
    const int64_t waiter = service_->admission_->Wait(
        request.request_id(), request.priority(), request.num_prompt_tokens(), deadline,
        [this](absl::StatusOr<std::string> ticket) { Answer(std::move(ticket)); });
    absl::MutexLock lock(&mu_);
    waiter_ = waiter;
    waiting_ = true;
  }

  void OnCancel() override {
    int64_t waiter;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!waiting_) return;  // not queued: nothing to take back
      waiter = waiter_;
    }
    // Removed: no answer will come, so this finishes the call. Otherwise the answer came or is
    // coming; an admitted ticket nobody will claim gives its share back now (Answer drops it
    // too if it comes after this).
    if (service_->admission_->Cancel(waiter)) {
      return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
    }
    std::string drop;
    {
      absl::MutexLock lock(&mu_);
      drop = ticket_;
    }
    if (!drop.empty()) service_->admission_->Drop(drop);
  }
  void OnDone() override { delete this; }

 private:
  void Answer(absl::StatusOr<std::string> ticket) {
    bool drop = false;
    {
      absl::MutexLock lock(&mu_);
      if (ticket.ok()) {
        ticket_ = *ticket;
        drop = cancelled_;
      }
    }
    if (!ticket.ok()) return Finish(server::ToGrpcStatus(ticket.status()));
    if (drop) service_->admission_->Drop(*ticket);
    response_->set_ticket(*std::move(ticket));
    response_->set_queue_us(Micros(absl::Now() - arrival_));
    response_->set_ticket_lease_ms(
        absl::ToInt64Milliseconds(service_->options_.admission.ticket_lease));
    service_->ExpireAdmissionAt(absl::Now() + service_->options_.admission.ticket_lease);
    Finish(grpc::Status::OK);
  }

  PrefillService* const service_;
  v1::AdmitResponse* const response_;
  const absl::Time arrival_;
  absl::Mutex mu_;
  int64_t waiter_ ABSL_GUARDED_BY(mu_) = 0;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;  // Wait returned
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::string ticket_ ABSL_GUARDED_BY(mu_);
};

void PrefillService::GiveUp(const std::shared_ptr<Job>& job, absl::Status status) {
  bool computing;
  {
    absl::MutexLock lock(&job->mu);
    if (job->done) return;
    computing = !job->kv.has_value();
  }
  // The send releases its writes, then the held blocks, so they are never reused while a write
  // may still read them. Still computing: abort it too.
  kvtransfer::KvSender::Abandon(job->send);
  if (computing) engine_->Cancel(job->request_id);
  job->Finish(std::move(status));
}

PrefillService::PrefillService(Engine* engine, std::vector<TransferLane> lanes,
                               metrics::WorkerMetrics* metrics,
                               std::shared_ptr<const auth::ServiceIdentity> identity,
                               PrefillServiceOptions options)
    : engine_(engine),
      lanes_(std::move(lanes)),
      metrics_(metrics),
      identity_(std::move(identity)),
      options_(std::move(options)),
      layout_(server::ToTransferLayout(engine->kv_layout())),
      dispatch_(std::make_shared<Dispatch>()),
      timers_(std::make_shared<CallExecutor>(1)),
      admission_(AdmissionQueue::Create(options_.admission, [engine](const AdmissionStats& s) {
        engine->SetQueuedOutside(s.waiting, s.waiting_tokens);
      })) {
  // Every lane's series exists from the start (at zero), so a scrape shows them before traffic.
  for (const TransferLane& lane : lanes_)
    (void)metrics_->kv_transfer.For(lane.sender->backend_name());
  absl::MutexLock lock(&dispatch_->mu);
  dispatch_->service = this;
}

size_t PrefillService::FindLane(const std::string& backend) const {
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i].sender->backend_name() == backend) return i;
  }
  return lanes_.size();
}

void PrefillService::Record(const std::string& backend, const kvtransfer::KvSendReport& report) {
  if (report.status.ok()) {
    metrics_->kv_transfer.CountTransfer(
        backend, static_cast<double>(report.bytes), static_cast<double>(report.ops),
        static_cast<double>(report.streamed_bytes), report.latency, report.exposed);
  } else if (report.failed_stage != kvtransfer::SendStage::kProducer) {
    metrics_->kv_transfer.CountFailure(backend,
                                       std::string(kvtransfer::SendStageName(report.failed_stage)));
  }
}

grpc::Status PrefillService::Connect(grpc::ServerContext* context,
                                     const v1::ConnectRequest* request,
                                     v1::ConnectResponse* response) {
  if (grpc::Status s = identity_->Authenticate(*context); !s.ok()) return s;
  const std::string who =
      request->decode_worker().empty() ? context->peer() : request->decode_worker();
  // The model and the layout formula must match before anything else is looked at.
  if (absl::Status s = server::CheckCompatibility(engine_->config(), request->compatibility(),
                                                  absl::StrCat("decode worker ", who));
      !s.ok()) {
    return server::ToGrpcStatus(s);
  }
  if (request->endpoints_size() == 0 || request->endpoints_size() > 8) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT, "endpoints: expected 1 to 8");
  }
  if (request->grant_key().size() != auth::kGrantKeyBytes) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("grant_key: expected ", auth::kGrantKeyBytes, " random bytes"));
  }
  std::vector<std::string> fallbacks;
  for (const v1::KvEndpoint& endpoint : request->endpoints()) {
    const size_t lane = FindLane(endpoint.backend());
    absl::Status usable;
    kvtransfer::KvLayout layout = server::KvLayoutFromProto(endpoint.layout());
    if (lane == lanes_.size()) {
      usable = absl::UnimplementedError("this prefill worker does not run it");
    } else {
      usable = lanes_[lane].sender->Admit(layout);
    }
    kvtransfer::KvSender::Joined joined;
    if (usable.ok()) {
      absl::StatusOr<kvtransfer::KvSender::Joined> connected = lanes_[lane].sender->Connect(
          endpoint.agent_name(), endpoint.agent_address(), options_.connect_timeout);
      usable = connected.status();
      if (connected.ok()) joined = *std::move(connected);
    }
    if (usable.ok()) {
      absl::StatusOr<std::string> pair_id = NewPairId();
      if (!pair_id.ok()) return server::ToGrpcStatus(pair_id.status());
      absl::MutexLock lock(&pairs_mu_);
      pairs_[*pair_id] = Pair{.lane = lane,
                              .endpoint = endpoint,
                              .layout = layout,
                              .grant_key = request->grant_key(),
                              .max_epoch = 0,
                              .seen_epochs = {}};
      if (!kvtransfer::SameBlockFormat(layout_, layout)) {
        LOG(INFO) << "prefill: decode worker " << who << " gets its KV converted: block size "
                  << layout_.block_size << " -> " << layout.block_size << ", "
                  << kvtransfer::KvDtypeName(layout_.dtype) << " -> "
                  << kvtransfer::KvDtypeName(layout.dtype);
      }
      pair_order_.push_back(*pair_id);
      while (pair_order_.size() > options_.max_pairs) {
        pairs_.erase(pair_order_.front());
        pair_order_.pop_front();
      }
      response->set_pair_id(*pair_id);
      response->set_backend(endpoint.backend());
      response->set_connect_reply(joined.reply);
      response->set_agent_name(joined.agent_name);
      for (std::string& f : fallbacks) response->add_fallbacks(std::move(f));
      LOG(INFO) << "prefill: paired with decode worker " << who << " over " << endpoint.backend();
      return grpc::Status::OK;
    }
    std::string reason = absl::StrCat(endpoint.backend(), ": ", usable.message());
    // Labels from our own names only: a peer must not mint metric series.
    metrics_->kv_transfer_fallbacks
        .Add({{"backend", lane == lanes_.size() ? "other" : endpoint.backend()},
              {"reason", absl::StatusCodeToString(usable.code())}})
        .Increment();
    {
      absl::MutexLock lock(&pairs_mu_);
      if (logged_fallbacks_.size() < kMaxLoggedFallbacks &&
          logged_fallbacks_.insert(absl::StrCat(who, "/", endpoint.backend())).second) {
        LOG(WARNING) << "prefill: decode worker " << who << ": not using " << reason;
      }
    }
    fallbacks.push_back(std::move(reason));
  }
  // No transfer can happen with this decode worker: a failure at the connect stage, counted on
  // the backend it would have preferred (its first endpoint).
  const size_t first = FindLane(request->endpoints(0).backend());
  metrics_->kv_transfer.CountFailure(
      first == lanes_.size() ? std::string("other") : request->endpoints(0).backend(), "connect");
  return Error(grpc::StatusCode::FAILED_PRECONDITION,
               absl::StrCat("no usable KV transfer endpoint: ", absl::StrJoin(fallbacks, "; ")));
}

PrefillService::~PrefillService() {
  admission_->Close();
  timers_->Stop();
}

void PrefillService::StopAdmitting() { admission_->Close(); }

void PrefillService::ExpireAdmissionAt(absl::Time when) {
  timers_->PostAt(when, [queue = std::weak_ptr<AdmissionQueue>(admission_)] {
    if (std::shared_ptr<AdmissionQueue> q = queue.lock()) q->Expire(absl::Now());
  });
}

grpc::ServerUnaryReactor* PrefillService::Admit(grpc::CallbackServerContext* context,
                                                const v1::AdmitRequest* request,
                                                v1::AdmitResponse* response) {
  auto* call = new AdmitCall(this, response);
  grpc::Status refused = identity_->Authenticate(*context);
  if (refused.ok()) {
    absl::MutexLock lock(&pairs_mu_);
    if (!pairs_.contains(request->pair_id())) {
      refused = Error(grpc::StatusCode::NOT_FOUND,
                      "pair_id: unknown pair (this prefill worker restarted or forgot it): "
                      "connect again");
    }
  }
  if (refused.ok() && request->request_id().empty()) {
    refused = Error(grpc::StatusCode::INVALID_ARGUMENT, "request_id: must not be empty");
  }
  if (refused.ok() && request->request_id().size() > kMaxAdmitRequestIdBytes) {
    refused = Error(grpc::StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("request_id: longer than ", kMaxAdmitRequestIdBytes, " bytes"));
  }
  if (refused.ok() && (request->num_prompt_tokens() < 1 ||
                       request->num_prompt_tokens() > engine_->max_model_len())) {
    refused = Error(grpc::StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("num_prompt_tokens: ", request->num_prompt_tokens(),
                                 " outside [1, ", engine_->max_model_len(), "]"));
  }
  if (!refused.ok()) {
    call->Refuse(refused);
    return call;
  }
  const absl::Time deadline =
      std::min(absl::Now() + options_.admit_timeout, absl::FromChrono(context->deadline()));
  call->Wait(*request, deadline);
  ExpireAdmissionAt(deadline);
  return call;
}

void PrefillService::Detach() {
  absl::MutexLock lock(&dispatch_->mu);
  dispatch_->service = nullptr;
}

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext* context,
                                                  const v1::PrefillRequest* request,
                                                  v1::PrefillResponse* response) {
  auto* call = new PrefillCall(this, response);
  if (grpc::Status refused = StartPrefill(context, request, call); !refused.ok()) {
    call->Refuse(refused);
  }
  return call;
}

grpc::Status PrefillService::StartPrefill(grpc::CallbackServerContext* context,
                                          const v1::PrefillRequest* request, PrefillCall* call) {
  if (grpc::Status s = identity_->Authenticate(*context); !s.ok()) return s;
  const absl::Time arrival = absl::Now();
  const std::string& id = request->request_id();
  if (id.empty()) return Error(grpc::StatusCode::INVALID_ARGUMENT, "request_id: must not be empty");
  const int num_tokens = request->prompt_token_ids_size();
  if (num_tokens == 0) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT, "prompt_token_ids: must not be empty");
  }
  SamplingParams params = server::SamplingParamsFromProto(request->sampling());
  if (absl::Status s = ValidateSamplingParams(params, engine_->config().vocab_size); !s.ok()) {
    return server::ToGrpcStatus(s);
  }
  if (request->admission_ticket().size() > kMaxAdmissionTicketBytes) {
    return Error(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("admission_ticket: longer than ", kMaxAdmissionTicketBytes, " bytes"));
  }
  const v1::KvTarget& target = request->target();
  if (target.num_cached_tokens() < 0 || target.num_cached_tokens() > num_tokens) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("target.num_cached_tokens: ", target.num_cached_tokens(),
                              " outside [0, ", num_tokens, "]"));
  }
  size_t lane = lanes_.size();
  kvtransfer::KvDestination destination;
  std::string fence_key;
  // Only paired requests: the region, layout and agent come from the handshake, never from the
  // request (a whole target in a request could point the writes anywhere).
  if (request->pair_id().empty()) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 "pair_id: required (pair with Prefill.Connect first; requests carry block ids "
                 "only)");
  }
  if (!target.backend().empty() || !target.agent_name().empty() ||
      !target.agent_address().empty() || !target.region().empty() || target.has_layout()) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 "target: with pair_id only block_ids and num_cached_tokens may be set");
  }
  {
    absl::MutexLock lock(&pairs_mu_);
    auto it = pairs_.find(request->pair_id());
    if (it == pairs_.end()) {
      return Error(grpc::StatusCode::NOT_FOUND,
                   "pair_id: unknown pair (this prefill worker restarted or forgot it): connect "
                   "again");
    }
    if (request->transfer_epoch() == 0) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT, "transfer_epoch: required (non-zero)");
    }
    Pair& pair = it->second;
    // The block ids must be the ones the decode worker reserved for this request and epoch.
    if (absl::Status granted = auth::VerifyKvGrant(
            pair.grant_key, request->grant(), request->pair_id(), request->transfer_epoch(), id,
            target.num_cached_tokens(),
            absl::MakeConstSpan(target.block_ids().data(), target.block_ids_size()));
        !granted.ok()) {
      return server::ToGrpcStatus(granted);
    }
    // Anti-replay: each epoch of a pair is accepted once, within a window below the highest seen
    // (the decode worker's epochs only grow; concurrent calls may arrive out of order).
    const uint64_t epoch = request->transfer_epoch();
    if (epoch + kEpochWindow <= pair.max_epoch) {
      return Error(grpc::StatusCode::FAILED_PRECONDITION,
                   absl::StrCat("transfer_epoch: ", epoch,
                                " is older than this pair's window "
                                "(a replayed or stale request)"));
    }
    if (!pair.seen_epochs.insert(epoch).second) {
      return Error(grpc::StatusCode::ALREADY_EXISTS,
                   absl::StrCat("transfer_epoch: ", epoch,
                                " was already used by this pair (a replayed request)"));
    }
    if (epoch > pair.max_epoch) pair.max_epoch = epoch;
    if (pair.seen_epochs.size() > 2 * kEpochWindow) {
      absl::erase_if(pair.seen_epochs,
                     [&pair](uint64_t e) { return e + kEpochWindow <= pair.max_epoch; });
    }
    fence_key = absl::StrCat(request->pair_id(), "/", epoch);
    lane = pair.lane;
    destination.agent_name = pair.endpoint.agent_name();
    destination.agent_address = pair.endpoint.agent_address();
    destination.region = pair.endpoint.region();
    destination.layout = pair.layout;
  }
  destination.block_ids.assign(target.block_ids().begin(), target.block_ids().end());
  destination.num_cached_tokens = target.num_cached_tokens();
  destination.want_checksum = request->want_kv_checksum();
  kvtransfer::KvSender& sender = *lanes_[lane].sender;
  // The layouts must be compatible and the target's block ids must cover the prompt: found out
  // before computing anything.
  if (absl::Status usable = sender.CheckDestination(destination, num_tokens); !usable.ok()) {
    return Error(grpc::StatusCode::FAILED_PRECONDITION, absl::StrCat("target: ", usable.message()));
  }
  // Layer-wise streaming: device lanes only (a host mirror is staged after the whole prompt, and
  // converted KV goes after the whole prompt too).
  const bool streamed = options_.kv_streaming && !lanes_[lane].staged &&
                        engine_->reports_kv_chunks() &&
                        kvtransfer::SameBlockFormat(layout_, destination.layout);
  const absl::Time deadline =
      std::min(arrival + options_.prefill_timeout, absl::FromChrono(context->deadline()));

  auto job = std::make_shared<Job>();
  job->request_id = id;
  {
    // The admitted share moves to this call (or, without a live ticket, it counts from now).
    std::unique_ptr<AdmissionQueue::Slot> slot =
        admission_->Claim(request->admission_ticket(), id, num_tokens);
    absl::MutexLock lock(&job->mu);
    job->slot = std::move(slot);
  }
  // From here on the job's first Finish (the send's report, a failed prefill, the client going
  // away, the deadline) completes the call: no more refusals.
  call->Watch(job, arrival, params.logprobs.has_value(), num_tokens);
  // The report may come after this service is gone (engine callbacks): count it only while the
  // service is attached.
  job->send =
      sender.Begin(id, std::move(destination), deadline, streamed,
                   [job_weak = std::weak_ptr<Job>(job), dispatch = dispatch_,
                    backend = sender.backend_name()](const kvtransfer::KvSendReport& report) {
                     {
                       absl::MutexLock lock(&dispatch->mu);
                       if (dispatch->service != nullptr) dispatch->service->Record(backend, report);
                     }
                     if (std::shared_ptr<Job> job = job_weak.lock()) {
                       job->Finish(report.status, report.bytes, report.exposed, report.checksum);
                     }
                   });
  {
    // The epoch is new to the pair (checked above), so no other call holds this key.
    absl::MutexLock lock(&jobs_mu_);
    jobs_[fence_key] = Fenceable{job, job->send};
    if (jobs_.size() > 2 * options_.max_pairs) {  // forget the ones nobody holds any more
      absl::erase_if(jobs_, [](const auto& entry) { return entry.second.send.expired(); });
    }
  }

  GenerateRequest engine_request;
  engine_request.request_id = id;
  engine_request.prompt_token_ids.assign(request->prompt_token_ids().begin(),
                                         request->prompt_token_ids().end());
  params.max_tokens = 1;  // only the first token is sampled here
  params.stop.clear();    // stop strings act on later text, on the decode worker
  engine_request.params = params;
  engine_request.priority = request->priority();
  engine_request.hold_kv_after_prefill = true;
  engine_request.stage_kv = lanes_[lane].staged;
  Engine* engine = engine_;
  // The callbacks hold the send (not the job): the handler may be gone when they run.
  engine_request.on_prefilled = [job, send = job->send, engine](const PrefilledKv& kv) {
    {
      absl::MutexLock lock(&job->mu);
      job->kv = kv;
      job->prefilled_at = absl::Now();
    }
    kvtransfer::KvSender::Whole(send, kv.block_ids, kv.num_tokens,
                                [engine, id = kv.request_id] { engine->ReleaseHeldKv(id); });
  };
  if (streamed) {
    engine_request.on_kv_chunk = [send = job->send](const KvChunk& chunk) {
      kvtransfer::KvSender::Chunk(send, {.block_ids = chunk.block_ids,
                                         .begin = chunk.begin,
                                         .end = chunk.end,
                                         .progress = chunk.progress,
                                         .first_value = chunk.first_value});
    };
  }
  engine_request.on_output = [job](const GenerationOutput& out) {
    bool failed = false;
    {
      absl::MutexLock lock(&job->mu);
      if (out.first_token_timings.has_value()) job->timings = out.first_token_timings;
      // A request that ends before its KV is ready (error, abort) has nothing to transfer.
      failed = out.finish_reason.has_value() && !job->kv.has_value();
    }
    if (!failed) return;
    absl::Status status =
        *out.finish_reason == FinishReason::kError
            ? absl::InternalError(absl::StrCat("prefill failed: ", out.error.message()))
            : absl::AbortedError("prefill aborted");
    job->Finish(status);
    kvtransfer::KvSender::Failed(job->send, std::move(status));
  };
  if (absl::Status s = engine_->Submit(std::move(engine_request)); !s.ok()) {
    job->Finish(s);
    kvtransfer::KvSender::Failed(job->send, s);
    return grpc::Status::OK;
  }
  call->Submitted(absl::Now());
  // The deadline: whatever is still running then is given up.
  timers_->PostAt(deadline, [this, weak = std::weak_ptr<Job>(job)] {
    if (std::shared_ptr<Job> job = weak.lock()) {
      GiveUp(job, absl::DeadlineExceededError("prefill and KV transfer did not finish in time"));
    }
  });
  return grpc::Status::OK;
}

grpc::Status PrefillService::Fence(grpc::ServerContext* context, const v1::FenceRequest* request,
                                   v1::FenceResponse* response) {
  if (grpc::Status s = identity_->Authenticate(*context); !s.ok()) return s;
  {
    absl::MutexLock lock(&pairs_mu_);
    if (!pairs_.contains(request->pair_id())) {
      return Error(grpc::StatusCode::NOT_FOUND, "pair_id: unknown pair");
    }
  }
  std::shared_ptr<Job> job;
  std::shared_ptr<kvtransfer::KvSend> send;
  {
    absl::MutexLock lock(&jobs_mu_);
    auto it = jobs_.find(absl::StrCat(request->pair_id(), "/", request->transfer_epoch()));
    if (it != jobs_.end()) {
      job = it->second.job.lock();
      send = it->second.send.lock();
    }
  }
  if (send == nullptr) {  // finished and dropped, or never started: nothing of it can post
    response->set_quiescent(true);
    return grpc::Status::OK;
  }
  const absl::Time deadline =
      std::min(absl::Now() + options_.fence_timeout, absl::FromChrono(context->deadline()));
  bool computing = false;
  if (job != nullptr) {
    absl::MutexLock lock(&job->mu);
    computing = !job->kv.has_value() && !job->done;
  }
  // No write of the send is posted from here on; the held KV of a finished prompt goes back once
  // its writes are released (and, for writes the backend could not recall, finished); a prompt
  // still computing is aborted.
  response->set_quiescent(kvtransfer::KvSender::Fence(send, deadline));
  if (computing) engine_->Cancel(job->request_id);
  return grpc::Status::OK;
}

}  // namespace tandem::prefill

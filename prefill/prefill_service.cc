#include "prefill/prefill_service.h"

#include <algorithm>
#include <deque>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvtransfer/kv_convert.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/server/grpc_status.h"
#include "runtime/server/kv_layout_convert.h"
#include "runtime/server/proto_convert.h"

namespace tandem::prefill {
namespace {

// How often a waiting handler looks at its client (cancellation) and its deadline.
constexpr absl::Duration kSlice = absl::Milliseconds(20);

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

// (decode worker, backend) fallbacks logged at most once each, for this many pairs of names.
constexpr size_t kMaxLoggedFallbacks = 1024;

// 128 bits from the kernel's CSPRNG, hex: a pair id nobody can guess.
absl::StatusOr<std::string> NewPairId() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[16];
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) {
    return absl::InternalError("cannot read /dev/urandom for a pair id");
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

grpc::Status Error(grpc::StatusCode code, std::string message) {
  return grpc::Status(code, std::move(message));
}

}  // namespace

// Layer-wise streaming state of one job: its lane's transfer thread only.
struct PrefillService::Stream {
  struct Pending {
    uint64_t threshold = 0;  // post once the layer progress reaches it (or after on_prefilled)
    std::vector<kvtransfer::CopyOp> ops;
  };
  const volatile uint64_t* progress = nullptr;
  std::deque<Pending> pending;  // thresholds ascending
  std::vector<kvtransfer::TransferHandle> posted;
  int64_t bytes = 0;
  int64_t early_bytes = 0;  // posted before on_prefilled
  absl::Status failure;     // set once; the job fails with it
  bool prefilled = false;   // on_prefilled arrived: the KV is held and every layer may go
  bool polling = false;     // PollStream is registered
  int chunks = 0;
  absl::Time first_post = absl::InfiniteFuture();
  absl::Time prefilled_at;
};

// A converted prompt's KV in the destination's format, registered with the lane's backend for
// one transfer (transfer thread only). Free deregisters it; the buffer goes with the last owner.
struct PrefillService::Staging {
  std::unique_ptr<char[]> bytes;
  uint64_t length = 0;
  uint64_t region_id = 0;
  bool registered = false;
  std::vector<kvtransfer::CopyOp> ops;  // buffer -> destination region

  void Free(kvtransfer::TransferBackend& backend) {
    if (!registered) return;
    registered = false;
    if (absl::Status s = backend.DeregisterMemory(region_id); !s.ok()) {
      LOG(WARNING) << "prefill: deregistering a KV conversion buffer: " << s;
    }
  }
};

// One Prefill call, shared by the handler, the engine callbacks and the transfer thread.
struct PrefillService::Job {
  std::string request_id;
  size_t lane = 0;
  // Where the KV goes: from the pair's handshake, or the request's whole target.
  std::string agent_name;
  std::string agent_address;
  std::string region;
  v1::KvTarget target;  // block_ids and num_cached_tokens
  kvtransfer::KvLayout target_layout;
  std::unique_ptr<Stream> stream;  // layer-wise streaming; the lane's transfer thread only
  absl::Time deadline;

  absl::Mutex mu;
  bool abandoned ABSL_GUARDED_BY(mu) = false;  // the handler gave up: release everything
  // Writes posted and not yet released (transfer thread changes it; Fence waits for 0).
  int unreleased ABSL_GUARDED_BY(mu) = 0;
  std::optional<PrefilledKv> kv ABSL_GUARDED_BY(mu);
  absl::Time prefilled_at ABSL_GUARDED_BY(mu);
  std::optional<FirstTokenTimings> timings ABSL_GUARDED_BY(mu);
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  int64_t bytes ABSL_GUARDED_BY(mu) = 0;
  absl::Duration transfer_time ABSL_GUARDED_BY(mu);

  bool is_abandoned() {
    absl::MutexLock lock(&mu);
    return abandoned;
  }
  void AddUnreleased(int n) {
    absl::MutexLock lock(&mu);
    unreleased += n;
  }
  // The first call wins.
  void Finish(absl::Status s, int64_t written = 0, absl::Duration time = absl::ZeroDuration()) {
    absl::MutexLock lock(&mu);
    if (done) return;
    done = true;
    status = std::move(s);
    bytes = written;
    transfer_time = time;
  }
};

PrefillService::PrefillService(Engine* engine, std::vector<TransferLane> lanes,
                               metrics::WorkerMetrics* metrics, PrefillServiceOptions options)
    : engine_(engine),
      lanes_(std::move(lanes)),
      metrics_(metrics),
      options_(std::move(options)),
      layout_(server::ToTransferLayout(engine->kv_layout())),
      dispatch_(std::make_shared<Dispatch>()),
      peers_(lanes_.size()) {
  absl::MutexLock lock(&dispatch_->mu);
  dispatch_->service = this;
}

size_t PrefillService::FindLane(const std::string& backend) const {
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i].transfer->backend_name() == backend) return i;
  }
  return lanes_.size();
}

absl::Status PrefillService::CheckLayouts(const TransferLane& lane,
                                          const kvtransfer::KvLayout& target) const {
  if (kvtransfer::SameBlockFormat(layout_, target)) {
    // Byte copies: the geometry must still be sound (a dry run of one block).
    const std::vector<int32_t> one = {0};
    return kvtransfer::PlanBlockCopies(layout_, target, one, one, 1, 0).status();
  }
  RETURN_IF_ERROR(kvtransfer::CheckConvertible(layout_, target));
  if (lane.host_memory == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the KV needs converting (block size ", layout_.block_size, " -> ", target.block_size, ", ",
        kvtransfer::KvDtypeName(layout_.dtype), " -> ", kvtransfer::KvDtypeName(target.dtype),
        ") and this worker converts only from host memory, which its ",
        lane.transfer->backend_name(), " lane does not read"));
  }
  return absl::OkStatus();
}

grpc::Status PrefillService::Connect(grpc::ServerContext* context,
                                     const v1::ConnectRequest* request,
                                     v1::ConnectResponse* response) {
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
  std::vector<std::string> fallbacks;
  for (const v1::KvEndpoint& endpoint : request->endpoints()) {
    const size_t lane = FindLane(endpoint.backend());
    absl::Status usable;
    kvtransfer::KvLayout layout = server::KvLayoutFromProto(endpoint.layout());
    if (lane == lanes_.size()) {
      usable = absl::UnimplementedError("this prefill worker does not run it");
    } else {
      usable = CheckLayouts(lanes_[lane], layout);
    }
    // Shared with the task: on a timeout it may still run after Run returns.
    struct Joined {
      std::string reply;
      std::string agent;
    };
    auto joined = std::make_shared<Joined>();
    if (usable.ok()) {
      usable = lanes_[lane].transfer->Run(
          [name = endpoint.agent_name(), address = endpoint.agent_address(),
           joined](kvtransfer::TransferBackend& backend) -> absl::Status {
            RETURN_IF_ERROR(backend.Connect(name, address));
            ASSIGN_OR_RETURN(joined->reply, backend.ConnectReply(name));
            joined->agent = backend.agent_name();
            return absl::OkStatus();
          },
          options_.connect_timeout);
    }
    if (usable.ok()) {
      absl::StatusOr<std::string> pair_id = NewPairId();
      if (!pair_id.ok()) return server::ToGrpcStatus(pair_id.status());
      absl::MutexLock lock(&pairs_mu_);
      pairs_[*pair_id] = Pair{lane, endpoint, layout};
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
      response->set_connect_reply(joined->reply);
      response->set_agent_name(joined->agent);
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
  // No transfer can happen with this decode worker: a failure at the connect stage.
  metrics_->kv_transfer_failures.Increment();
  return Error(grpc::StatusCode::FAILED_PRECONDITION,
               absl::StrCat("no usable KV transfer endpoint: ", absl::StrJoin(fallbacks, "; ")));
}

void PrefillService::Detach() {
  absl::MutexLock lock(&dispatch_->mu);
  dispatch_->service = nullptr;
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const v1::PrefillRequest* request,
                                     v1::PrefillResponse* response) {
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
  const v1::KvTarget& target = request->target();
  auto job = std::make_shared<Job>();
  kvtransfer::KvLayout target_layout;
  if (!request->pair_id().empty()) {
    if (!target.backend().empty() || !target.agent_name().empty() ||
        !target.agent_address().empty() || !target.region().empty() || target.has_layout()) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT,
                   "target: with pair_id only block_ids and num_cached_tokens may be set");
    }
    absl::MutexLock lock(&pairs_mu_);
    auto it = pairs_.find(request->pair_id());
    if (it == pairs_.end()) {
      return Error(grpc::StatusCode::NOT_FOUND,
                   "pair_id: unknown pair (this prefill worker restarted or forgot it): connect "
                   "again");
    }
    if (request->transfer_epoch() != 0) {
      absl::MutexLock jobs_lock(&jobs_mu_);
      const std::string key = absl::StrCat(request->pair_id(), "/", request->transfer_epoch());
      auto [slot, inserted] = jobs_.try_emplace(key);
      if (!inserted && !slot->second.expired()) {
        return Error(grpc::StatusCode::ALREADY_EXISTS,
                     "transfer_epoch: already used by a live transfer of this pair");
      }
      slot->second = job;
      if (jobs_.size() > 2 * options_.max_pairs) {  // forget the ones nobody holds any more
        absl::erase_if(jobs_, [](const auto& entry) { return entry.second.expired(); });
      }
    }
    job->lane = it->second.lane;
    job->agent_name = it->second.endpoint.agent_name();
    job->agent_address = it->second.endpoint.agent_address();
    job->region = it->second.endpoint.region();
    target_layout = it->second.layout;
  } else {
    job->lane = FindLane(target.backend());
    if (job->lane == lanes_.size()) {
      return Error(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("target.backend: '", target.backend(), "' is not a backend of this worker"));
    }
    job->agent_name = target.agent_name();
    job->agent_address = target.agent_address();
    job->region = target.region();
    target_layout = server::KvLayoutFromProto(target.layout());
  }
  if (target.num_cached_tokens() < 0 || target.num_cached_tokens() > num_tokens) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("target.num_cached_tokens: ", target.num_cached_tokens(),
                              " outside [0, ", num_tokens, "]"));
  }
  // The layouts must be compatible and the target's block ids must cover the prompt: plan once
  // with stand-in source blocks (our block 0) to find out before computing anything.
  {
    const int blocks = (num_tokens + layout_.block_size - 1) / layout_.block_size;
    const std::vector<int32_t> stand_in(blocks, 0);
    absl::Status usable = CheckLayouts(lanes_[job->lane], target_layout);
    if (usable.ok()) {
      const std::span<const int32_t> dst(target.block_ids().data(), target.block_ids_size());
      usable = kvtransfer::SameBlockFormat(layout_, target_layout)
                   ? kvtransfer::PlanBlockCopies(layout_, target_layout, stand_in, dst, num_tokens,
                                                 target.num_cached_tokens())
                         .status()
                   : kvtransfer::PlanKvConversion(layout_, target_layout, stand_in, dst, num_tokens,
                                                  target.num_cached_tokens(), 0, layout_.num_layers)
                         .status();
    }
    if (!usable.ok()) {
      return Error(grpc::StatusCode::FAILED_PRECONDITION,
                   absl::StrCat("target: ", usable.message()));
    }
  }

  job->request_id = id;
  job->target = target;
  job->target_layout = target_layout;
  job->deadline =
      std::min(arrival + options_.prefill_timeout, absl::FromChrono(context->deadline()));

  GenerateRequest engine_request;
  engine_request.request_id = id;
  engine_request.prompt_token_ids.assign(request->prompt_token_ids().begin(),
                                         request->prompt_token_ids().end());
  params.max_tokens = 1;  // only the first token is sampled here
  params.stop.clear();    // stop strings act on later text, on the decode worker
  engine_request.params = params;
  engine_request.hold_kv_after_prefill = true;
  engine_request.stage_kv = lanes_[job->lane].staged;
  Engine* engine = engine_;
  engine_request.on_prefilled = [dispatch = dispatch_, job, engine](const PrefilledKv& kv) {
    {
      absl::MutexLock lock(&job->mu);
      job->kv = kv;
      job->prefilled_at = absl::Now();
    }
    absl::MutexLock lock(&dispatch->mu);
    PrefillService* service = dispatch->service;
    if (service == nullptr || !service->lanes_[job->lane].transfer->Post(
                                  [service, job](kvtransfer::TransferBackend& backend) {
                                    service->StartTransfer(backend, job);
                                  })) {
      engine->ReleaseHeldKv(kv.request_id);
      job->Finish(absl::UnavailableError("prefill worker shutting down"));
    }
  };
  // Layer-wise streaming: device lanes only (a host mirror is staged after the whole prompt, and
  // converted KV goes after the whole prompt too).
  if (options_.kv_streaming && !lanes_[job->lane].staged && engine_->reports_kv_chunks() &&
      kvtransfer::SameBlockFormat(layout_, target_layout)) {
    engine_request.on_kv_chunk = [dispatch = dispatch_, job](const KvChunk& chunk) {
      absl::MutexLock lock(&dispatch->mu);
      PrefillService* service = dispatch->service;
      if (service == nullptr) return;  // shutting down: on_prefilled releases
      (void)service->lanes_[job->lane].transfer->Post(
          [service, job, chunk](kvtransfer::TransferBackend& backend) {
            service->OnKvChunk(backend, job, chunk);
          });
    };
  }
  engine_request.on_output = [job](const GenerationOutput& out) {
    absl::MutexLock lock(&job->mu);
    if (out.first_token_timings.has_value()) job->timings = out.first_token_timings;
    // A request that ends before its KV is ready (error, abort) has nothing to transfer.
    if (out.finish_reason.has_value() && !job->kv.has_value() && !job->done) {
      job->done = true;
      job->status = *out.finish_reason == FinishReason::kError
                        ? absl::InternalError(absl::StrCat("prefill failed: ", out.error.message()))
                        : absl::AbortedError("prefill aborted");
    }
  };
  if (absl::Status s = engine_->Submit(std::move(engine_request)); !s.ok()) {
    return server::ToGrpcStatus(s);
  }
  const absl::Time submitted = absl::Now();

  // Wait for the transfer to be acknowledged (or to fail), watching the client and the deadline.
  absl::MutexLock lock(&job->mu);
  while (!job->done) {
    job->mu.AwaitWithTimeout(absl::Condition(&job->done), kSlice);
    if (job->done) break;
    const bool cancelled = context->IsCancelled();
    if (cancelled || absl::Now() > job->deadline) {
      job->abandoned = true;
      if (!job->kv.has_value()) {
        // Still computing: abort it. (KV that becomes ready anyway is released by the transfer
        // thread when it sees `abandoned`.)
        job->mu.Unlock();
        engine_->Cancel(id);
        job->mu.Lock();
      }
      // Otherwise the transfer thread releases the transfer first and then the held blocks, so
      // they are never reused while a write may still read them.
      return cancelled ? Error(grpc::StatusCode::CANCELLED, "cancelled by the client")
                       : Error(grpc::StatusCode::DEADLINE_EXCEEDED,
                               "prefill and KV transfer did not finish in time");
    }
  }
  if (!job->status.ok()) return server::ToGrpcStatus(job->status);
  const PrefilledKv& kv = *job->kv;
  response->set_first_token_id(kv.first_token);
  if (params.logprobs.has_value() && kv.first_token_logprobs.has_value()) {
    server::TokenLogprobsToProto(*kv.first_token_logprobs,
                                 response->mutable_first_token_logprobs());
  }
  response->set_kv_bytes_written(job->bytes);
  response->set_prefix_cached_tokens(kv.prefix_cached_tokens);
  if (job->timings.has_value()) {
    response->set_queue_us(Micros(submitted - arrival) + job->timings->queue_us);
    response->set_prefill_us(job->timings->prefill_us);
  } else {  // the engine's final output has not arrived yet: no finer split than ours
    response->set_queue_us(Micros(submitted - arrival));
    response->set_prefill_us(Micros(job->prefilled_at - submitted));
  }
  response->set_transfer_us(Micros(job->transfer_time));
  metrics_->prompt_tokens.Increment(std::max(0, num_tokens - kv.prefix_cached_tokens));
  return grpc::Status::OK;
}

grpc::Status PrefillService::Fence(grpc::ServerContext* context, const v1::FenceRequest* request,
                                   v1::FenceResponse* response) {
  {
    absl::MutexLock lock(&pairs_mu_);
    if (!pairs_.contains(request->pair_id())) {
      return Error(grpc::StatusCode::NOT_FOUND, "pair_id: unknown pair");
    }
  }
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&jobs_mu_);
    auto it = jobs_.find(absl::StrCat(request->pair_id(), "/", request->transfer_epoch()));
    if (it != jobs_.end()) job = it->second.lock();
  }
  if (job == nullptr) {  // finished and dropped, or never started: nothing of it can post
    response->set_quiescent(true);
    return grpc::Status::OK;
  }
  // On the transfer thread, between its tasks: from here on no write of the job is posted.
  const absl::Time deadline =
      std::min(absl::Now() + options_.fence_timeout, absl::FromChrono(context->deadline()));
  absl::Status marked = lanes_[job->lane].transfer->Run(
      [job](kvtransfer::TransferBackend&) {
        absl::MutexLock lock(&job->mu);
        job->abandoned = true;
        return absl::OkStatus();
      },
      std::max(absl::ZeroDuration(), deadline - absl::Now()));
  if (!marked.ok()) {
    response->set_quiescent(false);
    return grpc::Status::OK;
  }
  bool computing;
  {
    absl::MutexLock lock(&job->mu);
    computing = !job->kv.has_value() && !job->done;
  }
  if (computing) engine_->Cancel(job->request_id);
  // The pollers see `abandoned` on their next tick and release what they posted.
  absl::MutexLock lock(&job->mu);
  auto released = [&job]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu) { return job->unreleased == 0; };
  job->mu.AwaitWithDeadline(absl::Condition(&released), deadline);
  response->set_quiescent(job->unreleased == 0);
  return grpc::Status::OK;
}

void PrefillService::StartTransfer(kvtransfer::TransferBackend& backend,
                                   const std::shared_ptr<Job>& job) {
  PrefilledKv kv;
  bool abandoned;
  {
    absl::MutexLock lock(&job->mu);
    kv = *job->kv;
    abandoned = job->abandoned;
  }
  auto fail = [&](absl::Status status) {
    engine_->ReleaseHeldKv(kv.request_id);
    bool finished;  // a streamed job that failed (and counted it) before its KV was whole
    {
      absl::MutexLock lock(&job->mu);
      finished = job->done;
    }
    if (!finished) metrics_->kv_transfer_failures.Increment();
    job->Finish(std::move(status));
  };
  if (abandoned) return fail(absl::CancelledError("the caller gave up"));

  if (job->stream != nullptr) {
    // Streamed: the layers went (or go) as they were computed; PollStream finishes the job.
    Stream& st = *job->stream;
    st.prefilled = true;
    st.prefilled_at = absl::Now();
    if (!st.polling) {  // it gave up already (and counted it), or never started
      if (st.failure.ok()) st.failure = absl::InternalError("KV stream stopped");
      engine_->ReleaseHeldKv(kv.request_id);
      job->Finish(st.failure);
    }
    return;
  }
  const std::string& peer = job->agent_name;
  absl::flat_hash_map<std::string, std::string>& peers = peers_[job->lane];
  if (absl::Status s = EnsurePeer(backend, *job); !s.ok()) return fail(s);
  const std::span<const int32_t> dst(job->target.block_ids().data(), job->target.block_ids_size());
  // Layouts of another block format: convert into a staging buffer of the destination's format
  // here, then write that (Connect admitted the pair only for a lane reading host memory).
  std::shared_ptr<Staging> staging;
  absl::StatusOr<std::vector<kvtransfer::CopyOp>> ops;
  if (kvtransfer::SameBlockFormat(layout_, job->target_layout)) {
    ops = kvtransfer::PlanBlockCopies(layout_, job->target_layout, kv.block_ids, dst, kv.num_tokens,
                                      job->target.num_cached_tokens());
  } else {
    absl::StatusOr<std::shared_ptr<Staging>> staged =
        Convert(backend, lanes_[job->lane], job->target_layout, kv.block_ids, dst, kv.num_tokens,
                job->target.num_cached_tokens());
    if (!staged.ok()) {
      ops = staged.status();
    } else {
      staging = *staged;
      ops = std::move(staging->ops);
    }
  }
  if (!ops.ok()) return fail(absl::FailedPreconditionError(ops.status().message()));
  int64_t bytes = 0;
  for (const kvtransfer::CopyOp& op : *ops) bytes += static_cast<int64_t>(op.length);
  if (ops->empty()) {  // the target already holds every block
    if (staging != nullptr) staging->Free(backend);
    engine_->ReleaseHeldKv(kv.request_id);
    metrics_->kv_transfers.Increment();
    job->Finish(absl::OkStatus());
    return;
  }

  kvtransfer::TransferRequest transfer;
  transfer.local_region = staging != nullptr ? staging->region_id : lanes_[job->lane].local_region;
  transfer.peer = peer;
  transfer.remote_region = job->region;
  transfer.ops = std::move(*ops);
  const absl::Time posted = absl::Now();
  auto handle = backend.PostWrite(transfer);
  if (!handle.ok()) {
    if (staging != nullptr) staging->Free(backend);
    // Reconnect next time: the connection may be what failed.
    (void)backend.Disconnect(peer);
    peers.erase(peer);
    return fail(absl::UnavailableError(
        absl::StrCat("posting KV writes to '", peer, "': ", handle.status().message())));
  }
  job->AddUnreleased(1);
  const absl::Time deadline = std::min(job->deadline, posted + options_.transfer_timeout);
  const std::string request_id = kv.request_id;
  const bool polling = lanes_[job->lane].transfer->AddPoller(
      [this, job, h = *handle, bytes, posted, deadline, request_id, staging](
          kvtransfer::TransferBackend& backend, bool stopping) {
        absl::Status failure;
        const absl::Time now = absl::Now();
        if (stopping) {
          failure = absl::UnavailableError("prefill worker shutting down");
        } else if (job->is_abandoned()) {
          failure = absl::CancelledError("the caller gave up");
        } else if (now > deadline) {
          failure = absl::DeadlineExceededError("KV transfer not acknowledged in time");
        } else {
          absl::StatusOr<kvtransfer::TransferState> state = backend.Poll(h);
          if (state.ok() && *state == kvtransfer::TransferState::kInProgress) return false;
          if (!state.ok()) {
            failure = state.status();
          } else if (*state == kvtransfer::TransferState::kFailed) {
            failure = absl::UnavailableError("KV transfer failed");
          }
        }
        if (absl::Status released = backend.Release(h); !released.ok()) {
          LOG(WARNING) << "request " << request_id << ": releasing its KV transfer: " << released;
        }
        job->AddUnreleased(-1);
        if (staging != nullptr) staging->Free(backend);  // after Release: nothing reads it now
        engine_->ReleaseHeldKv(request_id);
        if (!failure.ok()) {
          metrics_->kv_transfer_failures.Increment();
          job->Finish(std::move(failure));
          return true;
        }
        metrics_->kv_transfer_bytes.Increment(static_cast<double>(bytes));
        metrics_->kv_transfers.Increment();
        metrics_->kv_transfer_latency.Observe(absl::ToDoubleSeconds(now - posted));
        job->Finish(absl::OkStatus(), bytes, now - posted);
        return true;
      });
  if (!polling) {  // stopping: nobody will poll it
    (void)backend.Release(*handle);
    job->AddUnreleased(-1);
    if (staging != nullptr) staging->Free(backend);
    fail(absl::UnavailableError("prefill worker shutting down"));
  }
}

absl::StatusOr<std::shared_ptr<PrefillService::Staging>> PrefillService::Convert(
    kvtransfer::TransferBackend& backend, const TransferLane& lane,
    const kvtransfer::KvLayout& target, std::span<const int32_t> src_blocks,
    std::span<const int32_t> dst_blocks, int num_tokens, int skip_tokens) {
  if (lane.host_memory == nullptr) {
    return absl::FailedPreconditionError("KV conversion needs a lane reading host memory");
  }
  ASSIGN_OR_RETURN(kvtransfer::ConversionPlan plan,
                   kvtransfer::PlanKvConversion(layout_, target, src_blocks, dst_blocks, num_tokens,
                                                skip_tokens, 0, layout_.num_layers));
  kvtransfer::StagedConversion staged = kvtransfer::StageConversion(plan);
  auto staging = std::make_shared<Staging>();
  staging->ops = std::move(staged.ops);
  if (staged.staging_bytes == 0) return staging;
  staging->length = staged.staging_bytes;
  staging->bytes.reset(new (std::nothrow) char[staging->length]);
  if (staging->bytes == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no memory for a ", staging->length, "-byte KV conversion buffer"));
  }
  RETURN_IF_ERROR(kvtransfer::ConvertOnHost(staged.pack, lane.host_memory, lane.host_bytes,
                                            staging->bytes.get(), staging->length));
  ASSIGN_OR_RETURN(
      kvtransfer::MemoryRegion region,
      backend.RegisterMemory(staging->bytes.get(), staging->length, kvtransfer::MemoryKind::kHost));
  staging->region_id = region.id;
  staging->registered = true;
  return staging;
}

absl::Status PrefillService::EnsurePeer(kvtransfer::TransferBackend& backend, const Job& job) {
  const std::string& peer = job.agent_name;
  const std::string& address = job.agent_address;
  absl::flat_hash_map<std::string, std::string>& peers = peers_[job.lane];
  auto it = peers.find(peer);
  if (it != peers.end() && it->second == address) return absl::OkStatus();
  if (it != peers.end()) {
    (void)backend.Disconnect(peer);
    peers.erase(it);
  }
  if (absl::Status s = backend.Connect(peer, address); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("connecting to transfer agent '", peer, "': ", s.message()));
  }
  peers[peer] = address;
  return absl::OkStatus();
}

void PrefillService::OnKvChunk(kvtransfer::TransferBackend& backend,
                               const std::shared_ptr<Job>& job, const KvChunk& chunk) {
  if (job->stream == nullptr) job->stream = std::make_unique<Stream>();
  Stream& st = *job->stream;
  if (!st.failure.ok() || st.prefilled || job->is_abandoned()) return;
  st.progress = chunk.progress;
  const auto give_up = [&](absl::Status status) {
    if (st.failure.ok()) st.failure = std::move(status);
  };
  if (absl::Status s = EnsurePeer(backend, *job); !s.ok()) return give_up(s);
  const std::span<const int32_t> dst(job->target.block_ids().data(), job->target.block_ids_size());
  const int block_size = layout_.block_size;
  const int d_cached = job->target.num_cached_tokens();
  // Blocks wholly inside the decode worker's cache are never written; the block holding `begin`
  // is written again by this chunk (its earlier positions went with the previous chunk).
  const int skip = std::max(d_cached, (chunk.begin / block_size) * block_size);
  if (chunk.end <= skip) return;  // all of it is cached there
  if (st.chunks++ == 0 && chunk.begin > d_cached) {
    // Positions before the first chunk came from this worker's prefix cache: ready now.
    auto ops = kvtransfer::PlanBlockCopies(layout_, job->target_layout, chunk.block_ids, dst,
                                           chunk.begin, d_cached);
    if (!ops.ok()) return give_up(absl::FailedPreconditionError(ops.status().message()));
    if (!ops->empty()) st.pending.push_back({0, std::move(*ops)});
  }
  for (int layer = 0; layer < layout_.num_layers; ++layer) {
    auto ops = kvtransfer::PlanLayerBlockCopies(layout_, job->target_layout, chunk.block_ids, dst,
                                                chunk.end, skip, layer, layer + 1);
    if (!ops.ok()) return give_up(absl::FailedPreconditionError(ops.status().message()));
    const uint64_t threshold = chunk.progress != nullptr
                                   ? chunk.first_value + static_cast<uint64_t>(layer) + 1
                                   : std::numeric_limits<uint64_t>::max();
    if (!ops->empty()) st.pending.push_back({threshold, std::move(*ops)});
  }
  if (!st.polling) {
    st.polling = lanes_[job->lane].transfer->AddPoller(
        [this, job](kvtransfer::TransferBackend& b, bool stopping) {
          return PollStream(b, job, stopping);
        });
    if (!st.polling) give_up(absl::UnavailableError("prefill worker shutting down"));
  }
}

bool PrefillService::PollStream(kvtransfer::TransferBackend& backend,
                                const std::shared_ptr<Job>& job, bool stopping) {
  Stream& st = *job->stream;
  const absl::Time now = absl::Now();
  if (stopping) {
    st.failure = absl::UnavailableError("prefill worker shutting down");
  } else if (job->is_abandoned()) {
    st.failure = absl::CancelledError("the caller gave up");
  } else if (now > job->deadline ||
             (st.prefilled && now > st.prefilled_at + options_.transfer_timeout)) {
    st.failure = absl::DeadlineExceededError("KV transfer not acknowledged in time");
  }
  // Post every layer whose KV is computed (all of them once the prompt is done).
  const uint64_t progress = st.progress != nullptr ? *st.progress : 0;
  while (st.failure.ok() && !st.pending.empty() &&
         (st.prefilled || st.pending.front().threshold <= progress)) {
    Stream::Pending& next = st.pending.front();
    int64_t bytes = 0;
    for (const kvtransfer::CopyOp& op : next.ops) bytes += static_cast<int64_t>(op.length);
    kvtransfer::TransferRequest transfer;
    transfer.local_region = lanes_[job->lane].local_region;
    transfer.peer = job->agent_name;
    transfer.remote_region = job->region;
    transfer.ops = std::move(next.ops);
    st.pending.pop_front();
    auto handle = backend.PostWrite(transfer);
    if (!handle.ok()) {
      st.failure = absl::UnavailableError(absl::StrCat("posting KV writes to '", job->agent_name,
                                                       "': ", handle.status().message()));
      break;
    }
    st.posted.push_back(*handle);
    job->AddUnreleased(1);
    st.first_post = std::min(st.first_post, now);
    st.bytes += bytes;
    if (!st.prefilled) st.early_bytes += bytes;
  }
  bool all_done = true;
  for (kvtransfer::TransferHandle h : st.posted) {
    if (!st.failure.ok()) break;
    absl::StatusOr<kvtransfer::TransferState> state = backend.Poll(h);
    if (!state.ok()) {
      st.failure = state.status();
    } else if (*state == kvtransfer::TransferState::kFailed) {
      st.failure = absl::UnavailableError("KV transfer failed");
    } else if (*state == kvtransfer::TransferState::kInProgress) {
      all_done = false;
    }
  }
  const bool finished = st.failure.ok() && st.prefilled && st.pending.empty() && all_done;
  if (!finished && st.failure.ok()) return false;
  // Done or failed: nothing of the job may stay in flight (Release waits for running copies).
  for (kvtransfer::TransferHandle h : st.posted) {
    if (absl::Status released = backend.Release(h); !released.ok()) {
      LOG(WARNING) << "request " << job->request_id << ": releasing its KV transfer: " << released;
    }
  }
  job->AddUnreleased(-static_cast<int>(st.posted.size()));
  st.posted.clear();
  st.polling = false;
  if (!st.failure.ok()) {
    metrics_->kv_transfer_failures.Increment();
    // Before on_prefilled there is no held KV yet: StartTransfer releases it when it comes.
    if (st.prefilled) engine_->ReleaseHeldKv(job->request_id);
    job->Finish(st.failure);
    return true;
  }
  engine_->ReleaseHeldKv(job->request_id);
  metrics_->kv_transfer_bytes.Increment(static_cast<double>(st.bytes));
  metrics_->kv_transfer_streamed_bytes.Increment(static_cast<double>(st.early_bytes));
  metrics_->kv_transfers.Increment();
  metrics_->kv_transfer_latency.Observe(absl::ToDoubleSeconds(now - st.first_post));
  // What the client waited for: from the KV being whole to the last write landing.
  job->Finish(absl::OkStatus(), st.bytes, now - st.prefilled_at);
  return true;
}

}  // namespace tandem::prefill

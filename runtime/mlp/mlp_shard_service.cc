#include "runtime/mlp/mlp_shard_service.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/mlp/cpu_mlp_backend.h"
#include "runtime/mlp/host_plane/shard_host_plane.h"
#include "runtime/mlp/mlp_shard_checks.h"

namespace tandem::mlp {

MlpShardService::MlpShardService(std::shared_ptr<const DenseMlpWeights> weights,
                                 std::shared_ptr<const auth::ServiceIdentity> identity,
                                 const MlpShardOptions& options)
    : MlpShardService(std::make_unique<CpuMlpBackend>(std::move(weights)), std::move(identity),
                      options) {}

MlpShardService::MlpShardService(std::unique_ptr<MlpBackend> compute,
                                 std::shared_ptr<const auth::ServiceIdentity> identity,
                                 const MlpShardOptions& options)
    : compute_(std::move(compute)),
      shape_(compute_->shape()),
      identity_(std::move(identity)),
      options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

// An Attach or AttachHost call (the base the service's set of open sessions holds).
class MlpShardService::SessionCall {
 public:
  virtual ~SessionCall() = default;
  // Marks the call ended and hands over its session; false when it had ended already. Whoever
  // takes it must FinishCall it: until then OnDone cannot run, so the reactor stays alive.
  virtual bool Take(std::unique_ptr<MlpShardSession>* session) = 0;
  virtual void FinishCall(const grpc::Status& status) = 0;
};

// One Attach (GPU) or AttachHost (host) call: the session lives until the call ends (client
// gone or cancelled, the write failed, or the shard stops); End() is idempotent and frees the
// session before finishing.
template <typename Request, typename Response>
class MlpShardService::SessionReactor final : public grpc::ServerWriteReactor<Response>,
                                              public SessionCall {
 public:
  // `check`: the request's checks (InvalidArgument); `open`: the session, or why not; null:
  // this shard has no such data plane (`unimplemented` says why).
  using Open =
      std::function<absl::StatusOr<std::unique_ptr<MlpShardSession>>(const Request&, Response*)>;
  SessionReactor(MlpShardService* service, grpc::CallbackServerContext* context,
                 const Request* request, const std::function<absl::Status(const Request&)>& check,
                 const Open& open, const char* unimplemented)
      : service_(service) {
    if (grpc::Status auth = service_->identity_->Authenticate(*context); !auth.ok()) {
      Reject(auth, /*count=*/true);
      return;
    }
    if (!open) {
      Reject(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, unimplemented), false);
      return;
    }
    if (absl::Status bad = check(*request); !bad.ok()) {
      Reject(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(bad.message())), true);
      return;
    }
    {
      absl::MutexLock lock(&service_->mu_);
      if (service_->stopping_) {
        Reject(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the MLP shard is stopping"), false);
        return;
      }
      if (static_cast<int>(service_->attached_.size()) >= service_->options_.max_sessions) {
        Reject(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("the MLP shard serves ", service_->options_.max_sessions,
                                         " sessions already")),
               false);
        return;
      }
      service_->attached_.insert(this);
      ++service_->stats_.sessions;
      registered_ = true;
    }
    absl::StatusOr<std::unique_ptr<MlpShardSession>> session = open(*request, &response_);
    if (!session.ok()) {
      End(grpc::Status(static_cast<grpc::StatusCode>(session.status().code()),
                       std::string(session.status().message())));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      session_ = *std::move(session);
    }
    this->StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the session's answer was lost"));
    // Otherwise the call stays open: the session lives until the client ends it.
  }
  void OnCancel() override { End(grpc::Status::CANCELLED); }
  void OnDone() override {
    if (registered_) {
      absl::MutexLock lock(&service_->mu_);
      service_->attached_.erase(this);
    }
    delete this;
  }

  // Frees the session, then finishes the call (once).
  void End(const grpc::Status& status) {
    std::unique_ptr<MlpShardSession> session;
    if (!Take(&session)) return;
    session.reset();
    this->Finish(status);
  }

  bool Take(std::unique_ptr<MlpShardSession>* session) override {
    absl::MutexLock lock(&mu_);
    if (ended_) return false;
    ended_ = true;
    *session = std::move(session_);
    return true;
  }
  void FinishCall(const grpc::Status& status) override { this->Finish(status); }

 private:
  void Reject(const grpc::Status& status, bool count) {
    if (count) {
      absl::MutexLock lock(&service_->mu_);
      ++service_->stats_.rejected;
    }
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
    }
    this->Finish(status);
  }

  MlpShardService* const service_;
  Response response_;
  bool registered_ = false;  // in service_->attached_ (set before any callback can run)
  absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<MlpShardSession> session_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerWriteReactor<tandem::v1::MlpAttachResponse>* MlpShardService::Attach(
    grpc::CallbackServerContext* context, const tandem::v1::MlpAttachRequest* request) {
  const int max_rows = options_.max_rows;
  return new SessionReactor<tandem::v1::MlpAttachRequest, tandem::v1::MlpAttachResponse>(
      this, context, request,
      [max_rows](const tandem::v1::MlpAttachRequest& r) { return CheckAttachRequest(r, max_rows); },
      options_.attach,
      "this MLP shard computes on the CPU: its GPU data plane needs `tandem mlp-shard --device "
      "cuda`");
}

grpc::ServerWriteReactor<tandem::v1::MlpHostAttachResponse>* MlpShardService::AttachHost(
    grpc::CallbackServerContext* context, const tandem::v1::MlpHostAttachRequest* request) {
  using Reactor =
      SessionReactor<tandem::v1::MlpHostAttachRequest, tandem::v1::MlpHostAttachResponse>;
  const int max_rows = options_.max_rows;
  Reactor::Open open;
  if (options_.host_plane != nullptr) {
    std::shared_ptr<ShardHostPlane> plane = options_.host_plane;
    open = [plane](const tandem::v1::MlpHostAttachRequest& r,
                   tandem::v1::MlpHostAttachResponse* response) {
      return plane->Open(r, response);
    };
  }
  return new Reactor(
      this, context, request,
      [max_rows](const tandem::v1::MlpHostAttachRequest& r) {
        return CheckHostAttachRequest(r, max_rows);
      },
      open,
      "this MLP shard runs no host data plane (tandem mlp-shard --data-planes; a GPU shard "
      "serves the GPU data plane, Attach)");
}

MlpShardService::~MlpShardService() { Shutdown(); }

void MlpShardService::Shutdown() {
  // Sessions end first. A reactor is only touched under mu_ (its OnDone erases it under mu_
  // before deleting it), except the ones taken here, which cannot reach OnDone before the
  // Finish below.
  std::vector<std::pair<SessionCall*, std::unique_ptr<MlpShardSession>>> taken;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (SessionCall* r : attached_) {
      std::unique_ptr<MlpShardSession> session;
      if (r->Take(&session)) taken.emplace_back(r, std::move(session));
    }
  }
  for (auto& [reactor, session] : taken) {
    session.reset();
    reactor->FinishCall(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the MLP shard is stopping"));
  }
  // The host plane's reads in flight end now (their calls answered UNAVAILABLE): nothing of the
  // plane calls into this service after this.
  if (options_.host_plane != nullptr) options_.host_plane->Stop();
  if (thread_.joinable()) thread_.join();
}

MlpShardStats MlpShardService::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

grpc::ServerUnaryReactor* MlpShardService::Info(grpc::CallbackServerContext* context,
                                                const tandem::v1::MlpInfoRequest*,
                                                tandem::v1::MlpInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = identity_->Authenticate(*context); !auth.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.rejected;
    reactor->Finish(auth);
    return reactor;
  }
  const MlpShape& s = shape_;
  response->set_model_fingerprint(options_.model_fingerprint);
  response->set_first_layer(static_cast<uint32_t>(s.first_layer));
  response->set_end_layer(static_cast<uint32_t>(s.end_layer));
  response->set_hidden_size(static_cast<uint32_t>(s.hidden_size));
  response->set_intermediate_size(static_cast<uint32_t>(s.intermediate_size));
  response->set_max_rows(static_cast<uint32_t>(options_.max_rows));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* MlpShardService::Compute(grpc::CallbackServerContext* context,
                                                   const tandem::v1::MlpComputeRequest* request,
                                                   tandem::v1::MlpComputeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const auto reject = [&](grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      ++stats_.rejected;
    }
    reactor->Finish(std::move(status));
    return reactor;
  };
  if (grpc::Status auth = identity_->Authenticate(*context); !auth.ok()) return reject(auth);
  if (absl::Status bad = CheckComputeRequest(*request, shape_, options_.max_rows); !bad.ok()) {
    return reject(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(bad.message())));
  }
  Call call{context, request, response, reactor, nullptr, 0};
  if (request->session() == 0) {
    Enqueue(std::move(call));
    return reactor;
  }
  // The host data plane: the rows are in the worker's input slot.
  if (options_.host_plane == nullptr) {
    return reject(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               "session: this MLP shard runs no host data plane"));
  }
  absl::StatusOr<std::shared_ptr<ShardHostSession>> session =
      options_.host_plane->Find(request->session());
  if (!session.ok()) {
    return reject(
        grpc::Status(grpc::StatusCode::NOT_FOUND, std::string(session.status().message())));
  }
  if (absl::Status claimed = (*session)->Claim(request->slot(), request->rows()); !claimed.ok()) {
    return reject(grpc::Status(absl::IsFailedPrecondition(claimed)
                                   ? grpc::StatusCode::FAILED_PRECONDITION
                                   : grpc::StatusCode::INVALID_ARGUMENT,
                               std::string(claimed.message())));
  }
  call.session = *session;
  call.slot = request->slot();
  (*session)->Fetch(request->slot(), request->rows(), absl::FromChrono(context->deadline()),
                    [this, call](absl::Status fetched) {
                      if (fetched.ok()) {
                        Enqueue(call);
                        return;
                      }
                      call.session->Release(call.slot);
                      {
                        absl::MutexLock lock(&mu_);
                        ++stats_.failed;
                      }
                      call.reactor->Finish(grpc::Status(
                          absl::IsDeadlineExceeded(fetched) ? grpc::StatusCode::DEADLINE_EXCEEDED
                                                            : grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("reading the rows: ", fetched.message())));
                    });
  return reactor;
}

void MlpShardService::Enqueue(Call call) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      ++stats_.calls;
      if (call.session != nullptr) ++stats_.plane_calls;
      queue_.push_back(std::move(call));
      return;
    }
  }
  if (call.session != nullptr) call.session->Release(call.slot);
  call.reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the MLP shard is stopping"));
}

void MlpShardService::Loop() {
  const size_t hidden = static_cast<size_t>(shape_.hidden_size);
  std::vector<float> x, y;
  while (true) {
    std::vector<Call> calls;
    std::deque<Call> left;  // answered UNAVAILABLE when stopping
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) {
        left.swap(queue_);
        stop = true;
      }
      // Everything queued, up to max_batch_rows per layer (the rest waits for the next round).
      std::map<uint32_t, int64_t> taken;
      std::deque<Call> rest;
      for (Call& c : queue_) {
        int64_t& rows = taken[c.request->layer()];
        if (rows > 0 && rows + c.request->rows() > options_.max_batch_rows) {
          rest.push_back(c);
          continue;
        }
        rows += c.request->rows();
        calls.push_back(c);
      }
      queue_.swap(rest);
    }
    if (stop) {
      for (Call& c : left) {
        if (c.session != nullptr) c.session->Release(c.slot);
        c.reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the MLP shard is stopping"));
      }
      return;
    }
    // Layer by layer, in arrival order within a layer.
    std::stable_sort(calls.begin(), calls.end(), [](const Call& a, const Call& b) {
      return a.request->layer() < b.request->layer();
    });
    const absl::Time now = absl::Now();
    for (size_t begin = 0; begin < calls.size();) {
      const uint32_t layer = calls[begin].request->layer();
      size_t end = begin;
      std::vector<Call> live;
      int64_t rows = 0;
      for (; end < calls.size() && calls[end].request->layer() == layer; ++end) {
        Call& c = calls[end];
        const bool cancelled = c.context->IsCancelled();
        if (!cancelled && absl::FromChrono(c.context->deadline()) > now) {
          live.push_back(c);
          rows += c.request->rows();
          continue;
        }
        {
          absl::MutexLock lock(&mu_);
          ++stats_.expired;
        }
        if (c.session != nullptr) c.session->Release(c.slot);
        c.reactor->Finish(cancelled
                              ? grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")
                              : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                             "past its deadline before the shard computed it"));
      }
      begin = end;
      if (live.empty()) continue;
      x.resize(static_cast<size_t>(rows) * hidden);
      y.resize(static_cast<size_t>(rows) * hidden);
      size_t at = 0;
      for (const Call& c : live) {
        const size_t n = static_cast<size_t>(c.request->rows()) * hidden;
        const float* rows_in =
            c.session != nullptr ? c.session->input(c.slot)
                                 : reinterpret_cast<const float*>(c.request->activations().data());
        std::memcpy(x.data() + at, rows_in, n * sizeof(float));
        at += n;
      }
      const absl::Time start = absl::Now();
      const absl::Status computed =
          compute_->Run(static_cast<int>(layer), x.data(), static_cast<int>(rows), y.data(),
                        absl::InfiniteFuture());
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      if (!computed.ok()) {
        {
          absl::MutexLock lock(&mu_);
          stats_.failed += static_cast<int64_t>(live.size());
        }
        for (const Call& c : live) {
          if (c.session != nullptr) c.session->Release(c.slot);
          c.reactor->Finish(
              grpc::Status(grpc::StatusCode::INTERNAL,
                           absl::StrCat("layer ", layer, " on the ", std::string(compute_->name()),
                                        " backend: ", computed.message())));
        }
        continue;
      }
      {
        // Counted before any answer leaves, so a client that got its rows sees them counted.
        absl::MutexLock lock(&mu_);
        ++stats_.batches;
        stats_.rows += rows;
        stats_.max_batch_rows = std::max(stats_.max_batch_rows, rows);
        stats_.compute_seconds += seconds;
      }
      at = 0;
      for (const Call& c : live) {
        const size_t n = static_cast<size_t>(c.request->rows()) * hidden;
        if (c.session != nullptr) {
          // The answer stays in the shard's output slot; the worker reads it after this returns
          // and sends the slot's next call only then.
          std::memcpy(c.session->output(c.slot), y.data() + at, n * sizeof(float));
          c.session->Release(c.slot);
        } else {
          c.response->mutable_output()->assign(reinterpret_cast<const char*>(y.data() + at),
                                               n * sizeof(float));
        }
        at += n;
        c.reactor->Finish(grpc::Status::OK);
      }
    }
  }
}

}  // namespace tandem::mlp

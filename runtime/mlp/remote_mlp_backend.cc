#include "runtime/mlp/remote_mlp_backend.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "runtime/base/logging.h"
#include "runtime/mlp/mlp_shard_checks.h"
#include "runtime/mlp/shard_info_client.h"
#include "runtime/router/discovery.h"

namespace tandem::mlp {
namespace {

std::string GrpcMessage(const grpc::Status& s) {
  return absl::StrCat("gRPC ", static_cast<int>(s.error_code()), ": ", s.error_message());
}

}  // namespace

struct RemoteMlpBackend::Membership {
  Membership(std::shared_ptr<const auth::ServiceIdentity> identity, const MlpShape& expected,
             std::string fingerprint, const RemoteMlpOptions& options,
             std::shared_ptr<WorkerHostPlane> plane)
      : identity(std::move(identity)),
        expected(expected),
        fingerprint(std::move(fingerprint)),
        options(options),
        plane(std::move(plane)) {}
  ~Membership() { Stop(); }

  void Stop() {
    if (!stop.HasBeenNotified()) stop.Notify();
    if (thread.joinable()) thread.join();
  }

  // One round (the discovery thread's, or the creator's before it starts): the addresses the
  // names resolve to now; new ones join once their Info matches, gone ones are dropped; a
  // changed set is published.
  void Round() {
    const std::vector<std::string> addresses = discovery->RefreshNow();
    absl::flat_hash_map<std::string, ShardPtr> next;
    for (const std::string& address : addresses) {
      if (auto it = verified.find(address); it != verified.end()) {
        next.emplace(address, it->second);
        continue;
      }
      auto shard = std::make_shared<Shard>();
      shard->address = address;
      shard->stub = tandem::v1::MlpShard::NewStub(identity->Dial(address));
      absl::Status joined =
          FetchShardInfo(*shard->stub, address, expected, fingerprint,
                         absl::Now() + options.info_timeout, "remote MLP", &shard->shape)
              .status();
      if (joined.ok() && plane != nullptr) {
        absl::StatusOr<std::shared_ptr<WorkerHostSession>> session =
            plane->Attach(*shard->stub, address, absl::Now() + options.info_timeout);
        if (session.ok()) {
          shard->session = *std::move(session);
        } else {
          joined = session.status();
        }
      }
      if (!joined.ok()) {
        // Logged when the address or its reason is new, not at every refresh.
        std::string& last = refused[address];
        if (last != joined.message()) {
          LOG(WARNING) << "remote MLP: discovered shard " << address << " not used (" << joined
                       << "); asked again at each refresh";
          last = std::string(joined.message());
        }
        continue;
      }
      refused.erase(address);
      LOG(INFO) << "remote MLP: shard " << address << " joins (layers " << shard->shape.first_layer
                << ":" << shard->shape.end_layer << ")";
      next.emplace(address, std::move(shard));
    }
    bool changed = next.size() != verified.size();
    for (const auto& [address, shard] : verified) {
      if (!next.contains(address)) {
        LOG(INFO) << "remote MLP: shard " << address << " left the discovery answer";
        changed = true;
      }
    }
    verified = std::move(next);
    if (!changed) return;
    std::vector<ShardPtr> shards;
    for (const auto& [address, shard] : verified) shards.push_back(shard);
    std::sort(shards.begin(), shards.end(),
              [](const ShardPtr& a, const ShardPtr& b) { return a->address < b->address; });
    absl::MutexLock lock(&mu);
    published = std::move(shards);
    ++version;
  }

  std::vector<ShardPtr> Published() {
    absl::MutexLock lock(&mu);
    return published;
  }

  const std::shared_ptr<const auth::ServiceIdentity> identity;
  const MlpShape expected;
  const std::string fingerprint;
  const RemoteMlpOptions options;
  const std::shared_ptr<WorkerHostPlane> plane;           // null: data_plane "grpc"
  std::unique_ptr<router::Discovery> discovery;           // set before the first round
  absl::flat_hash_map<std::string, ShardPtr> verified;    // the rounds' own (one thread at a time)
  absl::flat_hash_map<std::string, std::string> refused;  // address -> why, as last logged
  absl::Notification stop;
  std::thread thread;

  absl::Mutex mu;
  std::vector<ShardPtr> published ABSL_GUARDED_BY(mu);
  uint64_t version ABSL_GUARDED_BY(mu) = 0;
};

absl::StatusOr<std::unique_ptr<RemoteMlpBackend>> RemoteMlpBackend::Create(
    const std::vector<std::string>& addresses,
    std::shared_ptr<const auth::ServiceIdentity> identity, const MlpShape& expected,
    const std::string& model_fingerprint, std::unique_ptr<MlpBackend> fallback,
    const RemoteMlpOptions& options) {
  if (addresses.empty()) {
    return absl::InvalidArgumentError("remote MLP: no shard address (remote:HOST:PORT,...)");
  }
  if (fallback != nullptr) {
    const MlpShape f = fallback->shape();
    if (f.first_layer > expected.first_layer || f.end_layer < expected.end_layer) {
      return absl::InvalidArgumentError("remote MLP: the fallback does not serve every layer");
    }
  }
  std::shared_ptr<WorkerHostPlane> plane;
  if (options.data_plane != "grpc") {
    WorkerHostPlaneOptions p;
    p.backend = options.data_plane;
    p.hidden_size = expected.hidden_size;
    p.slots = options.plane_slots;
    p.slot_rows = options.plane_slot_rows;
    p.wrap_backend = options.plane_wrap_backend;
    absl::StatusOr<std::shared_ptr<WorkerHostPlane>> created = WorkerHostPlane::Create(p);
    if (!created.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "remote MLP: --mlp-data-plane ", options.data_plane, ": ", created.status().message()));
    }
    plane = *std::move(created);
  }
  std::vector<std::string> fixed, names;
  for (const std::string& address : addresses) {
    if (address.empty()) return absl::InvalidArgumentError("remote MLP: an empty shard address");
    if (absl::StartsWith(address, "dns:")) {
      names.push_back(address.substr(4));
    } else {
      fixed.push_back(address);
    }
  }
  if (!names.empty()) {
    return CreateDiscovering(fixed, names, std::move(identity), expected, model_fingerprint,
                             std::move(fallback), options, std::move(plane));
  }
  const absl::Time give_up = absl::Now() + options.connect_timeout;
  std::vector<ShardPtr> shards;
  for (const std::string& address : fixed) {
    auto shard = std::make_shared<Shard>();
    shard->address = address;
    shard->stub = tandem::v1::MlpShard::NewStub(identity->Dial(address));
    absl::StatusOr<tandem::v1::MlpInfo> info = FetchShardInfo(
        *shard->stub, address, expected, model_fingerprint, give_up, "remote MLP", &shard->shape);
    if (!info.ok()) return info.status();
    if (plane != nullptr) {
      absl::StatusOr<std::shared_ptr<WorkerHostSession>> session =
          plane->Attach(*shard->stub, address, give_up);
      if (!session.ok()) {
        return absl::Status(session.status().code(),
                            absl::StrCat("remote MLP: ", session.status().message()));
      }
      shard->session = *std::move(session);
    }
    shards.push_back(std::move(shard));
  }
  std::vector<MlpShape> served;
  for (const ShardPtr& s : shards) served.push_back(s->shape);
  if (const std::vector<int> unserved = UnservedLayers(expected, served); !unserved.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("remote MLP: no shard serves layer(s) ", absl::StrJoin(unserved, ","),
                     " (shards: ", absl::StrJoin(addresses, ","), ")"));
  }
  return std::unique_ptr<RemoteMlpBackend>(new RemoteMlpBackend(
      std::move(shards), expected, std::move(fallback), options, nullptr, std::move(plane)));
}

absl::StatusOr<std::unique_ptr<RemoteMlpBackend>> RemoteMlpBackend::CreateDiscovering(
    const std::vector<std::string>& fixed, const std::vector<std::string>& names,
    std::shared_ptr<const auth::ServiceIdentity> identity, const MlpShape& expected,
    const std::string& model_fingerprint, std::unique_ptr<MlpBackend> fallback,
    const RemoteMlpOptions& options, std::shared_ptr<WorkerHostPlane> plane) {
  auto membership = std::make_shared<Membership>(std::move(identity), expected, model_fingerprint,
                                                 options, plane);
  router::Discovery::Options d;
  d.static_workers = fixed;
  d.dns_names = names;
  d.refresh = options.refresh;
  d.resolve_timeout = options.resolve_timeout;
  if (options.resolver) d.resolver = options.resolver;
  absl::StatusOr<std::unique_ptr<router::Discovery>> discovery =
      router::Discovery::Create(std::move(d), [](const std::vector<std::string>&) {});
  if (!discovery.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("remote MLP: ", discovery.status().message()));
  }
  membership->discovery = *std::move(discovery);
  // Rounds until the shards found serve every layer, or connect_timeout passes.
  const absl::Time give_up = absl::Now() + options.connect_timeout;
  std::vector<int> unserved;
  while (true) {
    membership->Round();
    std::vector<MlpShape> served;
    for (const ShardPtr& s : membership->Published()) served.push_back(s->shape);
    unserved = UnservedLayers(expected, served);
    if (unserved.empty() || absl::Now() >= give_up) break;
    absl::SleepFor(std::min(absl::Milliseconds(500), give_up - absl::Now()));
  }
  if (!unserved.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("remote MLP: the discovered shards (", membership->verified.size(),
                     " answering) serve no layer(s) ", absl::StrJoin(unserved, ","), " after ",
                     absl::FormatDuration(options.connect_timeout),
                     " (names: ", absl::StrJoin(names, ","), ")"));
  }
  Membership* m = membership.get();
  m->thread = std::thread([m] {
    while (!m->stop.WaitForNotificationWithTimeout(m->options.refresh)) m->Round();
  });
  std::vector<ShardPtr> shards = membership->Published();
  return std::unique_ptr<RemoteMlpBackend>(
      new RemoteMlpBackend(std::move(shards), expected, std::move(fallback), options,
                           std::move(membership), std::move(plane)));
}

RemoteMlpBackend::RemoteMlpBackend(std::vector<ShardPtr> shards, const MlpShape& expected,
                                   std::unique_ptr<MlpBackend> fallback,
                                   const RemoteMlpOptions& options,
                                   std::shared_ptr<Membership> membership,
                                   std::shared_ptr<WorkerHostPlane> plane)
    : plane_(std::move(plane)),
      shards_(std::move(shards)),
      expected_(expected),
      fallback_(std::move(fallback)),
      options_(options),
      membership_(std::move(membership)) {
  if (membership_ != nullptr) {
    absl::MutexLock lock(&membership_->mu);
    membership_version_ = membership_->version;
  }
  if (plane_ != nullptr) attach_thread_ = std::thread([this] { AttachLoop(); });
}

RemoteMlpBackend::~RemoteMlpBackend() {
  if (attach_thread_.joinable()) {
    {
      absl::MutexLock lock(&reattach_.mu);
      reattach_.stop = true;
    }
    attach_thread_.join();  // an Attach in progress ends within info_timeout
  }
  if (membership_ != nullptr) membership_->Stop();  // no round after this
  // Cancel what is in flight and wait for every callback (cancelled calls complete promptly)
  // before the calls, stubs and channels go.
  std::vector<std::shared_ptr<Call>> calls = std::move(abandoned_);
  for (auto& [handle, p] : pending_) {
    if (p.call != nullptr) calls.push_back(p.call);
  }
  for (const auto& call : calls) call->context.TryCancel();
  for (const auto& call : calls) {
    absl::MutexLock lock(&call->mu);
    if (!call->mu.AwaitWithTimeout(absl::Condition(&call->done), absl::Seconds(10))) {
      LOG(ERROR) << "remote MLP: a cancelled call did not complete in 10 s; leaking it";
      new std::shared_ptr<Call>(call);  // never destroyed under a live callback
    }
  }
}

void RemoteMlpBackend::TakeMembership() {
  if (membership_ == nullptr) return;
  absl::MutexLock lock(&membership_->mu);
  if (membership_->version == membership_version_) return;
  shards_ = membership_->published;
  membership_version_ = membership_->version;
  round_robin_ = 0;
}

void RemoteMlpBackend::Reap() {
  std::erase_if(abandoned_, [](const std::shared_ptr<Call>& call) {
    {
      absl::MutexLock lock(&call->mu);
      if (!call->done) return false;
    }
    FreeSlot(*call);  // its read, if any, has ended: nothing lands in the slot any more
    return true;
  });
}

int RemoteMlpBackend::TakeSlot(const ShardPtr& shard, int rows,
                               std::shared_ptr<WorkerHostSession>* session) {
  Shard& s = *shard;
  if (s.session == nullptr) return -1;  // no host data plane
  if (!s.session->alive()) {
    std::shared_ptr<WorkerHostSession> reopened;
    bool ask = false;
    const absl::Time now = absl::Now();
    {
      absl::MutexLock lock(&s.mu);
      reopened = std::move(s.reopened);
      if (reopened == nullptr && !s.reattaching && now >= s.reattach_at) {
        s.reattaching = true;
        ask = true;
      }
    }
    if (reopened == nullptr) {
      if (!s.session_lost_logged) {
        s.session_lost_logged = true;
        LOG(WARNING) << "remote MLP: shard " << s.address << "'s host data plane session ended "
                     << "(the shard stopped or restarted); its calls go in messages until it is "
                     << "opened again";
      }
      if (ask) {
        s.reattach_at = now + options_.backoff_initial;
        absl::MutexLock lock(&reattach_.mu);
        reattach_.queued.push_back(shard);
      }
      return -1;
    }
    LOG(INFO) << "remote MLP: shard " << s.address << "'s host data plane session is open again";
    s.session = std::move(reopened);  // calls in flight keep the old one
    s.session_lost_logged = false;
  }
  const std::optional<int> slot = s.session->AcquireSlot(rows);
  if (!slot.has_value()) return -1;
  *session = s.session;
  return *slot;
}

void RemoteMlpBackend::AttachLoop() {
  while (true) {
    ShardPtr shard;
    {
      absl::MutexLock lock(&reattach_.mu);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reattach_.mu) {
        return reattach_.stop || !reattach_.queued.empty();
      };
      reattach_.mu.Await(absl::Condition(&ready));
      if (reattach_.stop) return;
      shard = std::move(reattach_.queued.back());
      reattach_.queued.pop_back();
    }
    absl::StatusOr<std::shared_ptr<WorkerHostSession>> session =
        plane_->Attach(*shard->stub, shard->address, absl::Now() + options_.info_timeout);
    if (!session.ok() && shard->reattach_error != session.status().message()) {
      shard->reattach_error = std::string(session.status().message());
      LOG(WARNING) << "remote MLP: reopening shard " << shard->address
                   << "'s host data plane session: " << session.status() << " (tried again)";
    }
    if (session.ok()) shard->reattach_error.clear();
    absl::MutexLock lock(&shard->mu);
    shard->reattaching = false;
    if (session.ok()) shard->reopened = *std::move(session);
  }
}

void RemoteMlpBackend::FreeSlot(Call& call) {
  if (call.slot < 0) return;
  call.session->ReleaseSlot(call.slot);
  call.slot = -1;
}

RemoteMlpBackend::ShardPtr RemoteMlpBackend::PickShard(int layer,
                                                       const std::vector<ShardPtr>& tried,
                                                       absl::Time now) {
  const size_t n = shards_.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (round_robin_ + k) % n;
    const ShardPtr& s = shards_[i];
    if (!s->shape.Serves(layer) || s->retry_at > now ||
        std::find(tried.begin(), tried.end(), s) != tried.end()) {
      continue;
    }
    round_robin_ = i + 1;
    return s;
  }
  return nullptr;
}

void RemoteMlpBackend::StartCall(Pending& p, const ShardPtr& shard, absl::Time now) {
  auto call = std::make_shared<Call>();
  call->shard = shard;
  call->rows = p.rows;
  const absl::Time deadline = std::min(p.deadline, now + options_.call_timeout);
  call->context.set_deadline(absl::ToChronoTime(deadline));
  call->request.set_layer(static_cast<uint32_t>(p.layer));
  call->request.set_rows(static_cast<uint32_t>(p.rows));
  const size_t bytes = ComputeBytes(p.rows, expected_);
  call->slot = TakeSlot(shard, p.rows, &call->session);
  if (call->slot >= 0) {
    std::memcpy(call->session->input(call->slot), p.x, bytes);
    call->request.set_session(call->session->id());
    call->request.set_slot(static_cast<uint32_t>(call->slot));
    ++stats_.plane_calls;
  } else {
    call->request.set_activations(reinterpret_cast<const char*>(p.x), bytes);
  }
  p.tried.push_back(shard);
  p.call = call;
  Call* raw = call.get();
  // The call is done when its answer is here: in the message, or read out of the shard's slot
  // (a read that has a deadline of its own, the call's). The callback touches only `raw`, which
  // the backend keeps until done (Pending, then abandoned_).
  shard->stub->async()->Compute(
      &call->context, &call->request, &call->response, [raw, deadline](grpc::Status status) {
        if (status.ok() && raw->slot >= 0 && raw->response.output().empty()) {
          raw->session->ReadOutput(
              raw->slot, raw->rows, deadline + absl::Milliseconds(200), [raw](absl::Status read) {
                absl::MutexLock lock(&raw->mu);
                raw->status = read.ok() ? grpc::Status::OK
                                        : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                       std::string(read.message()));
                raw->done = true;
              });
          return;
        }
        absl::MutexLock lock(&raw->mu);
        raw->status = std::move(status);
        raw->done = true;
      });
}

void RemoteMlpBackend::Failed(Shard& s, absl::Time now) {
  s.backoff = s.backoff == absl::ZeroDuration() ? options_.backoff_initial
                                                : std::min(options_.backoff_max, s.backoff * 2);
  s.retry_at = now + s.backoff;
}

void RemoteMlpBackend::Succeeded(Shard& s) {
  s.backoff = absl::ZeroDuration();
  s.retry_at = absl::InfinitePast();
}

absl::StatusOr<MlpBackend::Handle> RemoteMlpBackend::Submit(int layer, const float* x, int rows,
                                                            float* out, absl::Time deadline) {
  if (!expected_.Serves(layer)) {
    return absl::InvalidArgumentError(absl::StrCat("remote MLP: layer ", layer, " is not in ",
                                                   expected_.first_layer, ":",
                                                   expected_.end_layer));
  }
  if (rows < 1) return absl::InvalidArgumentError(absl::StrCat("remote MLP: ", rows, " rows"));
  Reap();
  TakeMembership();
  const absl::Time now = absl::Now();
  Pending p;
  p.layer = layer;
  p.x = x;
  p.rows = rows;
  p.out = out;
  p.deadline = deadline;
  const ShardPtr shard = PickShard(layer, {}, now);
  if (shard == nullptr) {
    if (fallback_ == nullptr) {
      ++stats_.failures;
      return absl::UnavailableError(
          absl::StrCat("remote MLP: every shard serving layer ", layer,
                       " failed recently and is backing off, or none serves it now; no fallback "
                       "(--mlp-fallback cpu keeps one)"));
    }
    ++stats_.failovers;
    absl::StatusOr<Handle> h = fallback_->Submit(layer, x, rows, out, deadline);
    if (!h.ok()) return h.status();
    p.on_fallback = true;
    p.fallback_handle = *h;
  } else {
    StartCall(p, shard, now);
  }
  ++stats_.calls;
  stats_.rows += rows;
  const Handle handle = next_++;
  pending_.emplace(handle, std::move(p));
  return handle;
}

absl::Status RemoteMlpBackend::Wait(Handle handle) {
  auto it = pending_.find(handle);
  if (it == pending_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("remote MLP: unknown handle ", handle));
  }
  Pending p = std::move(it->second);
  pending_.erase(it);
  if (p.on_fallback) {
    absl::Status s = fallback_->Wait(p.fallback_handle);
    if (!s.ok()) ++stats_.failures;
    return s;
  }
  const size_t bytes = ComputeBytes(p.rows, expected_);
  std::vector<std::string> errors;
  while (true) {
    Shard& shard = *p.tried.back();
    Call& call = *p.call;
    grpc::Status status;
    bool done;
    {
      absl::MutexLock lock(&call.mu);
      // The call's own deadline ends it; a little grace for its callback to run.
      done = call.mu.AwaitWithDeadline(
          absl::Condition(&call.done),
          absl::FromChrono(call.context.deadline()) + absl::Milliseconds(500));
      // (A read of the answer has 200 ms past the call's deadline, inside that grace.)
      if (done) status = call.status;
    }
    const absl::Time now = absl::Now();
    if (!done) {
      call.context.TryCancel();
      abandoned_.push_back(p.call);  // its callback has not run: keep it until it has
      status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no answer by the deadline");
    }
    // Through a slot the answer is in the slot and the message must be empty.
    const size_t answered = call.slot >= 0 ? 0 : bytes;
    if (status.ok() && call.response.output().size() != answered) {
      status = grpc::Status(
          grpc::StatusCode::INTERNAL,
          absl::StrCat("answered ", call.response.output().size(), " bytes for ", answered));
    }
    if (status.ok()) {
      std::memcpy(p.out,
                  call.slot >= 0 ? static_cast<const void*>(call.session->output(call.slot))
                                 : static_cast<const void*>(call.response.output().data()),
                  bytes);
      FreeSlot(call);
      Succeeded(shard);
      return absl::OkStatus();
    }
    if (done) FreeSlot(call);  // else the abandoned call frees it once its callback has run
    Failed(shard, now);
    errors.push_back(absl::StrCat(shard.address, ": ", GrpcMessage(status)));
    if (now >= p.deadline) {
      ++stats_.failures;
      return absl::DeadlineExceededError(absl::StrCat(
          "remote MLP: layer ", p.layer, " past its deadline (", absl::StrJoin(errors, "; "), ")"));
    }
    const ShardPtr next = PickShard(p.layer, p.tried, now);
    if (next != nullptr) {
      ++stats_.failovers;
      StartCall(p, next, now);
      continue;
    }
    if (fallback_ != nullptr) {
      ++stats_.failovers;
      absl::Status s = fallback_->Run(p.layer, p.x, p.rows, p.out, p.deadline);
      if (!s.ok()) ++stats_.failures;
      return s;
    }
    ++stats_.failures;
    return absl::UnavailableError(absl::StrCat("remote MLP: no shard computed layer ", p.layer,
                                               " (", absl::StrJoin(errors, "; "), ")"));
  }
}

}  // namespace tandem::mlp

#include "runtime/mlp/host_plane/shard_host_plane.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::mlp {

using kvtransfer::TransferBackend;
using kvtransfer::TransferThread;

ShardHostSession::ShardHostSession(uint64_t id, std::shared_ptr<SessionBuffers> buffers,
                                   std::string peer, std::string worker_input_region)
    : id_(id),
      buffers_(std::move(buffers)),
      peer_(std::move(peer)),
      worker_input_region_(std::move(worker_input_region)),
      busy_(static_cast<size_t>(buffers_->slots()), false) {}

absl::Status ShardHostSession::Claim(uint32_t slot, uint32_t rows) {
  if (slot >= static_cast<uint32_t>(slots())) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot: ", slot, " is not in 0..", slots() - 1, " (session ", id_, ")"));
  }
  if (rows < 1 || rows > static_cast<uint32_t>(slot_rows())) {
    return absl::InvalidArgumentError(absl::StrCat("rows: ", rows, " is not in 1..", slot_rows(),
                                                   " (session ", id_, "'s slot_rows)"));
  }
  absl::MutexLock lock(&mu_);
  if (busy_[slot]) {
    return absl::FailedPreconditionError(
        absl::StrCat("slot ", slot, " of session ", id_, " is held by an earlier call"));
  }
  busy_[slot] = true;
  return absl::OkStatus();
}

void ShardHostSession::Release(uint32_t slot) {
  absl::MutexLock lock(&mu_);
  if (slot < busy_.size()) busy_[slot] = false;
}

void ShardHostSession::Fetch(uint32_t slot, uint32_t rows, absl::Time deadline,
                             std::function<void(absl::Status)> done) {
  const size_t offset = static_cast<size_t>(slot) * buffers_->slot_bytes();
  const size_t bytes = buffers_->slot_bytes() / static_cast<size_t>(slot_rows()) * rows;
  ReadSlot(buffers_, buffers_->input_region(), offset, peer_, worker_input_region_, offset, bytes,
           deadline, std::move(done));
}

// Ends its session when destroyed (the Attach call ended).
class ShardHostPlane::Handle final : public MlpShardSession {
 public:
  Handle(std::weak_ptr<ShardHostPlane> plane, uint64_t id) : plane_(std::move(plane)), id_(id) {}
  ~Handle() override {
    if (std::shared_ptr<ShardHostPlane> plane = plane_.lock()) plane->End(id_);
  }

 private:
  const std::weak_ptr<ShardHostPlane> plane_;
  const uint64_t id_;
};

absl::StatusOr<std::shared_ptr<ShardHostPlane>> ShardHostPlane::Create(
    ShardHostPlaneOptions options) {
  if (options.hidden_size < 1 || options.max_rows < 1) {
    return absl::InvalidArgumentError("host data plane: hidden_size and max_rows must be >= 1");
  }
  for (const std::string& name : options.backends) {
    bool host = false;
    for (const kvtransfer::BackendEntry& e : kvtransfer::TransferBackendRegistry()) {
      if (e.name == name) host = !e.moves_device_memory && !e.in_process_only;
    }
    if (!host) {
      return absl::InvalidArgumentError(
          absl::StrCat("host data plane: '", name,
                       "' is not a kvtransfer backend for host memory between "
                       "processes (cma, ucx)"));
    }
    if (!kvtransfer::TransferBackendBuilt(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("host data plane: this build has no '", name, "' transfer backend"));
    }
  }
  return std::shared_ptr<ShardHostPlane>(new ShardHostPlane(std::move(options)));
}

ShardHostPlane::~ShardHostPlane() { Stop(); }

void ShardHostPlane::Stop() {
  std::vector<std::shared_ptr<TransferThread>> threads;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (auto& [name, thread] : threads_) threads.push_back(thread);
  }
  for (const auto& thread : threads) thread->Stop();
}

absl::StatusOr<std::shared_ptr<TransferThread>> ShardHostPlane::ThreadFor(const std::string& name) {
  if (auto it = threads_.find(name); it != threads_.end()) return it->second;
  if (std::find(options_.backends.begin(), options_.backends.end(), name) ==
      options_.backends.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend: this shard runs the host data plane over ",
        options_.backends.empty() ? std::string("nothing") : absl::StrJoin(options_.backends, ","),
        ", not '", name, "' (tandem mlp-shard --data-planes)"));
  }
  kvtransfer::BackendOptions b;
  b.agent_name = absl::StrCat("mlp-shard-", getpid(), "-", name);
  b.ucx_transports = options_.ucx_transports;
  b.ucx_net_devices = options_.ucx_net_devices;
  b.cma_threads = 1;  // one slot's rows: small reads, one copy thread is enough
  absl::StatusOr<std::unique_ptr<TransferBackend>> backend =
      kvtransfer::CreateTransferBackend(name, b);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("host data plane: creating the ", name,
                                     " backend: ", backend.status().message()));
  }
  if (options_.wrap_backend) *backend = options_.wrap_backend(*std::move(backend));
  auto thread =
      std::make_shared<TransferThread>(*std::move(backend), options_.busy_tick, options_.idle_tick);
  threads_.emplace(name, thread);
  return thread;
}

absl::StatusOr<std::unique_ptr<MlpShardSession>> ShardHostPlane::Open(
    const tandem::v1::MlpHostAttachRequest& request, tandem::v1::MlpHostAttachResponse* response) {
  const absl::Time deadline = absl::Now() + options_.open_timeout;
  std::shared_ptr<TransferThread> thread;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the MLP shard serves ", options_.max_sessions, " host sessions already"));
    }
    if (stopped_) return absl::UnavailableError("the MLP shard is stopping");
    absl::StatusOr<std::shared_ptr<TransferThread>> t = ThreadFor(request.backend());
    if (!t.ok()) return t.status();
    thread = *std::move(t);
    std::random_device random;
    while (id == 0 || sessions_.contains(id)) {
      id = (static_cast<uint64_t>(random()) << 32) ^ static_cast<uint64_t>(random());
    }
  }
  absl::StatusOr<std::shared_ptr<SessionBuffers>> buffers =
      SessionBuffers::Create(thread, static_cast<int>(request.slots()),
                             static_cast<int>(request.slot_rows()), options_.hidden_size, deadline);
  if (!buffers.ok()) return buffers.status();
  // The worker's agent, named per session: two sessions of one worker never share a peer entry.
  const std::string peer = absl::StrCat(request.agent(), "#", id);
  // By value: a task that timed out may still run after this returns.
  auto address = std::make_shared<std::string>();
  const absl::Status connected = thread->Run(
      [peer, worker = request.address(), address](TransferBackend& backend) -> absl::Status {
        if (absl::Status s = backend.Connect(peer, worker); !s.ok()) return s;
        absl::StatusOr<std::string> local = backend.LocalAddress();
        if (!local.ok()) return local.status();
        *address = *std::move(local);
        return absl::OkStatus();
      },
      std::max(absl::ZeroDuration(), deadline - absl::Now()));
  // Connected or not (a task that timed out may connect later), the retirement disconnects it.
  (*buffers)->set_peer(peer);
  if (!connected.ok()) {
    return absl::Status(connected.code(),
                        absl::StrCat("host data plane: connecting to the worker over ",
                                     request.backend(), ": ", connected.message()));
  }
  response->set_session(id);
  response->set_agent(std::string(thread->backend_name()) + "@mlp-shard-" +
                      std::to_string(getpid()));
  response->set_address(*address);
  response->set_output_region((*buffers)->output_blob());
  auto session = std::make_shared<ShardHostSession>(id, *buffers, peer, request.input_region());
  {
    absl::MutexLock lock(&mu_);
    sessions_.emplace(id, std::move(session));
  }
  return std::unique_ptr<MlpShardSession>(new Handle(weak_from_this(), id));
}

absl::StatusOr<std::shared_ptr<ShardHostSession>> ShardHostPlane::Find(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session: ", id, " is not open on this shard"));
  }
  return it->second;
}

void ShardHostPlane::End(uint64_t id) {
  std::shared_ptr<ShardHostSession> session;
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  session = std::move(it->second);
  sessions_.erase(it);
  // `session` goes after the lock is released (its buffers' deleter posts to the thread).
}

}  // namespace tandem::mlp

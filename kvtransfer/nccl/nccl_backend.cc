#include "kvtransfer/nccl/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/nccl/nccl_api.h"
#include "kvtransfer/nccl/nccl_channel.h"
#include "kvtransfer/nccl/nccl_protocol.h"
#include "kvtransfer/nccl/nccl_wire.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"

namespace tandem::kvtransfer {
namespace {

using nccl::AgentAddress;
using nccl::InitiatorSession;
using nccl::TargetSession;

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  std::string host(name);
  for (char& c : host) {
    if (c == ';' || c == '=') c = '_';
  }
  return host;
}

class NcclBackend final : public TransferBackend {
 public:
  NcclBackend(const BackendOptions& options, std::shared_ptr<const nccl::NcclApi> api)
      : agent_name_(options.agent_name),
        device_(options.cuda_device),
        staging_cap_(std::max<uint64_t>(options.nccl_staging_bytes, 1)),
        api_(std::move(api)),
        pool_(std::make_shared<nccl::BufferPool>()) {
    session_options_.connect_timeout = options.connect_timeout;
    session_options_.transfer_timeout = options.transfer_timeout;
    session_options_.max_message_bytes = staging_cap_;
  }

  absl::Status Init() {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), absl::StrCat("nccl: GPU ", device_));
    cudaDeviceProp prop;
    RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, device_), "nccl: device properties");
    num_sms_ = prop.multiProcessorCount;
    std::memcpy(self_.gpu.data(), prop.uuid.bytes, nccl::kUuidBytes);
    self_.boot_id = nccl::ReadBootId();
    if (self_.boot_id.empty()) self_.boot_id = "unknown";
    self_.host = Hostname();
    ASSIGN_OR_RETURN(self_.token, nccl::RandomSecret());
    self_.staging_bytes = staging_cap_;
    return absl::OkStatus();
  }

  ~NcclBackend() override {
    (void)cudaSetDevice(device_);
    // Channels abort their communicators first; the pool frees its buffers last.
    initiators_.clear();
    targets_.clear();
  }

  std::string_view name() const override { return "nccl"; }
  Capabilities capabilities() const override {
    return Capabilities{.host_memory = false,
                        .cuda_memory = true,
                        .notifications = true,
                        .read = false,
                        .cross_process = true};
  }
  const std::string& agent_name() const override { return agent_name_; }
  absl::StatusOr<std::string> LocalAddress() override { return nccl::EncodeAgentAddress(self_); }

  absl::StatusOr<MemoryRegion> RegisterMemory(void* base, size_t length, MemoryKind kind) override {
    if (kind != MemoryKind::kCuda) {
      return absl::InvalidArgumentError(
          "nccl: only device memory (MemoryKind::kCuda) can be registered");
    }
    if (base == nullptr || length == 0) return absl::InvalidArgumentError("nccl: empty region");
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "nccl: cudaSetDevice");
    cudaPointerAttributes attr;
    RETURN_IF_CUDA_ERROR(cudaPointerGetAttributes(&attr, base), "nccl: pointer attributes");
    if (attr.type != cudaMemoryTypeDevice || attr.device != device_) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl: the region is not device memory of GPU ", device_));
    }
    const uint64_t id = next_region_++;
    regions_[id] = nccl::LocalRegion{.base = reinterpret_cast<uint64_t>(base), .length = length};
    return MemoryRegion{.id = id, .kind = kind, .base = base, .length = length};
  }

  absl::StatusOr<std::string> ExportRegion(uint64_t region_id) override {
    auto it = regions_.find(region_id);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("nccl: no region ", region_id));
    }
    return nccl::EncodeRegionBlob(
        nccl::RegionBlob{.token = self_.token, .region = region_id, .length = it->second.length});
  }

  absl::Status DeregisterMemory(uint64_t region_id) override {
    auto it = regions_.find(region_id);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("nccl: no region ", region_id));
    }
    Progress();
    for (const auto& [h, t] : transfers_) {
      if (t.region == region_id) {
        return absl::FailedPreconditionError(
            absl::StrCat("nccl: region ", region_id, " has a transfer that was not released"));
      }
    }
    for (const auto& [peer, target] : targets_) {
      if (target.session->UsesRegion(region_id)) {
        return absl::FailedPreconditionError(
            absl::StrCat("nccl: region ", region_id, " is receiving a message from '", peer, "'"));
      }
    }
    regions_.erase(it);
    return absl::OkStatus();
  }

  absl::Status Connect(const std::string& peer, const std::string& address) override {
    auto existing = initiators_.find(peer);
    if (existing != initiators_.end()) {
      if (existing->second.address != address) {
        return absl::AlreadyExistsError(absl::StrCat(
            "nccl: peer '", peer, "' is connected with another address (Disconnect first)"));
      }
      existing->second.session->Progress(absl::Now());
      if (!existing->second.session->failed()) return absl::OkStatus();
      if (HasTransfers(peer)) {
        return absl::FailedPreconditionError(absl::StrCat("nccl: the connection to '", peer,
                                                          "' failed; Release its transfers first"));
      }
      initiators_.erase(existing);  // a failed pair: start a new communicator
    }
    ASSIGN_OR_RETURN(AgentAddress a, nccl::DecodeAgentAddress(address));
    if (a.gpu == self_.gpu) {
      return absl::FailedPreconditionError(
          absl::StrCat("nccl: peer '", peer, "' uses this agent's own GPU (UUID ",
                       nccl::HexString(a.gpu.data(), a.gpu.size()),
                       "); NCCL cannot put both ranks on one GPU (use cuda_ipc)"));
    }
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "nccl: cudaSetDevice");
    ASSIGN_OR_RETURN(nccl::UniqueId id, nccl::NewUniqueId(*api_));
    ASSIGN_OR_RETURN(nccl::Secret secret, nccl::RandomSecret());
    ASSIGN_OR_RETURN(std::unique_ptr<nccl::Channel> channel, StartChannel(/*rank=*/0, id));
    Initiator i;
    i.address = address;
    i.peer = a;
    i.reply = nccl::EncodeConnectReply(
        nccl::ConnectReply{.unique_id = id, .secret = secret, .target_token = a.token});
    i.session = std::make_unique<InitiatorSession>(std::move(channel), secret, session_options_,
                                                   absl::Now());
    initiators_.emplace(peer, std::move(i));
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ConnectReply(const std::string& peer) override {
    auto it = initiators_.find(peer);
    if (it == initiators_.end()) {
      return absl::NotFoundError(absl::StrCat("nccl: peer '", peer, "' is not connected"));
    }
    return it->second.reply;
  }

  absl::Status Accept(const std::string& peer, const std::string& reply) override {
    ASSIGN_OR_RETURN(nccl::ConnectReply r, nccl::DecodeConnectReply(reply));
    if (r.target_token != self_.token) {
      return absl::FailedPreconditionError(absl::StrCat(
          "nccl: the reply of '", peer,
          "' was made for another process's address (a restarted target?); connect again"));
    }
    auto existing = targets_.find(peer);
    if (existing != targets_.end()) {
      if (existing->second.reply == reply && !existing->second.session->failed()) {
        return absl::OkStatus();
      }
      targets_.erase(existing);  // the initiator paired again: the old communicator goes
    }
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "nccl: cudaSetDevice");
    ASSIGN_OR_RETURN(std::unique_ptr<nccl::Channel> channel, StartChannel(/*rank=*/1, r.unique_id));
    Target t;
    t.reply = reply;
    t.session = std::make_unique<TargetSession>(
        std::move(channel), r.secret, session_options_,
        [this](uint64_t id) -> absl::StatusOr<nccl::LocalRegion> {
          auto it = regions_.find(id);
          if (it == regions_.end()) return absl::NotFoundError("not registered here");
          return it->second;
        },
        absl::Now());
    targets_.emplace(peer, std::move(t));
    return absl::OkStatus();
  }

  absl::Status Disconnect(const std::string& peer) override {
    if (HasTransfers(peer)) {
      return absl::FailedPreconditionError(
          absl::StrCat("nccl: peer '", peer, "' has transfers that were not released"));
    }
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "nccl: cudaSetDevice");
    initiators_.erase(peer);
    targets_.erase(peer);
    return absl::OkStatus();
  }

  absl::StatusOr<TransferHandle> PostWrite(const TransferRequest& request) override {
    auto region = regions_.find(request.local_region);
    if (region == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("nccl: no local region ", request.local_region));
    }
    auto peer = initiators_.find(request.peer);
    if (peer == initiators_.end()) {
      return absl::NotFoundError(absl::StrCat("nccl: peer '", request.peer, "' is not connected"));
    }
    if (request.notification.size() > nccl::kMaxNotificationBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl: notification of ", request.notification.size(), " bytes (at most ",
                       nccl::kMaxNotificationBytes, ")"));
    }
    ASSIGN_OR_RETURN(nccl::RegionBlob remote, nccl::DecodeRegionBlob(request.remote_region));
    if (remote.token != peer->second.peer.token) {
      return absl::InvalidArgumentError(absl::StrCat("nccl: the remote region is not one of peer '",
                                                     request.peer, "' (another process)"));
    }
    RETURN_IF_ERROR(CheckOpsInRegions("nccl", request.ops, region->second.length, remote.length));
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "nccl: cudaSetDevice");
    const uint64_t max_bytes = std::min(staging_cap_, peer->second.peer.staging_bytes);
    InitiatorSession& session = *peer->second.session;
    ASSIGN_OR_RETURN(
        const uint64_t id,
        session.Post(nccl::PlanSegments(request.ops, region->second.base, remote.region,
                                        request.notification, max_bytes, nccl::kMaxOpsPerMessage),
                     absl::Now()));
    const TransferHandle h = next_handle_++;
    transfers_.emplace(h, Transfer{.peer = request.peer, .id = id, .region = request.local_region});
    return h;
  }

  absl::StatusOr<TransferState> Poll(TransferHandle handle) override {
    auto it = transfers_.find(handle);
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("nccl: no transfer ", handle));
    }
    auto peer = initiators_.find(it->second.peer);
    if (peer == initiators_.end()) return TransferState::kFailed;
    (void)cudaSetDevice(device_);
    InitiatorSession& session = *peer->second.session;
    session.Progress(absl::Now());
    LogFailure(it->second.peer, peer->second.logged, session.status());
    ASSIGN_OR_RETURN(TransferState state, session.State(it->second.id));
    if (state == TransferState::kFailed && !it->second.logged) {
      it->second.logged = true;
      if (session.status().ok()) {  // failed alone (never left the queue); else logged above
        LOG(WARNING) << "nccl: transfer " << handle << " to '" << it->second.peer
                     << "' failed: " << session.TransferError(it->second.id);
      }
    }
    return state;
  }

  absl::Status Release(TransferHandle handle) override {
    auto it = transfers_.find(handle);
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("nccl: no transfer ", handle));
    }
    absl::Status s = absl::OkStatus();
    auto peer = initiators_.find(it->second.peer);
    if (peer != initiators_.end()) {
      (void)cudaSetDevice(device_);
      s = peer->second.session->Release(it->second.id);
      LogFailure(it->second.peer, peer->second.logged, peer->second.session->status());
    }
    transfers_.erase(it);
    return s;
  }

  void Progress() override {
    (void)cudaSetDevice(device_);
    const absl::Time now = absl::Now();
    for (auto& [peer, i] : initiators_) {
      i.session->Progress(now);
      LogFailure(peer, i.logged, i.session->status());
    }
    for (auto& [peer, t] : targets_) {
      t.session->Progress(now);
      LogFailure(peer, t.logged, t.session->status());
      for (std::string& message : t.session->TakeNotifications()) {
        notifications_.push_back(Notification{.peer = peer, .message = std::move(message)});
      }
    }
  }

  std::vector<Notification> GetNotifications() override {
    Progress();
    std::vector<Notification> out;
    out.swap(notifications_);
    return out;
  }

 private:
  struct Initiator {
    std::string address;
    AgentAddress peer;
    std::string reply;
    std::unique_ptr<InitiatorSession> session;
    bool logged = false;
  };
  struct Target {
    std::string reply;
    std::unique_ptr<TargetSession> session;
    bool logged = false;
  };
  struct Transfer {
    std::string peer;
    uint64_t id = 0;  // the session's transfer id
    uint64_t region = 0;
    bool logged = false;
  };

  absl::StatusOr<std::unique_ptr<nccl::Channel>> StartChannel(int rank, const nccl::UniqueId& id) {
    nccl::ChannelConfig config;
    config.rank = rank;
    config.unique_id = id;
    config.device = device_;
    config.num_sms = num_sms_;
    config.max_staging_bytes = staging_cap_;
    config.pool = pool_;
    return nccl::StartNcclChannel(api_, config);
  }

  bool HasTransfers(const std::string& peer) const {
    for (const auto& [h, t] : transfers_) {
      if (t.peer == peer) return true;
    }
    return false;
  }

  // Logs a pair's failure once (the loop's log, STYLE.md: return with context, log once).
  void LogFailure(const std::string& peer, bool& logged, const absl::Status& status) {
    if (status.ok() || logged) return;
    logged = true;
    LOG(WARNING) << "nccl: the connection with '" << peer << "' failed: " << status;
  }

  const std::string agent_name_;
  const int device_;
  const uint64_t staging_cap_;
  const std::shared_ptr<const nccl::NcclApi> api_;
  // Declared before the sessions so it outlives their channels.
  const std::shared_ptr<nccl::BufferPool> pool_;
  nccl::SessionOptions session_options_;
  int num_sms_ = 1;
  AgentAddress self_;

  uint64_t next_region_ = 1;
  absl::flat_hash_map<uint64_t, nccl::LocalRegion> regions_;
  absl::flat_hash_map<std::string, Initiator> initiators_;
  absl::flat_hash_map<std::string, Target> targets_;
  TransferHandle next_handle_ = 1;
  absl::flat_hash_map<TransferHandle, Transfer> transfers_;
  std::vector<Notification> notifications_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TransferBackend>> CreateNcclBackend(const BackendOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<const nccl::NcclApi> api, nccl::LoadNccl(options.nccl_library));
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("nccl: no usable CUDA device (",
                     e == cudaSuccess ? "none found" : std::string(cudaGetErrorString(e)), ")"));
  }
  if (options.cuda_device < 0 || options.cuda_device >= count) {
    return absl::NotFoundError(
        absl::StrCat("nccl: no GPU ", options.cuda_device, " (", count, " visible)"));
  }
  auto backend = std::make_unique<NcclBackend>(options, std::move(api));
  RETURN_IF_ERROR(backend->Init());
  return backend;
}

}  // namespace tandem::kvtransfer

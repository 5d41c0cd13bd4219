#include "kvtransfer/loopback_backend.h"

#include <cstring>
#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/copy_ops.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {
namespace {

struct Region {
  void* base = nullptr;
  size_t length = 0;
};

// What other agents may touch: regions (to resolve blobs) and the notification queue.
struct AgentState {
  absl::Mutex mu;
  absl::flat_hash_map<uint64_t, Region> regions ABSL_GUARDED_BY(mu);
  std::deque<Notification> notifications ABSL_GUARDED_BY(mu);
};

class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry();
    return *registry;
  }
  absl::Status Add(const std::string& name, std::shared_ptr<AgentState> state) {
    absl::MutexLock lock(&mu_);
    if (!agents_.emplace(name, std::move(state)).second) {
      return absl::AlreadyExistsError(
          absl::StrCat("loopback: an agent named '", name, "' already exists in this process"));
    }
    return absl::OkStatus();
  }
  void Remove(const std::string& name) {
    absl::MutexLock lock(&mu_);
    agents_.erase(name);
  }
  std::shared_ptr<AgentState> Find(const std::string& name) {
    absl::MutexLock lock(&mu_);
    auto it = agents_.find(name);
    return it == agents_.end() ? nullptr : it->second;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<AgentState>> agents_ ABSL_GUARDED_BY(mu_);
};

struct RemoteRegion {
  std::string agent;
  uint64_t id = 0;
  uintptr_t base = 0;
  size_t length = 0;
};

// Blob: "loopback:<agent>:<id>:<base>:<length>" (agent names may not contain ':').
std::string EncodeRegion(const std::string& agent, uint64_t id, const Region& region) {
  return absl::StrCat("loopback:", agent, ":", id, ":", reinterpret_cast<uintptr_t>(region.base),
                      ":", region.length);
}

absl::StatusOr<RemoteRegion> DecodeRegion(const std::string& blob) {
  std::vector<std::string> parts = absl::StrSplit(blob, ':');
  RemoteRegion r;
  uint64_t base = 0, length = 0;
  if (parts.size() != 5 || parts[0] != "loopback" || !absl::SimpleAtoi(parts[2], &r.id) ||
      !absl::SimpleAtoi(parts[3], &base) || !absl::SimpleAtoi(parts[4], &length)) {
    return absl::InvalidArgumentError("loopback: malformed remote region blob");
  }
  r.agent = parts[1];
  r.base = static_cast<uintptr_t>(base);
  r.length = static_cast<size_t>(length);
  return r;
}

class LoopbackBackend final : public TransferBackend {
 public:
  LoopbackBackend(std::string agent_name, std::shared_ptr<AgentState> state)
      : agent_name_(std::move(agent_name)), state_(std::move(state)) {}
  ~LoopbackBackend() override { Registry::Get().Remove(agent_name_); }

  std::string_view name() const override { return "loopback"; }
  Capabilities capabilities() const override {
    return Capabilities{.host_memory = true,
                        .cuda_memory = false,
                        .notifications = true,
                        .read = true,
                        .cross_process = false};
  }
  const std::string& agent_name() const override { return agent_name_; }
  absl::StatusOr<std::string> LocalAddress() override { return agent_name_; }

  absl::StatusOr<MemoryRegion> RegisterMemory(void* base, size_t length, MemoryKind kind) override {
    if (kind != MemoryKind::kHost) {
      return absl::InvalidArgumentError("loopback: only host memory can be registered");
    }
    if (base == nullptr || length == 0) {
      return absl::InvalidArgumentError("loopback: cannot register an empty region");
    }
    const uint64_t id = next_region_id_++;
    absl::MutexLock lock(&state_->mu);
    state_->regions[id] = Region{base, length};
    return MemoryRegion{.id = id, .kind = kind, .base = base, .length = length};
  }

  absl::StatusOr<std::string> ExportRegion(uint64_t region_id) override {
    ASSIGN_OR_RETURN(Region region, FindLocalRegion(region_id));
    return EncodeRegion(agent_name_, region_id, region);
  }

  absl::Status DeregisterMemory(uint64_t region_id) override {
    RETURN_IF_ERROR(FindLocalRegion(region_id).status());
    for (const auto& [handle, transfer] : transfers_) {
      if (transfer.local_region == region_id) {
        return absl::FailedPreconditionError(absl::StrCat(
            "loopback: region ", region_id, " is used by unreleased transfer ", handle));
      }
    }
    absl::MutexLock lock(&state_->mu);
    state_->regions.erase(region_id);
    return absl::OkStatus();
  }

  absl::Status Connect(const std::string& peer, const std::string& address) override {
    if (address != peer) {
      return absl::InvalidArgumentError(
          absl::StrCat("loopback: address '", address, "' is not the agent name '", peer, "'"));
    }
    if (Registry::Get().Find(peer) == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("loopback: no agent named '", peer, "' in this process"));
    }
    peers_[peer] = address;
    return absl::OkStatus();
  }

  absl::Status Disconnect(const std::string& peer) override {
    if (!peers_.contains(peer)) {
      return absl::NotFoundError(absl::StrCat("loopback: not connected to '", peer, "'"));
    }
    for (const auto& [handle, transfer] : transfers_) {
      if (transfer.peer == peer) {
        return absl::FailedPreconditionError(
            absl::StrCat("loopback: peer '", peer, "' has unreleased transfer ", handle));
      }
    }
    peers_.erase(peer);
    return absl::OkStatus();
  }

  absl::StatusOr<TransferHandle> PostWrite(const TransferRequest& request) override {
    return Post(request, /*write=*/true);
  }
  absl::StatusOr<TransferHandle> PostRead(const TransferRequest& request) override {
    return Post(request, /*write=*/false);
  }

  absl::StatusOr<TransferState> Poll(TransferHandle handle) override {
    if (!transfers_.contains(handle)) {
      return absl::NotFoundError(absl::StrCat("loopback: unknown transfer handle ", handle));
    }
    return TransferState::kDone;
  }

  absl::Status Release(TransferHandle handle) override {
    if (transfers_.erase(handle) == 0) {
      return absl::NotFoundError(absl::StrCat("loopback: unknown transfer handle ", handle));
    }
    return absl::OkStatus();
  }

  void Progress() override {}

  std::vector<Notification> GetNotifications() override {
    absl::MutexLock lock(&state_->mu);
    std::vector<Notification> out(std::make_move_iterator(state_->notifications.begin()),
                                  std::make_move_iterator(state_->notifications.end()));
    state_->notifications.clear();
    return out;
  }

 private:
  absl::StatusOr<Region> FindLocalRegion(uint64_t region_id) {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->regions.find(region_id);
    if (it == state_->regions.end()) {
      return absl::NotFoundError(absl::StrCat("loopback: unknown local region ", region_id));
    }
    return it->second;
  }

  absl::StatusOr<TransferHandle> Post(const TransferRequest& request, bool write) {
    ASSIGN_OR_RETURN(Region local, FindLocalRegion(request.local_region));
    if (!peers_.contains(request.peer)) {
      return absl::NotFoundError(absl::StrCat("loopback: not connected to '", request.peer, "'"));
    }
    ASSIGN_OR_RETURN(RemoteRegion remote, DecodeRegion(request.remote_region));
    if (remote.agent != request.peer) {
      return absl::InvalidArgumentError(absl::StrCat("loopback: region belongs to '", remote.agent,
                                                     "', not to peer '", request.peer, "'"));
    }
    std::shared_ptr<AgentState> target = Registry::Get().Find(request.peer);
    if (target == nullptr) {
      return absl::NotFoundError(absl::StrCat("loopback: peer '", request.peer, "' is gone"));
    }
    RETURN_IF_ERROR(CheckOpsInRegions("loopback", request.ops, local.length, remote.length));
    {
      // Holding the target's lock keeps its region registered while we copy.
      absl::MutexLock lock(&target->mu);
      auto it = target->regions.find(remote.id);
      if (it == target->regions.end() ||
          reinterpret_cast<uintptr_t>(it->second.base) != remote.base ||
          it->second.length != remote.length) {
        return absl::NotFoundError(absl::StrCat("loopback: peer '", request.peer,
                                                "' has no region ", remote.id, " any more"));
      }
      auto* remote_base = static_cast<uint8_t*>(it->second.base);
      auto* local_base = static_cast<uint8_t*>(local.base);
      for (const CopyOp& op : request.ops) {
        if (write) {
          std::memmove(remote_base + op.remote_offset, local_base + op.local_offset, op.length);
        } else {
          std::memmove(local_base + op.local_offset, remote_base + op.remote_offset, op.length);
        }
      }
      if (!request.notification.empty()) {
        target->notifications.push_back(
            Notification{.peer = agent_name_, .message = request.notification});
      }
    }
    const TransferHandle handle = next_handle_++;
    transfers_[handle] = Transfer{request.local_region, request.peer};
    return handle;
  }

  const std::string agent_name_;
  const std::shared_ptr<AgentState> state_;
  uint64_t next_region_id_ = 1;
  TransferHandle next_handle_ = 1;
  absl::flat_hash_map<std::string, std::string> peers_;
  struct Transfer {
    uint64_t local_region = 0;
    std::string peer;
  };
  absl::flat_hash_map<TransferHandle, Transfer> transfers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TransferBackend>> CreateLoopbackBackend(
    const BackendOptions& options) {
  if (options.agent_name.empty() || options.agent_name.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("loopback: agent name '", options.agent_name,
                                                   "' must be non-empty and ':'-free"));
  }
  auto state = std::make_shared<AgentState>();
  RETURN_IF_ERROR(Registry::Get().Add(options.agent_name, state));
  return std::unique_ptr<TransferBackend>(new LoopbackBackend(options.agent_name, state));
}

}  // namespace tandem::kvtransfer

#include "kvtransfer/cuda_ipc/cuda_ipc_backend.h"

#include <cuda.h>  // driver types only: cuMemGetAddressRange comes through the runtime's lookup
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/cuda_ipc/ipc_plan.h"
#include "kvtransfer/cuda_ipc/ipc_wire.h"
#include "kvtransfer/cuda_ipc/scatter_copy.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"

namespace tandem::kvtransfer {
namespace {

using cuda_ipc::AgentAddress;
using cuda_ipc::CopyPiece;
using cuda_ipc::RegionBlob;

using MemGetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

std::string HandleKey(const cudaIpcMemHandle_t& handle) {
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

// Allocations exported by cuda_ipc agents of THIS process, by IPC handle bytes: an agent of the
// same process cannot open its own process's handles through the driver, so it resolves them
// here (only handles some live agent registered, never an address from the blob).
class LocalExports {
 public:
  static LocalExports& Get() {
    static LocalExports* exports = new LocalExports();
    return *exports;
  }
  void Add(const std::string& key, void* allocation_base, size_t allocation_size) {
    absl::MutexLock lock(&mu_);
    Entry& e = entries_[key];
    e.base = allocation_base;
    e.size = allocation_size;
    ++e.refs;
  }
  void Remove(const std::string& key) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && --it->second.refs == 0) entries_.erase(it);
  }
  bool Find(const std::string& key, void** base, size_t* size) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return false;
    *base = it->second.base;
    *size = it->second.size;
    return true;
  }

 private:
  struct Entry {
    void* base = nullptr;
    size_t size = 0;
    int refs = 0;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

std::string UuidHex(const std::array<uint8_t, cuda_ipc::kUuidBytes>& uuid) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(uuid.data()), uuid.size()));
}

class CudaIpcBackend final : public TransferBackend {
 public:
  CudaIpcBackend(std::string agent_name, int device) : agent_name_(std::move(agent_name)) {
    device_ = device;
  }

  absl::Status Init() {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), absl::StrCat("cuda_ipc: GPU ", device_));
    cudaDeviceProp prop;
    RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, device_), "cuda_ipc: device properties");
    num_sms_ = prop.multiProcessorCount;
    std::memcpy(self_.gpu.data(), prop.uuid.bytes, cuda_ipc::kUuidBytes);
    self_.pid = static_cast<uint32_t>(getpid());
    self_.process = cuda_ipc::ProcessNonce();
    self_.boot_id = cuda_ipc::ReadBootId();
    if (self_.boot_id.empty()) {
      return absl::FailedPreconditionError(
          "cuda_ipc: cannot read /proc/sys/kernel/random/boot_id (needed to tell peers on this "
          "host from others)");
    }
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    RETURN_IF_CUDA_ERROR(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                          cudaEnableDefault, &found),
                         "cuda_ipc: looking up cuMemGetAddressRange");
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
      return absl::UnavailableError("cuda_ipc: the driver has no cuMemGetAddressRange");
    }
    mem_get_address_range_ = reinterpret_cast<MemGetAddressRangeFn>(fn);
    RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                         "cuda_ipc: creating the copy stream");
    return absl::OkStatus();
  }

  ~CudaIpcBackend() override {
    (void)cudaSetDevice(device_);
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    for (auto& [h, t] : transfers_) free_slots_.push_back(std::move(t.slot));
    for (Slot& s : free_slots_) FreeSlot(s);
    for (auto& [name, peer] : peers_) CloseMappings(peer);
    for (auto& [id, r] : regions_) LocalExports::Get().Remove(HandleKey(r.handle));
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  std::string_view name() const override { return "cuda_ipc"; }
  Capabilities capabilities() const override {
    return Capabilities{.host_memory = false,
                        .cuda_memory = true,
                        .notifications = false,
                        .read = false,
                        .cross_process = true};
  }
  const std::string& agent_name() const override { return agent_name_; }
  absl::StatusOr<std::string> LocalAddress() override {
    return cuda_ipc::EncodeAgentAddress(self_);
  }

  absl::StatusOr<MemoryRegion> RegisterMemory(void* base, size_t length, MemoryKind kind) override {
    if (kind != MemoryKind::kCuda) {
      return absl::InvalidArgumentError(
          "cuda_ipc: only device memory (MemoryKind::kCuda) can be registered");
    }
    if (base == nullptr || length == 0) {
      return absl::InvalidArgumentError("cuda_ipc: empty region");
    }
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cuda_ipc: cudaSetDevice");
    cudaPointerAttributes attr;
    RETURN_IF_CUDA_ERROR(cudaPointerGetAttributes(&attr, base), "cuda_ipc: pointer attributes");
    if (attr.type != cudaMemoryTypeDevice || attr.device != device_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda_ipc: the region is not device memory of GPU ", device_, " (memory type ",
          static_cast<int>(attr.type), ", device ", attr.device, ")"));
    }
    CUdeviceptr alloc_base = 0;
    size_t alloc_size = 0;
    if (CUresult r =
            mem_get_address_range_(&alloc_base, &alloc_size, reinterpret_cast<CUdeviceptr>(base));
        r != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc: cuMemGetAddressRange failed (", static_cast<int>(r), ")"));
    }
    const uint64_t offset = reinterpret_cast<uint64_t>(base) - alloc_base;
    if (length > alloc_size || offset > alloc_size - length) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc: the region (", length, " bytes at offset ", offset,
                       ") is not inside one allocation (", alloc_size, " bytes)"));
    }
    Region region;
    region.base = base;
    region.length = length;
    region.offset = offset;
    RETURN_IF_CUDA_ERROR(cudaIpcGetMemHandle(&region.handle, reinterpret_cast<void*>(alloc_base)),
                         "cuda_ipc: cudaIpcGetMemHandle (the memory must come from cudaMalloc)");
    LocalExports::Get().Add(HandleKey(region.handle), reinterpret_cast<void*>(alloc_base),
                            alloc_size);
    const uint64_t id = next_region_++;
    regions_[id] = region;
    return MemoryRegion{.id = id, .kind = kind, .base = base, .length = length};
  }

  absl::StatusOr<std::string> ExportRegion(uint64_t region_id) override {
    auto it = regions_.find(region_id);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("cuda_ipc: no region ", region_id));
    }
    RegionBlob blob;
    std::memcpy(blob.handle.data(), &it->second.handle, cuda_ipc::kIpcHandleBytes);
    blob.offset = it->second.offset;
    blob.length = it->second.length;
    blob.gpu = self_.gpu;
    return cuda_ipc::EncodeRegionBlob(blob);
  }

  absl::Status DeregisterMemory(uint64_t region_id) override {
    auto it = regions_.find(region_id);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("cuda_ipc: no region ", region_id));
    }
    for (const auto& [h, t] : transfers_) {
      if (t.region == region_id) {
        return absl::FailedPreconditionError(
            absl::StrCat("cuda_ipc: region ", region_id, " has a transfer in flight"));
      }
    }
    LocalExports::Get().Remove(HandleKey(it->second.handle));
    regions_.erase(it);
    return absl::OkStatus();
  }

  absl::Status Connect(const std::string& peer, const std::string& address) override {
    auto existing = peers_.find(peer);
    if (existing != peers_.end()) {
      if (existing->second.address == address) return absl::OkStatus();
      return absl::AlreadyExistsError(absl::StrCat(
          "cuda_ipc: peer '", peer, "' is connected with another address (Disconnect first)"));
    }
    ASSIGN_OR_RETURN(AgentAddress a, cuda_ipc::DecodeAgentAddress(address));
    if (a.boot_id != self_.boot_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuda_ipc: peer '", peer, "' runs on another host (boot id ", a.boot_id,
                       ", ours ", self_.boot_id, "); cuda_ipc needs both processes on one host"));
    }
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cuda_ipc: cudaSetDevice");
    int count = 0;
    RETURN_IF_CUDA_ERROR(cudaGetDeviceCount(&count), "cuda_ipc: device count");
    int peer_device = -1;
    for (int d = 0; d < count && peer_device < 0; ++d) {
      cudaDeviceProp prop;
      RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, d), "cuda_ipc: device properties");
      if (std::memcmp(prop.uuid.bytes, a.gpu.data(), cuda_ipc::kUuidBytes) == 0) peer_device = d;
    }
    if (peer_device < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cuda_ipc: the GPU of peer '", peer, "' (UUID ", UuidHex(a.gpu),
          ") is not visible in this process (CUDA_VISIBLE_DEVICES or the container's device "
          "list differ between the two)"));
    }
    if (peer_device != device_) {
      int can = 0;
      RETURN_IF_CUDA_ERROR(cudaDeviceCanAccessPeer(&can, device_, peer_device),
                           "cuda_ipc: cudaDeviceCanAccessPeer");
      if (!can) {
        return absl::FailedPreconditionError(
            absl::StrCat("cuda_ipc: GPU ", device_, " has no peer access to GPU ", peer_device,
                         " (no NVLink or PCIe P2P between them)"));
      }
    }
    Peer p;
    p.address = address;
    p.pid = a.pid;
    p.gpu = a.gpu;
    p.same_process = a.process == self_.process;  // not the pid: containers reuse pid 1
    peers_.emplace(peer, std::move(p));
    return absl::OkStatus();
  }

  absl::Status Disconnect(const std::string& peer) override {
    auto it = peers_.find(peer);
    if (it == peers_.end()) return absl::OkStatus();
    for (const auto& [h, t] : transfers_) {
      if (t.peer == peer) {
        return absl::FailedPreconditionError(
            absl::StrCat("cuda_ipc: peer '", peer, "' has a transfer in flight"));
      }
    }
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cuda_ipc: cudaSetDevice");
    CloseMappings(it->second);
    peers_.erase(it);
    return absl::OkStatus();
  }

  absl::StatusOr<TransferHandle> PostWrite(const TransferRequest& request) override {
    auto region = regions_.find(request.local_region);
    if (region == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("cuda_ipc: no local region ", request.local_region));
    }
    auto peer = peers_.find(request.peer);
    if (peer == peers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("cuda_ipc: peer '", request.peer, "' is not connected"));
    }
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cuda_ipc: cudaSetDevice");
    ASSIGN_OR_RETURN(const Mapping* mapping,
                     Map(request.peer, peer->second, request.remote_region));
    ASSIGN_OR_RETURN(const size_t pieces,
                     cuda_ipc::CountPieces(request.ops, region->second.length, mapping->length));
    ASSIGN_OR_RETURN(Slot slot, TakeSlot(pieces));
    // Straight into the pinned upload buffer: no other copy of the pieces on the host.
    cuda_ipc::FillPieces(request.ops, reinterpret_cast<uint64_t>(region->second.base),
                         mapping->base, slot.host);
    absl::Status launched = Launch(slot, pieces);
    if (!launched.ok()) {
      // Nothing was queued after a failed call; the slot's buffers are still ours.
      free_slots_.push_back(std::move(slot));
      return launched;
    }
    const TransferHandle h = next_handle_++;
    transfers_.emplace(
        h, Transfer{.slot = std::move(slot), .region = request.local_region, .peer = request.peer});
    return h;
  }

  absl::StatusOr<TransferState> Poll(TransferHandle handle) override {
    auto it = transfers_.find(handle);
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("cuda_ipc: no transfer ", handle));
    }
    const cudaError_t e = cudaEventQuery(it->second.slot.event);
    if (e == cudaSuccess) return TransferState::kDone;
    if (e == cudaErrorNotReady) return TransferState::kInProgress;
    LOG(WARNING) << "cuda_ipc: transfer " << handle << " failed: " << CudaStatus(e, "copy");
    return TransferState::kFailed;
  }

  absl::Status Release(TransferHandle handle) override {
    auto it = transfers_.find(handle);
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("cuda_ipc: no transfer ", handle));
    }
    // A running kernel cannot be recalled: wait for it so nothing of the transfer stays in flight.
    (void)cudaSetDevice(device_);
    const cudaError_t e = cudaEventSynchronize(it->second.slot.event);
    free_slots_.push_back(std::move(it->second.slot));
    transfers_.erase(it);
    if (e != cudaSuccess && e != cudaErrorNotReady) return CudaStatus(e, "cuda_ipc: release");
    return absl::OkStatus();
  }

  void Progress() override {}
  std::vector<Notification> GetNotifications() override { return {}; }

 private:
  struct Region {
    void* base = nullptr;
    size_t length = 0;
    uint64_t offset = 0;  // of base inside its allocation
    cudaIpcMemHandle_t handle;
  };
  // A peer's region as mapped here: [base, base + length) is validated against the mapping.
  struct Mapping {
    void* opened = nullptr;  // cudaIpcOpenMemHandle result (null for same-process regions)
    uint64_t base = 0;
    uint64_t length = 0;
  };
  struct Peer {
    std::string address;
    uint32_t pid = 0;
    std::array<uint8_t, cuda_ipc::kUuidBytes> gpu{};
    bool same_process = false;
    absl::flat_hash_map<std::string, Mapping> mappings;  // by region blob
  };
  // Per-transfer piece buffers (pinned host and device) and completion event, pooled.
  struct Slot {
    CopyPiece* host = nullptr;
    CopyPiece* device = nullptr;
    size_t capacity = 0;
    cudaEvent_t event = nullptr;
  };
  struct Transfer {
    Slot slot;
    uint64_t region = 0;
    std::string peer;
  };

  absl::StatusOr<const Mapping*> Map(const std::string& name, Peer& peer, const std::string& blob) {
    auto cached = peer.mappings.find(blob);
    if (cached != peer.mappings.end()) return &cached->second;
    ASSIGN_OR_RETURN(RegionBlob r, cuda_ipc::DecodeRegionBlob(blob));
    if (r.gpu != peer.gpu) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: the region of peer '", name,
                                                     "' is on another GPU than the peer's agent"));
    }
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, r.handle.data(), sizeof(handle));
    Mapping m;
    void* allocation = nullptr;
    size_t allocation_size = 0;
    if (peer.same_process) {
      if (!LocalExports::Get().Find(HandleKey(handle), &allocation, &allocation_size)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cuda_ipc: peer '", name, "' names a region no agent of this process exports"));
      }
    } else {
      const cudaError_t e =
          cudaIpcOpenMemHandle(&allocation, handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cuda_ipc: the driver rejected the IPC handle of peer '", name, "' (",
            CudaStatus(e, "cudaIpcOpenMemHandle").message(),
            "): both processes need one IPC namespace (same pod, or hostIPC in Kubernetes) and "
            "the peer must still be running"));
      }
      m.opened = allocation;
      CUdeviceptr base = 0;
      if (CUresult res = mem_get_address_range_(&base, &allocation_size,
                                                reinterpret_cast<CUdeviceptr>(allocation));
          res != CUDA_SUCCESS) {
        (void)cudaIpcCloseMemHandle(allocation);
        return absl::InternalError(absl::StrCat("cuda_ipc: size of the mapped allocation of peer '",
                                                name, "' unknown (", res, ")"));
      }
    }
    if (r.length > allocation_size || r.offset > allocation_size - r.length) {
      if (m.opened != nullptr) (void)cudaIpcCloseMemHandle(m.opened);
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda_ipc: peer '", name, "' claims a region (", r.length, " bytes at offset ", r.offset,
          ") beyond the allocation its handle maps (", allocation_size, " bytes)"));
    }
    m.base = reinterpret_cast<uint64_t>(allocation) + r.offset;
    m.length = r.length;
    return &peer.mappings.emplace(blob, m).first->second;
  }

  void CloseMappings(Peer& peer) {
    for (auto& [blob, m] : peer.mappings) {
      if (m.opened != nullptr) (void)cudaIpcCloseMemHandle(m.opened);
    }
    peer.mappings.clear();
  }

  absl::StatusOr<Slot> TakeSlot(size_t pieces) {
    Slot slot;
    if (!free_slots_.empty()) {
      // The largest free slot, grown if it is too small.
      auto best =
          std::max_element(free_slots_.begin(), free_slots_.end(),
                           [](const Slot& a, const Slot& b) { return a.capacity < b.capacity; });
      slot = std::move(*best);
      free_slots_.erase(best);
    }
    if (slot.event == nullptr) {
      RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&slot.event, cudaEventDisableTiming),
                           "cuda_ipc: event");
    }
    if (slot.capacity < pieces) {
      size_t capacity = std::max<size_t>(1024, slot.capacity);
      while (capacity < pieces) capacity *= 2;
      if (slot.host != nullptr) (void)cudaFreeHost(slot.host);
      if (slot.device != nullptr) (void)cudaFree(slot.device);
      slot.host = nullptr;
      slot.device = nullptr;
      slot.capacity = 0;
      cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&slot.host),
                                    capacity * sizeof(CopyPiece), cudaHostAllocDefault);
      if (e == cudaSuccess) {
        e = cudaMalloc(reinterpret_cast<void**>(&slot.device), capacity * sizeof(CopyPiece));
      }
      if (e != cudaSuccess) {
        FreeSlot(slot);
        return CudaStatus(e, "cuda_ipc: piece buffers");
      }
      slot.capacity = capacity;
    }
    return slot;
  }

  absl::Status Launch(const Slot& slot, size_t pieces) {
    if (pieces > 0) {
      RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(slot.device, slot.host, pieces * sizeof(CopyPiece),
                                           cudaMemcpyHostToDevice, stream_),
                           "cuda_ipc: uploading the pieces");
      RETURN_IF_CUDA_ERROR(
          cuda_ipc::LaunchScatterCopy(slot.device, static_cast<int>(pieces), num_sms_, stream_),
          "cuda_ipc: scatter copy");
    }
    RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.event, stream_), "cuda_ipc: event record");
    return absl::OkStatus();
  }

  static void FreeSlot(Slot& s) {
    if (s.host != nullptr) (void)cudaFreeHost(s.host);
    if (s.device != nullptr) (void)cudaFree(s.device);
    if (s.event != nullptr) (void)cudaEventDestroy(s.event);
    s = Slot{};
  }

  const std::string agent_name_;
  int device_ = 0;
  int num_sms_ = 1;
  AgentAddress self_;
  MemGetAddressRangeFn mem_get_address_range_ = nullptr;
  cudaStream_t stream_ = nullptr;

  uint64_t next_region_ = 1;
  absl::flat_hash_map<uint64_t, Region> regions_;
  absl::flat_hash_map<std::string, Peer> peers_;
  TransferHandle next_handle_ = 1;
  absl::flat_hash_map<TransferHandle, Transfer> transfers_;
  std::vector<Slot> free_slots_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TransferBackend>> CreateCudaIpcBackend(
    const BackendOptions& options) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("cuda_ipc: no usable CUDA device (",
                     e == cudaSuccess ? "none found" : std::string(cudaGetErrorString(e)), ")"));
  }
  if (options.cuda_device < 0 || options.cuda_device >= count) {
    return absl::NotFoundError(
        absl::StrCat("cuda_ipc: no GPU ", options.cuda_device, " (", count, " visible)"));
  }
  auto backend = std::make_unique<CudaIpcBackend>(options.agent_name, options.cuda_device);
  RETURN_IF_ERROR(backend->Init());
  return backend;
}

}  // namespace tandem::kvtransfer

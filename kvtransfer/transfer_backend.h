#pragma once
// The KV transfer boundary: moves bytes described by descriptors between two agents (processes),
// and knows nothing of requests or models. One interface, backends created by name
// (CreateTransferBackend): "loopback" (in-process reference), "ucx" (UCX one-sided puts over
// tcp / shared memory / RDMA), "cuda_ipc" (device memory of processes on one host, through CUDA
// IPC; cuda_ipc/cuda_ipc_backend.h), "nccl" (device memory of GPUs on any hosts, NCCL send/recv
// over one two-rank communicator per pair; nccl/nccl_backend.h), "cma" (host memory of processes
// on one host, process_vm_writev / readv from a pool of copy threads; cma/cma_backend.h), and a
// fault-injecting wrapper for tests.
//
// Life of a transfer (STYLE.md 2: prepare -> post -> poll -> release):
//   target:    region = RegisterMemory(kv_base, kv_bytes); blob = ExportRegion(region);
//              send {LocalAddress(), blob} to the initiator out of band (gRPC).
//   initiator: Connect(peer, address); reply = ConnectReply(peer);
//              send reply to the target out of band when it is not empty ("nccl" needs one);
//   target:    Accept(initiator, reply) when a reply came;
//   initiator: h = PostWrite({local region, peer, blob, ops, notify});
//              while (Poll(h) == kInProgress) {...}   // never blocks
//              Release(h);
//   target:    Progress() regularly (UCX's tcp/shm transports need target-side progress);
//              GetNotifications() yields the initiator's notify message once its writes landed.
// kDone means every byte of the transfer is visible in the target's memory (remote completion),
// so the initiator may acknowledge to the target over another channel.
//
// Threading: a backend is NOT thread-safe; one thread owns it (a worker's transfer thread) and
// makes every call. Calls never block on the network beyond a bounded, short time (Connect may
// take up to its deadline). Failure leaves the backend usable: a failed PostWrite posts nothing;
// a transfer that fails mid-way reports kFailed from Poll (target memory of that transfer is then
// unspecified) and must still be Released.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer {

enum class MemoryKind { kHost, kCuda };

struct Capabilities {
  bool host_memory = true;
  bool cuda_memory = false;
  bool notifications = false;
  bool read = false;           // PostRead
  bool cross_process = false;  // peers may live in other processes / hosts
};

// A registered local region. `id` is backend-local.
struct MemoryRegion {
  uint64_t id = 0;
  MemoryKind kind = MemoryKind::kHost;
  void* base = nullptr;
  size_t length = 0;
};

// One contiguous copy, offsets relative to the local and remote region bases.
struct CopyOp {
  size_t local_offset = 0;
  size_t remote_offset = 0;
  size_t length = 0;
};

struct TransferRequest {
  uint64_t local_region = 0;  // a MemoryRegion id of this backend
  std::string peer;           // a Connect()ed peer name
  std::string remote_region;  // the blob the peer's ExportRegion produced
  std::vector<CopyOp> ops;    // may be many (one per KV block and layer)
  std::string notification;   // delivered to the peer after all ops land; "" = none
};

enum class TransferState { kInProgress, kDone, kFailed };

using TransferHandle = uint64_t;

struct Notification {
  std::string peer;  // the initiator's agent name
  std::string message;
};

struct BackendOptions {
  std::string agent_name;  // this process's agent name, unique among peers
  // UCX: transports (UCX_TLS syntax, e.g. "tcp,sm,self"); "" = UCX's default.
  std::string ucx_transports;
  // UCX: network devices (UCX_NET_DEVICES syntax, e.g. "lo"); "" = every device. A worker bound
  // to loopback sets "lo", so UCX's tcp transport does not listen on the other interfaces.
  std::string ucx_net_devices;
  absl::Duration connect_timeout = absl::Seconds(5);
  // cuda_ipc, nccl: the GPU (CUDA ordinal in this process) whose memory is registered and whose
  // stream runs the copies.
  int cuda_device = 0;
  // nccl: how long one posted transfer may take, waiting for the pair's communicator included
  // (the target applies it from a message's header to its last byte). Past it the pair's
  // communicator is aborted and every transfer on it fails. connect_timeout bounds the
  // communicator's set-up on both sides (from Connect on the initiator, Accept on the target).
  absl::Duration transfer_timeout = absl::Seconds(5);
  // nccl: the largest device staging buffer per communicator (grown on demand up to this). A
  // transfer with more bytes is sent as several messages of at most this (the smaller of both
  // sides' values); each is acknowledged on its own.
  uint64_t nccl_staging_bytes = uint64_t{256} << 20;
  // nccl: the library dlopen()ed at backend creation (found through LD_LIBRARY_PATH).
  std::string nccl_library = "libnccl.so.2";
  // cma: the copy threads the backend owns (1..64); each transfer's ops are split over them in
  // shares of about equal bytes (at least 1 MiB each), each share copied by process_vm_writev
  // (readv for PostRead).
  int cma_threads = 2;
};

class TransferBackend {
 public:
  virtual ~TransferBackend() = default;

  virtual std::string_view name() const = 0;
  virtual Capabilities capabilities() const = 0;
  virtual const std::string& agent_name() const = 0;

  // This agent's connection blob, for peers' Connect.
  virtual absl::StatusOr<std::string> LocalAddress() = 0;

  // Registers [base, base+length) for transfers. The memory must outlive the registration.
  virtual absl::StatusOr<MemoryRegion> RegisterMemory(void* base, size_t length,
                                                      MemoryKind kind) = 0;
  // A blob that lets a connected peer address this region remotely.
  virtual absl::StatusOr<std::string> ExportRegion(uint64_t region_id) = 0;
  // Fails with FailedPrecondition while transfers using the region are in flight.
  virtual absl::Status DeregisterMemory(uint64_t region_id) = 0;

  // Connects to a peer by its LocalAddress blob. Idempotent for the same name and address.
  virtual absl::Status Connect(const std::string& peer, const std::string& address) = 0;
  // Two-sided pairing. After a successful Connect(peer, ...) on the initiator: the blob the peer
  // must receive (out of band) and pass to Accept before transfers can flow; "" = nothing to
  // send (the default: one-sided backends). NotFound for a peer that is not connected.
  virtual absl::StatusOr<std::string> ConnectReply(const std::string& peer) {
    (void)peer;
    return std::string();
  }
  // On the target: joins the connection that initiator `peer` started, given its ConnectReply.
  // Returns at once (the connection may finish later, within connect_timeout). Default: OK for
  // an empty reply, InvalidArgument otherwise.
  virtual absl::Status Accept(const std::string& peer, const std::string& reply) {
    if (reply.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(std::string(name()) + ": Accept of peer '" + peer +
                                      "' got a reply, but this backend pairs one-sided");
  }
  virtual absl::Status Disconnect(const std::string& peer) = 0;

  // Posts the writes of `request`; returns at once. InvalidArgument for ops outside either
  // region, NotFound for an unknown region or peer.
  virtual absl::StatusOr<TransferHandle> PostWrite(const TransferRequest& request) = 0;
  virtual absl::StatusOr<TransferHandle> PostRead(const TransferRequest& request) {
    return absl::UnimplementedError(std::string(name()) + ": PostRead is not supported");
  }
  // Progresses the backend and reports the transfer's state. NotFound for an unknown handle.
  virtual absl::StatusOr<TransferState> Poll(TransferHandle handle) = 0;
  // Frees the handle; a transfer still in progress is cancelled (best effort) first.
  virtual absl::Status Release(TransferHandle handle) = 0;
  // After Release(handle): true while that transfer's bytes may still land in the target, or its
  // local memory still be read (a backend that cannot recall an in-flight write keeps it until it
  // finishes: UCX). Whoever fences a transfer, or reuses its source or destination memory, waits
  // for false. Progresses the backend; cheap. Default: false (Release finished it).
  virtual bool Lingering(TransferHandle released) {
    (void)released;
    return false;
  }

  // Drives the backend's progress engine (target side too). Cheap when idle.
  virtual void Progress() = 0;
  // Notifications that arrived since the last call (calls Progress).
  virtual std::vector<Notification> GetNotifications() = 0;
};

// The registry: every backend of the project, in the order `--kv-transfer auto` prefers them
// (DESIGN.md: same host with IPC, then GPU to GPU anywhere, then host memory on one host (cma),
// then UCX; loopback is in-process only). Each backend is its own CMake target with its SDK
// private; an entry this build lacks has no `create` and says in `missing` what it would need.
struct BackendEntry {
  std::string_view name;
  std::string_view summary;  // what it moves, and between whom
  bool moves_device_memory = false;
  bool in_process_only = false;  // never chosen by auto
  absl::StatusOr<std::unique_ptr<TransferBackend>> (*create)(const BackendOptions&) = nullptr;
  std::string_view missing;  // when create is null: why this build has no such backend
};
const std::vector<BackendEntry>& TransferBackendRegistry();
// True when the registry names `name` and this build has it.
bool TransferBackendBuilt(std::string_view name);

// Creates a backend by its registry name (InvalidArgument for an unknown name, naming the
// choices; Unimplemented for a backend this build lacks, saying why).
absl::StatusOr<std::unique_ptr<TransferBackend>> CreateTransferBackend(
    std::string_view name, const BackendOptions& options);

}  // namespace tandem::kvtransfer

#pragma once
// The shard's side of the MLP host data plane (MlpShard.AttachHost in proto/tandem/v1/mlp.proto;
// docs/mlp.md "Host data plane"). A `tandem mlp-shard` computing on the CPU opens one session
// per attached attention worker: two SessionBuffers (plane_buffers.h) registered with a
// kvtransfer backend of the worker's choosing, among those the shard runs (`--data-planes`,
// each created on first use, with a TransferThread of its own).
//
// A Compute call that names (session, slot): Claim takes the slot for the call (one call per
// slot at a time: a second is FailedPrecondition, so a late call can never overwrite an answer
// the worker is reading); Fetch reads the worker's rows out of its exported input slot into
// ours; the compute thread reads input(slot) and writes output(slot); Release frees the slot
// when the call is answered. The worker reads output(slot) afterwards and only then uses the
// slot again. The shard never writes into the worker's memory.
//
// Untrusted input: the attach request is checked (mlp_shard_checks.h) before anything is
// allocated; the worker's address and region are blobs its backend parses and bounds (a read
// outside the worker's region is refused by the backend before anything moves); the session id
// is random, and a call naming an unknown id, a slot or row count outside the session, is
// refused before any transfer.
//
// Threading: Open and Find run on gRPC threads (a mutex guards the sessions); a session's Claim,
// Release and Fetch may be called from any thread; Fetch's `done` runs on the transfer thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/handoff/transfer_thread.h"
#include "runtime/mlp/host_plane/plane_buffers.h"
#include "runtime/mlp/mlp_shard_session.h"
#include "tandem/v1/mlp.pb.h"

namespace tandem::mlp {

struct ShardHostPlaneOptions {
  // The kvtransfer backends sessions may ask for ("cma", "ucx"); each must be one this build has.
  std::vector<std::string> backends = {"cma", "ucx"};
  int hidden_size = 0;
  int max_rows = 8192;  // a session's slot_rows bound (MlpInfo.max_rows)
  int max_sessions = 64;
  // UCX: transports and network devices (kvtransfer::BackendOptions); "" = UCX's defaults.
  std::string ucx_transports;
  std::string ucx_net_devices;
  // How long opening a session may take (registration on the transfer thread, Connect).
  absl::Duration open_timeout = absl::Seconds(5);
  // The transfer threads' ticks: busy while a read is in flight, idle otherwise (UCX over tcp
  // needs the target to progress for a worker's read to be served: this bounds its latency).
  absl::Duration busy_tick = absl::Microseconds(20);
  absl::Duration idle_tick = absl::Microseconds(200);
  // Tests: wraps the backend once created (a fault-injecting wrapper); null: as created.
  std::function<std::unique_ptr<kvtransfer::TransferBackend>(
      std::unique_ptr<kvtransfer::TransferBackend>)>
      wrap_backend;
};

class ShardHostSession {
 public:
  ShardHostSession(uint64_t id, std::shared_ptr<SessionBuffers> buffers, std::string peer,
                   std::string worker_input_region);
  uint64_t id() const { return id_; }
  int slots() const { return buffers_->slots(); }
  int slot_rows() const { return buffers_->slot_rows(); }

  // Takes `slot` for one call of `rows` rows: InvalidArgument for a slot or row count outside
  // the session, FailedPrecondition while another call holds the slot.
  absl::Status Claim(uint32_t slot, uint32_t rows);
  void Release(uint32_t slot);
  // Reads the worker's `rows` rows of `slot` into input(slot); `done` as ReadSlot's.
  void Fetch(uint32_t slot, uint32_t rows, absl::Time deadline,
             std::function<void(absl::Status)> done);
  const float* input(uint32_t slot) { return buffers_->input(static_cast<int>(slot)); }
  float* output(uint32_t slot) { return buffers_->output(static_cast<int>(slot)); }

 private:
  const uint64_t id_;
  const std::shared_ptr<SessionBuffers> buffers_;
  const std::string peer_;
  const std::string worker_input_region_;
  absl::Mutex mu_;
  std::vector<bool> busy_ ABSL_GUARDED_BY(mu_);
};

class ShardHostPlane : public std::enable_shared_from_this<ShardHostPlane> {
 public:
  // InvalidArgument for a backend name this build lacks or that moves no host memory, or a
  // hidden size below 1. Backends are created when a session first asks for them.
  static absl::StatusOr<std::shared_ptr<ShardHostPlane>> Create(ShardHostPlaneOptions options);
  ~ShardHostPlane();  // Stop()
  // Stops the transfer threads: reads in flight end Unavailable (their `done` runs), later ones
  // at once, and no session opens any more. Idempotent.
  void Stop();

  // For a checked AttachHost request: registers the session's buffers, connects to the worker,
  // and fills `response`. The returned handle ends the session when destroyed (calls in flight
  // keep its buffers; a handle outliving the plane ends nothing). FailedPrecondition for a backend
  // this shard does not run, ResourceExhausted past max_sessions, the backend's errors otherwise.
  absl::StatusOr<std::unique_ptr<MlpShardSession>> Open(
      const tandem::v1::MlpHostAttachRequest& request, tandem::v1::MlpHostAttachResponse* response);
  // The open session `id`; NotFound when there is none (never opened, or ended).
  absl::StatusOr<std::shared_ptr<ShardHostSession>> Find(uint64_t id);

  const std::vector<std::string>& backends() const { return options_.backends; }

 private:
  class Handle;
  explicit ShardHostPlane(ShardHostPlaneOptions options) : options_(std::move(options)) {}
  absl::StatusOr<std::shared_ptr<kvtransfer::TransferThread>> ThreadFor(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void End(uint64_t id);

  const ShardHostPlaneOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<kvtransfer::TransferThread>> threads_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<ShardHostSession>> sessions_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::mlp

#pragma once
// The attention worker's side of the MLP host data plane (MlpShard.AttachHost in
// proto/tandem/v1/mlp.proto; docs/mlp.md "Host data plane"), used by the remote backend
// (remote_mlp_backend.h) with `--mlp-data-plane cma|ucx`.
//
// A WorkerHostPlane owns one kvtransfer backend on a TransferThread of its own. Attach opens a
// session with one shard: it registers the session's SessionBuffers (plane_buffers.h), asks the
// shard over an AttachHost call that stays open, connects to the shard's agent, and returns the
// session. The call's end (the shard stopped, died, or refused) marks the session dead.
//
// A call through a session: AcquireSlot takes a free slot for the call, the caller writes its
// rows into input(slot) and sends Compute naming (session, slot); once the call returned OK,
// ReadOutput reads the shard's answer out of its output slot into output(slot); the caller copies
// it out and ReleaseSlot frees the slot. A slot is never used by two calls: one whose call or read
// was given up on stays taken until its read's `done` has run (no read can land in it any more).
//
// Untrusted input: the shard's answer is checked (mlp_shard_checks.h) before anything is
// connected; its address and region are blobs the backend parses and bounds: a read outside the
// shard's exported region is refused before anything moves.
//
// Threading: Attach blocks (bounded by its deadline) and may run on any thread, several at once; a
// session's slots are the engine thread's (AcquireSlot, ReleaseSlot, input, output); ReadOutput may
// be called from any thread (gRPC's callback threads) and its `done` runs on the transfer thread;
// alive() from any thread.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/handoff/transfer_thread.h"
#include "runtime/mlp/host_plane/plane_buffers.h"
#include "tandem/v1/mlp.grpc.pb.h"

namespace tandem::mlp {

struct WorkerHostPlaneOptions {
  std::string backend = "cma";  // "cma" or "ucx"
  int hidden_size = 0;
  int slots = 4;        // calls in flight to one shard at once (ping-pong takes 2)
  int slot_rows = 256;  // rows a call through the plane carries (larger calls go in messages)
  std::string ucx_transports;
  std::string ucx_net_devices;
  absl::Duration busy_tick = absl::Microseconds(20);
  absl::Duration idle_tick = absl::Microseconds(200);
  // Tests: wraps the backend once created (a fault-injecting wrapper); null: as created.
  std::function<std::unique_ptr<kvtransfer::TransferBackend>(
      std::unique_ptr<kvtransfer::TransferBackend>)>
      wrap_backend;
};

class WorkerHostSession;

class WorkerHostPlane {
 public:
  // InvalidArgument for a backend other than cma/ucx (or one this build lacks), slots outside
  // 1..16 or slot_rows below 1; the backend's creation errors.
  static absl::StatusOr<std::shared_ptr<WorkerHostPlane>> Create(
      const WorkerHostPlaneOptions& options);
  ~WorkerHostPlane();  // stops the transfer thread: reads in flight end Unavailable

  const WorkerHostPlaneOptions& options() const { return options_; }

  // Opens a session with the shard behind `stub` (its address for messages), within `deadline`.
  // The shard's refusal keeps its gRPC code (UNIMPLEMENTED: a shard without the host plane,
  // FAILED_PRECONDITION: not over this backend); an answer that fails the checks is
  // FailedPrecondition; DeadlineExceeded when it took too long.
  absl::StatusOr<std::shared_ptr<WorkerHostSession>> Attach(tandem::v1::MlpShard::Stub& stub,
                                                            const std::string& shard_address,
                                                            absl::Time deadline);

 private:
  WorkerHostPlane(const WorkerHostPlaneOptions& options,
                  std::shared_ptr<kvtransfer::TransferThread> thread, std::string address);

  const WorkerHostPlaneOptions options_;
  const std::shared_ptr<kvtransfer::TransferThread> thread_;
  const std::string address_;          // this worker's LocalAddress blob
  std::atomic<uint64_t> attached_{0};  // numbers this plane's sessions (agent names)
};

class WorkerHostSession {
 public:
  ~WorkerHostSession();  // ends the AttachHost call (the shard frees its side)

  uint64_t id() const { return id_; }
  int slots() const { return buffers_->slots(); }
  int slot_rows() const { return buffers_->slot_rows(); }
  // False once the AttachHost call ended: the shard no longer knows the session.
  bool alive() const;

  // A free slot for a call of `rows` rows; nullopt when rows exceed slot_rows or every slot is
  // taken (the call then travels in its message).
  std::optional<int> AcquireSlot(int rows);
  void ReleaseSlot(int slot);
  float* input(int slot) { return buffers_->input(slot); }
  const float* output(int slot) { return buffers_->output(slot); }
  // Reads the shard's answer of `rows` rows in `slot` into output(slot); `done` as ReadSlot's.
  void ReadOutput(int slot, int rows, absl::Time deadline, std::function<void(absl::Status)> done);

 private:
  friend class WorkerHostPlane;
  class Stream;
  WorkerHostSession(uint64_t id, std::shared_ptr<SessionBuffers> buffers, std::string peer,
                    std::string shard_output_region, std::unique_ptr<Stream> stream);

  const uint64_t id_;
  const std::shared_ptr<SessionBuffers> buffers_;
  const std::string peer_;
  const std::string shard_output_region_;
  std::unique_ptr<Stream> stream_;
  std::vector<bool> taken_;  // the engine thread's
};

}  // namespace tandem::mlp

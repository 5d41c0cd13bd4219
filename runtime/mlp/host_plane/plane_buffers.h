#pragma once
// What both sides of the MLP host data plane share (proto/tandem/v1/mlp.proto, AttachHost;
// docs/mlp.md "Host data plane"): a session's two buffers, and the one transfer the plane runs,
// a read of a peer's slot into ours. The shard's side is shard_host_plane.h, the attention
// worker's worker_host_plane.h.
//
// - SessionBuffers: an input and an output buffer of slots x slot_rows x hidden float32, both
//   registered with (and exported by) one TransferThread's backend. Always held by shared_ptr
//   (Create): every read in flight holds its session's buffers. When the last holder lets go,
//   the registrations are dropped on the transfer thread (retried there each tick while a
//   transfer of the backend still uses them), the session's peer is disconnected, and only then
//   is the memory freed; after the thread stopped, the memory is simply freed.
// - ReadSlot: one PostRead of a peer's exported region into ours, with `done` called exactly
//   once on the transfer thread (or at once on the caller's thread when the thread has stopped):
//   OK when the bytes are in our memory; Unavailable when the post or the transfer failed, or the
//   thread stopped; DeadlineExceeded when it had not finished by `deadline`. A read the backend
//   cannot recall (UCX) lingers after its release, and `done` waits until it no longer does, so
//   when `done` runs nothing writes into the slot any more.
//
// Threading: Create blocks on the transfer thread (bounded by its deadline); ReadSlot may be
// called from any thread; buffers' slot memory is read and written by the callers, who own a
// slot between the plane's transfers (the slot discipline in the two sides' headers).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/handoff/transfer_thread.h"

namespace tandem::mlp {

class SessionBuffers {
 public:
  // Allocates and registers both buffers on `thread` (waiting at most until `deadline`), and
  // exports them. InvalidArgument for sizes outside 1..16 slots, 1..1<<20 rows, or a total past
  // 1 GiB; the backend's errors otherwise.
  static absl::StatusOr<std::shared_ptr<SessionBuffers>> Create(
      std::shared_ptr<kvtransfer::TransferThread> thread, int slots, int slot_rows, int hidden,
      absl::Time deadline);

  int slots() const { return slots_; }
  int slot_rows() const { return slot_rows_; }
  size_t slot_bytes() const { return slot_floats_ * sizeof(float); }
  float* input(int slot) { return input_.get() + static_cast<size_t>(slot) * slot_floats_; }
  float* output(int slot) { return output_.get() + static_cast<size_t>(slot) * slot_floats_; }
  uint64_t input_region() const { return input_region_; }
  uint64_t output_region() const { return output_region_; }
  const std::string& input_blob() const { return input_blob_; }
  const std::string& output_blob() const { return output_blob_; }
  // The thread the buffers are registered with; null once its owner let it go.
  std::shared_ptr<kvtransfer::TransferThread> thread() const { return thread_.lock(); }

  // The peer this session reads from (connected by the owner); disconnected at retirement.
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  const std::string& peer() const { return peer_; }

  ~SessionBuffers();
  SessionBuffers(const SessionBuffers&) = delete;
  SessionBuffers& operator=(const SessionBuffers&) = delete;

 private:
  SessionBuffers(std::weak_ptr<kvtransfer::TransferThread> thread, int slots, int slot_rows,
                 int hidden);
  // Runs on the transfer thread as the deleter's task: true once everything is dropped.
  static bool TryRetire(SessionBuffers& buffers, kvtransfer::TransferBackend& backend);

  // Weak: the plane that owns the thread stops it (the last holder of these buffers may be a
  // transfer on that very thread, which must never destroy it).
  const std::weak_ptr<kvtransfer::TransferThread> thread_;
  const int slots_;
  const int slot_rows_;
  const size_t slot_floats_;
  std::unique_ptr<float[]> input_;
  std::unique_ptr<float[]> output_;
  uint64_t input_region_ = 0;  // 0: not registered
  uint64_t output_region_ = 0;
  std::string input_blob_;
  std::string output_blob_;
  std::string peer_;
};

// Reads `bytes` at `remote_offset` of the peer's exported `remote_region` into `local_region` at
// `local_offset`; `keep` (the buffers the read lands in) is held until `done` has run.
void ReadSlot(std::shared_ptr<SessionBuffers> keep, uint64_t local_region, size_t local_offset,
              const std::string& peer, const std::string& remote_region, size_t remote_offset,
              size_t bytes, absl::Time deadline, std::function<void(absl::Status)> done);

}  // namespace tandem::mlp

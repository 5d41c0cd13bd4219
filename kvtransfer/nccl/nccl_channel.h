#pragma once
// Channel (nccl_protocol.h) over one two-rank NCCL communicator and one CUDA stream of this
// process's GPU: control messages go through pinned host and device buffers pooled per channel,
// data through one device staging buffer grown on demand (stream-ordered cudaMallocAsync /
// cudaFreeAsync, never more than the protocol's cap), gathers and scatters through one
// piece-copy kernel each (piece_copy.h).
//
// - Set-up is non-blocking (ncclCommInitRankConfig with config.blocking = 0); Poll checks
//   ncclCommGetAsyncError.
// - A non-blocking communicator may answer ncclGroupEnd with ncclInProgress before anything is
//   on the stream; the channel then holds every later post (and the event that marks the op)
//   until ncclCommGetAsyncError says the group was enqueued, so stream order always equals post
//   order.
// - Nothing here blocks on the peer: Abort calls ncclCommAbort (which makes NCCL's kernels
//   return) and then waits at most one second for the stream to drain; buffers the stream may
//   still use are then leaked rather than freed under it. No cudaFree or cudaFreeHost while an
//   op is pending (a device-wide synchronization would wait for the peer).
//
// Threading: one thread (the backend's) calls everything; each call sets the channel's device.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtransfer/nccl/nccl_api.h"
#include "kvtransfer/nccl/nccl_protocol.h"
#include "kvtransfer/nccl/nccl_wire.h"

namespace tandem::kvtransfer::nccl {

// Pinned host + device buffer pairs shared by a backend's channels, freed only when the pool
// goes (after every channel of the backend was aborted): freeing memory while any channel's
// receive is posted could wait for that channel's peer.
class BufferPool {
 public:
  struct Buffer {
    char* host = nullptr;
    char* device = nullptr;
    size_t capacity = 0;
  };
  BufferPool() = default;
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  ~BufferPool();
  // A buffer of at least `bytes` (on the current device).
  absl::StatusOr<Buffer> Take(size_t bytes);
  void Give(Buffer buffer);

 private:
  std::vector<Buffer> free_;
  std::vector<Buffer> all_;
};

struct ChannelConfig {
  int rank = 0;  // 0 = initiator, 1 = target
  UniqueId unique_id{};
  int device = 0;
  int num_sms = 1;
  uint64_t max_staging_bytes = 0;  // larger staging requests fail the op
  std::shared_ptr<BufferPool> pool;
};

// Starts the communicator's set-up and returns at once. Errors from NCCL or CUDA keep NCCL's
// message; nothing is left behind on failure.
absl::StatusOr<std::unique_ptr<Channel>> StartNcclChannel(std::shared_ptr<const NcclApi> api,
                                                          const ChannelConfig& config);

// A fresh ncclUniqueId (the initiator's side of the pairing).
absl::StatusOr<UniqueId> NewUniqueId(const NcclApi& api);

}  // namespace tandem::kvtransfer::nccl

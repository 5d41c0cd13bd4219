#pragma once
// The GPU data plane of a `tandem mlp-shard` (MlpShard.Attach, proto/tandem/v1/mlp.proto): a
// session between the shard and one attention worker on the same GPU, created from an Attach
// request and alive while that call is open (mlp_shard_service.h ends it: destroying the session
// frees its buffers, events and doorbell). The CUDA implementation is
// runtime/mlp/cuda/ipc_shard_session.h; a shard computing on the CPU has no factory and answers
// Attach UNIMPLEMENTED.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/mlp/mlp_backend.h"
#include "tandem/v1/mlp.pb.h"

namespace tandem::mlp {

class MlpShardSession {
 public:
  virtual ~MlpShardSession() = default;
};

// Creates a session for a checked request (mlp_shard_checks.h) and fills the response with its
// handles. Called on a gRPC thread.
using MlpSessionFactory = std::function<absl::StatusOr<std::unique_ptr<MlpShardSession>>(
    const tandem::v1::MlpAttachRequest& request, tandem::v1::MlpAttachResponse* response)>;

// What a shard computes with: the backend of Compute calls and, on a GPU, the session factory.
struct ShardCompute {
  std::unique_ptr<MlpBackend> backend;
  MlpSessionFactory attach;  // null: no GPU data plane
  // A line on the GPU data plane's work so far (its layer groups); null without one.
  std::function<std::string()> data_plane_stats;
};

// How a GPU shard groups its sessions' calls (cuda/ipc_layer_batcher.h): the longest a call
// waits for another attention worker's call of the same layer.
struct ShardComputeOptions {
  absl::Duration ipc_batch_window = absl::Milliseconds(2);
  // How long the shard's stream waits on the GPU for a worker's input signal before it gives up
  // on that call (a dead or stuck worker must not stop the stream every session shares); the
  // answer is then marked failed and the worker discards it.
  absl::Duration ipc_input_timeout = absl::Seconds(2);
};

}  // namespace tandem::mlp

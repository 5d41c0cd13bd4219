#pragma once
// Creates an MlpBackend by name (mlp_backend.h, docs/mlp.md). This is the one file that knows
// which backends exist:
//   local              nullptr: the runner computes the MLP itself (the default)
//   cpu                the model's MLP weights in host memory, computed with BLAS
//   cuda, cuda:N       the model's MLP weights in bf16 on that GPU (cuda/cuda_mlp_backend.h;
//                      FailedPrecondition in a build without CUDA)
//   remote:A[,B...]    `tandem mlp-shard` services at A, B...; with fallback "cpu" the weights
//                      are also kept here, and a layer no shard answers is computed on them
//   cuda_ipc:A[,B...]  `tandem mlp-shard --device cuda` services on this worker's GPU, through
//                      the GPU data plane (cuda/cuda_ipc_mlp_backend.h; no fallback)
// InvalidArgument for an unknown name or a malformed address list (the message lists the
// names), plus the backends' own errors (missing tensors, unreachable or mismatched shards).
//
// Thread-safe.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/mlp/mlp_backend.h"
#include "runtime/mlp/mlp_shard_session.h"
#include "runtime/mlp/remote_mlp_options.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace tandem::auth {
class ServiceIdentity;
}  // namespace tandem::auth

namespace tandem::mlp {

struct MlpContext {
  const ModelConfig* config = nullptr;
  const TensorStore* store = nullptr;                     // for cpu, and remote's cpu fallback
  std::string model_fingerprint;                          // what remote shards must serve
  std::shared_ptr<const auth::ServiceIdentity> identity;  // remote: the service credential
  std::string fallback = "none";                          // remote: "none" or "cpu"
  RemoteMlpOptions remote;
  int device_ordinal = 0;   // cuda_ipc: the worker's GPU (the shards' too)
  int ipc_max_rows = 8192;  // cuda_ipc: rows a call carries (larger steps take several)
};

// The names CreateMlpBackend takes (remote with its address list elided).
std::vector<std::string> MlpBackendNames();

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateMlpBackend(const std::string& spec,
                                                             const MlpContext& context);

// What a `tandem mlp-shard` computes `shape`'s layers with on `device` ("cpu", "cuda" or
// "cuda:N"): the backend of its Compute calls and, on a GPU, its Attach sessions (the GPU data
// plane). InvalidArgument for another device name; FailedPrecondition for CUDA in a build
// without it; the backends' own load errors.
absl::StatusOr<ShardCompute> CreateShardCompute(const std::string& device, const MlpShape& shape,
                                                const ModelConfig& config, const TensorStore& store,
                                                const ShardComputeOptions& options = {});

}  // namespace tandem::mlp

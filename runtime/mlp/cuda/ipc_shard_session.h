#pragma once
// The GPU side of `tandem mlp-shard --device cuda` (docs/mlp.md, "GPU data plane"): the compute
// backend of its Compute calls (cuda_mlp_backend.h) and the factory of its Attach sessions, both
// over one CudaDenseMlp.
//
// A session, for one attention worker on the shard's GPU and host (the request's GPU UUID and
// boot id must be the shard's: FailedPrecondition otherwise), owns:
// - an input and an output buffer of max_rows x hidden bf16, each its own cudaMalloc, exported
//   with cudaIpcGetMemHandle;
// - an input and an output event (cudaEventInterprocess), exported with cudaIpcGetEventHandle;
// - a doorbell page (runtime/mlp/ipc_doorbell.h) and a thread that serves it: for each call it
//   checks the layer (in the shard's range) and the rows (offset >= 0, 1..max_rows, within the
//   buffers), hands the call to the shard's layer batcher (ipc_layer_batcher.h: the sessions'
//   calls of one layer run as one GEMM; the batcher's stream waits for the input event and
//   records the output event) and answers 0 once it is queued; a bad call is answered 1 and a
//   compute error 2, with nothing queued that the client waits for.
// Destroying the session stops its thread, waits for the batcher's stream and frees everything.
//
// Thread-safety: the factory may be called from any thread; each session's thread is its own.

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/mlp/mlp_shard_session.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace tandem::mlp {

// Answer codes of a session's doorbell.
inline constexpr int kIpcCallOk = 0;
inline constexpr int kIpcCallRefused = 1;  // layer or rows out of range
inline constexpr int kIpcCallFailed = 2;   // a CUDA or cuBLAS error

absl::StatusOr<ShardCompute> CreateGpuShardCompute(const ModelConfig& config,
                                                   const TensorStore& store, const MlpShape& shape,
                                                   int device_ordinal,
                                                   const ShardComputeOptions& options = {});

// This host's boot id and a GPU's UUID as 32 lowercase hex digits (what Attach carries).
absl::StatusOr<std::string> HostBootId();
absl::StatusOr<std::string> GpuUuid(int device_ordinal);

}  // namespace tandem::mlp

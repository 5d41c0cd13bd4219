#pragma once
// CudaMlpBackend ("cuda", "cuda:N"): the MLP weights of a range of layers in bf16 on one GPU,
// computed as the CUDA runner computes its own MLP (cuda_dense_mlp.h). It is the compute of `tandem
// mlp-shard --device cuda` and of a worker's `--mlp cuda`.
//
// Host rows (Submit, float32, mlp_backend.h): a call rounds them to bf16, copies them to the GPU
// through pinned memory, runs the layer on the backend's own stream and copies the result back;
// Submit returns when `out` holds it (synchronous, as `cpu`), Wait reports it. A Submit past its
// deadline computes nothing and its Wait is DeadlineExceeded.
// Device rows (EnqueueOnDevice, bf16, for a caller on the same GPU: the CUDA runner's `--mlp
// cuda`): the layer is queued on the caller's stream (cuda_dense_mlp.h), with no copy and no
// wait; SubmitOnDevice queues it on a stream of its own behind an event of the caller's stream
// (ping-pong: the caller's next micro-batch's attention may run meanwhile), JoinOnDevice makes
// the caller's stream wait for it.
//
// Errors: creation fails as LoadDenseMlpWeights does for missing or misshapen tensors (naming
// them), Unavailable / NotFound for the GPU, ResourceExhausted for its memory; nothing stays
// allocated. Submit: InvalidArgument for a layer outside the range or rows < 1; a CUDA or cuBLAS
// error as a status naming the op (a sticky CUDA error leaves the backend unusable).
//
// Thread-safety: one thread at a time; each call binds that thread to the backend's GPU. No CUDA
// types in this header.

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/mlp/cuda/cuda_dense_mlp.h"
#include "runtime/mlp/mlp_backend.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace tandem::mlp {

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaMlpBackend(const ModelConfig& config,
                                                                 const TensorStore& store,
                                                                 MlpShape shape,
                                                                 int device_ordinal);
// Over weights already on the GPU (shared with a shard's sessions, ipc_shard_session.h).
absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaMlpBackend(std::shared_ptr<CudaDenseMlp> mlp);

}  // namespace tandem::mlp

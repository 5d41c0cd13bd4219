#pragma once
// CudaDenseMlp: the MLP weights of a range of layers in bf16 on one GPU and the forward pass over
// rows in that GPU's memory, as the CUDA runner computes its own MLP (cublas_gemm.h and the
// SiLU-and-multiply kernel): gate/up projection with float32 accumulation rounded to bf16 (at
// decode sizes the fused gated kernel), silu(gate) * up rounded to bf16, down projection rounded
// to bf16. It is the compute of the `cuda` MLP backend (cuda_mlp_backend.h) and of a GPU
// `tandem mlp-shard`.
//
// Forward only queues work on the stream it is given (its workspace grows, waiting for the last
// call's work, when a call brings more rows than any before). Calls on different streams share
// one workspace: each call's work is ordered after the last call's (an event recorded at the end
// of every call), so callers need no ordering of their own, and no caller's stream is kept (a
// stream may be destroyed once its call's work is done).
//
// Errors: Create fails for missing or misshapen tensors (naming them), a shape that does not fit
// the config (InvalidArgument), no such GPU (NotFound), short GPU memory (ResourceExhausted);
// nothing stays allocated. Forward: InvalidArgument for a layer outside the range or rows < 1,
// cuBLAS / CUDA errors as statuses naming the op.
//
// Thread-safety: Forward is thread-safe (calls are serialized; each binds its thread to the
// GPU). No CUDA types
// here (streams are cudaStream_t passed as void*).

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/mlp/mlp_backend.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace tandem::mlp {

class CudaDenseMlp {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDenseMlp>> Create(const ModelConfig& config,
                                                              const TensorStore& store,
                                                              MlpShape shape, int device_ordinal);
  ~CudaDenseMlp();
  CudaDenseMlp(const CudaDenseMlp&) = delete;
  CudaDenseMlp& operator=(const CudaDenseMlp&) = delete;

  const MlpShape& shape() const { return shape_; }
  int device() const { return device_; }
  size_t weight_bytes() const { return weight_bytes_; }

  // Queues y = MLP(layer, x) for `rows` bf16 rows of hidden_size on `stream`.
  absl::Status Forward(int layer, const void* x, int rows, void* y, void* stream);

 private:
  CudaDenseMlp(MlpShape shape, int device);
  absl::Status Init(const TensorStore& store);
  absl::Status Reserve(int rows);

  struct Impl;
  absl::Mutex mu_;  // serializes Forward
  const MlpShape shape_;
  const int device_;
  size_t weight_bytes_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::mlp

#pragma once
// The CUDA ModelRunner: bf16 weights and a bf16 paged KV cache in GPU memory, cuBLASLt GEMMs
// (f32 accumulation) and the kernels of runtime/kernels/cuda/, one stream, CUDA graphs for
// decode-only batches. No CUDA types in this header (tandem_cuda_runner keeps cudart private).
//
// Forward, per step: the batch is planned on the host (cuda/step_plan.h: row order, graph
// padding, metadata), the metadata goes to the GPU in one copy through a pinned staging buffer,
// then embedding -> per layer [fused residual RMSNorm -> QKV GEMM (+bias in the epilogue for
// Qwen2) -> RoPE + KV append (one kernel; in the QKV GEMM's epilogue where the single-row GEMV or
// the skinny GEMM takes it) -> decode attention (one-token chunks) and/or prefill attention
// (longer chunks) -> O GEMM -> fused residual RMSNorm -> gate/up GEMM -> SiLU-mul (one kernel
// with the gate/up product where the GEMV or the skinny GEMM takes it) -> down GEMM] ->
// final norm -> gather of the rows that need logits -> LM head (f32) -> logits copied to the host,
// or, when every logits row carries a SampleRequest (model_runner.h; SupportsDeviceSampling() for
// vocabularies up to cuda::kSamplingMaxVocab), the GPU sampler (sampling_kernels.h) on the logits
// and only the tokens and logprobs copied back. The request parameters go through a pinned buffer
// into a device buffer of fixed address, so graphs (keyed also by "samples or not") replay them.
// A decode-only batch of at most 256 rows is padded to a bucket; its device work is captured once
// per (bucket, block-table width) into a CUDA graph (after one eager run) and replayed afterwards.
//
// Memory: weights (q/k/v and gate/up fused into one matrix each), KV cache ([num_layers, 2 (K, V),
// num_blocks, block_size, num_kv_heads, head_dim] bf16, elem_bytes 2, zero-filled, ONE
// allocation: kv_layout()), activation workspaces sized for options.max_batch_tokens rows, the
// cuBLASLt workspace and the metadata buffers are allocated at creation. A batch larger than the
// workspaces grows them once (synchronizing, dropping the captured graphs); otherwise the step
// path allocates nothing on the device.
//
// Validation and failure: Forward rejects the same batches as the CPU runner (InvalidArgument, KV
// and `out` untouched). A CUDA or cuBLAS error is returned as a status naming the op; the KV of
// the batch's positions is then unspecified and, for sticky CUDA errors, the runner unusable.
//
// MLP offload (options.mlp, docs/mlp.md): with a backend the runner uploads no MLP weights (their
// bf16 bytes, less what the backend keeps on this GPU, go to the KV cache when num_blocks is
// derived from kv_cache_bytes). Each layer's post-attention normed rows go to the backend, one
// call per layer on the runner's thread: queued on the runner's stream when the backend has a
// device path on this GPU (MlpBackend::SupportsDevice), else through pinned host memory (bf16 ->
// f32 -> MLP -> bf16 into the sublayer output, waiting for the stream). Such steps run eagerly
// (no CUDA graphs). Ping-pong: a decode-only step of at least 2 rows, with a backend that has
// device slots (SubmitOnDevice/JoinOnDevice) and takes its rows, runs as mlp_micro_batches
// micro-batches of nearly equal rows, alternated per layer so that one's attention is queued
// while another's MLP computes (on the backend's streams or in its process); other steps run as
// one. A backend error fails the step with a status naming the layer and backend (the KV of the
// layers already run is written); every call submitted is joined first.
//
// Thread-safety: as ModelRunner, one thread at a time; the runner may be created on one thread and
// used on another (every call binds the thread to the runner's GPU).

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/mlp/mlp_backend.h"
#include "runtime/model/cuda/cuda_tuning.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_runner.h"
#include "runtime/model/safetensors.h"

namespace tandem {

struct CudaRunnerOptions {
  int device_ordinal = 0;
  int block_size = 16;
  int num_blocks = 0;  // 0: derive from kv_cache_bytes
  size_t kv_cache_bytes = size_t{256} << 20;
  int max_batch_tokens = 2048;  // rows the workspaces are sized for at creation
  bool cuda_graphs = true;
  bool progress = false;  // a weight-loading progress bar on stderr (models over 256 MiB)
  // Null: the MLP runs here (local). Otherwise on this backend, which must serve every layer of
  // the model's shape (InvalidArgument otherwise); see "MLP offload" above.
  std::shared_ptr<mlp::MlpBackend> mlp;
  // Ping-pong with an offloaded MLP (see "MLP offload"): the micro-batches a decode-only step
  // runs in when the backend has device slots; 1 turns it off, 0 chooses per batch size from
  // measured step times (mlp/micro_batch_chooser.h).
  int mlp_micro_batches = 0;
  // The kernel plan (cuda_tuning.h: decode attention splits, GEMM routing), fixed for the runner's
  // life. Speed only: results stay within float32 summation order of the defaults.
  CudaTuning tuning;
};

// What the last Forward did, for benchmarks and tests.
struct CudaStepStats {
  double host_us = 0;    // host time from entry to the last launch queued (before the logits wait)
  int rows = 0;          // device rows, padding included
  int graph_bucket = 0;  // 0: eager
  bool graph_replayed = false;  // a captured graph ran (false on the eager run before capture)
  int micro_batches = 1;        // ping-pong micro-batches of the eager step (MLP offload)
};

// One op of an instrumented step: total GPU time over its calls (one per layer for most ops).
struct OpTiming {
  std::string name;
  double ms = 0;
  int calls = 0;
};

class CudaModelRunner : public ModelRunner {
 public:
  virtual CudaStepStats last_step_stats() const = 0;
  // Bytes of weights on the GPU (every tensor, bf16).
  virtual size_t weight_bytes() const = 0;
  // Benchmark hook: plans and uploads `batch` once, runs its device work `warmup` then `iters`
  // times (graph replays when the batch is graphed, capturing first if needed) and returns the
  // mean GPU milliseconds per step between CUDA events. Logits stay on the device. The batch's KV
  // positions are rewritten each time (same values).
  virtual absl::StatusOr<double> TimeDeviceStep(const ForwardBatch& batch, int warmup,
                                                int iters) = 0;
  // Benchmark hook: one eager step with a CUDA event after every op; per-op GPU time, in the order
  // the ops first ran.
  virtual absl::StatusOr<std::vector<OpTiming>> ProfileStep(const ForwardBatch& batch) = 0;
};

// Loads the weights of `store` (bf16; f16/f32 converted on the host) to GPU `device_ordinal` and
// allocates the KV cache and workspaces. InvalidArgument for an inconsistent config, a head_dim
// the attention kernels do not support (32, 64, 128), missing or misshapen tensors (named), or
// options that leave no KV block or a tuning field out of range (named by its cuda_tuning.h key);
// ResourceExhausted when GPU memory is short; Unavailable / NotFound when there is no such GPU.
// Nothing stays allocated on failure.
absl::StatusOr<std::unique_ptr<CudaModelRunner>> CreateCudaModelRunner(
    const ModelConfig& config, const TensorStore& store, const CudaRunnerOptions& options);

}  // namespace tandem

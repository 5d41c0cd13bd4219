#pragma once
// Creates a ModelRunner by device name. This is the one file that knows which runners exist: the
// CPU reference runner (cpu_model_runner.h) and, in builds with -DTANDEM_CUDA=ON, the CUDA runner
// (cuda/cuda_model_runner.h).
//
// Devices: "cpu", "cuda" (= "cuda:0"), "cuda:N". Errors, never crashes: InvalidArgument for a
// malformed or unknown name; FailedPrecondition for a CUDA device in a build without CUDA;
// Unavailable when no usable GPU or driver is present; NotFound for an ordinal past the GPUs
// present; plus the runners' own errors (bad config or weights, memory).
// Thread-safe; the runner is owned by the caller and obeys model_runner.h's threading contract.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/mlp/mlp_backend.h"
#include "runtime/model/cuda/cuda_tuning.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_runner.h"
#include "runtime/model/safetensors.h"

namespace tandem {

struct RunnerOptions {
  int block_size = 16;
  int num_blocks = 0;  // 0: as many as fit in kv_cache_bytes
  size_t kv_cache_bytes = size_t{256} << 20;
  // CUDA only: rows the activation workspaces are sized for at creation (they grow if needed),
  // CUDA graphs for decode-only batches, a weight-loading progress bar on stderr.
  int max_batch_tokens = 2048;
  bool cuda_graphs = true;
  bool progress = false;
  CudaTuning cuda_tuning;  // CUDA only: the kernel plan (cuda/cuda_tuning.h, --cuda-tuning)
  // Null: the runner computes the MLP (local). Otherwise the MLP runs on this backend
  // (runtime/mlp/registry.h) and the runner loads no MLP weights: the CPU runner adds the bytes
  // they would have taken, less what the backend keeps in this process, to its KV cache; the CUDA
  // runner adds their bf16 bytes on the GPU (cuda_model_runner.h, "MLP offload").
  std::shared_ptr<mlp::MlpBackend> mlp;
  int mlp_micro_batches = 0;  // ping-pong: {Cpu,Cuda}RunnerOptions::mlp_micro_batches (0: measured)
};

// Host bytes of a model's MLP weights in the CPU runner's float32: what an offloaded MLP gives
// back to the KV cache.
size_t CpuMlpWeightBytes(const ModelConfig& config);

struct RunnerDevice {
  bool cuda = false;
  int ordinal = 0;
};

// Parses "cpu" | "cuda" | "cuda:N" (InvalidArgument otherwise); says nothing about availability.
absl::StatusOr<RunnerDevice> ParseRunnerDevice(std::string_view device);

// Whether this build contains the CUDA runner.
bool CudaRunnerCompiledIn();

// From an opened checkpoint. The CPU runner converts the weights to float32 copies and the CUDA
// runner to bf16 GPU copies, so `store` may be closed afterwards.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(std::string_view device,
                                                               const ModelConfig& config,
                                                               const TensorStore& store,
                                                               const RunnerOptions& options);

// From a Hugging Face model directory (config.json and safetensors; the tokenizer is not read).
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(std::string_view device,
                                                               const std::string& model_dir,
                                                               const RunnerOptions& options);

}  // namespace tandem

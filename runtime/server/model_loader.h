#pragma once
// Loads a Hugging Face model directory into a running Engine for a worker: config.json, the
// safetensors weights, the runner of `device` (runner_factory.h: the CPU runner's float32 copies
// by default; "cuda[:N]" puts bf16 weights and the KV cache in GPU memory) with its KV cache,
// and the tokenizer (optional: without tokenizer.json the worker streams token ids and no text).
//
// Ownership: LoadedModel owns the tokenizer and the engine; the engine is declared after the
// tokenizer so it is destroyed first (it points at the tokenizer). A failure leaves nothing
// running.

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/auth/service_identity.h"
#include "runtime/engine/engine.h"
#include "runtime/mlp/remote_mlp_options.h"
#include "runtime/model/cuda/cuda_tuning.h"
#include "runtime/model/tokenizer.h"

namespace tandem::server {

struct ModelLoadOptions {
  std::string model_dir;
  std::string device = "cpu";  // "cpu", "cuda", "cuda:N"
  int block_size = 16;
  int num_blocks = 0;  // 0: as many as fit in kv_cache_bytes
  size_t kv_cache_bytes = size_t{256} << 20;
  CudaTuning cuda_tuning;  // the CUDA runner's kernel plan (--cuda-tuning); unused on the CPU
  EngineOptions engine;
  // Where the MLP runs (runtime/mlp/registry.h): "local", "cpu" or "remote:ADDR,...", with
  // mlp_fallback "cpu" keeping the weights here for when no shard answers. A remote backend
  // dials with mlp_identity (the deployment's service credential). With the MLP elsewhere the
  // CPU runner gives the weights' bytes to the KV cache (logged with the capacity in tokens).
  std::string mlp = "local";
  std::string mlp_fallback = "none";
  std::shared_ptr<const auth::ServiceIdentity> mlp_identity;
  mlp::RemoteMlpOptions mlp_remote;
  int mlp_micro_batches = 0;  // ping-pong with an offloaded MLP (RunnerOptions; 0: measured)
};

struct LoadedModel {
  std::string name;  // the model directory's base name (what clients call the model)
  std::unique_ptr<Tokenizer> tokenizer;  // may be null
  std::unique_ptr<Engine> engine;
};

// InvalidArgument / NotFound for a bad or missing directory, config or weights (the message names
// the file); ResourceExhausted when the KV cache cannot be allocated.
absl::StatusOr<LoadedModel> LoadModel(const ModelLoadOptions& options);

}  // namespace tandem::server

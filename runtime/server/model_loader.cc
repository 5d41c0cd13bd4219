#include "runtime/server/model_loader.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/mlp/registry.h"
#include "runtime/model/model_fingerprint.h"
#include "runtime/model/runner_factory.h"
#include "runtime/model/safetensors.h"

namespace tandem::server {

absl::StatusOr<LoadedModel> LoadModel(const ModelLoadOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_directory(options.model_dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("model directory '", options.model_dir, "' does not exist"));
  }
  LoadedModel model;
  std::filesystem::path dir = std::filesystem::path(options.model_dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "models/tiny/"
  model.name = dir.filename().string();
  if (auto tokenizer = Tokenizer::FromModelDir(options.model_dir); tokenizer.ok()) {
    model.tokenizer = std::move(*tokenizer);
  } else {
    LOG(WARNING) << "no usable tokenizer in " << options.model_dir << " ("
                 << tokenizer.status().message() << "); streaming token ids without text";
  }
  RunnerOptions runner_options;
  runner_options.block_size = options.block_size;
  runner_options.num_blocks = options.num_blocks;
  runner_options.kv_cache_bytes = options.kv_cache_bytes;
  runner_options.cuda_tuning = options.cuda_tuning;
  std::unique_ptr<ModelRunner> runner;
  if (options.mlp.empty() || options.mlp == "local") {
    ASSIGN_OR_RETURN(runner, CreateModelRunner(options.device, options.model_dir, runner_options));
  } else {
    ASSIGN_OR_RETURN(RunnerDevice device, ParseRunnerDevice(options.device));
    if (device.cuda && !CudaRunnerCompiledIn()) {
      return CreateModelRunner(options.device, options.model_dir, runner_options).status();
    }
    ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
    ASSIGN_OR_RETURN(std::unique_ptr<TensorStore> store, TensorStore::Open(options.model_dir));
    config.fingerprint = ModelFingerprint(*store);
    mlp::MlpContext context;
    context.config = &config;
    context.store = store.get();
    context.model_fingerprint = config.fingerprint;
    context.identity = options.mlp_identity;
    context.fallback = options.mlp_fallback;
    context.remote = options.mlp_remote;
    context.device_ordinal = device.ordinal;
    ASSIGN_OR_RETURN(std::unique_ptr<mlp::MlpBackend> backend,
                     mlp::CreateMlpBackend(options.mlp, context));
    runner_options.mlp = std::move(backend);
    runner_options.mlp_micro_batches = options.mlp_micro_batches;
    ASSIGN_OR_RETURN(runner, CreateModelRunner(options.device, config, *store, runner_options));
    // What the worker's device does not hold: bf16 GPU bytes on CUDA, float32 host bytes less
    // what the backend keeps here on the CPU.
    const int64_t moved = device.cuda ? static_cast<int64_t>(CpuMlpWeightBytes(config) / 2)
                                      : static_cast<int64_t>(CpuMlpWeightBytes(config)) -
                                            runner_options.mlp->resident_weight_bytes();
    LOG(INFO) << "MLP on the " << runner_options.mlp->name() << " backend ("
              << (moved > 0 ? absl::StrCat(moved >> 20,
                                           " MiB of MLP weights not held here, "
                                           "given to the KV cache")
                            : std::string("its weights held here"))
              << "): KV cache of " << runner->num_blocks() << " blocks, "
              << static_cast<int64_t>(runner->num_blocks()) * runner->block_size() << " tokens";
  }
  ASSIGN_OR_RETURN(model.engine,
                   Engine::Create(std::move(runner), model.tokenizer.get(), options.engine));
  return model;
}

}  // namespace tandem::server

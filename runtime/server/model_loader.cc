#include "runtime/server/model_loader.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/model/cpu_model_runner.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weights.h"

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
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<TensorStore> store, TensorStore::Open(options.model_dir));
  ASSIGN_OR_RETURN(ModelWeights weights, LoadCpuWeights(config, *store));
  store.reset();  // the weights are converted copies; release the mmaps
  CpuRunnerOptions runner_options;
  runner_options.block_size = options.block_size;
  runner_options.num_blocks = options.num_blocks;
  runner_options.kv_cache_bytes = options.kv_cache_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                   CreateCpuModelRunner(config, std::move(weights), runner_options));
  ASSIGN_OR_RETURN(model.engine,
                   Engine::Create(std::move(runner), model.tokenizer.get(), options.engine));
  return model;
}

}  // namespace tandem::server

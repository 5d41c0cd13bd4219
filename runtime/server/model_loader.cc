#include "runtime/server/model_loader.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/model/runner_factory.h"

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
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                   CreateModelRunner(options.device, options.model_dir, runner_options));
  ASSIGN_OR_RETURN(model.engine,
                   Engine::Create(std::move(runner), model.tokenizer.get(), options.engine));
  return model;
}

}  // namespace tandem::server

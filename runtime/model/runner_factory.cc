#include "runtime/model/runner_factory.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/model/cpu_model_runner.h"
#include "runtime/model/model_fingerprint.h"
#include "runtime/model/weights.h"

#if TANDEM_HAVE_CUDA
#include "runtime/model/cuda/cuda_model_runner.h"
#endif

namespace tandem {
namespace {

[[maybe_unused]] absl::Status NoCudaRunner(int ordinal) {
  return absl::FailedPreconditionError(
      absl::StrCat("device \"cuda:", ordinal,
                   "\" requested, but this build of Tandem has no CUDA runner (configure with "
                   "-DTANDEM_CUDA=ON and a CUDA toolkit)"));
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCuda(int ordinal, const ModelConfig& config,
                                                        const TensorStore& store,
                                                        const RunnerOptions& options) {
#if TANDEM_HAVE_CUDA
  CudaRunnerOptions o;
  o.device_ordinal = ordinal;
  o.block_size = options.block_size;
  o.num_blocks = options.num_blocks;
  o.kv_cache_bytes = options.kv_cache_bytes;
  o.max_batch_tokens = options.max_batch_tokens;
  o.cuda_graphs = options.cuda_graphs;
  o.progress = options.progress;
  o.mlp = options.mlp;  // its bf16 weight bytes go to the KV cache (the runner adds them)
  o.mlp_micro_batches = options.mlp_micro_batches;
  o.tuning = options.cuda_tuning;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaModelRunner> runner,
                   CreateCudaModelRunner(config, store, o));
  return std::unique_ptr<ModelRunner>(std::move(runner));
#else
  return NoCudaRunner(ordinal);
#endif
}

}  // namespace

bool CudaRunnerCompiledIn() { return TANDEM_HAVE_CUDA; }

absl::StatusOr<RunnerDevice> ParseRunnerDevice(std::string_view device) {
  if (device == "cpu") return RunnerDevice{false, 0};
  if (device == "cuda") return RunnerDevice{true, 0};
  constexpr std::string_view kPrefix = "cuda:";
  if (device.substr(0, kPrefix.size()) == kPrefix) {
    const std::string_view digits = device.substr(kPrefix.size());
    int ordinal = -1;
    if (!digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos &&
        absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()), &ordinal)) {
      return RunnerDevice{true, ordinal};
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device \"", std::string(device), "\": expected cpu, cuda or cuda:N"));
}

size_t CpuMlpWeightBytes(const ModelConfig& config) {
  return sizeof(float) * 3 * static_cast<size_t>(config.num_layers) *
         static_cast<size_t>(config.hidden_size) * static_cast<size_t>(config.intermediate_size);
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(std::string_view device,
                                                               const ModelConfig& config,
                                                               const TensorStore& store,
                                                               const RunnerOptions& options) {
  ASSIGN_OR_RETURN(RunnerDevice d, ParseRunnerDevice(device));
  if (d.cuda) return CreateCuda(d.ordinal, config, store, options);
  ASSIGN_OR_RETURN(ModelWeights weights,
                   LoadCpuWeights(config, store, {.skip_mlp = options.mlp != nullptr}));
  CpuRunnerOptions o;
  o.block_size = options.block_size;
  o.num_blocks = options.num_blocks;
  o.kv_cache_bytes = options.kv_cache_bytes;
  if (options.mlp != nullptr) {
    const int64_t freed =
        static_cast<int64_t>(CpuMlpWeightBytes(config)) - options.mlp->resident_weight_bytes();
    if (freed > 0) o.kv_cache_bytes += static_cast<size_t>(freed);
  }
  o.mlp = options.mlp;
  o.mlp_micro_batches = options.mlp_micro_batches;
  return CreateCpuModelRunner(config, std::move(weights), o);
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(std::string_view device,
                                                               const std::string& model_dir,
                                                               const RunnerOptions& options) {
  ASSIGN_OR_RETURN(RunnerDevice d, ParseRunnerDevice(device));
  if (d.cuda && !CudaRunnerCompiledIn()) return NoCudaRunner(d.ordinal);
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<TensorStore> store, TensorStore::Open(model_dir));
  config.fingerprint = ModelFingerprint(*store);
  return CreateModelRunner(device, config, *store, options);
}

}  // namespace tandem

#include "runtime/mlp/registry.h"

#include <functional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/mlp/cpu_mlp_backend.h"
#include "runtime/mlp/dense_mlp.h"
#include "runtime/mlp/remote_mlp_backend.h"

#if TANDEM_HAVE_CUDA
#include "runtime/mlp/cuda/cuda_ipc_mlp_backend.h"
#include "runtime/mlp/cuda/cuda_mlp_backend.h"
#include "runtime/mlp/cuda/ipc_shard_session.h"
#endif

namespace tandem::mlp {
namespace {

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCpu(const MlpContext& context) {
  if (context.store == nullptr) {
    return absl::InvalidArgumentError("cpu MLP: needs the model's weights");
  }
  absl::StatusOr<MlpShape> shape = ParseLayerRange("all", *context.config);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<DenseMlpWeights> weights =
      LoadDenseMlpWeights(*context.config, *context.store, *shape);
  if (!weights.ok()) return weights.status();
  return std::unique_ptr<MlpBackend>(std::make_unique<CpuMlpBackend>(
      std::make_shared<const DenseMlpWeights>(*std::move(weights))));
}

// The GPU of "cuda" or "cuda:N".
absl::StatusOr<int> CudaOrdinal(const std::string& spec) {
  int ordinal = 0;
  if (spec != "cuda" && (spec.size() <= 5 || spec.rfind("cuda:", 0) != 0 ||
                         spec.find_first_not_of("0123456789", 5) != std::string::npos ||
                         !absl::SimpleAtoi(spec.substr(5), &ordinal))) {
    return absl::InvalidArgumentError(absl::StrCat(spec, ": expected cuda or cuda:N"));
  }
#if TANDEM_HAVE_CUDA
  return ordinal;
#else
  return absl::FailedPreconditionError(
      absl::StrCat(spec, ": this build of Tandem has no CUDA (configure with -DTANDEM_CUDA=ON)"));
#endif
}

// "cuda" or "cuda:N": `shape`'s layers on that GPU of this host.
absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCuda(const std::string& spec,
                                                       const MlpShape& shape,
                                                       const ModelConfig& config,
                                                       const TensorStore& store) {
  absl::StatusOr<int> ordinal = CudaOrdinal(spec);
  if (!ordinal.ok()) return ordinal.status();
#if TANDEM_HAVE_CUDA
  return CreateCudaMlpBackend(config, store, shape, *ordinal);
#else
  return absl::InternalError("unreachable");
#endif
}

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaIpc(const std::string& addresses,
                                                          const MlpContext& context) {
  std::vector<std::string> list = absl::StrSplit(addresses, ',');
  for (const std::string& a : list) {
    if (a.empty() || a.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mlp cuda_ipc:", addresses, ": expected HOST:PORT[,HOST:PORT...]"));
    }
  }
  if (context.identity == nullptr) {
    return absl::InvalidArgumentError("cuda_ipc MLP: needs the deployment's service credential");
  }
  if (context.fallback != "none") {
    return absl::InvalidArgumentError("--mlp cuda_ipc takes no --mlp-fallback");
  }
#if TANDEM_HAVE_CUDA
  absl::StatusOr<MlpShape> shape = ParseLayerRange("all", *context.config);
  if (!shape.ok()) return shape.status();
  return CreateCudaIpcMlpBackend(list, context.identity, *shape, context.model_fingerprint,
                                 context.device_ordinal, context.ipc_max_rows, context.remote);
#else
  return absl::FailedPreconditionError(
      "--mlp cuda_ipc: this build of Tandem has no CUDA (configure with -DTANDEM_CUDA=ON)");
#endif
}

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateRemote(const std::string& addresses,
                                                         const MlpContext& context) {
  std::vector<std::string> list = absl::StrSplit(addresses, ',');
  for (const std::string& a : list) {
    if (a.empty() || a.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mlp remote:", addresses, ": expected HOST:PORT or dns:NAME:PORT, comma-separated"));
    }
  }
  if (context.identity == nullptr) {
    return absl::InvalidArgumentError("remote MLP: needs the deployment's service credential");
  }
  std::unique_ptr<MlpBackend> fallback;
  if (context.fallback == "cpu") {
    absl::StatusOr<std::unique_ptr<MlpBackend>> cpu = CreateCpu(context);
    if (!cpu.ok()) return cpu.status();
    fallback = *std::move(cpu);
  } else if (context.fallback != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("--mlp-fallback ", context.fallback, ": expected none or cpu"));
  }
  absl::StatusOr<MlpShape> shape = ParseLayerRange("all", *context.config);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<std::unique_ptr<RemoteMlpBackend>> remote =
      RemoteMlpBackend::Create(list, context.identity, *shape, context.model_fingerprint,
                               std::move(fallback), context.remote);
  if (!remote.ok()) return remote.status();
  return std::unique_ptr<MlpBackend>(*std::move(remote));
}

}  // namespace

std::vector<std::string> MlpBackendNames() {
  return {"local", "cpu", "cuda[:N]", "remote:ADDR[,ADDR...] (ADDR: HOST:PORT or dns:NAME:PORT)",
          "cuda_ipc:ADDR[,ADDR...]"};
}

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateMlpBackend(const std::string& spec,
                                                             const MlpContext& context) {
  if (context.config == nullptr) return absl::InvalidArgumentError("MLP backend: no model");
  if (spec == "local" || spec.empty()) return std::unique_ptr<MlpBackend>();
  if (spec == "cpu") return CreateCpu(context);
  if (spec.rfind("cuda_ipc:", 0) == 0) return CreateCudaIpc(spec.substr(9), context);
  if (spec.rfind("cuda", 0) == 0) {
    if (context.store == nullptr) {
      return absl::InvalidArgumentError("cuda MLP: needs the model's weights");
    }
    absl::StatusOr<MlpShape> shape = ParseLayerRange("all", *context.config);
    if (!shape.ok()) return shape.status();
    return CreateCuda(spec, *shape, *context.config, *context.store);
  }
  if (spec.rfind("remote:", 0) == 0) return CreateRemote(spec.substr(7), context);
  return absl::InvalidArgumentError(absl::StrCat("--mlp ", spec, ": unknown MLP backend; one of ",
                                                 absl::StrJoin(MlpBackendNames(), ", ")));
}

absl::StatusOr<ShardCompute> CreateShardCompute(const std::string& device, const MlpShape& shape,
                                                const ModelConfig& config, const TensorStore& store,
                                                const ShardComputeOptions& options) {
  if (device == "cpu") {
    absl::StatusOr<DenseMlpWeights> weights = LoadDenseMlpWeights(config, store, shape);
    if (!weights.ok()) return weights.status();
    ShardCompute compute;
    compute.backend = std::make_unique<CpuMlpBackend>(
        std::make_shared<const DenseMlpWeights>(*std::move(weights)));
    return compute;
  }
  if (device.rfind("cuda", 0) == 0) {
    absl::StatusOr<int> ordinal = CudaOrdinal(device);
    if (!ordinal.ok()) return ordinal.status();
#if TANDEM_HAVE_CUDA
    return CreateGpuShardCompute(config, store, shape, *ordinal, options);
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device \"", device, "\": expected cpu, cuda or cuda:N"));
}

}  // namespace tandem::mlp

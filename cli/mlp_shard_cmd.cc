// `tandem mlp-shard`: a dense model's MLP for a range of its layers, served to attention workers
// started with `--mlp remote:ADDR,...` (tandem.v1.MlpShard, runtime/mlp/mlp_shard_service.h,
// docs/mlp.md).
//   tandem mlp-shard --model DIR --port P [--host H] [--layers FIRST:END|all] [--max-rows N]
//       [--device cpu|cuda|cuda:N] [--ipc-batch-window-us US] [--ipc-input-timeout-ms MS]
//       [--data-planes auto|none|cma,ucx]
//       (--service-token-file F | --tls-ca CA --tls-cert C --tls-key K | --insecure-services)
// It loads only the MLP weights of those layers: host float32 computed by the CPU, or bf16 on
// the GPU with --device cuda (runtime/mlp/cuda/ipc_shard_session.h), which also serves the GPU
// data plane to attention workers on that GPU (`--mlp cuda_ipc:ADDR`; Compute calls still carry
// float32 rows in the gRPC message); the sessions' calls of one layer run as one GEMM
// (runtime/mlp/cuda/ipc_layer_batcher.h). Workers whose activations are in host memory may
// attach through the host data plane (`--mlp-data-plane cma|ucx`, MlpShard.AttachHost,
// runtime/mlp/host_plane/shard_host_plane.h) over the backends --data-planes allows (auto: every
// one this build has; each created when a worker first asks for it). Prints
// "tandem mlp-shard: serving on HOST:PORT" once it serves; SIGINT/SIGTERM stop it (queued calls
// are answered UNAVAILABLE: workers fail over to another shard or their fallback). Exit status:
// 0 ok, 1 runtime error, 2 usage error.
#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/access_flags.h"
#include "cli/commands.h"
#include "kvtransfer/transfer_backend.h"
#include "runtime/mlp/dense_mlp.h"
#include "runtime/mlp/mlp_shard_service.h"
#include "runtime/mlp/registry.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_fingerprint.h"
#include "runtime/model/safetensors.h"
#include "runtime/server/grpc_server.h"
#include "runtime/server/worker_main.h"

namespace tandem::cli {
namespace {

struct MlpShardFlags {
  std::string model_dir;
  std::string layers = "all";
  std::string host = "127.0.0.1";
  int port = 0;
  int max_rows = 8192;
  int ipc_batch_window_us = 2000;
  int ipc_input_timeout_ms = 2000;
  std::string device = "cpu";
  std::string data_planes = "auto";
  ServiceAuthFlags service_auth;
  std::string log_format = "text";
};

int RunMlpShard(const MlpShardFlags& flags) {
  const std::string prefix = "tandem mlp-shard: ";
  server::BlockTerminationSignals();
  ApplyLogFormat(flags.log_format);
  auto identity = MakeServiceIdentity(flags.service_auth);
  if (!identity.ok()) {
    std::cerr << prefix << identity.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<ModelConfig> config = LoadModelConfig(flags.model_dir);
  if (!config.ok()) {
    std::cerr << prefix << "--model: " << config.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<mlp::MlpShape> shape = mlp::ParseLayerRange(flags.layers, *config);
  if (!shape.ok()) {
    std::cerr << prefix << "--layers: " << shape.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(flags.model_dir);
  if (!store.ok()) {
    std::cerr << prefix << store.status().message() << "\n";
    return 1;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<mlp::ShardCompute> compute = mlp::CreateShardCompute(
      flags.device, *shape, *config, **store,
      {.ipc_batch_window = absl::Microseconds(flags.ipc_batch_window_us),
       .ipc_input_timeout = absl::Milliseconds(flags.ipc_input_timeout_ms)});
  if (!compute.ok()) {
    std::cerr << prefix << "--device " << flags.device << ": " << compute.status().message()
              << "\n";
    return compute.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  mlp::MlpShardOptions options;
  if (flags.data_planes != "none") {
    mlp::ShardHostPlaneOptions plane;
    plane.backends.clear();
    if (flags.data_planes == "auto") {
      for (const char* name : {"cma", "ucx"}) {
        if (kvtransfer::TransferBackendBuilt(name)) plane.backends.emplace_back(name);
      }
    } else {
      plane.backends = absl::StrSplit(flags.data_planes, ',', absl::SkipEmpty());
    }
    plane.hidden_size = config->hidden_size;
    plane.max_rows = flags.max_rows;
    absl::StatusOr<std::shared_ptr<mlp::ShardHostPlane>> created =
        mlp::ShardHostPlane::Create(plane);
    if (!created.ok()) {
      std::cerr << prefix << "--data-planes " << flags.data_planes << ": "
                << created.status().message() << "\n";
      return 2;
    }
    options.host_plane = *std::move(created);
  }
  options.model_fingerprint = ModelFingerprint(**store);
  options.max_rows = flags.max_rows;
  options.attach = std::move(compute->attach);
  const std::function<std::string()> data_plane_stats = std::move(compute->data_plane_stats);
  store->reset();
  mlp::MlpShardService service(std::move(compute->backend), *identity, options);
  absl::StatusOr<server::GrpcServer> grpc = server::StartGrpcServer(
      flags.host, flags.port, {&service}, {"tandem.v1.MlpShard"}, *identity);
  if (!grpc.ok()) {
    std::cerr << prefix << grpc.status().message() << "\n";
    return 1;
  }
  std::cerr << prefix << "layers " << shape->first_layer << ":" << shape->end_layer << ", "
            << "MLP weights loaded on " << flags.device << " in "
            << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1)))
            << ", host data plane: "
            << (options.host_plane == nullptr ? std::string("none")
                                              : absl::StrJoin(options.host_plane->backends(), ","))
            << ", service authentication: " << (*identity)->mode() << "\n";
  std::cout << prefix << "serving on " << flags.host << ":" << grpc->port << std::endl;
  const int signal = server::WaitForTerminationSignal();
  std::cerr << prefix << "signal " << signal << ", stopping\n";
  service.Shutdown();
  grpc->Shutdown(absl::Seconds(1));
  const mlp::MlpShardStats s = service.stats();
  std::cerr << prefix << s.calls << " calls, " << s.batches << " layer batches, " << s.rows
            << " rows (largest batch " << s.max_batch_rows << "), "
            << absl::StrFormat("%.3f", s.compute_seconds) << " s computing, " << s.rejected
            << " rejected, " << s.expired << " expired, " << s.failed << " failed, "
            << s.plane_calls << " through the host data plane\n";
  if (data_plane_stats) std::cerr << prefix << data_plane_stats() << "\n";
  return 0;
}

}  // namespace

void AddMlpShardCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<MlpShardFlags>();
  CLI::App* cmd = app.add_subcommand(
      "mlp-shard", "Serve a model's MLP for a range of layers to attention workers (docs/mlp.md)");
  cmd->add_option("--model", flags->model_dir, "Model directory (config.json, safetensors)")
      ->required();
  cmd->add_option("--layers", flags->layers, "FIRST:END (layers FIRST..END-1) or all")
      ->capture_default_str();
  cmd->add_option("--host", flags->host, "Address to bind")->capture_default_str();
  cmd->add_option("--port", flags->port, "Port (0: a free one, printed)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--device", flags->device,
                  "Where the layers are computed: cpu (host float32) or cuda[:N] (bf16 on that "
                  "GPU)")
      ->capture_default_str();
  cmd->add_option("--max-rows", flags->max_rows, "Rows one call may carry")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--ipc-batch-window-us", flags->ipc_batch_window_us,
                  "With --device cuda: how long an attention worker's call of a layer may wait "
                  "for another worker's call of that layer, to run both as one GEMM")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--ipc-input-timeout-ms", flags->ipc_input_timeout_ms,
                  "With --device cuda: how long the shard's GPU stream waits for a worker's rows "
                  "of a call before it gives up on that call (a dead worker must not stop the "
                  "stream every session shares; the answer is then marked failed)")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  cmd->add_option("--data-planes", flags->data_planes,
                  "The host data plane's transfer backends workers may attach with "
                  "(--mlp-data-plane): auto (every one this build has), none, or a list of cma "
                  "(one host) and ucx")
      ->capture_default_str();
  AddServiceAuthFlags(cmd, &flags->service_auth);
  AddLogFormatFlag(cmd, &flags->log_format);
  cmd->callback([flags, exit_code] { *exit_code = RunMlpShard(*flags); });
}

}  // namespace tandem::cli

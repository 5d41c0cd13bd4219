// `tandem prefill` and `tandem decode`: one worker role each (Prefill or Decode + Worker gRPC
// services, grpc.health.v1), with the same flags:
//   tandem prefill|decode --model DIR --port P [--host H]
//       [--kv-transfer auto|cuda_ipc|nccl|cma|ucx|loopback]
//       [--device cpu|cuda|cuda:N] [--num-blocks N | --kv-cache-mib M] [--block-size 16]
//       [--cuda-tuning KEY=VALUE,...]
//       [--metrics-port Q] [--max-num-seqs N] [--max-num-batched-tokens N]
//       [--ucx-transports TLS] [--drain-seconds S]
//       [--speculative ngram|draft:DIR|remote:ADDR,... [--num-speculative-tokens K]]  (decode)
//       [--mlp local|cpu|remote:ADDR,... [--mlp-fallback none|cpu] [--mlp-call-timeout-ms T]
//        [--mlp-micro-batches N] [--mlp-data-plane grpc|cma|ucx [--mlp-plane-slot-rows R]]]
//       (--service-token-file F | --tls-ca CA --tls-cert C --tls-key K | --insecure-services)
// The service flags (cli/access_flags.h) are required: every call served is authenticated, and
// a decode worker presents the same identity to its prefill workers.
// --device cuda[:N]: weights and the KV cache (--kv-cache-mib of GPU memory) on that GPU. With
// --kv-transfer cuda_ipc the backend registers that cache itself and moves KV GPU to GPU; with a
// host-memory backend (cma, ucx) it uses a pinned host mirror of the same size that the engine
// copies a prompt's blocks through (runtime/server/transfer_memory.h). --cuda-tuning sets the CUDA
// runner's kernel plan (runtime/model/cuda/cuda_tuning.h, docs/tuning.md); a bad one is a usage
// error.
// Each prints one line "tandem ROLE: serving on HOST:PORT" to stdout once it serves (launchers
// wait for it); SIGINT/SIGTERM stop accepting, drain for --drain-seconds and exit 0.
// Exit status: 0 ok, 1 runtime error (model load, port, backend), 2 usage error (including a CUDA
// device in a build without CUDA or on a machine without a usable GPU).
#include <iostream>
#include <memory>
#include <string>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/access_flags.h"
#include "cli/commands.h"
#include "decode/decode_worker.h"
#include "prefill/prefill_worker.h"
#include "runtime/base/logging.h"
#include "runtime/model/cuda/cuda_tuning.h"
#include "runtime/model/model_config.h"
#include "runtime/model/runner_factory.h"
#include "runtime/server/model_loader.h"
#include "runtime/server/worker_main.h"
#include "speculative/registry.h"

namespace tandem::cli {
namespace {

struct WorkerFlags {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 0;
  std::string kv_transfer = "auto";
  std::string ucx_transports;
  std::string device = "cpu";
  int num_blocks = 0;
  int kv_cache_mib = 256;
  int block_size = 16;
  std::string cuda_tuning;  // "": the defaults
  int metrics_port = 0;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  int long_prefill_token_threshold = 0;
  double drain_seconds = 2.0;
  std::string kv_streaming = "on";                   // prefill workers only
  std::string kv_verify = "off";                     // decode workers only
  int64_t admission_window_tokens = 16384;           // prefill workers only
  std::string two_phase_admission = "on";            // decode workers only
  std::vector<std::string> allowed_prefill_workers;  // decode workers only
  std::string mlp = "local";                         // runtime/mlp/registry.h
  std::string mlp_fallback = "none";
  int mlp_call_timeout_ms = 2000;
  int mlp_micro_batches = 0;
  std::string mlp_data_plane = "grpc";
  int mlp_plane_slot_rows = 256;
  std::string speculative;         // decode workers only; "": off
  int num_speculative_tokens = 4;  // decode workers only
  ServiceAuthFlags service_auth;
  std::string log_format = "text";
  double stats_interval_s = 10;
};

// Loads the model, starts the role's worker (prefill::PrefillWorker or decode::DecodeWorker: the
// same Create/metrics/port/Shutdown shape) and serves until SIGINT/SIGTERM.
template <typename Worker, typename WorkerOptions>
int RunWorker(const char* role, const WorkerFlags& flags) {
  const std::string prefix = absl::StrCat("tandem ", role, ": ");
  server::BlockTerminationSignals();
  ApplyLogFormat(flags.log_format);
  auto identity = MakeServiceIdentity(flags.service_auth);
  if (!identity.ok()) {
    std::cerr << prefix << identity.status().message() << "\n";
    return 2;
  }
  if (absl::Status device = ParseRunnerDevice(flags.device).status(); !device.ok()) {
    std::cerr << prefix << "--device: " << device.message() << "\n";
    return 2;
  }
  if (flags.mlp_data_plane != "grpc" && !absl::StartsWith(flags.mlp, "remote:")) {
    std::cerr << prefix << "--mlp-data-plane " << flags.mlp_data_plane
              << ": needs --mlp remote:ADDR,... (the host data plane reaches MLP shards)\n";
    return 2;
  }
  absl::StatusOr<CudaTuning> cuda_tuning = ParseCudaTuning(flags.cuda_tuning);
  if (!cuda_tuning.ok()) {
    std::cerr << prefix << "--cuda-tuning: " << cuda_tuning.status().message() << "\n";
    return 2;
  }
  server::ModelLoadOptions load;
  load.model_dir = flags.model_dir;
  load.cuda_tuning = *cuda_tuning;
  load.device = flags.device;
  load.block_size = flags.block_size;
  load.num_blocks = flags.num_blocks;
  load.kv_cache_bytes = static_cast<size_t>(flags.kv_cache_mib) << 20;
  load.mlp = flags.mlp;
  load.mlp_fallback = flags.mlp_fallback;
  load.mlp_identity = *identity;
  load.mlp_remote.call_timeout = absl::Milliseconds(flags.mlp_call_timeout_ms);
  load.mlp_micro_batches = flags.mlp_micro_batches;
  load.mlp_remote.data_plane = flags.mlp_data_plane;
  load.mlp_remote.plane_slot_rows = flags.mlp_plane_slot_rows;
  load.engine.max_num_seqs = flags.max_num_seqs;
  load.engine.max_num_batched_tokens = flags.max_num_batched_tokens;
  load.engine.long_prefill_token_threshold = flags.long_prefill_token_threshold;
  const bool streaming = std::string(role) == "prefill" && flags.kv_streaming == "on";
  load.engine.kv_layer_progress = streaming;
  if (!flags.speculative.empty()) {
    absl::StatusOr<ModelConfig> target = LoadModelConfig(flags.model_dir);
    if (!target.ok()) {
      std::cerr << prefix << target.status().message() << "\n";
      return 1;
    }
    speculative::DrafterContext context;
    context.target_vocab_size = target->vocab_size;
    context.device = flags.device;
    context.block_size = flags.block_size;
    context.identity = *identity;
    absl::StatusOr<std::unique_ptr<speculative::Drafter>> drafter =
        speculative::CreateDrafter(flags.speculative, context);
    if (!drafter.ok()) {
      std::cerr << prefix << drafter.status().message() << "\n";
      return drafter.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    load.engine.drafter = *std::move(drafter);
    load.engine.num_speculative_tokens = flags.num_speculative_tokens;
  }
  auto model = server::LoadModel(load);
  if (!model.ok()) {
    std::cerr << prefix << model.status().message() << "\n";
    // No CUDA runner in this build, or no usable GPU: the command line asks for what is not here.
    const absl::StatusCode code = model.status().code();
    const bool no_device =
        flags.device != "cpu" &&
        (code == absl::StatusCode::kFailedPrecondition || code == absl::StatusCode::kUnavailable);
    return no_device ? 2 : 1;
  }
  const KvCacheLayout& kv = model->engine->kv_layout();
  auto backends = server::CreateWorkerBackends(flags.kv_transfer, role, flags.ucx_transports,
                                               kv.on_device, kv.device_ordinal, flags.host);
  if (!backends.ok()) {
    std::cerr << prefix << "--kv-transfer: " << backends.status().message() << "\n";
    return backends.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  WorkerOptions options;
  if constexpr (std::is_same_v<WorkerOptions, prefill::PrefillWorkerOptions>) {
    options.service.kv_streaming = streaming;
    options.service.admission.window_tokens = flags.admission_window_tokens;
  } else {
    options.service.verify_kv = flags.kv_verify == "on";
    options.service.two_phase_admission = flags.two_phase_admission == "on";
    options.service.allowed_prefill_workers.insert(flags.allowed_prefill_workers.begin(),
                                                   flags.allowed_prefill_workers.end());
  }
  options.host = flags.host;
  options.port = flags.port;
  options.model_name = model->name;
  options.identity = *identity;
  auto worker = Worker::Create(model->engine.get(), std::move(*backends), options);
  if (!worker.ok()) {
    std::cerr << prefix << worker.status().message() << "\n";
    return 1;
  }
  if (flags.metrics_port != 0) {
    const int port = flags.metrics_port < 0 ? 0 : flags.metrics_port;
    if (absl::Status s = (*worker)->metrics().Serve(flags.host, port); !s.ok()) {
      std::cerr << prefix << s.message() << "\n";
      return 1;
    }
    std::cerr << prefix << "metrics on http://" << flags.host << ":" << (*worker)->metrics().port()
              << "/metrics\n";
  }
  std::cerr << prefix << "service authentication: " << (*identity)->mode() << "\n";
  std::cout << prefix << "serving on " << flags.host << ":" << (*worker)->port() << std::endl;
  // A stats line every --stats-interval-s until a signal.
  int signal = 0;
  EngineStats previous = model->engine->stats();
  absl::Time previous_at = absl::Now();
  while (signal == 0) {
    if (flags.stats_interval_s <= 0) {
      signal = server::WaitForTerminationSignal();
      break;
    }
    signal = server::WaitForTerminationSignal(absl::Seconds(flags.stats_interval_s));
    if (signal != 0) break;
    const EngineStats now = model->engine->stats();
    const absl::Time now_at = absl::Now();
    LOG(INFO) << server::WorkerStatsLine(role, now, previous, now_at - previous_at);
    previous = now;
    previous_at = now_at;
  }
  std::cerr << prefix << "signal " << signal << ", draining\n";
  (*worker)->Shutdown(absl::Seconds(flags.drain_seconds));
  model->engine->Shutdown(absl::ZeroDuration());
  worker->reset();
  return 0;
}

// The flags both worker roles take.
CLI::App* AddWorkerCommand(CLI::App& app, const char* name, const char* description,
                           std::shared_ptr<WorkerFlags> flags) {
  CLI::App* cmd = app.add_subcommand(name, description);
  cmd->add_option("--model", flags->model_dir, "Hugging Face model directory")->required();
  cmd->add_option("--port", flags->port, "gRPC port (0: any free port)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--host", flags->host, "address to bind (default 127.0.0.1)");
  cmd->add_option(
         "--kv-transfer", flags->kv_transfer,
         "KV transfer backend: auto (default: cuda_ipc, nccl, cma, then ucx for a GPU cache; "
         "cma, then ucx otherwise; the pair handshake picks), cuda_ipc, nccl, cma (host memory "
         "on one host), ucx or loopback")
      ->check(CLI::IsMember({"auto", "ucx", "cma", "cuda_ipc", "nccl", "loopback"}));
  cmd->add_option("--device", flags->device,
                  "cpu (default), cuda or cuda:N: where the weights and the KV cache live");
  cmd->add_option("--ucx-transports", flags->ucx_transports,
                  "UCX transports, UCX_TLS syntax (default: UCX's choice)");
  CLI::Option* blocks = cmd->add_option("--num-blocks", flags->num_blocks, "KV cache blocks")
                            ->check(CLI::PositiveNumber);
  cmd->add_option("--kv-cache-mib", flags->kv_cache_mib, "KV cache size in MiB (default 256)")
      ->check(CLI::PositiveNumber)
      ->excludes(blocks);
  cmd->add_option("--block-size", flags->block_size, "tokens per KV block (default 16)")
      ->check(CLI::PositiveNumber);
  AddCudaTuningFlag(cmd, &flags->cuda_tuning);
  cmd->add_option("--metrics-port", flags->metrics_port,
                  "Prometheus /metrics port (0: none, -1: any free port, printed at start)")
      ->check(CLI::Range(-1, 65535));
  cmd->add_option("--max-num-seqs", flags->max_num_seqs, "sequences per batch (default 64)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-batched-tokens", flags->max_num_batched_tokens,
                  "tokens per step (default 512 for decode, 8192 for prefill: a prefill worker "
                  "runs no decode steps that long prompt chunks would delay)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--long-prefill-token-threshold", flags->long_prefill_token_threshold,
                  "fairness: while other prompts wait for a step, each prompt's chunk first gets "
                  "at most this many tokens, and the rest of the step's budget tops them up "
                  "(0: no cap, the default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--drain-seconds", flags->drain_seconds,
                  "on SIGINT/SIGTERM, time in-flight requests get (default 2)")
      ->check(CLI::NonNegativeNumber);
  AddServiceAuthFlags(cmd, &flags->service_auth);
  AddLogFormatFlag(cmd, &flags->log_format);
  cmd->add_option("--stats-interval-s", flags->stats_interval_s,
                  "log a stats line (batch, queue, KV use, token rates) this often; 0: never "
                  "(default 10)")
      ->check(CLI::NonNegativeNumber);
  return cmd;
}

}  // namespace

void AddPrefillCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<WorkerFlags>();
  flags->max_num_batched_tokens = 8192;
  CLI::App* cmd =
      AddWorkerCommand(app, "prefill", "Run a prefill worker (Prefill + Worker gRPC)", flags);
  cmd->add_option("--kv-streaming", flags->kv_streaming,
                  "on (default): over a device backend (cuda_ipc) each layer's KV is written as "
                  "soon as it is computed; off: after the whole prompt")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--admission-window-tokens", flags->admission_window_tokens,
                  "two-phase reservation: prompt tokens admitted at once (Prefill.Admit), so "
                  "decode workers reserve KV blocks only for prompts about to be prefilled "
                  "(default 16384; 0: admit everyone at once)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([flags, exit_code] {
    *exit_code =
        RunWorker<prefill::PrefillWorker, prefill::PrefillWorkerOptions>("prefill", *flags);
  });
}

void AddDecodeCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<WorkerFlags>();
  CLI::App* cmd =
      AddWorkerCommand(app, "decode", "Run a decode worker (Decode + Worker gRPC)", flags);
  cmd->add_option("--allowed-prefill-worker", flags->allowed_prefill_workers,
                  "host:port of a prefill worker this decode worker may dial (others are refused "
                  "with PERMISSION_DENIED); repeatable or comma-separated. Default: any")
      ->delimiter(',');
  cmd->add_option("--kv-verify", flags->kv_verify,
                  "on: check each remotely prefilled prompt's KV where it landed in host memory "
                  "against the prefill worker's checksum (a mismatch recomputes it); off (default)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--two-phase-admission", flags->two_phase_admission,
                  "on (default): ask the prefill worker to admit a prompt before reserving its KV "
                  "blocks; off: reserve at once (blocks then wait out the prefill worker's queue)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--mlp", flags->mlp,
                  "Where the MLP runs: local (default), cpu (host weights, BLAS) or "
                  "remote:ADDR[,ADDR...] (`tandem mlp-shard` services; docs/mlp.md)")
      ->capture_default_str();
  cmd->add_option("--mlp-fallback", flags->mlp_fallback,
                  "With --mlp remote: none, or cpu (keep the MLP weights here and compute a "
                  "layer on them when no shard answers)")
      ->check(CLI::IsMember({"none", "cpu"}))
      ->capture_default_str();
  cmd->add_option("--mlp-call-timeout-ms", flags->mlp_call_timeout_ms,
                  "With --mlp remote: a layer call's deadline before the next shard or the "
                  "fallback takes it")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  cmd->add_option("--mlp-data-plane", flags->mlp_data_plane,
                  "With --mlp remote: how a call's rows reach the shards: grpc (in the call's "
                  "messages), cma (the host data plane, shards on this host) or ucx (the host "
                  "data plane over UCX). docs/mlp.md")
      ->check(CLI::IsMember({"grpc", "cma", "ucx"}))
      ->capture_default_str();
  cmd->add_option("--mlp-plane-slot-rows", flags->mlp_plane_slot_rows,
                  "With --mlp-data-plane cma|ucx: rows one call through the plane carries "
                  "(larger calls go in messages)")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--mlp-micro-batches", flags->mlp_micro_batches,
                  "With --mlp remote, cuda or cuda_ipc: micro-batches a step runs in ping-pong "
                  "(one's attention while another's MLP is away); 0 chooses per batch size from "
                  "measured step times, 1 turns it off")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  cmd->add_option("--speculative", flags->speculative,
                  "speculative decoding with this drafter: ngram (prompt lookup and suffix "
                  "decoding), draft:DIR (a small model of the same tokenizer on this worker's "
                  "device, with a 64 MiB KV cache of its own) or remote:ADDR[,ADDR...] (tandem "
                  "drafter services); docs/speculative.md. Default: off");
  cmd->add_option("--num-speculative-tokens", flags->num_speculative_tokens,
                  "with --speculative: the most drafts per sequence and step (adapted per request "
                  "from its acceptance; default 4)")
      ->check(CLI::Range(1, 64));
  cmd->callback([flags, exit_code] {
    *exit_code = RunWorker<decode::DecodeWorker, decode::DecodeWorkerOptions>("decode", *flags);
  });
}

}  // namespace tandem::cli

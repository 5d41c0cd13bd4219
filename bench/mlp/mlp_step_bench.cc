// mlp_step_bench: the CUDA runner's decode step with its MLP local against the same step with the
// MLP on a backend (issue 26's H200 target: an 8B-shape attention worker whose MLP runs on a
// `tandem mlp-shard --device cuda` process on the same GPU, `--mlp cuda_ipc:ADDR`), in one process
// and one run, plus the KV capacity each leaves at one GPU memory budget.
//
//   mlp_step_bench --model DIR [--mlp local,cuda,cuda_ipc:HOST:PORT] [--batches 64,256]
//       [--context 1024] [--iters 20] [--micro-batches 1,2] [--auto-steps N]
//       [--start-file F] [--service-token-file F] [--json OUT]
//
// For each backend it creates a runner (KV sized for the largest batch at the context), then
// times decode steps (every sequence one new token at `context`) with TimeDeviceStep: `local`
// replays CUDA graphs as serving does, and is also run eagerly (`local-eager`), the mode every
// offloaded step runs in. An offloaded backend runs once per --micro-batches count (ping-pong:
// 1 is one micro-batch; the backend is reused by each count's runner), and with --auto-steps
// also with the count chosen from measured step times (whole Forward steps, wall time). Weights and
// GPU memory in use after creation are printed per backend. Exit status: 0 ok, 1 a failure (named),
// 2 a usage error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "runtime/auth/service_identity.h"
#include "runtime/mlp/registry.h"
#include "runtime/model/cuda/cuda_model_runner.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_fingerprint.h"
#include "runtime/model/safetensors.h"
#include "runtime/sampling/sample_request.h"

namespace {

using json = nlohmann::json;
using namespace tandem;  // NOLINT: a benchmark's main file

struct Flags {
  std::string model;
  std::string mlp = "local,cuda";
  std::vector<int> batches = {64, 256};
  int context = 1024;
  int iters = 20;
  std::vector<int> micro_batches = {1, 2};
  int auto_steps = 0;
  std::string start_file;
  std::string token_file;
  std::string json_out;
};

double GpuUsedGiB() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
  return static_cast<double>(total - free) / (1 << 30);
}

// Runs `steps` Forward calls of `fb` (sampled greedily on the GPU) on a runner choosing its
// micro-batch count; returns the median wall milliseconds of the last quarter (the chooser has
// decided by then: it probes 3 steps per candidate), the count in last_step_stats().
absl::StatusOr<double> ChosenStep(CudaModelRunner& r, ForwardBatch fb, int steps) {
  // Greedy on the GPU, as serving asks: tokens come back, not [batch, vocab] logits.
  std::vector<SampleRequest> greedy(fb.chunks.size());
  for (size_t i = 0; i < fb.chunks.size(); ++i) {
    greedy[i].greedy = 1;
    fb.chunks[i].sample = &greedy[i];
  }
  std::vector<double> ms;
  ForwardOutput out;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = r.Forward(fb, &out); !s.ok()) return s;
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::vector<double> tail(ms.end() - std::max<size_t>(1, ms.size() / 4), ms.end());
  std::sort(tail.begin(), tail.end());
  return tail[tail.size() / 2];
}

int Run(const Flags& flags) {
  auto config = LoadModelConfig(flags.model);
  if (!config.ok()) {
    std::fprintf(stderr, "mlp_step_bench: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  auto store = TensorStore::Open(flags.model);
  if (!store.ok()) {
    std::fprintf(stderr, "mlp_step_bench: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  config->fingerprint = ModelFingerprint(**store);
  const ModelConfig& c = *config;
  int max_batch = 0;
  for (int b : flags.batches) max_batch = std::max(max_batch, b);
  constexpr int kBlock = 16;
  const int blocks_per_seq = (flags.context + kBlock - 1) / kBlock;
  std::shared_ptr<const auth::ServiceIdentity> identity;
  if (!flags.token_file.empty()) {
    std::ifstream in(flags.token_file);
    std::string token;
    in >> token;
    auto id = auth::ServiceIdentity::FromTokens({token});
    if (!id.ok()) {
      std::fprintf(stderr, "mlp_step_bench: %s\n", std::string(id.status().message()).c_str());
      return 2;
    }
    identity = *id;
  }
  json results = json::array();
  bool started = false;
  std::printf("%-34s %6s %8s %10s %10s %12s\n", "mlp", "batch", "context", "ms/step", "tok/s",
              "weights GiB");
  const std::vector<std::string> specs = absl::StrSplit(flags.mlp, ',');
  for (const std::string& spec : specs) {
    mlp::MlpContext context;
    context.config = &c;
    context.store = store->get();
    context.model_fingerprint = c.fingerprint;
    context.identity = identity;
    context.device_ordinal = 0;
    context.ipc_max_rows = max_batch;
    auto backend = mlp::CreateMlpBackend(spec, context);
    if (!backend.ok()) {
      std::fprintf(stderr, "mlp_step_bench: --mlp %s: %s\n", spec.c_str(),
                   std::string(backend.status().message()).c_str());
      return 1;
    }
    CudaRunnerOptions o;
    o.block_size = kBlock;
    o.num_blocks = max_batch * blocks_per_seq + 1;
    o.max_batch_tokens = std::max(2048, max_batch);
    o.mlp = std::shared_ptr<mlp::MlpBackend>(*std::move(backend));
    std::vector<std::string> modes = {spec};
    std::vector<int> counts;  // per offloaded mode: its micro-batch count (0: chosen)
    if (spec == "local") {
      modes.push_back("local-eager");
    } else {
      modes.clear();
      for (int m : flags.micro_batches) {
        modes.push_back(absl::StrCat(spec, " mb=", m));
        counts.push_back(m);
      }
      if (flags.auto_steps > 0) {
        modes.push_back(absl::StrCat(spec, " mb=auto"));
        counts.push_back(0);
      }
    }
    o.mlp_micro_batches = spec == "local" ? 1 : flags.micro_batches.front();
    auto runner = CreateCudaModelRunner(c, **store, o);
    if (!runner.ok()) {
      std::fprintf(stderr, "mlp_step_bench: runner with --mlp %s: %s\n", spec.c_str(),
                   std::string(runner.status().message()).c_str());
      return 1;
    }
    const double used = GpuUsedGiB();
    for (size_t mode_index = 0; mode_index < modes.size(); ++mode_index) {
      const std::string& mode = modes[mode_index];
      // local-eager: the graphed runner is freed first, so the two never hold weights at once.
      std::unique_ptr<CudaModelRunner> eager;
      CudaModelRunner* r = runner->get();
      if (mode == "local-eager" || (spec != "local" && mode_index > 0)) {
        // local-eager, or the next micro-batch count: the last runner is freed first, so two
        // never hold weights at once.
        runner->reset();
        CudaRunnerOptions e = o;
        e.cuda_graphs = false;
        if (spec != "local") e.mlp_micro_batches = counts[mode_index];
        auto created = CreateCudaModelRunner(c, **store, e);
        if (!created.ok()) {
          std::fprintf(stderr, "mlp_step_bench: eager runner: %s\n",
                       std::string(created.status().message()).c_str());
          return 1;
        }
        eager = *std::move(created);
        r = eager.get();
      }
      for (int b : flags.batches) {
        std::vector<std::vector<int32_t>> tables(b), tokens(b, std::vector<int32_t>(1));
        ForwardBatch fb;
        for (int i = 0; i < b; ++i) {
          tokens[i][0] = (i * 7919) % c.vocab_size;
          tables[i].resize(blocks_per_seq);
          for (int j = 0; j < blocks_per_seq; ++j) tables[i][j] = 1 + i * blocks_per_seq + j;
          SequenceChunk ch;
          ch.tokens = tokens[i];
          ch.start_pos = flags.context - 1;
          ch.block_table = tables[i];
          fb.chunks.push_back(ch);
        }
        if (!flags.start_file.empty() && !started) {
          // Several benches against one shard start timing together: each says it is ready and
          // waits for the file (bench/mlp/cuda_offload_h200.sh, PAIR=1).
          std::fprintf(stderr, "mlp_step_bench: ready\n");
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(300);
          while (!std::ifstream(flags.start_file).good()) {
            if (std::chrono::steady_clock::now() > give_up) {
              std::fprintf(stderr, "mlp_step_bench: no %s in 300 s\n", flags.start_file.c_str());
              return 1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          started = true;
        }
        absl::StatusOr<double> ms;
        if (spec != "local" && counts[mode_index] == 0) {
          // The chooser's pick: whole steps (Forward: plan, upload, device, logits back, as
          // serving runs them) until it decides; the median wall time of the steps after.
          ms = ChosenStep(*r, fb, flags.auto_steps);
        } else {
          ms = r->TimeDeviceStep(fb, 5, flags.iters);
        }
        if (!ms.ok()) {
          std::fprintf(stderr, "mlp_step_bench: %s batch %d: %s\n", mode.c_str(), b,
                       std::string(ms.status().message()).c_str());
          return 1;
        }
        std::printf("%-34s %6d %8d %10.3f %10.0f %12.2f\n", mode.c_str(), b, flags.context, *ms,
                    b * 1000.0 / *ms, r->weight_bytes() / 1073741824.0);
        results.push_back({{"mlp", mode},
                           {"micro_batches", r->last_step_stats().micro_batches},
                           {"batch", b},
                           {"context", flags.context},
                           {"ms_per_step", *ms},
                           {"weight_bytes", r->weight_bytes()},
                           {"gpu_used_gib_after_create", used},
                           {"kv_blocks", r->num_blocks()}});
      }
    }
  }
  if (!flags.json_out.empty()) std::ofstream(flags.json_out) << results.dump(1) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app("The CUDA runner's decode step with its MLP local and on MLP backends");
  app.add_option("--model", flags.model, "Model directory")->required();
  app.add_option("--mlp", flags.mlp, "Backends, comma-separated: local, cuda, cuda_ipc:HOST:PORT")
      ->capture_default_str();
  app.add_option("--batches", flags.batches, "Decode batch sizes")->delimiter(',');
  app.add_option("--context", flags.context, "Context of every sequence")
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--iters", flags.iters, "Timed steps per point")->check(CLI::Range(1, 10000));
  app.add_option("--micro-batches", flags.micro_batches,
                 "Ping-pong micro-batch counts to run each offloaded backend with")
      ->delimiter(',')
      ->check(CLI::Range(1, 16));
  app.add_option("--start-file", flags.start_file,
                 "Before the first timed point, print \"ready\" and wait for this file");
  app.add_option("--auto-steps", flags.auto_steps,
                 "Also run each offloaded backend with the count chosen from measured step times "
                 "(mlp_micro_batches 0) for this many whole steps, reporting its pick")
      ->check(CLI::Range(0, 100000));
  app.add_option("--service-token-file", flags.token_file, "Token of the shards (cuda_ipc)");
  app.add_option("--json", flags.json_out, "Write the results as JSON here");
  CLI11_PARSE(app, argc, argv);
  return Run(flags);
}

// The CUDA runner with its MLP on a backend (cuda_model_runner.h, "MLP offload"; docs/mlp.md)
// against the same runner computing the MLP itself: logits within bf16 tolerance and greedy
// tokens for 64 steps on the CUDA runner's test models, through the `cpu` backend and through a
// `tandem mlp-shard` service in this process (`remote`, computing on the CPU and on the GPU); a
// shard killed mid-run fails the step with a clean error; the KV cache gets the MLP weights' bytes.
// Skipped without a GPU.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "runtime/auth/service_identity.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_device.h"
#include "runtime/mlp/cpu_mlp_backend.h"
#include "runtime/mlp/cuda/cuda_ipc_mlp_backend.h"
#include "runtime/mlp/cuda/cuda_mlp_backend.h"
#include "runtime/mlp/dense_mlp.h"
#include "runtime/mlp/mlp_shard_service.h"
#include "runtime/mlp/remote_mlp_backend.h"
#include "runtime/model/cuda/cuda_model_runner.h"
#include "runtime/model/cuda/random_checkpoint_for_test.h"
#include "runtime/model/cuda/test_paths_for_test.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_fingerprint.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/synth.h"
#include "runtime/server/grpc_server.h"

namespace tandem {
namespace {

std::string TempDirFor(const std::string& name) {
  return testing_util::TestTempDir("tandem_cuda_mlp", name);
}

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 128;
const std::string kToken = "cuda-mlp-offload-test-token-0123456789";

std::shared_ptr<const auth::ServiceIdentity> Identity() {
  auto identity = auth::ServiceIdentity::FromTokens({kToken});
  EXPECT_TRUE(identity.ok()) << identity.status();
  return identity.ok() ? *identity : nullptr;
}

int Argmax(const ForwardOutput& o, int row, int vocab) {
  const float* l = o.logits.data() + static_cast<size_t>(row) * vocab;
  return static_cast<int>(std::max_element(l, l + vocab) - l);
}

// Largest |local - offloaded| of each row relative to the row's logit scale (max |local|).
double MaxRelativeError(const ForwardOutput& local, const ForwardOutput& off, int vocab) {
  double worst = 0;
  for (int r = 0; r < local.rows; ++r) {
    const float* a = local.logits.data() + static_cast<size_t>(r) * vocab;
    const float* b = off.logits.data() + static_cast<size_t>(r) * vocab;
    double scale = 1e-6, err = 0;
    for (int v = 0; v < vocab; ++v) {
      scale = std::max(scale, std::fabs(static_cast<double>(a[v])));
      err = std::max(err, std::fabs(static_cast<double>(a[v]) - b[v]));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> table;
};

class CudaMlpOffloadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok() || *count == 0) return;
    SynthOptions o;
    o.like = "tiny";
    o.out_dir = TempDirFor("tiny");
    o.seed = 1;
    ASSERT_TRUE(SynthesizeModel(o, nullptr).ok());
    testing_util::RandomCheckpoint qwen;
    qwen.qwen2 = true;
    models_ = new std::map<std::string, std::string>{
        {"tiny", o.out_dir},
        {"qwen", testing_util::WriteRandomCheckpoint(TempDirFor("qwen"), qwen)}};
    // The bundled trained model, where the checkout has it (a GPU host may get only binaries).
    if (std::filesystem::exists(testing_util::BundledModelsDir() + "/target/config.json")) {
      models_->emplace("target", testing_util::BundledModelsDir() + "/target");
    }
  }

  void SetUp() override {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) GTEST_SKIP() << "no usable CUDA GPU: " << count.status();
    if (*count == 0) GTEST_SKIP() << "no CUDA GPU present (cudaGetDeviceCount = 0)";
    ASSERT_NE(models_, nullptr);
  }

  void Load(const std::string& name) {
    if (!models_->contains(name))
      GTEST_SKIP() << "no " << name << " model under " << testing_util::BundledModelsDir();
    const std::string dir = models_->at(name);
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    auto store = TensorStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    all_ = *mlp::ParseLayerRange("all", config_);
  }

  std::shared_ptr<const mlp::DenseMlpWeights> Weights(const std::string& range) {
    auto w = mlp::LoadDenseMlpWeights(config_, *store_, *mlp::ParseLayerRange(range, config_));
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::make_shared<const mlp::DenseMlpWeights>(*std::move(w)) : nullptr;
  }

  absl::StatusOr<std::unique_ptr<CudaModelRunner>> Gpu(std::shared_ptr<mlp::MlpBackend> backend,
                                                       int num_blocks = kNumBlocks,
                                                       int micro_batches = 0) {
    CudaRunnerOptions o;
    o.mlp_micro_batches = micro_batches;
    o.block_size = kBlockSize;
    o.num_blocks = num_blocks;
    o.kv_cache_bytes = size_t{16} << 20;
    o.max_batch_tokens = 64;
    o.mlp = std::move(backend);
    return CreateCudaModelRunner(config_, *store_, o);
  }

  SequenceChunk Chunk(Seq* s, const std::vector<int32_t>& tokens) {
    const int start = static_cast<int>(s->tokens.size());
    s->tokens.insert(s->tokens.end(), tokens.begin(), tokens.end());
    while (static_cast<int>(s->table.size()) * kBlockSize < static_cast<int>(s->tokens.size())) {
      s->table.push_back(next_block_++);
    }
    SequenceChunk c;
    c.tokens = std::span<const int32_t>(s->tokens).subspan(start);
    c.start_pos = start;
    c.block_table = s->table;
    c.need_logits = true;
    return c;
  }

  std::vector<int32_t> RandomTokens(int n) {
    std::vector<int32_t> t(n);
    std::uniform_int_distribution<int32_t> d(3, config_.vocab_size - 1);
    for (auto& x : t) x = d(rng_);
    return t;
  }

  // 64 greedy steps of one sequence (a 12-token prompt first), teacher-forced with the local
  // runner's tokens: logits within bf16 tolerance of local at every step and the same argmax,
  // except on near-ties (local logit gap below 1% of the logit scale), which bf16 may flip.
  void ExpectGreedyMatches(ModelRunner& local, ModelRunner& offloaded, const std::string& what) {
    constexpr double kRelTol = 0.03;  // as the CUDA runner against the CPU runner
    const int vocab = config_.vocab_size;
    Seq a, b;
    std::vector<int32_t> next = RandomTokens(12);
    int exact = 0, near_ties = 0;
    double worst = 0;
    for (int i = 0; i < 64; ++i) {
      ForwardBatch la, lb;
      la.chunks = {Chunk(&a, next)};
      lb.chunks = {Chunk(&b, next)};
      ForwardOutput lo, oo;
      ASSERT_TRUE(local.Forward(la, &lo).ok());
      const absl::Status s = offloaded.Forward(lb, &oo);
      ASSERT_TRUE(s.ok()) << what << " step " << i << ": " << s;
      ASSERT_EQ(oo.rows, 1);
      const double rel = MaxRelativeError(lo, oo, vocab);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, kRelTol) << what << " step " << i;
      const int lt = Argmax(lo, 0, vocab), ot = Argmax(oo, 0, vocab);
      if (lt == ot) {
        ++exact;
      } else {
        double scale = 1e-6;
        for (int v = 0; v < vocab; ++v) scale = std::max(scale, std::fabs(double{lo.logits[v]}));
        const double gap = lo.logits[lt] - lo.logits[ot];
        EXPECT_LE(gap, 0.01 * scale) << what << " step " << i << ": local token " << lt
                                     << ", offloaded " << ot << ", gap " << gap;
        ++near_ties;
      }
      next = {lt};
    }
    std::printf(
        "[%s] 64 greedy steps: %d identical argmax, %d near-tie flips, worst logit error "
        "%.4f of the scale\n",
        what.c_str(), exact, near_ties, worst);
  }

  // Ping-pong: 7 sequences prefilled one by one, then 16 greedy decode steps of all 7 in one
  // batch (teacher-forced with the local runner's tokens), the offloaded runner splitting each
  // into `micro_batches` micro-batches: logits within bf16 tolerance of local, the same argmax
  // but for near-ties, and the step stats show the split.
  void ExpectDecodeBatchMatches(ModelRunner& local, CudaModelRunner& offloaded, int micro_batches,
                                const std::string& what) {
    constexpr int kSeqs = 7;
    const int vocab = config_.vocab_size;
    std::vector<Seq> l(kSeqs), o(kSeqs);
    std::vector<int32_t> next(kSeqs);
    for (int i = 0; i < kSeqs; ++i) {
      const std::vector<int32_t> prompt = RandomTokens(3 + 4 * i);
      ForwardBatch lb, ob;
      lb.chunks = {Chunk(&l[i], prompt)};
      ob.chunks = {Chunk(&o[i], prompt)};
      ForwardOutput lo, oo;
      ASSERT_TRUE(local.Forward(lb, &lo).ok());
      ASSERT_TRUE(offloaded.Forward(ob, &oo).ok()) << what;
      next[i] = Argmax(lo, 0, vocab);
    }
    int exact = 0;
    double worst = 0;
    for (int step = 0; step < 16; ++step) {
      ForwardBatch lb, ob;
      for (int i = 0; i < kSeqs; ++i) {
        lb.chunks.push_back(Chunk(&l[i], {next[i]}));
        ob.chunks.push_back(Chunk(&o[i], {next[i]}));
      }
      ForwardOutput lo, oo;
      ASSERT_TRUE(local.Forward(lb, &lo).ok());
      const absl::Status st = offloaded.Forward(ob, &oo);
      ASSERT_TRUE(st.ok()) << what << " step " << step << ": " << st;
      ASSERT_EQ(oo.rows, kSeqs);
      EXPECT_EQ(offloaded.last_step_stats().micro_batches, micro_batches) << what;
      const double rel = MaxRelativeError(lo, oo, vocab);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 0.03) << what << " step " << step;
      for (int i = 0; i < kSeqs; ++i) {
        const int lt = Argmax(lo, i, vocab), ot = Argmax(oo, i, vocab);
        if (lt == ot) {
          ++exact;
        } else {
          const float* row = lo.logits.data() + static_cast<size_t>(i) * vocab;
          double scale = 1e-6;
          for (int v = 0; v < vocab; ++v) scale = std::max(scale, std::fabs(double{row[v]}));
          EXPECT_LE(row[lt] - row[ot], 0.01 * scale) << what << " step " << step << " row " << i;
        }
        next[i] = lt;
      }
    }
    std::printf(
        "[%s] 16 decode steps of %d rows in %d micro-batches: %d/%d identical argmax, "
        "worst logit error %.4f of the scale\n",
        what.c_str(), kSeqs, micro_batches, exact, 16 * kSeqs, worst);
  }

  // A mixed batch (two prompts of different lengths and a decode) on both runners.
  void ExpectMixedBatchMatches(ModelRunner& local, ModelRunner& offloaded,
                               const std::string& what) {
    std::vector<Seq> l(3), o(3);
    const std::vector<int32_t> p0 = RandomTokens(29), p1 = RandomTokens(5), p2 = RandomTokens(17);
    for (auto* seqs : {&l, &o}) {
      ForwardBatch first;
      first.chunks = {Chunk(&(*seqs)[2], p2)};
      ForwardOutput ignored;
      ModelRunner& r = seqs == &l ? local : offloaded;
      ASSERT_TRUE(r.Forward(first, &ignored).ok());
    }
    const std::vector<int32_t> d = RandomTokens(1);
    ForwardBatch lb, ob;
    lb.chunks = {Chunk(&l[0], p0), Chunk(&l[2], d), Chunk(&l[1], p1)};
    ob.chunks = {Chunk(&o[0], p0), Chunk(&o[2], d), Chunk(&o[1], p1)};
    ForwardOutput lo, oo;
    ASSERT_TRUE(local.Forward(lb, &lo).ok());
    const absl::Status s = offloaded.Forward(ob, &oo);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(oo.rows, 3);
    EXPECT_LE(MaxRelativeError(lo, oo, config_.vocab_size), 0.03) << what << " mixed batch";
  }

  static std::map<std::string, std::string>* models_;
  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
  mlp::MlpShape all_;
  int next_block_ = 1;
  std::mt19937 rng_{4321};
};
std::map<std::string, std::string>* CudaMlpOffloadTest::models_ = nullptr;

// A shard service with its own gRPC server in this process.
struct Shard {
  std::unique_ptr<mlp::MlpShardService> service;
  server::GrpcServer server;
  bool up = false;
  std::string address() const { return absl::StrCat("127.0.0.1:", server.port); }
  void Kill() {
    if (!up) return;
    service->Shutdown();
    server.Shutdown(absl::ZeroDuration());
    up = false;
  }
  ~Shard() { Kill(); }
};

std::unique_ptr<Shard> StartShard(std::unique_ptr<mlp::MlpBackend> compute) {
  auto shard = std::make_unique<Shard>();
  mlp::MlpShardOptions options;
  options.model_fingerprint = "fp";
  shard->service = std::make_unique<mlp::MlpShardService>(std::move(compute), Identity(), options);
  auto started = server::StartGrpcServer("127.0.0.1", 0, {shard->service.get()},
                                         {"tandem.v1.MlpShard"}, Identity());
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return nullptr;
  shard->server = *std::move(started);
  shard->up = true;
  return shard;
}

class OffloadModels : public CudaMlpOffloadTest,
                      public ::testing::WithParamInterface<std::string> {};

TEST_P(OffloadModels, CpuBackendMatchesLocal) {
  Load(GetParam());
  if (IsSkipped()) return;
  auto local = Gpu(nullptr);
  ASSERT_TRUE(local.ok()) << local.status();
  auto cpu = std::make_shared<mlp::CpuMlpBackend>(Weights("all"));
  auto offloaded = Gpu(cpu);
  ASSERT_TRUE(offloaded.ok()) << offloaded.status();
  ExpectGreedyMatches(**local, **offloaded, GetParam() + " cpu");
  ExpectMixedBatchMatches(**local, **offloaded, GetParam() + " cpu");
  // One call per layer per step.
  EXPECT_EQ((*offloaded)->mlp_stats().calls, cpu->stats().calls);
  EXPECT_EQ(cpu->stats().calls, int64_t{66} * config_.num_layers);
}

INSTANTIATE_TEST_SUITE_P(Models, OffloadModels, ::testing::Values("tiny", "target", "qwen"));

// Two shards of half the layers each, over gRPC.
TEST_F(CudaMlpOffloadTest, RemoteShardsMatchLocal) {
  Load("qwen");
  ASSERT_GE(config_.num_layers, 2);
  const std::string half = absl::StrCat(config_.num_layers / 2);
  auto low = StartShard(std::make_unique<mlp::CpuMlpBackend>(Weights("0:" + half)));
  auto high = StartShard(
      std::make_unique<mlp::CpuMlpBackend>(Weights(half + ":" + absl::StrCat(config_.num_layers))));
  ASSERT_TRUE(low != nullptr && high != nullptr);
  auto remote = mlp::RemoteMlpBackend::Create({low->address(), high->address()}, Identity(), all_,
                                              "fp", nullptr, mlp::RemoteMlpOptions{});
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto local = Gpu(nullptr);
  ASSERT_TRUE(local.ok()) << local.status();
  auto offloaded = Gpu(std::shared_ptr<mlp::MlpBackend>(std::move(*remote)));
  ASSERT_TRUE(offloaded.ok()) << offloaded.status();
  ExpectGreedyMatches(**local, **offloaded, "qwen remote");
  ExpectMixedBatchMatches(**local, **offloaded, "qwen remote");
}

// The `cuda` backend on the runner's GPU: its device path queues the layer on the runner's
// stream, with the kernels the runner's own MLP runs.
TEST_P(OffloadModels, CudaBackendOnTheSameGpuMatchesLocal) {
  Load(GetParam());
  if (IsSkipped()) return;
  auto local = Gpu(nullptr);
  ASSERT_TRUE(local.ok()) << local.status();
  auto backend = mlp::CreateCudaMlpBackend(config_, *store_, all_, 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  ASSERT_TRUE((*backend)->SupportsDevice(0));
  auto offloaded = Gpu(std::shared_ptr<mlp::MlpBackend>(*std::move(backend)));
  ASSERT_TRUE(offloaded.ok()) << offloaded.status();
  ExpectGreedyMatches(**local, **offloaded, GetParam() + " cuda");
  ExpectMixedBatchMatches(**local, **offloaded, GetParam() + " cuda");
  EXPECT_EQ((*offloaded)->mlp_stats().calls, int64_t{66} * config_.num_layers);
}

// Ping-pong in one process: each micro-batch's MLP on the backend's own streams while the next
// one's attention is queued on the runner's.
TEST_P(OffloadModels, PingPongOnTheCudaBackendMatchesLocal) {
  Load(GetParam());
  if (IsSkipped()) return;
  auto backend = mlp::CreateCudaMlpBackend(config_, *store_, all_, 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::shared_ptr<mlp::MlpBackend> shared = *std::move(backend);
  for (int micro_batches : {2, 3}) {
    next_block_ = 1;
    auto fresh_local = Gpu(nullptr);
    ASSERT_TRUE(fresh_local.ok());
    auto offloaded = Gpu(shared, kNumBlocks, micro_batches);
    ASSERT_TRUE(offloaded.ok()) << offloaded.status();
    ExpectDecodeBatchMatches(**fresh_local, **offloaded, micro_batches,
                             absl::StrCat(GetParam(), " cuda ping-pong"));
  }
  EXPECT_EQ(shared->stats().failures, 0);
}

// A shard computing on the GPU (`tandem mlp-shard --device cuda`), as the runner computes its MLP.
TEST_P(OffloadModels, GpuShardMatchesLocal) {
  Load(GetParam());
  if (IsSkipped()) return;
  auto compute = mlp::CreateCudaMlpBackend(config_, *store_, all_, 0);
  ASSERT_TRUE(compute.ok()) << compute.status();
  auto shard = StartShard(*std::move(compute));
  ASSERT_NE(shard, nullptr);
  auto remote = mlp::RemoteMlpBackend::Create({shard->address()}, Identity(), all_, "fp", nullptr,
                                              mlp::RemoteMlpOptions{});
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto local = Gpu(nullptr);
  ASSERT_TRUE(local.ok()) << local.status();
  auto offloaded = Gpu(std::shared_ptr<mlp::MlpBackend>(std::move(*remote)));
  ASSERT_TRUE(offloaded.ok()) << offloaded.status();
  ExpectGreedyMatches(**local, **offloaded, GetParam() + " gpu shard");
  ExpectMixedBatchMatches(**local, **offloaded, GetParam() + " gpu shard");
  EXPECT_EQ(shard->service->stats().failed, 0);
}

// A `tandem mlp-shard --device cuda` process on this GPU, its stdout read for the port.
struct ShardProcess {
  pid_t pid = -1;
  int port = 0;
  ~ShardProcess() { Kill(); }
  void Kill() { Signal(SIGKILL); }
  // SIGTERM: the shard stops cleanly and prints its stats on stderr.
  void Stop() { Signal(SIGTERM); }
  void Signal(int sig) {
    if (pid <= 0) return;
    kill(pid, sig);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

// Starts the shard on `model_dir` (stderr into `stderr_file` when given); false (with a gtest
// failure) when it does not serve in 60 s.
bool StartShardProcess(const std::string& model_dir, ShardProcess* shard,
                       const std::vector<std::string>& extra_args = {},
                       const std::string& stderr_file = "") {
  const std::string token_file = TempDirFor("token") + "/token";
  {
    std::ofstream(token_file) << kToken << "\n";
    chmod(token_file.c_str(), 0600);
  }
  int out[2];
  if (pipe(out) != 0) return false;
  const std::string bin = testing_util::TandemBinary();
  std::vector<std::string> args = {bin,       "mlp-shard", "--model",
                                   model_dir, "--device",  "cuda",
                                   "--port",  "0",         "--service-token-file",
                                   token_file};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    if (!stderr_file.empty()) {
      const int fd = open(stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) dup2(fd, 2);
    }
    close(out[0]);
    close(out[1]);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  close(out[1]);
  shard->pid = pid;
  std::string text;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < give_up) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 500) <= 0) continue;
    char buf[256];
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    const size_t at = text.find("serving on ");
    const size_t end = at == std::string::npos ? at : text.find('\n', at);
    if (end != std::string::npos) {
      const std::string address = text.substr(at + 11, end - at - 11);
      shard->port = std::atoi(address.substr(address.rfind(':') + 1).c_str());
      break;
    }
  }
  close(out[0]);
  EXPECT_GT(shard->port, 0) << bin << " mlp-shard did not serve: " << text;
  return shard->port > 0;
}

// The GPU data plane: the MLP on a `tandem mlp-shard --device cuda` process on the same GPU,
// each layer's rows copied GPU to GPU through its IPC buffers (`--mlp cuda_ipc:ADDR`).
TEST_P(OffloadModels, ShardProcessOverCudaIpcMatchesLocal) {
  Load(GetParam());
  if (IsSkipped()) return;
  ShardProcess process;
  ASSERT_TRUE(StartShardProcess(models_->at(GetParam()), &process));
  mlp::RemoteMlpOptions options;
  options.call_timeout = absl::Seconds(2);
  auto ipc = mlp::CreateCudaIpcMlpBackend({absl::StrCat("127.0.0.1:", process.port)}, Identity(),
                                          all_, ModelFingerprint(*store_), 0, 64, options);
  ASSERT_TRUE(ipc.ok()) << ipc.status();
  auto local = Gpu(nullptr);
  ASSERT_TRUE(local.ok()) << local.status();
  std::shared_ptr<mlp::MlpBackend> backend = *std::move(ipc);
  auto offloaded = Gpu(backend);
  ASSERT_TRUE(offloaded.ok()) << offloaded.status();
  // Calls carry at most 64 rows here: the 150-token prompt below takes three per layer.
  ExpectGreedyMatches(**local, **offloaded, GetParam() + " cuda_ipc");
  ExpectMixedBatchMatches(**local, **offloaded, GetParam() + " cuda_ipc");
  Seq a, b;
  const std::vector<int32_t> long_prompt = RandomTokens(150);  // three calls per layer
  ForwardBatch la, lb;
  la.chunks = {Chunk(&a, long_prompt)};
  lb.chunks = {Chunk(&b, long_prompt)};
  ForwardOutput lo, oo;
  ASSERT_TRUE((*local)->Forward(la, &lo).ok());
  const absl::Status split = (*offloaded)->Forward(lb, &oo);
  ASSERT_TRUE(split.ok()) << split;
  EXPECT_LE(MaxRelativeError(lo, oo, config_.vocab_size), 0.03);
  EXPECT_EQ(backend->stats().failures, 0);
  {
    // Ping-pong over the data plane: two micro-batches in flight in the session's buffers at
    // once (their own row ranges), each collected on a slot's stream.
    next_block_ = 1;
    auto fresh_local = Gpu(nullptr);
    ASSERT_TRUE(fresh_local.ok());
    auto pp = Gpu(backend, kNumBlocks, 2);
    ASSERT_TRUE(pp.ok()) << pp.status();
    ExpectDecodeBatchMatches(**fresh_local, **pp, 2, GetParam() + " cuda_ipc ping-pong");
    EXPECT_EQ(backend->stats().failures, 0);
  }
  // The shard process dies: the next step fails within the call timeout, naming the shard; so
  // does the one after (no hang, no crash).
  process.Kill();
  for (int attempt = 0; attempt < 2; ++attempt) {
    lb.chunks = {Chunk(&b, RandomTokens(1))};
    const auto start = std::chrono::steady_clock::now();
    const absl::Status st = (*offloaded)->Forward(lb, &oo);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("cuda_ipc"), std::string::npos) << st;
    EXPECT_LT(seconds, 5.0) << st;
  }
}

// One shard process serving two attention workers (two sessions) that step at once: their calls
// of a layer run as one GEMM (the shard's layer batcher), and each worker still gets its own
// rows' results.
TEST_P(OffloadModels, OneShardProcessBatchesTwoWorkersCalls) {
  Load(GetParam());
  if (IsSkipped()) return;
  const std::string log = TempDirFor("batcher") + "/shard.err";
  ShardProcess process;
  // A long window, so that the two threads' calls meet whatever the scheduling.
  ASSERT_TRUE(StartShardProcess(models_->at(GetParam()), &process,
                                {"--ipc-batch-window-us", "50000"}, log));
  mlp::RemoteMlpOptions options;
  options.call_timeout = absl::Seconds(5);
  std::vector<std::unique_ptr<CudaModelRunner>> workers;
  for (int w = 0; w < 2; ++w) {
    auto ipc = mlp::CreateCudaIpcMlpBackend({absl::StrCat("127.0.0.1:", process.port)}, Identity(),
                                            all_, ModelFingerprint(*store_), 0, 64, options);
    ASSERT_TRUE(ipc.ok()) << ipc.status();
    auto runner = Gpu(std::shared_ptr<mlp::MlpBackend>(*std::move(ipc)), kNumBlocks, 1);
    ASSERT_TRUE(runner.ok()) << runner.status();
    workers.push_back(*std::move(runner));
  }
  auto local = Gpu(nullptr);
  ASSERT_TRUE(local.ok()) << local.status();
  // The same steps for every runner: 4 prompts, then 24 decode steps of all 4 (fixed tokens).
  constexpr int kSeqs = 4, kSteps = 24;
  std::vector<std::vector<int32_t>> prompts, decode;
  for (int i = 0; i < kSeqs; ++i) prompts.push_back(RandomTokens(5 + 3 * i));
  for (int i = 0; i < kSteps; ++i) decode.push_back(RandomTokens(kSeqs));
  auto run = [&](ModelRunner& r, std::vector<std::vector<float>>* logits) -> absl::Status {
    std::vector<std::vector<int32_t>> tokens(kSeqs), tables(kSeqs);
    auto chunk = [&](int i, const std::vector<int32_t>& t) {
      const int start = static_cast<int>(tokens[i].size());
      tokens[i].insert(tokens[i].end(), t.begin(), t.end());
      while (static_cast<int>(tables[i].size()) * kBlockSize < static_cast<int>(tokens[i].size())) {
        tables[i].push_back(1 + i * 8 + static_cast<int>(tables[i].size()));
      }
      SequenceChunk c;
      c.tokens = std::span<const int32_t>(tokens[i]).subspan(start);
      c.start_pos = start;
      c.block_table = tables[i];
      return c;
    };
    ForwardOutput out;
    for (int i = 0; i < kSeqs; ++i) {
      ForwardBatch b;
      b.chunks = {chunk(i, prompts[i])};
      RETURN_IF_ERROR(r.Forward(b, &out));
    }
    for (int step = 0; step < kSteps; ++step) {
      ForwardBatch b;
      for (int i = 0; i < kSeqs; ++i) b.chunks.push_back(chunk(i, {decode[step][i]}));
      RETURN_IF_ERROR(r.Forward(b, &out));
      logits->push_back(out.logits);
    }
    return absl::OkStatus();
  };
  std::vector<std::vector<float>> expected;
  ASSERT_TRUE(run(**local, &expected).ok());
  std::vector<std::vector<std::vector<float>>> got(2);
  std::vector<absl::Status> status(2);
  {
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] { status[w] = run(*workers[w], &got[w]); });
    }
    for (auto& t : threads) t.join();
  }
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(status[w].ok()) << "worker " << w << ": " << status[w];
    ASSERT_EQ(got[w].size(), expected.size());
    for (size_t step = 0; step < expected.size(); ++step) {
      ForwardOutput a, b;
      a.logits = expected[step];
      b.logits = got[w][step];
      a.rows = b.rows = kSeqs;
      EXPECT_LE(MaxRelativeError(a, b, config_.vocab_size), 0.03)
          << "worker " << w << " step " << step;
    }
  }
  workers.clear();  // ends the sessions
  process.Stop();
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("GPU data plane: ");
  ASSERT_NE(at, std::string::npos) << text;
  std::printf("[%s] %s", GetParam().c_str(), text.substr(at, text.find('\n', at) - at + 1).c_str());
  // "(N of several workers' calls": some layer ran both workers' rows in one GEMM.
  const size_t open = text.find('(', at);
  ASSERT_NE(open, std::string::npos);
  EXPECT_GT(std::atoi(text.c_str() + open + 1), 0) << text.substr(at);
}

// The shard dies between steps: the next step fails with the layer and backend named, within the
// call deadline, and a step after that fails the same way (no hang, no crash).
TEST_F(CudaMlpOffloadTest, KilledShardFailsTheStepCleanly) {
  Load("tiny");
  auto shard = StartShard(std::make_unique<mlp::CpuMlpBackend>(Weights("all")));
  ASSERT_NE(shard, nullptr);
  mlp::RemoteMlpOptions options;
  options.call_timeout = absl::Milliseconds(500);
  auto remote =
      mlp::RemoteMlpBackend::Create({shard->address()}, Identity(), all_, "fp", nullptr, options);
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto runner = Gpu(std::shared_ptr<mlp::MlpBackend>(std::move(*remote)));
  ASSERT_TRUE(runner.ok()) << runner.status();
  Seq s;
  ForwardBatch batch;
  batch.chunks = {Chunk(&s, RandomTokens(8))};
  ForwardOutput out;
  ASSERT_TRUE((*runner)->Forward(batch, &out).ok());
  shard->Kill();
  for (int attempt = 0; attempt < 2; ++attempt) {
    batch.chunks = {Chunk(&s, RandomTokens(1))};
    const auto start = std::chrono::steady_clock::now();
    const absl::Status st = (*runner)->Forward(batch, &out);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("layer 0 MLP on the remote backend"), std::string::npos) << st;
    EXPECT_LT(seconds, 5.0) << st;
  }
  EXPECT_GE((*runner)->mlp_stats().failures, 2);
}

// Without its MLP weights the runner holds fewer weight bytes, and a KV cache sized from
// kv_cache_bytes gets the MLP's bf16 bytes.
TEST_F(CudaMlpOffloadTest, OffloadedWeightsGoToTheKvCache) {
  Load("qwen");
  auto local = Gpu(nullptr, /*num_blocks=*/0);
  ASSERT_TRUE(local.ok()) << local.status();
  auto offloaded = Gpu(std::make_shared<mlp::CpuMlpBackend>(Weights("all")), /*num_blocks=*/0);
  ASSERT_TRUE(offloaded.ok()) << offloaded.status();
  const size_t mlp_bytes = size_t{3} * 2 * config_.num_layers * config_.hidden_size *
                           static_cast<size_t>(config_.intermediate_size);
  EXPECT_EQ((*local)->weight_bytes() - (*offloaded)->weight_bytes(), mlp_bytes);
  const size_t per_block =
      size_t{2} * 2 * config_.num_layers * kBlockSize * config_.num_kv_heads * config_.head_dim;
  EXPECT_EQ((*local)->num_blocks(), static_cast<int>((size_t{16} << 20) / per_block));
  EXPECT_EQ((*offloaded)->num_blocks(),
            static_cast<int>(((size_t{16} << 20) + mlp_bytes) / per_block));
  // The `cuda` backend on the runner's own GPU keeps the weights there: no KV gained.
  auto same_gpu = mlp::CreateCudaMlpBackend(config_, *store_, all_, 0);
  ASSERT_TRUE(same_gpu.ok()) << same_gpu.status();
  auto kept = Gpu(std::shared_ptr<mlp::MlpBackend>(*std::move(same_gpu)), /*num_blocks=*/0);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)->num_blocks(), (*local)->num_blocks());
  std::printf("[qwen] KV blocks: %d local, %d with the MLP offloaded (%zu MLP bytes)\n",
              (*local)->num_blocks(), (*offloaded)->num_blocks(), mlp_bytes);
}

// A backend that does not serve every layer, or serves another shape, is refused at creation.
TEST_F(CudaMlpOffloadTest, BackendOfTheWrongShapeIsRefused) {
  Load("tiny");
  ASSERT_GE(config_.num_layers, 2);
  auto partial = Gpu(std::make_shared<mlp::CpuMlpBackend>(Weights("0:1")));
  ASSERT_FALSE(partial.ok());
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(partial.status().message().find("serves layers 0:1"), std::string::npos)
      << partial.status();
}

}  // namespace
}  // namespace tandem

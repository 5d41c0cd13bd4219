// The MLP seam on the CPU runner: the `cpu` backend gives the local path's bits, a backend's
// failure fails the forward pass naming the layer (and the runner keeps working), and the
// registry's names and errors.
#include "runtime/mlp/mlp_backend.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/mlp/cpu_mlp_backend.h"
#include "runtime/mlp/dense_mlp.h"
#include "runtime/mlp/registry.h"
#include "runtime/mlp/tiny_model_for_test.h"
#include "runtime/model/cpu_model_runner.h"
#include "runtime/model/weights.h"

namespace tandem::mlp {
namespace {

using ::testing::HasSubstr;

class MlpBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = new TinyModelDir("tandem-mlp-test", 7); }
  static void TearDownTestSuite() { delete model_; }
  void SetUp() override { model_->Open(&config_, &store_); }

  std::unique_ptr<ModelRunner> Runner(std::shared_ptr<MlpBackend> mlp, int micro_batches = 2) {
    auto weights = LoadCpuWeights(config_, *store_, {.skip_mlp = mlp != nullptr});
    EXPECT_TRUE(weights.ok()) << weights.status();
    CpuRunnerOptions o;
    o.num_blocks = 64;
    o.mlp = std::move(mlp);
    o.mlp_micro_batches = micro_batches;
    auto runner = CreateCpuModelRunner(config_, *std::move(weights), o);
    EXPECT_TRUE(runner.ok()) << runner.status();
    return runner.ok() ? *std::move(runner) : nullptr;
  }

  std::shared_ptr<MlpBackend> Cpu() {
    MlpContext context;
    context.config = &config_;
    context.store = store_.get();
    auto backend = CreateMlpBackend("cpu", context);
    EXPECT_TRUE(backend.ok()) << backend.status();
    return backend.ok() ? std::shared_ptr<MlpBackend>(*std::move(backend)) : nullptr;
  }

  // A prefill of 11 tokens and, in the next step, a batch of that sequence's decode and a new
  // 5-token prompt: every row's logits of both steps.
  std::vector<float> Logits(ModelRunner& runner, absl::Status* status = nullptr) {
    std::vector<int32_t> prompt = {1, 5, 9, 2, 7, 3, 3, 8, 4, 6, 2}, next = {11},
                         other = {4, 4, 2, 9, 1};
    std::vector<int32_t> table_a = {0, 1}, table_b = {2};
    std::vector<float> all;
    ForwardBatch first;
    first.chunks.push_back({.tokens = prompt, .start_pos = 0, .block_table = table_a});
    ForwardOutput out;
    absl::Status s = runner.Forward(first, &out);
    if (status != nullptr) *status = s;
    if (!s.ok()) return all;
    all = out.logits;
    ForwardBatch second;
    second.chunks.push_back({.tokens = next, .start_pos = 11, .block_table = table_a});
    second.chunks.push_back(
        {.tokens = other, .start_pos = 0, .block_table = table_b, .num_logits = 3});
    s = runner.Forward(second, &out);
    if (status != nullptr) *status = s;
    if (!s.ok()) return all;
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    return all;
  }

  static TinyModelDir* model_;
  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
};
TinyModelDir* MlpBackendTest::model_ = nullptr;

// Fails layer `fail_layer`'s call (once, or always), otherwise computes on the CPU.
class FaultyMlp final : public MlpBackend {
 public:
  FaultyMlp(std::shared_ptr<MlpBackend> inner, int fail_layer, bool always)
      : inner_(std::move(inner)), fail_layer_(fail_layer), always_(always) {}
  std::string_view name() const override { return "faulty"; }
  MlpShape shape() const override { return inner_->shape(); }
  absl::StatusOr<Handle> Submit(int layer, const float* x, int rows, float* out,
                                absl::Time deadline) override {
    if (layer == fail_layer_ && (always_ || !failed_)) {
      failed_ = true;
      return absl::UnavailableError("injected: shard gone");
    }
    return inner_->Submit(layer, x, rows, out, deadline);
  }
  absl::Status Wait(Handle h) override { return inner_->Wait(h); }
  int64_t resident_weight_bytes() const override { return 0; }
  MlpBackendStats stats() const override { return {}; }

 private:
  std::shared_ptr<MlpBackend> inner_;
  int fail_layer_;
  bool always_;
  bool failed_ = false;
};

// An asynchronous backend that computes at Wait, from the rows as they are then (so a runner
// that touched them before Wait computes wrong numbers), and counts what is in flight.
class DeferredMlp final : public MlpBackend {
 public:
  DeferredMlp(std::shared_ptr<const DenseMlpWeights> weights, int fail_layer = -1)
      : weights_(std::move(weights)), fail_layer_(fail_layer) {}
  std::string_view name() const override { return "deferred"; }
  MlpShape shape() const override { return weights_->shape; }
  bool asynchronous() const override { return true; }
  absl::StatusOr<Handle> Submit(int layer, const float* x, int rows, float* out,
                                absl::Time) override {
    calls_[next_] = {layer, x, rows, out};
    max_in_flight_ = std::max(max_in_flight_, static_cast<int>(calls_.size()));
    return next_++;
  }
  absl::Status Wait(Handle h) override {
    auto it = calls_.find(h);
    if (it == calls_.end()) return absl::InvalidArgumentError("unknown handle");
    const Call c = it->second;
    calls_.erase(it);
    if (c.layer == fail_layer_) return absl::UnavailableError("injected at Wait");
    DenseMlpForward(weights_->layer(c.layer), weights_->shape, c.x, c.rows, c.out, &scratch_);
    return absl::OkStatus();
  }
  int64_t resident_weight_bytes() const override { return weights_->bytes(); }
  MlpBackendStats stats() const override { return {}; }
  int in_flight() const { return static_cast<int>(calls_.size()); }
  int max_in_flight() const { return max_in_flight_; }

 private:
  struct Call {
    int layer;
    const float* x;
    int rows;
    float* out;
  };
  std::shared_ptr<const DenseMlpWeights> weights_;
  const int fail_layer_;
  std::map<Handle, Call> calls_;
  Handle next_ = 1;
  int max_in_flight_ = 0;
  std::vector<float> scratch_;
};

TEST_F(MlpBackendTest, PingPongMicroBatchesComputeWhatTheLocalPathDoes) {
  auto weights = LoadDenseMlpWeights(config_, *store_, *ParseLayerRange("all", config_));
  ASSERT_TRUE(weights.ok());
  auto shared = std::make_shared<const DenseMlpWeights>(*std::move(weights));
  auto deferred = std::make_shared<DeferredMlp>(shared);
  auto local = Runner(nullptr);
  auto offloaded = Runner(deferred);
  ASSERT_NE(local, nullptr);
  ASSERT_NE(offloaded, nullptr);
  const std::vector<float> a = Logits(*local);
  const std::vector<float> b = Logits(*offloaded);
  ASSERT_EQ(a.size(), b.size());
  // The second step's two chunks ran as two micro-batches: both MLPs were away at once.
  EXPECT_EQ(deferred->max_in_flight(), 2);
  EXPECT_EQ(deferred->in_flight(), 0);
  // Split GEMMs sum in another order: equal within float rounding.
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], 1e-4f * (1 + std::abs(a[i]))) << "logit " << i;
  }
  // A failure at one layer's Wait fails the step naming the layer, with nothing left waiting.
  auto failing = std::make_shared<DeferredMlp>(shared, /*fail_layer=*/2);
  auto runner = Runner(failing);
  absl::Status status;
  Logits(*runner, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("layer 2 MLP on the deferred backend"));
  EXPECT_EQ(failing->in_flight(), 0);
}

TEST_F(MlpBackendTest, MeasuredMicroBatchCountsTryBothThenKeepOne) {
  // mlp_micro_batches 0: the runner probes one and two micro-batches on its two-chunk steps
  // (three steps each), then keeps one; every step's logits stay the local path's.
  auto weights = LoadDenseMlpWeights(config_, *store_, *ParseLayerRange("all", config_));
  ASSERT_TRUE(weights.ok());
  auto shared = std::make_shared<const DenseMlpWeights>(*std::move(weights));
  auto deferred = std::make_shared<DeferredMlp>(shared);
  auto local = Runner(nullptr);
  auto offloaded = Runner(deferred, /*micro_batches=*/0);
  ASSERT_NE(local, nullptr);
  ASSERT_NE(offloaded, nullptr);
  const std::vector<float> a = Logits(*local);
  for (int i = 0; i < 8; ++i) {
    const std::vector<float> b = Logits(*offloaded);
    ASSERT_EQ(a.size(), b.size());
    for (size_t j = 0; j < a.size(); ++j) {
      ASSERT_NEAR(a[j], b[j], 1e-4f * (1 + std::abs(a[j]))) << "step " << i << " logit " << j;
    }
  }
  EXPECT_EQ(deferred->max_in_flight(), 2);  // two micro-batches were tried
  EXPECT_EQ(deferred->in_flight(), 0);
  // Out of range counts are refused at creation.
  auto w = LoadCpuWeights(config_, *store_, {.skip_mlp = true});
  ASSERT_TRUE(w.ok());
  CpuRunnerOptions o;
  o.num_blocks = 8;
  o.mlp = deferred;
  o.mlp_micro_batches = 17;
  EXPECT_EQ(CreateCpuModelRunner(config_, *std::move(w), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(MlpBackendTest, CpuBackendGivesTheLocalPathsBits) {
  auto local = Runner(nullptr);
  auto offloaded = Runner(Cpu());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(offloaded, nullptr);
  const std::vector<float> a = Logits(*local);
  const std::vector<float> b = Logits(*offloaded);
  ASSERT_EQ(a.size(), static_cast<size_t>(5 * config_.vocab_size));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST_F(MlpBackendTest, HostMlpEqualsItsDefinition) {
  // silu(x.G^T) * (x.U^T) . D^T in double precision, against DenseMlpForward.
  auto shape = ParseLayerRange("1:2", config_);
  ASSERT_TRUE(shape.ok());
  auto weights = LoadDenseMlpWeights(config_, *store_, *shape);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const int h = config_.hidden_size, n = config_.intermediate_size, rows = 3;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  std::vector<float> x(static_cast<size_t>(rows) * h), y(x.size()), scratch;
  for (float& v : x) v = dist(rng);
  DenseMlpForward(weights->layer(1), weights->shape, x.data(), rows, y.data(), &scratch);
  const DenseMlpLayer& w = weights->layer(1);
  for (int r = 0; r < rows; ++r) {
    std::vector<double> act(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      double g = 0, u = 0;
      for (int k = 0; k < h; ++k) {
        g += double{x[static_cast<size_t>(r) * h + k]} * w.gate_up[static_cast<size_t>(i) * h + k];
        u += double{x[static_cast<size_t>(r) * h + k]} *
             w.gate_up[static_cast<size_t>(n + i) * h + k];
      }
      act[static_cast<size_t>(i)] = g / (1 + std::exp(-g)) * u;
    }
    for (int j = 0; j < h; ++j) {
      double want = 0;
      for (int i = 0; i < n; ++i)
        want += act[static_cast<size_t>(i)] * w.down[static_cast<size_t>(j) * n + i];
      EXPECT_NEAR(y[static_cast<size_t>(r) * h + j], want, 1e-4 * (1 + std::abs(want)))
          << "row " << r << " col " << j;
    }
  }
}

TEST_F(MlpBackendTest, ABackendFailureFailsTheStepNamingTheLayerAndTheRunnerGoesOn) {
  auto runner = Runner(std::make_shared<FaultyMlp>(Cpu(), 1, /*always=*/false));
  ASSERT_NE(runner, nullptr);
  absl::Status status;
  Logits(*runner, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("layer 1 MLP on the faulty backend"));
  EXPECT_THAT(status.message(), HasSubstr("injected"));
  // The next steps (the fault was once) compute what the local runner does.
  auto local = Runner(nullptr);
  const std::vector<float> a = Logits(*local);
  const std::vector<float> b = Logits(*runner, &status);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST_F(MlpBackendTest, ARunnerRefusesABackendOfAnotherShape) {
  auto shape = ParseLayerRange("0:1", config_);
  ASSERT_TRUE(shape.ok());
  auto weights = LoadDenseMlpWeights(config_, *store_, *shape);
  ASSERT_TRUE(weights.ok());
  auto partial =
      std::make_shared<CpuMlpBackend>(std::make_shared<const DenseMlpWeights>(*std::move(weights)));
  auto w = LoadCpuWeights(config_, *store_, {.skip_mlp = true});
  ASSERT_TRUE(w.ok());
  CpuRunnerOptions o;
  o.num_blocks = 8;
  o.mlp = partial;
  auto runner = CreateCpuModelRunner(config_, *std::move(w), o);
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(runner.status().message(), HasSubstr("serves layers 0:1"));
  // And without a backend, weights without an MLP are refused.
  auto bare = LoadCpuWeights(config_, *store_, {.skip_mlp = true});
  ASSERT_TRUE(bare.ok());
  o.mlp = nullptr;
  EXPECT_EQ(CreateCpuModelRunner(config_, *std::move(bare), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(MlpBackendTest, CpuBackendContract) {
  std::shared_ptr<MlpBackend> cpu = Cpu();
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->shape().end_layer, config_.num_layers);
  EXPECT_GT(cpu->resident_weight_bytes(), 0);
  std::vector<float> x(static_cast<size_t>(config_.hidden_size), 0.5f), y(x.size());
  EXPECT_EQ(cpu->Submit(config_.num_layers, x.data(), 1, y.data(), absl::InfiniteFuture())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu->Submit(0, x.data(), 0, y.data(), absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto late = cpu->Submit(0, x.data(), 1, y.data(), absl::Now() - absl::Seconds(1));
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(cpu->Wait(*late).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(cpu->Wait(*late).code(), absl::StatusCode::kInvalidArgument);  // waited already
  // Two in flight, waited out of order.
  std::vector<float> y2(y.size());
  auto h1 = cpu->Submit(0, x.data(), 1, y.data(), absl::InfiniteFuture());
  auto h2 = cpu->Submit(1, x.data(), 1, y2.data(), absl::InfiniteFuture());
  ASSERT_TRUE(h1.ok() && h2.ok());
  EXPECT_TRUE(cpu->Wait(*h2).ok());
  EXPECT_TRUE(cpu->Wait(*h1).ok());
  EXPECT_NE(y, y2);
}

TEST_F(MlpBackendTest, RegistryNamesAndErrors) {
  MlpContext context;
  context.config = &config_;
  context.store = store_.get();
  auto local = CreateMlpBackend("local", context);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(*local, nullptr);
  auto unknown = CreateMlpBackend("gpu", context);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("local, cpu, cuda[:N], remote:"));
  for (const char* bad : {"cuda:", "cuda:x", "cudax", "cuda:-1"}) {
    EXPECT_EQ(CreateMlpBackend(bad, context).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  // No GPU here, or no CUDA in the build: a clean error either way (the GPU case runs in
  // runtime/mlp/cuda/mlp_backend_cuda_test.cc).
  if (!std::filesystem::exists("/dev/nvidiactl")) {
    EXPECT_FALSE(CreateMlpBackend("cuda", context).ok());
  }
  // The shard's compute backends over a layer range.
  auto range = ParseLayerRange("1:3", config_);
  ASSERT_TRUE(range.ok());
  auto cpu = CreateShardCompute("cpu", *range, config_, *store_);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->backend->shape().first_layer, 1);
  EXPECT_EQ(cpu->backend->shape().end_layer, 3);
  EXPECT_FALSE(cpu->attach);  // no GPU data plane on the CPU
  EXPECT_EQ(CreateShardCompute("tpu", *range, config_, *store_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateMlpBackend("cuda_ipc:", context).status().code(),
            absl::StatusCode::kInvalidArgument);
  // cuda_ipc is its own backend, not a malformed cuda:N.
  auto ipc = CreateMlpBackend("cuda_ipc:127.0.0.1:1", context);
  EXPECT_EQ(ipc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ipc.status().message(), HasSubstr("service credential"));
  EXPECT_EQ(CreateMlpBackend("remote:", context).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateMlpBackend("remote:nohostport", context).status().code(),
            absl::StatusCode::kInvalidArgument);
  // No credential for a remote backend: refused before dialing anything.
  EXPECT_EQ(CreateMlpBackend("remote:127.0.0.1:1", context).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLayerRange("3:1", config_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLayerRange("0:99", config_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLayerRange("x", config_).status().code(), absl::StatusCode::kInvalidArgument);
  auto all = ParseLayerRange("all", config_);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->end_layer, config_.num_layers);
}

}  // namespace
}  // namespace tandem::mlp

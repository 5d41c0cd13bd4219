// The `cuda` MLP backend against the `cpu` backend (the float32 host reference) on the tiny
// model's layers: every row within bf16 tolerance at decode and prefill row counts, and its
// argument and deadline errors. Skipped without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "runtime/base/float16.h"
#include "runtime/device/cuda/cuda_device.h"
#include "runtime/mlp/cpu_mlp_backend.h"
#include "runtime/mlp/cuda/cuda_mlp_backend.h"
#include "runtime/mlp/dense_mlp.h"
#include "runtime/mlp/tiny_model_for_test.h"

namespace tandem::mlp {
namespace {

class CudaMlpBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (count.ok() && *count > 0) model_ = new TinyModelDir("tandem-mlp-cuda", 5);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) GTEST_SKIP() << "no usable CUDA GPU: " << count.status();
    if (*count == 0) GTEST_SKIP() << "no CUDA GPU present (cudaGetDeviceCount = 0)";
    model_->Open(&config_, &store_);
    all_ = *ParseLayerRange("all", config_);
  }

  std::vector<float> Rows(int rows, uint32_t seed) {
    return RandomRows(rows, config_.hidden_size, seed);
  }

  static TinyModelDir* model_;
  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
  MlpShape all_;
};
TinyModelDir* CudaMlpBackendTest::model_ = nullptr;

TEST_F(CudaMlpBackendTest, MatchesTheCpuBackendWithinBf16Tolerance) {
  auto gpu = CreateCudaMlpBackend(config_, *store_, all_, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto weights = LoadDenseMlpWeights(config_, *store_, all_);
  ASSERT_TRUE(weights.ok()) << weights.status();
  CpuMlpBackend cpu(std::make_shared<const DenseMlpWeights>(*std::move(weights)));
  const int hidden = config_.hidden_size;
  double worst = 0;
  // Decode sizes (the GEMV and skinny paths), then prefill sizes (cuBLASLt), growing the
  // workspace past its first 64 rows.
  for (int rows : {1, 2, 5, 8, 17, 64, 129, 300}) {
    for (int layer = 0; layer < config_.num_layers; ++layer) {
      const std::vector<float> x = Rows(rows, static_cast<uint32_t>(rows * 100 + layer));
      std::vector<float> want(x.size()), got(x.size());
      ASSERT_TRUE(cpu.Run(layer, x.data(), rows, want.data(), absl::InfiniteFuture()).ok());
      const absl::Status s = (*gpu)->Run(layer, x.data(), rows, got.data(), absl::InfiniteFuture());
      ASSERT_TRUE(s.ok()) << s;
      for (int r = 0; r < rows; ++r) {
        double scale = 1e-6, err = 0;
        for (int i = 0; i < hidden; ++i) {
          const size_t at = static_cast<size_t>(r) * hidden + i;
          scale = std::max(scale, std::fabs(static_cast<double>(want[at])));
          err = std::max(err, std::fabs(static_cast<double>(want[at]) - got[at]));
        }
        worst = std::max(worst, err / scale);
        ASSERT_LE(err / scale, 0.03) << rows << " rows, layer " << layer << ", row " << r;
      }
    }
  }
  std::printf("cuda MLP against cpu: worst row error %.4f of the row's scale\n", worst);
  EXPECT_EQ((*gpu)->stats().calls, 8 * config_.num_layers);
  EXPECT_EQ((*gpu)->resident_weight_bytes(), 0);
}

// The device path (bf16 rows in GPU memory, queued on the caller's stream) gives the bits of the
// host path, which rounds its float32 rows to bf16 first.
TEST_F(CudaMlpBackendTest, DevicePathGivesTheHostPathsBits) {
  auto gpu = CreateCudaMlpBackend(config_, *store_, all_, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_TRUE((*gpu)->SupportsDevice(0));
  EXPECT_FALSE((*gpu)->SupportsDevice(1));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (int rows : {1, 9, 100}) {
    std::vector<float> x = Rows(rows, static_cast<uint32_t>(rows));
    const size_t n = x.size();
    std::vector<uint16_t> xb(n), yb(n);
    for (size_t i = 0; i < n; ++i) {
      xb[i] = FloatToBf16(x[i]);
      x[i] = Bf16ToFloat(xb[i]);
    }
    std::vector<float> host(n);
    ASSERT_TRUE((*gpu)->Run(1, x.data(), rows, host.data(), absl::InfiniteFuture()).ok());
    void* dx = nullptr;
    void* dy = nullptr;
    ASSERT_EQ(cudaMalloc(&dx, n * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, n * 2), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dx, xb.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    const absl::Status s = (*gpu)->EnqueueOnDevice(1, dx, rows, dy, stream, absl::InfiniteFuture());
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(cudaMemcpyAsync(yb.data(), dy, n * 2, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bf16ToFloat(yb[i]), host[i]) << rows << " rows, element " << i;
    }
    cudaFree(dx);
    cudaFree(dy);
  }
  EXPECT_EQ(
      (*gpu)
          ->EnqueueOnDevice(config_.num_layers, nullptr, 1, nullptr, stream, absl::InfiniteFuture())
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*gpu)->EnqueueOnDevice(0, nullptr, 1, nullptr, stream, absl::InfinitePast()).code(),
            absl::StatusCode::kDeadlineExceeded);
  cudaStreamDestroy(stream);
}

TEST_F(CudaMlpBackendTest, BadCallsAreRefusedAndLateOnesComputeNothing) {
  auto gpu = CreateCudaMlpBackend(config_, *store_, all_, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<float> x = Rows(2, 1), y(x.size(), 7.0f);
  EXPECT_EQ((*gpu)
                ->Submit(config_.num_layers, x.data(), 2, y.data(), absl::InfiniteFuture())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*gpu)->Submit(0, x.data(), 0, y.data(), absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto late = (*gpu)->Submit(0, x.data(), 2, y.data(), absl::InfinitePast());
  ASSERT_TRUE(late.ok());
  EXPECT_EQ((*gpu)->Wait(*late).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(y[0], 7.0f);                                                      // untouched
  EXPECT_EQ((*gpu)->Wait(*late).code(), absl::StatusCode::kInvalidArgument);  // waited already
}

TEST_F(CudaMlpBackendTest, CreationFailsCleanly) {
  auto missing_gpu = CreateCudaMlpBackend(config_, *store_, all_, 4096);
  EXPECT_EQ(missing_gpu.status().code(), absl::StatusCode::kNotFound) << missing_gpu.status();
  MlpShape wrong = all_;
  wrong.intermediate_size += 1;
  EXPECT_EQ(CreateCudaMlpBackend(config_, *store_, wrong, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  MlpShape past = all_;
  past.end_layer = config_.num_layers + 1;
  EXPECT_EQ(CreateCudaMlpBackend(config_, *store_, past, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::mlp

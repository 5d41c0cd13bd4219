// GPU differential test of the cluster GEMM (cluster_gemm.h) against a float64 CPU dot product
// over the same bf16 inputs: the Llama-3-8B decode projections it is planned for (QKV, O, down) at
// 33-64 rows and small odd shapes (n not a multiple of the tile, k of two stages, m of 1-64,
// including every m % 16), with every valid plan (64-256-row tiles x 1, 2, 4 or 8 splits), bias
// and float32 output. Also: the default plans of those shapes exist and fit one wave, repeated
// launches are bit-identical, bad plans and shapes are errors. Skipped without a compute
// capability 9.0 GPU (the kernel is sm_90a code).
// Tolerance per element as in skinny_gemm_cuda_test: kAccTol * sum_k |x w| (float32 accumulation;
// a dropped or repeated k16 slice moves the result by ~4 |x w|) plus one bf16 rounding.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/float16.h"
#include "runtime/kernels/cuda/cluster_gemm.h"
#include "runtime/kernels/cuda/cuda_kernel_test_util.h"

namespace tandem {
namespace {

using testing_util::CudaKernelTest;
using testing_util::FastRng;
using testing_util::RandomBf16;
using testing_util::RowsToCheck;

constexpr double kAccTol = 3e-5;
constexpr double kBf16RoundRel = 1.0 / 256;
constexpr int kMaxCheckedRows = 512;
constexpr int kMaxM = cuda::kClusterGemmMaxRows;

class ClusterGemmCudaTest : public CudaKernelTest {
 protected:
  void SetUp() override {
    CudaKernelTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!cuda::ClusterGemmRunsHere()) GTEST_SKIP() << "needs compute capability 9.0";
    capacity_ = cuda::ClusterGemmCapacityHere();
    ASSERT_GT(capacity_.For(1), 0);
    ASSERT_GT(capacity_.For(2), 0);
    ASSERT_GT(capacity_.For(4), 0);
    std::printf("clusters held at once: %d x1, %d x2, %d x4, %d x8\n", capacity_.For(1),
                capacity_.For(2), capacity_.For(4), capacity_.For(8));
  }
  // Queues out = x [m, k] . w [n, k]^T (+ bias) with `plan` and `stages`.
  absl::Status Launch(const DeviceBuffer& x, const DeviceBuffer& w, const DeviceBuffer& out, int m,
                      int n, int k, const cuda::ClusterGemmPlan& plan, int stages = 0,
                      const void* bias = nullptr, bool out_f32 = false) {
    cuda::ClusterGemmArgs a;
    a.x = x.data;
    a.w = w.data;
    a.bias = bias;
    a.out = out.data;
    a.out_f32 = out_f32;
    a.m = m;
    a.n = n;
    a.k = k;
    a.stages = stages;
    return cuda::LaunchClusterGemm(a, plan, stream());
  }
  // The bf16 output bits of one such launch (empty, and a test failure, when it fails).
  std::vector<uint16_t> Bits(const DeviceBuffer& x, const DeviceBuffer& w, const DeviceBuffer& out,
                             int m, int n, int k, const cuda::ClusterGemmPlan& plan,
                             int stages = 0) {
    const absl::Status st = Launch(x, w, out, m, n, k, plan, stages);
    EXPECT_TRUE(st.ok()) << st;
    return st.ok() ? Download<uint16_t>(out, static_cast<size_t>(m) * n) : std::vector<uint16_t>{};
  }
  cuda::ClusterGemmCapacity capacity_;
};

struct Shape {
  int n, k;
  std::vector<int> ms;
  bool every_plan;  // all valid plans, or the default plan only
};

TEST_F(ClusterGemmCudaTest, MatchesCpuReference) {
  const std::vector<int> all_ms = {1, 5, 16, 17, 33, 48, 63, 64};
  const std::vector<Shape> shapes = {
      {96, 256, all_ms, true},    // one partial 128-row tile, 2 stages per split at 2 splits
      {200, 1024, all_ms, true},  // n % 64 != 0
      {512, 128, {7, 64}, true},  // k of two stages: one split only
      {4096, 4096, {33, 64}, true},
      {6144, 4096, {48, 64}, true},  // no default plan fills the SMs: every plan
      {4096, 14336, {40, 64}, false},
  };
  int launches = 0;
  for (const Shape& s : shapes) {
    FastRng rng(static_cast<uint64_t>(s.n) * 7 + s.k);
    const std::vector<uint16_t> w =
        RandomBf16(static_cast<size_t>(s.n) * s.k, 1.0f / std::sqrt(static_cast<float>(s.k)), rng);
    const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(kMaxM) * s.k, 1.0f, rng);
    const std::vector<uint16_t> bias = RandomBf16(s.n, 1.0f, rng);
    const std::vector<float> wf = testing_util::Bf16ToFloats(w);
    const std::vector<float> xf = testing_util::Bf16ToFloats(x);
    const DeviceBuffer d_w = Upload(w);
    const DeviceBuffer d_bias = Upload(bias);
    const std::vector<int> rows = RowsToCheck(s.n, kMaxCheckedRows);
    const int max_m = *std::max_element(s.ms.begin(), s.ms.end());
    std::vector<double> dot(static_cast<size_t>(max_m) * rows.size());
    std::vector<double> mag(dot.size());
    for (int i = 0; i < max_m; ++i) {
      for (size_t j = 0; j < rows.size(); ++j) {
        const float* xr = &xf[static_cast<size_t>(i) * s.k];
        const float* wr = &wf[static_cast<size_t>(rows[j]) * s.k];
        double acc = 0.0, abs_acc = 0.0;
        for (int kk = 0; kk < s.k; ++kk) {
          const double p = static_cast<double>(xr[kk]) * wr[kk];
          acc += p;
          abs_acc += std::fabs(p);
        }
        dot[static_cast<size_t>(i) * rows.size() + j] = acc;
        mag[static_cast<size_t>(i) * rows.size() + j] = abs_acc;
      }
    }
    std::vector<cuda::ClusterGemmPlan> plans;
    if (s.every_plan) {
      for (const int splits : {1, 2, 4, 8}) {
        for (const int tile : {64, 128, 192, 256}) {
          const cuda::ClusterGemmPlan p = cuda::MakeClusterGemmPlan(s.n, s.k, tile, splits);
          if (p.ok()) plans.push_back(p);
        }
      }
    } else {
      const cuda::ClusterGemmPlan p = cuda::PlanClusterGemm(s.n, s.k, capacity_);
      ASSERT_TRUE(p.ok()) << "no default plan for n=" << s.n << " k=" << s.k;
      EXPECT_LE(p.tiles, capacity_.For(p.splits)) << "the default plan must be one wave";
      plans.push_back(p);
    }
    for (const int m : s.ms) {
      // The activations of exactly m rows (the kernel must not read past them).
      const DeviceBuffer d_x =
          Upload(std::vector<uint16_t>(x.begin(), x.begin() + static_cast<size_t>(m) * s.k));
      for (const cuda::ClusterGemmPlan& plan : plans) {
        for (const int variant : {0, 1, 2}) {  // bf16 out, bf16 out + bias, float32 out
          const bool with_bias = variant == 1;
          const bool out_f32 = variant == 2;
          const std::string what = absl::StrCat(
              "m=", m, " n=", s.n, " k=", s.k, with_bias ? " bias" : "", out_f32 ? " f32" : "",
              " (", plan.tile_rows, "-row tiles x ", plan.splits, " splits)");
          SCOPED_TRACE(what);
          const size_t out_elems = static_cast<size_t>(m) * s.n;
          const DeviceBuffer d_out = PoisonedOutput(out_elems, out_f32);
          const absl::Status st = Launch(d_x, d_w, d_out, m, s.n, s.k, plan, 0,
                                         with_bias ? d_bias.data : nullptr, out_f32);
          ASSERT_TRUE(st.ok()) << what << ": " << st;
          ++launches;
          const std::vector<float> got = DownloadOutput(d_out, out_elems, out_f32, what);
          int64_t bad = 0;
          double max_ratio = 0.0;
          std::string first;
          for (int i = 0; i < m; ++i) {
            for (size_t j = 0; j < rows.size(); ++j) {
              const int r = rows[j];
              const size_t at = static_cast<size_t>(i) * rows.size() + j;
              const double ref = dot[at] + (with_bias ? Bf16ToFloat(bias[r]) : 0.0);
              const double tol = kAccTol * (mag[at] + (with_bias ? 1.0 : 0.0)) +
                                 (out_f32 ? 0.0 : kBf16RoundRel * std::fabs(ref)) + 1e-6;
              const double g = got[static_cast<size_t>(i) * s.n + r];
              const double err = std::fabs(g - ref);
              max_ratio = std::max(max_ratio, err / tol);
              if (!(err <= tol) && bad++ < 5) {
                first += absl::StrCat(" [m=", i, " n=", r, "] got ", g, " ref ", ref, ";");
              }
            }
          }
          EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << m * rows.size()
                            << " checked outputs outside tolerance; max err/tol=" << max_ratio
                            << "; first:" << first;
          if (m == max_m && variant == 0) {
            std::printf("%s: checked %zu rows, max err/tol=%.3g\n", what.c_str(), rows.size(),
                        max_ratio);
          }
        }
      }
    }
    FreeAll();
  }
  EXPECT_GT(launches, 300);
}

TEST_F(ClusterGemmCudaTest, RepeatedLaunchesAreBitIdentical) {
  constexpr int kM = 64, kN = 4096, kK = 14336;
  FastRng rng(99);
  const DeviceBuffer d_w = Upload(RandomBf16(static_cast<size_t>(kN) * kK, 0.02f, rng));
  const DeviceBuffer d_x = Upload(RandomBf16(static_cast<size_t>(kM) * kK, 1.0f, rng));
  const DeviceBuffer d_out = Alloc(static_cast<size_t>(kM) * kN * 2);
  for (const int splits : {2, 4, 8}) {
    const cuda::ClusterGemmPlan plan = cuda::MakeClusterGemmPlan(kN, kK, 128, splits);
    ASSERT_TRUE(plan.ok());
    std::vector<uint16_t> first;
    for (int rep = 0; rep < 4; ++rep) {
      const std::vector<uint16_t> bits = Bits(d_x, d_w, d_out, kM, kN, kK, plan);
      ASSERT_FALSE(bits.empty());
      if (rep == 0) {
        first = bits;
      } else {
        ASSERT_EQ(bits, first) << splits << " splits: launch " << rep << " differs";
      }
    }
  }
}

// The ring depth changes when stages land, not the summation order: every depth gives the bits of
// the deepest ring, with one split and with a cluster's split-K.
TEST_F(ClusterGemmCudaTest, AnyStageCountGivesTheSameBits) {
  constexpr int kM = 48, kN = 1024, kK = 2048;
  FastRng rng(7);
  const DeviceBuffer d_w = Upload(RandomBf16(static_cast<size_t>(kN) * kK, 0.02f, rng));
  const DeviceBuffer d_x = Upload(RandomBf16(static_cast<size_t>(kM) * kK, 1.0f, rng));
  const DeviceBuffer d_out = Alloc(static_cast<size_t>(kM) * kN * 2);
  for (const auto& [tile, splits] : {std::pair{64, 1}, {128, 2}, {256, 4}}) {
    const cuda::ClusterGemmPlan plan = cuda::MakeClusterGemmPlan(kN, kK, tile, splits);
    ASSERT_TRUE(plan.ok());
    std::vector<uint16_t> first;
    for (const int stages : {0, 2, 3, 5, 8, 16}) {
      const std::vector<uint16_t> bits = Bits(d_x, d_w, d_out, kM, kN, kK, plan, stages);
      ASSERT_FALSE(bits.empty()) << stages << " stages";
      if (stages == 0) {
        first = bits;
      } else {
        ASSERT_EQ(bits, first) << tile << "x" << splits << ": " << stages << " stages differ";
      }
    }
  }
}

TEST_F(ClusterGemmCudaTest, BadPlansAndShapesAreErrors) {
  const DeviceBuffer d_w = Alloc(size_t{1024} * 512 * 2);
  const DeviceBuffer d_x = Alloc(size_t{64} * 512 * 2);
  const DeviceBuffer d_out = Alloc(size_t{64} * 1024 * 4);
  cuda::ClusterGemmArgs a;
  a.x = d_x.data;
  a.w = d_w.data;
  a.out = d_out.data;
  a.m = 64;
  a.n = 1024;
  a.k = 512;
  const cuda::ClusterGemmPlan good = cuda::MakeClusterGemmPlan(1024, 512, 128, 2);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(cuda::LaunchClusterGemm(a, good, stream()).ok());
  // A plan made for another shape, no plan, a bad m, n, k or alignment.
  EXPECT_EQ(
      cuda::LaunchClusterGemm(a, cuda::MakeClusterGemmPlan(2048, 512, 128, 2), stream()).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::LaunchClusterGemm(a, cuda::ClusterGemmPlan{}, stream()).code(),
            absl::StatusCode::kInvalidArgument);
  for (const auto& bad : std::vector<std::pair<int, int>>{{65, 512}, {-1, 512}, {64, 500}}) {
    cuda::ClusterGemmArgs b = a;
    b.m = bad.first;
    b.k = bad.second;
    EXPECT_EQ(cuda::LaunchClusterGemm(b, good, stream()).code(), absl::StatusCode::kInvalidArgument)
        << "m=" << bad.first << " k=" << bad.second;
  }
  cuda::ClusterGemmArgs c = a;
  c.stages = 1;
  EXPECT_EQ(cuda::LaunchClusterGemm(c, good, stream()).code(), absl::StatusCode::kInvalidArgument);
  c = a;
  c.n = 1020;
  EXPECT_EQ(cuda::LaunchClusterGemm(c, good, stream()).code(), absl::StatusCode::kInvalidArgument);
  c = a;
  c.x = static_cast<const char*>(a.x) + 8;
  EXPECT_EQ(cuda::LaunchClusterGemm(c, good, stream()).code(), absl::StatusCode::kInvalidArgument);
  FreeAll();
}

}  // namespace
}  // namespace tandem

// Differential test of the CUDA fused residual-add + RMSNorm against the CPU reference
// (tandem::cpu::RmsNorm) applied to the same bf16-rounded inputs. Skipped without a GPU.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "runtime/base/float16.h"
#include "runtime/device/cuda/cuda_device.h"
#include "runtime/device/device.h"
#include "runtime/device/device_factory.h"
#include "runtime/kernels/cpu_ops.h"
#include "runtime/kernels/cuda/norm_kernels.h"

namespace tandem {
namespace {

constexpr float kEps = 1e-5f;
constexpr uint16_t kPoison = 0xffff;  // a bf16 NaN: any element the kernel does not write fails

std::vector<uint16_t> RandomBf16(size_t n, float mean, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = FloatToBf16(dist(rng));
  return v;
}

std::vector<float> ToFloat(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = Bf16ToFloat(v[i]);
  return f;
}

class RmsNormCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) GTEST_SKIP() << "no usable CUDA GPU: " << count.status();
    if (*count == 0) GTEST_SKIP() << "no CUDA GPU present (cudaGetDeviceCount = 0)";
    absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice("cuda");
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    absl::StatusOr<Stream> stream = device_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *stream;
  }

  DeviceBuffer Upload(const std::vector<uint16_t>& host) {
    absl::StatusOr<DeviceBuffer> buffer = device_->Allocate(host.size() * 2);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    if (!buffer.ok()) return {};
    EXPECT_TRUE(device_->CopyHostToDevice(host.data(), host.size() * 2, *buffer, 0, stream_).ok());
    return *buffer;
  }

  std::vector<uint16_t> Download(const DeviceBuffer& buffer, size_t n) {
    std::vector<uint16_t> host(n);
    EXPECT_TRUE(device_->CopyDeviceToHost(buffer, 0, n * 2, host.data(), stream_).ok());
    EXPECT_TRUE(device_->SynchronizeStream(stream_).ok());
    return host;
  }

  // Runs one case on fresh random inputs and checks it against the CPU reference.
  // `in_place`: out is the x buffer. `byte_offset`: the arrays start this many bytes into their
  // buffers (2 makes them misaligned for 16-byte loads).
  void RunCase(int rows, int dim, bool with_residual, bool in_place, size_t byte_offset) {
    const unsigned seed = std::random_device{}();
    SCOPED_TRACE(::testing::Message()
                 << "rows=" << rows << " dim=" << dim << " residual=" << with_residual
                 << " in_place=" << in_place << " offset=" << byte_offset << " seed=" << seed);
    std::mt19937 rng(seed);
    const size_t n = static_cast<size_t>(rows) * dim;
    const size_t pad = byte_offset / 2;
    std::vector<uint16_t> x = RandomBf16(n + pad, 0.0f, 1.0f, rng);
    std::vector<uint16_t> residual = RandomBf16(n + pad, 0.0f, 3.0f, rng);
    std::vector<uint16_t> weight = RandomBf16(dim + pad, 1.0f, 0.5f, rng);

    // Reference on the bf16-rounded inputs: h = bf16(x + residual) (or x), out = RmsNorm(h) * w.
    std::vector<uint16_t> expected_residual(n);
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) {
      const float xf = Bf16ToFloat(x[pad + i]);
      if (with_residual) {
        expected_residual[i] = FloatToBf16(xf + Bf16ToFloat(residual[pad + i]));
        h[i] = Bf16ToFloat(expected_residual[i]);
      } else {
        h[i] = xf;
      }
    }
    const std::vector<float> w = ToFloat(std::vector<uint16_t>(weight.begin() + pad, weight.end()));
    std::vector<float> ref(n);
    cpu::RmsNorm(h.data(), w.data(), rows, dim, kEps, ref.data());

    DeviceBuffer x_buf = Upload(x);
    DeviceBuffer residual_buf = Upload(residual);
    DeviceBuffer weight_buf = Upload(weight);
    DeviceBuffer out_buf = in_place ? x_buf : Upload(std::vector<uint16_t>(n + pad, kPoison));
    ASSERT_FALSE(::testing::Test::HasFailure());

    cuda::RmsNormArgs args;
    args.x = static_cast<const char*>(x_buf.data) + byte_offset;
    args.residual = with_residual ? static_cast<char*>(residual_buf.data) + byte_offset : nullptr;
    args.weight = static_cast<const char*>(weight_buf.data) + byte_offset;
    args.out = static_cast<char*>(out_buf.data) + byte_offset;
    args.rows = rows;
    args.dim = dim;
    args.eps = kEps;
    ASSERT_TRUE(cuda::LaunchRmsNorm(args, stream_.native).ok());

    const std::vector<uint16_t> out = Download(out_buf, n + pad);
    const std::vector<uint16_t> residual_after = Download(residual_buf, n + pad);

    double max_abs_err = 0.0, max_ulp_err = 0.0, err2 = 0.0, ref2 = 0.0;
    int64_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const float got = Bf16ToFloat(out[pad + i]);
      const double err = std::fabs(static_cast<double>(got) - ref[i]);
      // One bf16 ulp of the reference's magnitude (8 significant bits) plus a small absolute term
      // for float32 accumulation-order differences on values near zero.
      const double ulp = std::ldexp(1.0, std::ilogb(std::fmax(std::fabs(ref[i]), 1e-30f)) - 7);
      if (!(err <= ulp + 1e-5)) {
        if (bad++ < 5) ADD_FAILURE() << "out[" << i << "] = " << got << ", reference " << ref[i];
      }
      max_abs_err = std::fmax(max_abs_err, err);
      max_ulp_err = std::fmax(max_ulp_err, err / ulp);
      err2 += err * err;
      ref2 += static_cast<double>(ref[i]) * ref[i];
    }
    EXPECT_EQ(bad, 0) << "elements outside tolerance";
    const double rel_l2 = std::sqrt(err2 / std::fmax(ref2, 1e-30));
    EXPECT_LT(rel_l2, 1e-2);
    if (with_residual) {
      int64_t residual_mismatches = 0;
      for (size_t i = 0; i < n; ++i)
        residual_mismatches += residual_after[pad + i] != expected_residual[i];
      EXPECT_EQ(residual_mismatches, 0) << "residual must be bf16(x + residual), bit for bit";
    } else {
      EXPECT_EQ(std::memcmp(residual_after.data(), residual.data(), residual.size() * 2), 0)
          << "residual must be untouched when not given";
    }
    std::printf(
        "rmsnorm rows=%d dim=%d residual=%d in_place=%d offset=%zu: max_abs_err=%.3g "
        "max_err=%.3g ulp rel_l2=%.3g\n",
        rows, dim, with_residual, in_place, byte_offset, max_abs_err, max_ulp_err, rel_l2);

    for (DeviceBuffer* b : {&x_buf, &residual_buf, &weight_buf}) {
      EXPECT_TRUE(device_->Free(*b).ok());
    }
    if (!in_place) {
      EXPECT_TRUE(device_->Free(out_buf).ok());
    }
  }

  std::unique_ptr<Device> device_;
  Stream stream_;
};

class RmsNormShapeTest : public RmsNormCudaTest,
                         public ::testing::WithParamInterface<std::tuple<int, int, bool>> {};

TEST_P(RmsNormShapeTest, MatchesCpuReference) {
  const auto [rows, dim, with_residual] = GetParam();
  RunCase(rows, dim, with_residual, /*in_place=*/false, /*byte_offset=*/0);
}

// Dims: model sizes (vectorized, rows in registers), 16384 (8 packs a thread), 24576 (vectorized
// two-pass loop), 77 and 3000 (not multiples of 8: scalar, then scalar loop). Odd row counts.
INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormShapeTest,
                         ::testing::Combine(::testing::Values(1, 7, 129),
                                            ::testing::Values(64, 2048, 4096, 5120, 16384, 24576,
                                                              77, 3000),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return "rows" + std::to_string(std::get<0>(info.param)) + "_dim" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_residual" : "_plain");
                         });

TEST_F(RmsNormCudaTest, InPlaceOutputOverX) {
  RunCase(33, 4096, /*with_residual=*/true, /*in_place=*/true, 0);
  RunCase(33, 4096, /*with_residual=*/false, /*in_place=*/true, 0);
}

TEST_F(RmsNormCudaTest, MisalignedArraysTakeScalarPath) {
  RunCase(17, 2048, /*with_residual=*/true, /*in_place=*/false, /*byte_offset=*/2);
}

TEST_F(RmsNormCudaTest, ManyRows) { RunCase(2049, 4096, /*with_residual=*/true, false, 0); }

// Argument checks happen before any CUDA call, so these need no GPU.
TEST(RmsNormArgsTest, RejectsBadArguments) {
  uint16_t dummy[8] = {};
  cuda::RmsNormArgs args;
  args.x = dummy;
  args.weight = dummy;
  args.out = dummy;
  args.rows = 1;
  args.dim = 0;
  EXPECT_EQ(cuda::LaunchRmsNorm(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.dim = 8;
  args.rows = -1;
  EXPECT_EQ(cuda::LaunchRmsNorm(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.rows = 1;
  args.eps = 0.0f;
  EXPECT_EQ(cuda::LaunchRmsNorm(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.eps = NAN;
  EXPECT_EQ(cuda::LaunchRmsNorm(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.eps = 1e-6f;
  args.weight = nullptr;
  EXPECT_EQ(cuda::LaunchRmsNorm(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.weight = dummy;
  args.rows = 0;
  EXPECT_TRUE(cuda::LaunchRmsNorm(args, nullptr).ok()) << "zero rows queue nothing";
}

}  // namespace
}  // namespace tandem

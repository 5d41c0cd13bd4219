#pragma once
// Test-only helpers for the GPU differential tests of tandem_kernels_cuda: a fixture that skips
// without a GPU and owns its device buffers, fast random bf16 data, and an element-wise comparison
// that reports max absolute/relative error and the first mismatches. Not thread-safe (one test).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/float16.h"
#include "runtime/device/cuda/cuda_device.h"
#include "runtime/device/device.h"
#include "runtime/device/device_factory.h"

namespace tandem::testing_util {

constexpr uint16_t kBf16Poison = 0xffff;  // a bf16 NaN: an element a kernel fails to write fails

// xorshift64*: fast enough to fill hundreds of MB of test KV, deterministic per seed.
class FastRng {
 public:
  explicit FastRng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t Next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
  }
  // Uniform in [lo, hi).
  float Uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f);
  }
  int UniformInt(int lo, int hi_inclusive) {
    return lo + static_cast<int>(Next() % static_cast<uint64_t>(hi_inclusive - lo + 1));
  }

 private:
  uint64_t state_;
};

// Uniform in [-a, a) with a = sqrt(3) * stddev (so the given standard deviation), bf16-rounded.
inline std::vector<uint16_t> RandomBf16(size_t n, float stddev, FastRng& rng) {
  const float a = 1.7320508f * stddev;
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = FloatToBf16(rng.Uniform(-a, a));
  return v;
}

inline std::vector<float> Bf16ToFloats(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = Bf16ToFloat(v[i]);
  return f;
}

// Output rows (features) a differential test checks against its CPU reference: all of them up to
// max_rows, otherwise the first and last max_rows / 8 and every stride-th row between (about
// max_rows in all), so edges and tiles everywhere in a large matrix are covered.
inline std::vector<int> RowsToCheck(int n, int max_rows) {
  std::vector<int> rows;
  if (n <= max_rows) {
    for (int r = 0; r < n; ++r) rows.push_back(r);
    return rows;
  }
  const int edge = max_rows / 8;
  const int stride = n / (max_rows - 2 * edge) + 1;
  for (int r = 0; r < n; ++r) {
    if (r < edge || r >= n - edge || r % stride == 0) rows.push_back(r);
  }
  return rows;
}

struct CompareResult {
  double max_abs = 0.0;
  double max_rel = 0.0;  // over elements with |ref| > atol
  double rel_l2 = 0.0;   // ||got - ref|| / ||ref||
  int64_t bad = 0;
};

// Checks |got[i] - ref[i]| <= atol + rtol * |ref[i]| for every i (NaN fails), and the relative
// L2 error against max_rel_l2. Adds a failure naming `what`, the error statistics and the first
// few mismatches.
inline CompareResult ExpectClose(const std::vector<float>& got, const std::vector<float>& ref,
                                 double atol, double rtol, double max_rel_l2,
                                 const std::string& what) {
  CompareResult r;
  EXPECT_EQ(got.size(), ref.size()) << what;
  std::string first;
  double err2 = 0.0, ref2 = 0.0;
  const size_t n = std::min(got.size(), ref.size());
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double mag = std::fabs(static_cast<double>(ref[i]));
    if (!(err <= atol + rtol * mag)) {
      if (r.bad++ < 5) {
        first += " [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " ref " +
                 std::to_string(ref[i]) + ";";
      }
    }
    if (std::isnan(err)) {
      r.max_abs = NAN;
    } else {
      r.max_abs = std::max(r.max_abs, err);
      if (mag > atol) r.max_rel = std::max(r.max_rel, err / mag);
      err2 += err * err;
    }
    ref2 += mag * mag;
  }
  r.rel_l2 = std::sqrt(err2 / std::max(ref2, 1e-30));
  EXPECT_EQ(r.bad, 0) << what << ": " << r.bad << " of " << n << " elements outside atol=" << atol
                      << " rtol=" << rtol << "; max_abs_err=" << r.max_abs
                      << " max_rel_err=" << r.max_rel << " rel_l2=" << r.rel_l2
                      << "; first:" << first;
  EXPECT_LE(r.rel_l2, max_rel_l2) << what
                                  << ": relative L2 error too large; max_abs_err=" << r.max_abs
                                  << " max_rel_err=" << r.max_rel;
  std::printf("%s: max_abs_err=%.3g max_rel_err=%.3g rel_l2=%.3g\n", what.c_str(), r.max_abs,
              r.max_rel, r.rel_l2);
  return r;
}

// Skips without a usable GPU; allocations made through it are freed at TearDown.
class CudaKernelTest : public ::testing::Test {
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

  void TearDown() override {
    if (device_ == nullptr) return;
    EXPECT_TRUE(device_->SynchronizeStream(stream_).ok());
    for (const DeviceBuffer& b : buffers_) EXPECT_TRUE(device_->Free(b).ok());
    buffers_.clear();
  }

  // Frees every buffer so far (between cases of one test, to bound memory).
  void FreeAll() {
    EXPECT_TRUE(device_->SynchronizeStream(stream_).ok());
    for (const DeviceBuffer& b : buffers_) EXPECT_TRUE(device_->Free(b).ok());
    buffers_.clear();
  }

  DeviceBuffer Alloc(size_t bytes) {
    absl::StatusOr<DeviceBuffer> b = device_->Allocate(std::max<size_t>(bytes, 16));
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return {};
    buffers_.push_back(*b);
    return *b;
  }

  template <typename T>
  DeviceBuffer Upload(const std::vector<T>& host) {
    DeviceBuffer b = Alloc(host.size() * sizeof(T));
    if (b.data != nullptr) {
      EXPECT_TRUE(
          device_->CopyHostToDevice(host.data(), host.size() * sizeof(T), b, 0, stream_).ok());
    }
    return b;
  }

  template <typename T>
  std::vector<T> Download(const DeviceBuffer& b, size_t n) {
    std::vector<T> host(n);
    EXPECT_TRUE(device_->CopyDeviceToHost(b, 0, n * sizeof(T), host.data(), stream_).ok());
    EXPECT_TRUE(device_->SynchronizeStream(stream_).ok());
    return host;
  }

  void* stream() const { return stream_.native; }

  // An output buffer of `elems` bf16 or float32 values, every one NaN (kBf16Poison bytes), so an
  // element a kernel fails to write fails the comparison.
  DeviceBuffer PoisonedOutput(size_t elems, bool f32) {
    return Upload(std::vector<uint16_t>(elems * (f32 ? 2 : 1), kBf16Poison));
  }

  // `elems` bf16 or float32 outputs as floats; adds a failure naming `what` if any is not finite
  // (unwritten, i.e. still poisoned, or a NaN/inf result).
  std::vector<float> DownloadOutput(const DeviceBuffer& b, size_t elems, bool f32,
                                    const std::string& what) {
    std::vector<float> got(elems);
    if (f32) {
      got = Download<float>(b, elems);
    } else {
      const std::vector<uint16_t> bits = Download<uint16_t>(b, elems);
      for (size_t i = 0; i < elems; ++i) got[i] = Bf16ToFloat(bits[i]);
    }
    int64_t non_finite = 0;
    for (const float g : got) non_finite += !std::isfinite(g);
    EXPECT_EQ(non_finite, 0) << what << ": unwritten (poisoned) or non-finite outputs";
    return got;
  }

  std::unique_ptr<Device> device_;
  Stream stream_;
  std::vector<DeviceBuffer> buffers_;
};

}  // namespace tandem::testing_util

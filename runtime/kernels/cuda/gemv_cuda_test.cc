// GPU differential test of the small-M GEMV (gemv_kernels.h) against a float64 CPU dot product
// over the same bf16-rounded inputs, at the decode projection shapes of Llama-3-8B (QKV, O,
// gate/up, down, LM head), a small odd one and a long-k one (several rounds of 4 packs per
// thread), plus the gated (SiLU-and-multiply) mode. Skipped without a GPU.
// Tolerance per element: float32 accumulation error, bounded by kAccTol * sum_k |x w| (a
// dropped or repeated 8-element pack moves the result by ~sqrt(8) * |x w|, far above it), plus one
// bf16 rounding (2^-8 * |ref|) for bf16 outputs.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/float16.h"
#include "runtime/kernels/cuda/cuda_kernel_test_util.h"
#include "runtime/kernels/cuda/gemv_kernels.h"

namespace tandem {
namespace {

using testing_util::CudaKernelTest;
using testing_util::FastRng;
using testing_util::RandomBf16;
using testing_util::RowsToCheck;

constexpr double kAccTol = 3e-5;
constexpr double kBf16RoundRel = 1.0 / 256;
// Rows checked against the CPU at most per (shape, m): all rows of small matrices, otherwise the
// first and last 256 and every stride-th row between.
constexpr int kMaxCheckedRows = 2048;

struct Shape {
  int n, k;
};

// A random [n, k] weight matrix at the 1 / sqrt(k) scale of a trained projection.
std::vector<uint16_t> RandomWeights(const Shape& s, FastRng& rng) {
  return RandomBf16(static_cast<size_t>(s.n) * s.k, 1.0f / std::sqrt(static_cast<float>(s.k)), rng);
}

// kGemvMaxRows random rows of `width` values at `scale`.
std::vector<uint16_t> RandomRows(int width, float scale, FastRng& rng) {
  return RandomBf16(static_cast<size_t>(cuda::kGemvMaxRows) * width, scale, rng);
}

class GemvCudaTest : public CudaKernelTest {
 protected:
  void CheckGated(const Shape& s, int m, const std::vector<float>& xf, const std::vector<float>& wf,
                  const DeviceBuffer& d_x, const DeviceBuffer& d_w);
};

// Gated mode on the same matrix read as [2 * half, k]: gate rows [0, half), up rows
// [half, 2 * half); out[i, j] = silu(gate) * up against a float64 reference. The tolerance carries
// each dot product's accumulation bound through silu(g) * u (|silu'| <= 1.1) plus one bf16
// rounding.
void GemvCudaTest::CheckGated(const Shape& s, int m, const std::vector<float>& xf,
                              const std::vector<float>& wf, const DeviceBuffer& d_x,
                              const DeviceBuffer& d_w) {
  const int half = s.n / 2;
  const std::string what = absl::StrCat("gemv gated m=", m, " n=", half, " k=", s.k);
  SCOPED_TRACE(what);
  const size_t out_elems = static_cast<size_t>(m) * half;
  const DeviceBuffer d_out = PoisonedOutput(out_elems, /*f32=*/false);
  cuda::GemvArgs a;
  a.x = d_x.data;
  a.w = d_w.data;
  a.out = d_out.data;
  a.gated_silu = true;
  a.m = m;
  a.n = half;
  a.k = s.k;
  const absl::Status st = cuda::LaunchGemv(a, stream());
  ASSERT_TRUE(st.ok()) << what << ": " << st;
  const std::vector<uint16_t> bits = Download<uint16_t>(d_out, out_elems);
  int64_t bad = 0;
  double max_ratio = 0.0;
  std::string first;
  const std::vector<int> rows = RowsToCheck(half, kMaxCheckedRows);
  for (int i = 0; i < m; ++i) {
    const float* xr = &xf[static_cast<size_t>(i) * s.k];
    for (const int r : rows) {
      double g = 0, u = 0, g_mag = 0, u_mag = 0;
      const float* gr = &wf[static_cast<size_t>(r) * s.k];
      const float* ur = &wf[static_cast<size_t>(half + r) * s.k];
      for (int kk = 0; kk < s.k; ++kk) {
        g += static_cast<double>(xr[kk]) * gr[kk];
        u += static_cast<double>(xr[kk]) * ur[kk];
        g_mag += std::fabs(static_cast<double>(xr[kk]) * gr[kk]);
        u_mag += std::fabs(static_cast<double>(xr[kk]) * ur[kk]);
      }
      const double silu = g / (1.0 + std::exp(-g));
      const double ref = silu * u;
      const double tol = 1.1 * std::fabs(u) * kAccTol * g_mag +
                         (std::fabs(silu) + 1.1 * kAccTol * g_mag) * kAccTol * u_mag +
                         kBf16RoundRel * std::fabs(ref) + 1e-6;
      const double got = Bf16ToFloat(bits[static_cast<size_t>(i) * half + r]);
      const double err = std::fabs(got - ref);
      max_ratio = std::max(max_ratio, err / tol);
      if (!(err <= tol) && bad++ < 5) {
        first += absl::StrCat(" [m=", i, " n=", r, "] got ", got, " ref ", ref, " tol ", tol, ";");
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " outputs outside tolerance (or unwritten); max "
                    << "err/tol=" << max_ratio << "; first:" << first;
  std::printf("%s: checked %zu rows, max err/tol=%.3g\n", what.c_str(), rows.size(), max_ratio);
}

TEST_F(GemvCudaTest, MatchesCpuReference) {
  for (const Shape& s :
       {Shape{96, 256}, Shape{98, 192}, Shape{6144, 4096}, Shape{4096, 4096}, Shape{4096, 14336},
        Shape{28672, 4096}, Shape{128256, 4096}, Shape{64, 36864}}) {
    FastRng rng(s.n * 7 + s.k);
    const std::vector<uint16_t> w = RandomWeights(s, rng);
    const std::vector<uint16_t> x = RandomRows(s.k, 1.0f, rng);
    const std::vector<uint16_t> bias = RandomBf16(s.n, 1.0f, rng);
    std::vector<float> wf(w.size()), xf(x.size());
    for (size_t i = 0; i < w.size(); ++i) wf[i] = Bf16ToFloat(w[i]);
    for (size_t i = 0; i < x.size(); ++i) xf[i] = Bf16ToFloat(x[i]);
    const DeviceBuffer d_w = Upload(w);
    const DeviceBuffer d_x = Upload(x);
    const DeviceBuffer d_bias = Upload(bias);
    const std::vector<int> rows = RowsToCheck(s.n, kMaxCheckedRows);

    for (const int m : {1, 2, 5, 8}) {
      // Reference dot products and their error scale, float64.
      std::vector<double> dot(static_cast<size_t>(m) * rows.size());
      std::vector<double> mag(dot.size());
      for (int i = 0; i < m; ++i) {
        const float* xr = &xf[static_cast<size_t>(i) * s.k];
        for (size_t j = 0; j < rows.size(); ++j) {
          const float* wr = &wf[static_cast<size_t>(rows[j]) * s.k];
          double acc = 0.0, abs_acc = 0.0;
          for (int kk = 0; kk < s.k; ++kk) {
            const double p = static_cast<double>(xr[kk]) * wr[kk];
            acc += p;
            abs_acc += std::fabs(p);
          }
          dot[i * rows.size() + j] = acc;
          mag[i * rows.size() + j] = abs_acc;
        }
      }
      // Variants: bf16 out, bf16 out + bias (Qwen2 QKV), float32 out (LM head).
      for (const int variant : {0, 1, 2}) {
        const bool with_bias = variant == 1;
        const bool out_f32 = variant == 2;
        const std::string what = absl::StrCat("gemv m=", m, " n=", s.n, " k=", s.k,
                                              with_bias ? " bias" : "", out_f32 ? " f32-out" : "");
        SCOPED_TRACE(what);
        const size_t out_elems = static_cast<size_t>(m) * s.n;
        const DeviceBuffer d_out = PoisonedOutput(out_elems, out_f32);
        cuda::GemvArgs a;
        a.x = d_x.data;
        a.w = d_w.data;
        a.bias = with_bias ? d_bias.data : nullptr;
        a.out = d_out.data;
        a.out_f32 = out_f32;
        a.m = m;
        a.n = s.n;
        a.k = s.k;
        const absl::Status st = cuda::LaunchGemv(a, stream());
        ASSERT_TRUE(st.ok()) << what << ": " << st;
        const std::vector<float> got = DownloadOutput(d_out, out_elems, out_f32, what);

        int64_t bad = 0;
        double max_abs = 0.0, max_ratio = 0.0;
        std::string first;
        for (int i = 0; i < m; ++i) {
          for (size_t j = 0; j < rows.size(); ++j) {
            const int r = rows[j];
            double ref = dot[i * rows.size() + j];
            if (with_bias) ref += Bf16ToFloat(bias[r]);
            const double tol = kAccTol * (mag[i * rows.size() + j] + (with_bias ? 1.0 : 0.0)) +
                               (out_f32 ? 0.0 : kBf16RoundRel * std::fabs(ref)) + 1e-6;
            const double g = got[static_cast<size_t>(i) * s.n + r];
            const double err = std::fabs(g - ref);
            max_abs = std::max(max_abs, err);
            max_ratio = std::max(max_ratio, err / tol);
            if (!(err <= tol) && bad++ < 5) {
              first +=
                  absl::StrCat(" [m=", i, " n=", r, "] got ", g, " ref ", ref, " tol ", tol, ";");
            }
          }
        }
        EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << m * rows.size()
                          << " checked outputs outside tolerance; max_abs_err=" << max_abs
                          << " max err/tol=" << max_ratio << "; first:" << first;
        std::printf("%s: checked %zu rows, max_abs_err=%.3g max err/tol=%.3g\n", what.c_str(),
                    rows.size(), max_abs, max_ratio);
      }
      if (s.n % 2 == 0) CheckGated(s, m, xf, wf, d_x, d_w);
    }
    FreeAll();
  }
}

}  // namespace
}  // namespace tandem

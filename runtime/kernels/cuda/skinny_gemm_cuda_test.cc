// GPU differential test of the skinny tensor-core GEMM (skinny_gemm.h) against a float64 CPU dot
// product over the same bf16-rounded inputs: the decode projection shapes of Llama-3-8B (QKV, O,
// gate/up gated, down, LM head) and small odd ones (n not a multiple of the 64-row tile, k of one
// pipeline stage), at 1 to 64 activation rows including every padding case (m % 16 != 0), with
// bias, float32 output and the gated SiLU-and-multiply mode; one-split and split-K plans (the
// test asserts both occur). Also: repeated launches are bit-identical (the split counters are
// back to zero after each launch) and a too-small split-K scratch is an error. Every test runs
// once per kernel: the wgmma one (compute capability 9.0 only; skipped elsewhere) and the mma.sync
// one every GPU can run. Skipped without a GPU.
// Tolerance per element as in gemv_cuda_test: float32 accumulation error, bounded by
// kAccTol * sum_k |x w| (a dropped or repeated k16 slice moves the result by ~4 |x w|, far above
// it), plus one bf16 rounding (2^-8 |ref|) for bf16 outputs.

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
#include "runtime/kernels/cuda/model_kernels.h"
#include "runtime/kernels/cuda/skinny_gemm.h"

namespace tandem {
namespace {

using testing_util::CudaKernelTest;
using testing_util::FastRng;
using testing_util::RandomBf16;
using testing_util::RowsToCheck;

constexpr double kAccTol = 3e-5;
constexpr double kBf16RoundRel = 1.0 / 256;
constexpr int kMaxCheckedRows = 1024;
constexpr int kMaxM = cuda::kSkinnyGemmMaxRows;

struct Shape {
  int n, k;  // n: output features (gated: the [2n, k] matrix's n)
  bool gated = false;
  std::vector<int> ms;  // activation row counts to run
};

// Parameter: launch on the wgmma kernel (true) or the mma.sync kernel.
class SkinnyGemmCudaTest : public CudaKernelTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    CudaKernelTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (GetParam() && !cuda::SkinnyGemmUsesWgmma()) {
      GTEST_SKIP() << "the wgmma kernel runs on compute capability 9.0 only";
    }
    absl::StatusOr<DeviceCapabilities> caps = device_->Capabilities();
    ASSERT_TRUE(caps.ok()) << caps.status();
    num_sms_ = caps->multiprocessor_count;
    ASSERT_GT(num_sms_, 0);
  }

  // Scratch for the largest plan of these shapes (64 rows, 16 splits of 2004 tiles would be
  // 33 MB; the real plans need at most a few MB).
  void AllocScratch() {
    partials_ = Alloc(kScratchBytes);
    counters_ = Upload(std::vector<uint32_t>(kCounterWords, 0));
  }

  cuda::SkinnyGemmArgs Args(const DeviceBuffer& x, const DeviceBuffer& w, const DeviceBuffer& out,
                            int m, int n, int k) const {
    cuda::SkinnyGemmArgs a;
    a.x = x.data;
    a.w = w.data;
    a.out = out.data;
    a.m = m;
    a.n = n;
    a.k = k;
    a.num_sms = num_sms_;
    a.partials = partials_.data;
    a.partials_bytes = kScratchBytes;
    a.counters = counters_.data;
    a.counters_bytes = kCounterWords * sizeof(uint32_t);
    return a;
  }

  // LaunchSkinnyGemm on this test's kernel.
  absl::Status Launch(const cuda::SkinnyGemmArgs& a) {
    return cuda::internal::LaunchSkinnyGemmWithKernel(a, GetParam(), stream());
  }

  static constexpr size_t kScratchBytes = size_t{64} << 20;
  static constexpr size_t kCounterWords = 1 << 16;
  int num_sms_ = 0;
  DeviceBuffer partials_, counters_;
};

TEST_P(SkinnyGemmCudaTest, MatchesCpuReference) {
  const std::vector<int> all_ms = {1, 2, 5, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64};
  const std::vector<Shape> shapes = {
      {96, 256, false, all_ms},
      {100, 64, false, all_ms},
      {96, 1024, false, all_ms},
      {50, 192, true, all_ms},
      {160, 256, false, all_ms},  // 3 tiles
      {80, 192, true, all_ms},    // 3 gated tiles
      {1024, 4096, true, {5, 40}},
      {6144, 4096, false, {2, 17, 64}},
      {4096, 4096, false, {2, 8, 33, 64}},
      {14336, 4096, true, {2, 64}},
      {4096, 14336, false, {3, 64}},
      {128256, 4096, false, {64}},
  };
  bool saw_split = false, saw_single = false;
  for (const Shape& s : shapes) {
    AllocScratch();
    const int w_rows = s.gated ? 2 * s.n : s.n;
    FastRng rng(static_cast<uint64_t>(w_rows) * 7 + s.k);
    const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(w_rows) * s.k,
                                               1.0f / std::sqrt(static_cast<float>(s.k)), rng);
    const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(kMaxM) * s.k, 1.0f, rng);
    const std::vector<uint16_t> bias = RandomBf16(s.n, 1.0f, rng);
    const std::vector<float> wf = testing_util::Bf16ToFloats(w);
    const std::vector<float> xf = testing_util::Bf16ToFloats(x);
    const DeviceBuffer d_w = Upload(w);
    const DeviceBuffer d_x = Upload(x);
    const DeviceBuffer d_bias = Upload(bias);
    const std::vector<int> rows = RowsToCheck(s.n, kMaxCheckedRows);
    const int max_m = *std::max_element(s.ms.begin(), s.ms.end());

    // Float64 dot products (and their magnitude) of every activation row with every checked
    // weight row; gated: the gate row r and the up row n + r. Row i does not depend on m.
    const int per_row = s.gated ? 2 : 1;
    std::vector<double> dot(static_cast<size_t>(max_m) * rows.size() * per_row);
    std::vector<double> mag(dot.size());
    for (int i = 0; i < max_m; ++i) {
      const float* xr = &xf[static_cast<size_t>(i) * s.k];
      for (size_t j = 0; j < rows.size(); ++j) {
        for (int h = 0; h < per_row; ++h) {
          const float* wr = &wf[static_cast<size_t>(rows[j] + h * s.n) * s.k];
          double acc = 0.0, abs_acc = 0.0;
          for (int kk = 0; kk < s.k; ++kk) {
            const double p = static_cast<double>(xr[kk]) * wr[kk];
            acc += p;
            abs_acc += std::fabs(p);
          }
          const size_t at = (static_cast<size_t>(i) * rows.size() + j) * per_row + h;
          dot[at] = acc;
          mag[at] = abs_acc;
        }
      }
    }

    for (const int m : s.ms) {
      const cuda::SkinnyGemmPlan plan = cuda::PlanSkinnyGemm(m, s.n, s.k, s.gated, num_sms_);
      (plan.splits > 1 ? saw_split : saw_single) = true;
      // Variants: bf16 out, bf16 out + bias, float32 out (gated: bf16 and float32 out).
      for (const int variant : {0, 1, 2}) {
        const bool with_bias = variant == 1;
        const bool out_f32 = variant == 2;
        if (s.gated && with_bias) continue;
        const std::string what =
            absl::StrCat("skinny m=", m, " n=", s.n, " k=", s.k, s.gated ? " gated" : "",
                         with_bias ? " bias" : "", out_f32 ? " f32-out" : "", " (", plan.tiles,
                         " tiles x ", plan.splits, " splits)");
        SCOPED_TRACE(what);
        const size_t out_elems = static_cast<size_t>(m) * s.n;
        const DeviceBuffer d_out = PoisonedOutput(out_elems, out_f32);
        cuda::SkinnyGemmArgs a = Args(d_x, d_w, d_out, m, s.n, s.k);
        a.bias = with_bias ? d_bias.data : nullptr;
        a.out_f32 = out_f32;
        a.gated_silu = s.gated;
        const absl::Status st = Launch(a);
        ASSERT_TRUE(st.ok()) << what << ": " << st;
        const std::vector<float> got = DownloadOutput(d_out, out_elems, out_f32, what);

        int64_t bad = 0;
        double max_ratio = 0.0;
        std::string first;
        for (int i = 0; i < m; ++i) {
          for (size_t j = 0; j < rows.size(); ++j) {
            const int r = rows[j];
            const size_t at = (static_cast<size_t>(i) * rows.size() + j) * per_row;
            double ref, tol;
            if (s.gated) {
              const double g = dot[at], u = dot[at + 1];
              const double g_mag = mag[at], u_mag = mag[at + 1];
              const double silu = g / (1.0 + std::exp(-g));
              ref = silu * u;
              tol = 1.1 * std::fabs(u) * kAccTol * g_mag +
                    (std::fabs(silu) + 1.1 * kAccTol * g_mag) * kAccTol * u_mag;
            } else {
              ref = dot[at] + (with_bias ? Bf16ToFloat(bias[r]) : 0.0);
              tol = kAccTol * (mag[at] + (with_bias ? 1.0 : 0.0));
            }
            tol += (out_f32 ? 0.0 : kBf16RoundRel * std::fabs(ref)) + 1e-6;
            const double g = got[static_cast<size_t>(i) * s.n + r];
            const double err = std::fabs(g - ref);
            max_ratio = std::max(max_ratio, err / tol);
            if (!(err <= tol) && bad++ < 5) {
              first +=
                  absl::StrCat(" [m=", i, " n=", r, "] got ", g, " ref ", ref, " tol ", tol, ";");
            }
          }
        }
        EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << m * rows.size()
                          << " checked outputs outside tolerance; max err/tol=" << max_ratio
                          << "; first:" << first;
        std::printf("%s: checked %zu rows, max err/tol=%.3g\n", what.c_str(), rows.size(),
                    max_ratio);
      }
    }
    FreeAll();
  }
  EXPECT_TRUE(saw_split) << "no shape exercised the split-K path on " << num_sms_ << " SMs";
  EXPECT_TRUE(saw_single) << "no shape exercised the one-split path on " << num_sms_ << " SMs";
}

// Split-K launches leave their counters at zero: five launches of each split plan give the same
// bits, and the counters read back as zero.
TEST_P(SkinnyGemmCudaTest, RepeatedLaunchesAreBitIdentical) {
  AllocScratch();
  for (const Shape& s : {Shape{4096, 4096, false, {64}}, Shape{4096, 14336, false, {9}},
                         Shape{1024, 4096, true, {40}}}) {
    const int m = s.ms[0];
    const cuda::SkinnyGemmPlan plan = cuda::PlanSkinnyGemm(m, s.n, s.k, s.gated, num_sms_);
    const std::string what = absl::StrCat("m=", m, " n=", s.n, " k=", s.k, s.gated ? " gated" : "",
                                          " (", plan.tiles, " tiles x ", plan.splits, " splits)");
    SCOPED_TRACE(what);
    FastRng rng(s.n + s.k + m);
    const int w_rows = s.gated ? 2 * s.n : s.n;
    const DeviceBuffer d_w = Upload(RandomBf16(static_cast<size_t>(w_rows) * s.k, 0.02f, rng));
    const DeviceBuffer d_x = Upload(RandomBf16(static_cast<size_t>(m) * s.k, 1.0f, rng));
    const size_t out_elems = static_cast<size_t>(m) * s.n;
    const DeviceBuffer d_out = Alloc(out_elems * sizeof(uint16_t));
    std::vector<uint16_t> first;
    for (int rep = 0; rep < 5; ++rep) {
      cuda::SkinnyGemmArgs a = Args(d_x, d_w, d_out, m, s.n, s.k);
      a.gated_silu = s.gated;
      ASSERT_TRUE(Launch(a).ok());
      const std::vector<uint16_t> bits = Download<uint16_t>(d_out, out_elems);
      if (rep == 0) {
        first = bits;
      } else {
        ASSERT_EQ(bits, first) << what << ": launch " << rep << " differs from the first";
      }
    }
    const std::vector<uint32_t> counters = Download<uint32_t>(counters_, plan.tiles);
    EXPECT_EQ(std::count(counters.begin(), counters.end(), 0u), plan.tiles)
        << what << ": split counters not reset";
  }
}

// Rope mode must equal the plain launch followed by LaunchRopeKvAppend bit for bit, in the qkv rows
// and in the whole cache, with and without a bias, with one- and multi-split plans and a padding
// slot.
TEST_P(SkinnyGemmCudaTest, RopeModeEqualsPlainThenRopeKvAppend) {
  AllocScratch();
  struct Case {
    int heads, kv_heads, head_dim, hidden, m;
  };
  bool saw_split = false;
  for (const Case& c : {Case{32, 8, 128, 4096, 64}, Case{32, 8, 128, 4096, 3},
                        Case{8, 2, 64, 512, 17}, Case{7, 1, 32, 256, 40}}) {
    for (const bool with_bias : {false, true}) {
      const int n = (c.heads + 2 * c.kv_heads) * c.head_dim;
      const cuda::SkinnyGemmPlan plan = cuda::PlanSkinnyGemmRope(c.m, n, c.hidden, num_sms_);
      saw_split |= plan.splits > 1;
      const std::string what =
          absl::StrCat("rope ", c.heads, "x", c.kv_heads, "x", c.head_dim, " m=", c.m,
                       with_bias ? " bias" : "", " (", plan.tiles, " tiles x ", plan.splits, ")");
      SCOPED_TRACE(what);
      FastRng rng(c.m * 13 + c.head_dim + with_bias);
      constexpr int kSlots = 128;
      const size_t cache_elems = static_cast<size_t>(kSlots) * c.kv_heads * c.head_dim;
      const std::vector<uint16_t> w =
          RandomBf16(static_cast<size_t>(n) * c.hidden, 1.0f / std::sqrt(float(c.hidden)), rng);
      const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(c.m) * c.hidden, 1.0f, rng);
      const std::vector<uint16_t> bias = RandomBf16(n, 0.5f, rng);
      std::vector<int32_t> positions(c.m), slots(c.m);
      for (int r = 0; r < c.m; ++r) {
        positions[r] = rng.UniformInt(0, 100000);
        slots[r] = r == 1 ? -1 : (r * 37 + 5) % kSlots;
      }
      std::vector<float> inv_freq(c.head_dim / 2);
      for (int i = 0; i < c.head_dim / 2; ++i) {
        inv_freq[i] = std::pow(500000.0f, -2.0f * i / c.head_dim);
      }
      const DeviceBuffer d_w = Upload(w), d_x = Upload(x), d_bias = Upload(bias);
      const DeviceBuffer d_pos = Upload(positions), d_slots = Upload(slots),
                         d_inv = Upload(inv_freq);
      std::vector<uint16_t> got_qkv[2], got_k[2], got_v[2];
      for (const bool fused : {false, true}) {
        const DeviceBuffer d_qkv =
            Upload(std::vector<uint16_t>(static_cast<size_t>(c.m) * n, testing_util::kBf16Poison));
        const DeviceBuffer d_k =
            Upload(std::vector<uint16_t>(cache_elems, testing_util::kBf16Poison));
        const DeviceBuffer d_v =
            Upload(std::vector<uint16_t>(cache_elems, testing_util::kBf16Poison));
        cuda::SkinnyGemmArgs a = Args(d_x, d_w, d_qkv, c.m, n, c.hidden);
        a.bias = with_bias ? d_bias.data : nullptr;
        cuda::SkinnyRope rope;
        rope.num_heads = c.heads;
        rope.num_kv_heads = c.kv_heads;
        rope.head_dim = c.head_dim;
        rope.positions = static_cast<const int32_t*>(d_pos.data);
        rope.inv_freq = static_cast<const float*>(d_inv.data);
        rope.slot_mapping = static_cast<const int32_t*>(d_slots.data);
        rope.k_layer = d_k.data;
        rope.v_layer = d_v.data;
        if (fused) a.rope = &rope;
        ASSERT_TRUE(Launch(a).ok()) << what;
        if (!fused) {
          cuda::PagedKvCache cache;
          cache.k = d_k.data;
          cache.v = d_v.data;
          cache.num_layers = 1;
          cache.num_blocks = kSlots;
          cache.block_size = 1;
          cache.num_kv_heads = c.kv_heads;
          cache.head_dim = c.head_dim;
          ASSERT_TRUE(cuda::LaunchRopeKvAppend(d_qkv.data, rope.positions, rope.inv_freq,
                                               rope.slot_mapping, c.m, c.heads, cache, 0, stream())
                          .ok());
        }
        got_qkv[fused] = Download<uint16_t>(d_qkv, static_cast<size_t>(c.m) * n);
        got_k[fused] = Download<uint16_t>(d_k, cache_elems);
        got_v[fused] = Download<uint16_t>(d_v, cache_elems);
      }
      EXPECT_TRUE(got_qkv[0] == got_qkv[1]) << what << ": qkv differs";
      EXPECT_TRUE(got_k[0] == got_k[1]) << what << ": k cache differs";
      EXPECT_TRUE(got_v[0] == got_v[1]) << what << ": v cache differs";
      FreeAll();
      AllocScratch();
    }
  }
  EXPECT_TRUE(saw_split) << "no rope case split K on " << num_sms_ << " SMs";
}

TEST_P(SkinnyGemmCudaTest, TooSmallScratchIsAnError) {
  AllocScratch();
  const cuda::SkinnyGemmPlan plan = cuda::PlanSkinnyGemm(64, 4096, 4096, false, num_sms_);
  ASSERT_GT(plan.splits, 1) << "O-projection shape should split K on " << num_sms_ << " SMs";
  const DeviceBuffer d_w = Alloc(size_t{4096} * 4096 * 2);
  const DeviceBuffer d_x = Alloc(size_t{64} * 4096 * 2);
  const DeviceBuffer d_out = Alloc(size_t{64} * 4096 * 2);
  cuda::SkinnyGemmArgs a = Args(d_x, d_w, d_out, 64, 4096, 4096);
  a.partials_bytes = plan.partial_bytes - 1;
  EXPECT_EQ(Launch(a).code(), absl::StatusCode::kInvalidArgument);
  a = Args(d_x, d_w, d_out, 64, 4096, 4096);
  a.counters = nullptr;
  EXPECT_EQ(Launch(a).code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Kernels, SkinnyGemmCudaTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Wgmma" : "MmaSync"; });

}  // namespace
}  // namespace tandem

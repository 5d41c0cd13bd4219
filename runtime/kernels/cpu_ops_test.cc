#include "runtime/kernels/cpu_ops.h"

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

std::vector<float> RandomVector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(RmsNormTest, HandComputedRow) {
  const std::vector<float> x = {1, 2, 3, 4};
  const std::vector<float> w = {1, 1, 2, 0.5f};
  std::vector<float> out(4);
  RmsNorm(x.data(), w.data(), 1, 4, 0.0f, out.data());
  const float rms = std::sqrt(7.5f);  // mean(1, 4, 9, 16) = 7.5
  EXPECT_NEAR(out[0], 1 / rms, 1e-6);
  EXPECT_NEAR(out[1], 2 / rms, 1e-6);
  EXPECT_NEAR(out[2], 6 / rms, 1e-6);
  EXPECT_NEAR(out[3], 2 / rms, 1e-6);
}

TEST(RmsNormTest, MatchesNaiveLoopAndMayAlias) {
  const int rows = 3, dim = 37;
  const float eps = 1e-5f;
  std::vector<float> x = RandomVector(rows * dim, 1);
  const std::vector<float> w = RandomVector(dim, 2);
  std::vector<float> out(rows * dim);
  RmsNorm(x.data(), w.data(), rows, dim, eps, out.data());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double{x[r * dim + i]} * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) {
      EXPECT_NEAR(out[r * dim + i], x[r * dim + i] * inv * w[i], 1e-5) << r << "," << i;
    }
  }
  RmsNorm(x.data(), w.data(), rows, dim, eps, x.data());
  for (int i = 0; i < rows * dim; ++i) EXPECT_FLOAT_EQ(x[i], out[i]);
}

TEST(AddInPlaceTest, Adds) {
  std::vector<float> x = {1, 2, 3};
  const std::vector<float> y = {0.5f, -2, 10};
  AddInPlace(x.data(), y.data(), 3);
  EXPECT_THAT(x, testing::ElementsAre(1.5f, 0.0f, 13.0f));
}

void CheckLinear(int rows, int in, int out_features, bool with_bias) {
  const std::vector<float> x = RandomVector(rows * in, 3);
  const std::vector<float> w = RandomVector(out_features * in, 4);
  const std::vector<float> b = RandomVector(out_features, 5);
  std::vector<float> out(rows * out_features);
  Linear(x.data(), w.data(), with_bias ? b.data() : nullptr, rows, in, out_features, out.data());
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out_features; ++o) {
      double acc = with_bias ? b[o] : 0.0;
      for (int i = 0; i < in; ++i) acc += double{x[r * in + i]} * w[o * in + i];
      EXPECT_NEAR(out[r * out_features + o], acc, 1e-4) << r << "," << o;
    }
  }
}

TEST(LinearTest, SingleRowMatchesNaive) { CheckLinear(1, 33, 17, false); }
TEST(LinearTest, SingleRowWithBiasMatchesNaive) { CheckLinear(1, 33, 17, true); }
TEST(LinearTest, ManyRowsWithBiasMatchesNaive) { CheckLinear(5, 40, 23, true); }

TEST(LinearTest, HandComputed) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};   // [2, 3]
  const std::vector<float> w = {1, 0, -1, 0, 1, 0};  // [2, 3]: rows (1,0,-1), (0,1,0)
  const std::vector<float> b = {10, 20};
  std::vector<float> out(4);
  Linear(x.data(), w.data(), b.data(), 2, 3, 2, out.data());
  EXPECT_THAT(out, testing::ElementsAre(8.0f, 22.0f, 8.0f, 25.0f));
}

TEST(RopeInvFreqTest, DefaultFrequencies) {
  float inv[4];
  RopeInvFreq(8, 10000.0f, nullptr, inv);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[1], 0.1f, 1e-7);
  EXPECT_NEAR(inv[2], 0.01f, 1e-8);
  EXPECT_NEAR(inv[3], 0.001f, 1e-9);
}

// head_dim 8, theta 1e4: inv_freq (1, 0.1, 0.01, 0.001), wavelengths 2*pi/f = (6.28, 62.8, 628,
// 6283). With original_max 1024, low 1, high 4: low_freq_wavelen 1024, high_freq_wavelen 256.
// So f0, f1 are high-frequency (kept), f3 is low-frequency (divided by 8) and f2 is interpolated:
// smooth = (1024 / 628.3185 - 1) / 3 = 0.2099154, f2 = (1 - smooth) * 0.01 / 8 + smooth * 0.01.
TEST(RopeInvFreqTest, Llama3ScalingOnKnownNumbers) {
  Llama3RopeScaling s;
  s.factor = 8.0f;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position_embeddings = 1024;
  float inv[4];
  RopeInvFreq(8, 10000.0f, &s, inv);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[1], 0.1f, 1e-7);
  const double smooth = (1024.0 / (2 * std::numbers::pi / 0.01) - 1.0) / 3.0;
  EXPECT_NEAR(smooth, 0.2099154, 1e-6);
  EXPECT_NEAR(inv[2], (1 - smooth) * 0.01 / 8 + smooth * 0.01, 1e-8);
  EXPECT_NEAR(inv[2], 0.00308677, 1e-8);
  EXPECT_NEAR(inv[3], 0.001 / 8, 1e-10);
}

TEST(RopeInvFreqTest, Llama31EightBBoundaries) {
  // Llama 3.1 8B: head_dim 128, theta 5e5, factor 8, low 1, high 4, original 8192.
  Llama3RopeScaling s;
  std::vector<float> plain(64), scaled(64);
  RopeInvFreq(128, 500000.0f, nullptr, plain.data());
  RopeInvFreq(128, 500000.0f, &s, scaled.data());
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * std::numbers::pi / plain[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i]) << i;
    } else if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i] / 8) << i;
    } else {
      EXPECT_LT(scaled[i], plain[i]) << i;
      EXPECT_GT(scaled[i], plain[i] / 8) << i;
    }
  }
}

TEST(RopeTest, RotatesHalvesByPositionAngle) {
  const int head_dim = 4;
  float inv[2];
  RopeInvFreq(head_dim, 10000.0f, nullptr, inv);  // (1, 0.01)
  std::vector<float> cos_t(3 * 2), sin_t(3 * 2);
  RopeTables(inv, head_dim, 3, cos_t.data(), sin_t.data());
  EXPECT_FLOAT_EQ(cos_t[0], 1.0f);
  EXPECT_FLOAT_EQ(sin_t[0], 0.0f);
  EXPECT_FLOAT_EQ(cos_t[2 * 2 + 1], std::cos(0.02f));

  // Two heads of token at position 1: head 0 = e0, head 1 = e2 (the second half's first lane).
  std::vector<float> x = {1, 0, 0, 0, 0, 0, 1, 0};
  const int32_t pos = 1;
  ApplyRope(x.data(), 1, 8, 2, head_dim, &pos, cos_t.data(), sin_t.data());
  const float c = std::cos(1.0f), s = std::sin(1.0f);
  EXPECT_THAT(
      x, testing::Pointwise(testing::FloatNear(1e-6), std::vector<float>{c, 0, s, 0, -s, 0, c, 0}));
}

TEST(RopeTest, MatchesComplexRotationOnRandomRows) {
  const int head_dim = 8, heads = 3, rows = 4, stride = 30;  // padded rows
  float inv[4];
  RopeInvFreq(head_dim, 500.0f, nullptr, inv);
  std::vector<float> cos_t(50 * 4), sin_t(50 * 4);
  RopeTables(inv, head_dim, 50, cos_t.data(), sin_t.data());
  std::vector<float> x = RandomVector(rows * stride, 9);
  const std::vector<float> orig = x;
  const std::vector<int32_t> pos = {0, 7, 49, 3};
  ApplyRope(x.data(), rows, stride, heads, head_dim, pos.data(), cos_t.data(), sin_t.data());
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < 4; ++i) {
        const double angle = pos[r] * double{inv[i]};
        const double a = orig[r * stride + h * head_dim + i];
        const double b = orig[r * stride + h * head_dim + i + 4];
        EXPECT_NEAR(x[r * stride + h * head_dim + i], a * std::cos(angle) - b * std::sin(angle),
                    1e-5);
        EXPECT_NEAR(x[r * stride + h * head_dim + i + 4], b * std::cos(angle) + a * std::sin(angle),
                    1e-5);
      }
    }
    for (int i = heads * head_dim; i < stride; ++i) {
      EXPECT_EQ(x[r * stride + i], orig[r * stride + i]) << "padding touched";
    }
  }
}

TEST(SiluAndMulTest, KnownValues) {
  const std::vector<float> gate = {0.0f, 1.0f, -2.0f};
  const std::vector<float> up = {5.0f, 2.0f, 1.0f};
  std::vector<float> out(3);
  SiluAndMul(gate.data(), up.data(), 3, out.data());
  EXPECT_FLOAT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 2 * 0.7310585786, 1e-6);
  EXPECT_NEAR(out[2], -2 * 0.1192029220, 1e-6);
}

TEST(EmbeddingGatherTest, CopiesRows) {
  const std::vector<float> table = {0, 1, 10, 11, 20, 21};  // vocab 3, hidden 2
  const std::vector<int32_t> ids = {2, 0, 2};
  std::vector<float> out(6);
  EmbeddingGather(table.data(), 2, ids.data(), 3, out.data());
  EXPECT_THAT(out, testing::ElementsAre(20, 21, 0, 1, 20, 21));
}

TEST(ArgmaxTest, FirstOfTies) {
  const std::vector<float> x = {1, 5, -3, 5, 2};
  EXPECT_EQ(Argmax(x.data(), 5), 1);
  const std::vector<float> y = {-1, -0.5f};
  EXPECT_EQ(Argmax(y.data(), 2), 1);
}

TEST(PagedAttentionTest, SingleKeyReturnsItsValue) {
  PagedKvShape shape{.block_size = 2, .num_kv_heads = 1, .head_dim = 2};
  std::vector<float> kc(3 * 2 * 2, 0.0f), vc(3 * 2 * 2, 0.0f);
  const std::vector<int32_t> table = {2};
  const std::vector<float> k = {1, 2}, v = {3, -4};
  PagedKvAppend(k.data(), 2, v.data(), 2, 1, 0, table.data(), shape, kc.data(), vc.data());
  EXPECT_EQ(kc[2 * 4 + 0], 1.0f);  // block 2, slot 0
  EXPECT_EQ(vc[2 * 4 + 1], -4.0f);
  const std::vector<float> q = {0.3f, 7.0f, -1.0f, 0.0f};  // two query heads share the KV head
  std::vector<float> out(4), scratch(1);
  PagedAttention(q.data(), 4, 1, 0, 2, table.data(), shape, kc.data(), vc.data(), 1.0f,
                 scratch.data(), out.data());
  EXPECT_THAT(out, testing::ElementsAre(3, -4, 3, -4));
}

TEST(PagedAttentionTest, HandComputedTwoKeys) {
  // Keys (1, 0), (0, 1); query (ln 3, 0) with scale 1 -> weights 3/4, 1/4.
  PagedKvShape shape{.block_size = 1, .num_kv_heads = 1, .head_dim = 2};
  std::vector<float> kc(4 * 2), vc(4 * 2);
  const std::vector<int32_t> table = {3, 1};
  const std::vector<float> k = {1, 0, 0, 1}, v = {4, 0, 0, 8};
  PagedKvAppend(k.data(), 2, v.data(), 2, 2, 0, table.data(), shape, kc.data(), vc.data());
  const std::vector<float> q = {std::log(3.0f), 0};
  std::vector<float> out(2), scratch(2);
  PagedAttention(q.data(), 2, 1, 1, 1, table.data(), shape, kc.data(), vc.data(), 1.0f,
                 scratch.data(), out.data());
  EXPECT_NEAR(out[0], 3.0, 1e-5);
  EXPECT_NEAR(out[1], 2.0, 1e-5);
}

// Paged GQA attention over a shuffled block table vs. a naive contiguous causal attention.
TEST(PagedAttentionTest, MatchesNaiveGqaCausalAttention) {
  const int heads = 6, kv_heads = 2, head_dim = 8, block_size = 4, num_blocks = 10;
  const int start_pos = 5, rows = 7, total = start_pos + rows;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  PagedKvShape shape{.block_size = block_size, .num_kv_heads = kv_heads, .head_dim = head_dim};
  std::vector<float> kc(num_blocks * shape.BlockStride(), NAN), vc(kc.size(), NAN);
  const std::vector<int32_t> table = {7, 2, 9, 0};
  const int kv_width = kv_heads * head_dim;
  const std::vector<float> k = RandomVector(total * kv_width, 11);
  const std::vector<float> v = RandomVector(total * kv_width, 12);
  const std::vector<float> q = RandomVector(rows * heads * head_dim, 13, 2.0f);
  // Cached prefix first, then the new rows, as the runner does.
  PagedKvAppend(k.data(), kv_width, v.data(), kv_width, start_pos, 0, table.data(), shape,
                kc.data(), vc.data());
  PagedKvAppend(k.data() + start_pos * kv_width, kv_width, v.data() + start_pos * kv_width,
                kv_width, rows, start_pos, table.data(), shape, kc.data(), vc.data());
  std::vector<float> out(rows * heads * head_dim), scratch(total);
  PagedAttention(q.data(), heads * head_dim, rows, start_pos, heads, table.data(), shape, kc.data(),
                 vc.data(), scale, scratch.data(), out.data());
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const int g = h / (heads / kv_heads);
      const int n = start_pos + r + 1;
      std::vector<double> s(n);
      double mx = -1e300;
      for (int j = 0; j < n; ++j) {
        double dot = 0;
        for (int d = 0; d < head_dim; ++d) {
          dot += double{q[(r * heads + h) * head_dim + d]} * k[j * kv_width + g * head_dim + d];
        }
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int d = 0; d < head_dim; ++d) {
        double acc = 0;
        for (int j = 0; j < n; ++j) acc += s[j] / sum * v[j * kv_width + g * head_dim + d];
        EXPECT_NEAR(out[(r * heads + h) * head_dim + d], acc, 1e-5) << r << "," << h << "," << d;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cpu

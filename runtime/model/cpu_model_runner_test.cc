#include "runtime/model/cpu_model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"

namespace tandem {
namespace {

ModelConfig TinyConfig(bool qwen2) {
  ModelConfig c;
  c.architecture = qwen2 ? ModelArchitecture::kQwen2 : ModelArchitecture::kLlama;
  c.vocab_size = 50;
  c.hidden_size = 24;
  c.intermediate_size = 40;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 6;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = qwen2 ? 10000.0f : 5000.0f;
  if (!qwen2) {
    c.rope_scaling.kind = RopeScaling::Kind::kLlama3;
    c.rope_scaling.factor = 4.0f;
    c.rope_scaling.original_max_position_embeddings = 16;
  }
  c.tie_word_embeddings = !qwen2;
  c.attention_bias = qwen2;
  return c;
}

std::vector<float> Random(size_t n, std::mt19937& rng, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

ModelWeights RandomWeights(const ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim,
               f = c.intermediate_size;
  ModelWeights w;
  w.embed = Random(c.vocab_size * h, rng, 1.0f);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.input_norm = Random(h, rng, 0.2f);
    for (float& x : lw.input_norm) x += 1.0f;
    lw.post_norm = Random(h, rng, 0.2f);
    for (float& x : lw.post_norm) x += 1.0f;
    lw.q_proj = Random(q * h, rng, 0.3f);
    lw.k_proj = Random(kv * h, rng, 0.3f);
    lw.v_proj = Random(kv * h, rng, 0.3f);
    if (c.attention_bias) {
      lw.q_bias = Random(q, rng, 0.3f);
      lw.k_bias = Random(kv, rng, 0.3f);
      lw.v_bias = Random(kv, rng, 0.3f);
    }
    lw.o_proj = Random(h * q, rng, 0.2f);
    lw.gate_proj = Random(f * h, rng, 0.2f);
    lw.up_proj = Random(f * h, rng, 0.2f);
    lw.down_proj = Random(h * f, rng, 0.2f);
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = std::vector<float>(h, 1.0f);
  if (!c.tie_word_embeddings) w.lm_head = Random(c.vocab_size * h, rng, 0.3f);
  return w;
}

// A deliberately naive, dense, double-precision forward pass of the whole sequence (no paging,
// no batching, RoPE angles from the HF formulas in double): logits of every position.
std::vector<std::vector<double>> NaiveForward(const ModelConfig& c, const ModelWeights& w,
                                              const std::vector<int32_t>& tokens) {
  const int n = tokens.size(), h = c.hidden_size, hd = c.head_dim, nh = c.num_heads,
            nkv = c.num_kv_heads, f = c.intermediate_size;
  using Mat = std::vector<std::vector<double>>;
  auto linear = [](const Mat& x, const std::vector<float>& wt, const std::vector<float>& b,
                   int out) {
    Mat y(x.size(), std::vector<double>(out));
    const int in = x[0].size();
    for (size_t r = 0; r < x.size(); ++r)
      for (int o = 0; o < out; ++o) {
        double acc = b.empty() ? 0.0 : b[o];
        for (int i = 0; i < in; ++i) acc += x[r][i] * wt[o * in + i];
        y[r][o] = acc;
      }
    return y;
  };
  auto rms = [&](const Mat& x, const std::vector<float>& wt) {
    Mat y = x;
    for (auto& row : y) {
      double ss = 0;
      for (double v : row) ss += v * v;
      const double inv = 1.0 / std::sqrt(ss / row.size() + c.rms_norm_eps);
      for (size_t i = 0; i < row.size(); ++i) row[i] *= inv * wt[i];
    }
    return y;
  };
  std::vector<double> inv_freq(hd / 2);
  for (int i = 0; i < hd / 2; ++i) {
    double fr = 1.0 / std::pow(double{c.rope_theta}, 2.0 * i / hd);
    if (c.rope_scaling.kind == RopeScaling::Kind::kLlama3) {
      const RopeScaling& s = c.rope_scaling;
      const double wl = 2 * std::numbers::pi / fr, old = s.original_max_position_embeddings;
      if (wl > old / s.low_freq_factor) {
        fr /= s.factor;
      } else if (wl >= old / s.high_freq_factor) {
        const double sm = (old / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        fr = (1 - sm) * fr / s.factor + sm * fr;
      }
    }
    inv_freq[i] = fr;
  }
  auto rope = [&](Mat& x, int heads) {
    for (int p = 0; p < n; ++p)
      for (int hh = 0; hh < heads; ++hh)
        for (int i = 0; i < hd / 2; ++i) {
          double& a = x[p][hh * hd + i];
          double& b = x[p][hh * hd + i + hd / 2];
          const double cs = std::cos(p * inv_freq[i]), sn = std::sin(p * inv_freq[i]);
          const double na = a * cs - b * sn, nb = b * cs + a * sn;
          a = na;
          b = nb;
        }
  };
  Mat x(n, std::vector<double>(h));
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < h; ++i) x[p][i] = w.embed[tokens[p] * h + i];
  for (const LayerWeights& lw : w.layers) {
    Mat a = rms(x, lw.input_norm);
    Mat q = linear(a, lw.q_proj, lw.q_bias, nh * hd);
    Mat k = linear(a, lw.k_proj, lw.k_bias, nkv * hd);
    Mat v = linear(a, lw.v_proj, lw.v_bias, nkv * hd);
    rope(q, nh);
    rope(k, nkv);
    Mat att(n, std::vector<double>(nh * hd, 0.0));
    for (int p = 0; p < n; ++p)
      for (int hh = 0; hh < nh; ++hh) {
        const int g = hh / (nh / nkv);
        std::vector<double> s(p + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= p; ++j) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[p][hh * hd + i] * k[j][g * hd + i];
          s[j] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int j = 0; j <= p; ++j)
          for (int i = 0; i < hd; ++i) att[p][hh * hd + i] += s[j] / sum * v[j][g * hd + i];
      }
    Mat o = linear(att, lw.o_proj, {}, h);
    for (int p = 0; p < n; ++p)
      for (int i = 0; i < h; ++i) x[p][i] += o[p][i];
    Mat m = rms(x, lw.post_norm);
    Mat g = linear(m, lw.gate_proj, {}, f);
    Mat u = linear(m, lw.up_proj, {}, f);
    for (int p = 0; p < n; ++p)
      for (int i = 0; i < f; ++i) g[p][i] = g[p][i] / (1 + std::exp(-g[p][i])) * u[p][i];
    Mat d = linear(g, lw.down_proj, {}, h);
    for (int p = 0; p < n; ++p)
      for (int i = 0; i < h; ++i) x[p][i] += d[p][i];
  }
  return linear(rms(x, w.final_norm), w.LmHead(), {}, c.vocab_size);
}

std::unique_ptr<ModelRunner> MakeRunner(const ModelConfig& c, uint32_t seed, int block_size = 4,
                                        int num_blocks = 32) {
  CpuRunnerOptions opts;
  opts.block_size = block_size;
  opts.num_blocks = num_blocks;
  auto runner = CreateCpuModelRunner(c, RandomWeights(c, seed), opts);
  CHECK(runner.ok()) << runner.status();
  return *std::move(runner);
}

std::vector<int32_t> Tokens(int n, uint32_t seed, int vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = rng() % vocab;
  return t;
}

void ExpectRowNear(const float* got, const std::vector<double>& want, double tol) {
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << "vocab " << i;
}

class RunnerVsNaiveTest : public testing::TestWithParam<bool> {};

// Prefill in uneven chunks, then decode, against the naive dense forward at every position.
TEST_P(RunnerVsNaiveTest, ChunkedPrefillThenDecodeMatchesNaiveForward) {
  const ModelConfig c = TinyConfig(GetParam());
  auto runner = MakeRunner(c, 7);
  const ModelWeights w = RandomWeights(c, 7);
  const std::vector<int32_t> tokens = Tokens(23, 3, c.vocab_size);
  const auto want = NaiveForward(c, w, tokens);
  const std::vector<int32_t> table = {9, 3, 17, 0, 30, 12};    // 6 blocks of 4 cover 24 positions
  const std::vector<int> chunk_sizes = {5, 1, 7, 2, 1, 1, 6};  // sums to 23
  int pos = 0;
  for (int size : chunk_sizes) {
    ForwardBatch batch;
    batch.chunks.push_back({std::span(tokens).subspan(pos, size), pos, table, true});
    ForwardOutput out;
    ASSERT_TRUE(runner->Forward(batch, &out).ok());
    ASSERT_EQ(out.rows, 1);
    pos += size;
    ExpectRowNear(out.logits.data(), want[pos - 1], 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaAndQwen2, RunnerVsNaiveTest, testing::Bool(),
                         [](const auto& info) { return info.param ? "Qwen2" : "Llama"; });

TEST(CpuModelRunnerTest, MixedBatchMatchesSeparateSequences) {
  const ModelConfig c = TinyConfig(false);
  auto runner = MakeRunner(c, 11);
  const ModelWeights w = RandomWeights(c, 11);
  const std::vector<int32_t> a = Tokens(13, 1, c.vocab_size), b = Tokens(9, 2, c.vocab_size);
  const auto want_a = NaiveForward(c, w, a), want_b = NaiveForward(c, w, b);
  const std::vector<int32_t> table_a = {1, 2, 3, 4}, table_b = {8, 7, 6};
  // Step 1: a's first 10 tokens (no logits) with b's first 4. Step 2: a's 3 remaining tokens,
  // b's next 5 tokens; b's logits only.
  ForwardBatch s1;
  s1.chunks.push_back({std::span(a).first(10), 0, table_a, false});
  s1.chunks.push_back({std::span(b).first(4), 0, table_b, true});
  ForwardOutput out;
  ASSERT_TRUE(runner->Forward(s1, &out).ok());
  ASSERT_EQ(out.rows, 1);
  ExpectRowNear(out.logits.data(), want_b[3], 1e-4);
  ForwardBatch s2;
  s2.chunks.push_back({std::span(b).subspan(4), 4, table_b, true});
  s2.chunks.push_back({std::span(a).subspan(10), 10, table_a, true});
  ASSERT_TRUE(runner->Forward(s2, &out).ok());
  ASSERT_EQ(out.rows, 2);
  ExpectRowNear(out.logits.data(), want_b[8], 1e-4);
  ExpectRowNear(out.logits.data() + c.vocab_size, want_a[12], 1e-4);
}

// num_logits: a chunk's last k tokens each get their logits row (prompt logprobs, draft scoring),
// exactly the rows a token-by-token forward gives; such a step is never sampled by the runner.
TEST(CpuModelRunnerTest, MultiRowLogitsMatchTheNaiveForward) {
  const ModelConfig c = TinyConfig(false);
  auto runner = MakeRunner(c, 17);
  const ModelWeights w = RandomWeights(c, 17);
  const std::vector<int32_t> a = Tokens(13, 3, c.vocab_size), b = Tokens(6, 4, c.vocab_size);
  const auto want_a = NaiveForward(c, w, a), want_b = NaiveForward(c, w, b);
  const std::vector<int32_t> table_a = {1, 2, 3, 4}, table_b = {8, 7};
  SampleRequest greedy;
  greedy.greedy = 1;
  ForwardBatch s1;
  SequenceChunk ca{std::span(a).first(10), 0, table_a, true};
  ca.num_logits = 10;
  ca.sample = &greedy;  // ignored: a multi-row chunk returns logits
  SequenceChunk cb{std::span(b), 0, table_b, true};
  cb.sample = &greedy;
  s1.chunks = {ca, cb};
  ForwardOutput out;
  ASSERT_TRUE(runner->Forward(s1, &out).ok());
  ASSERT_EQ(out.rows, 11);
  ASSERT_TRUE(out.tokens.empty());
  for (int i = 0; i < 10; ++i) ExpectRowNear(out.logits.data() + i * c.vocab_size, want_a[i], 1e-4);
  ExpectRowNear(out.logits.data() + 10 * c.vocab_size, want_b[5], 1e-4);
  // After a cached prefix: the last 2 of 3 new tokens.
  ForwardBatch s2;
  SequenceChunk rest{std::span(a).subspan(10), 10, table_a, true};
  rest.num_logits = 2;
  s2.chunks = {rest};
  ASSERT_TRUE(runner->Forward(s2, &out).ok());
  ASSERT_EQ(out.rows, 2);
  ExpectRowNear(out.logits.data(), want_a[11], 1e-4);
  ExpectRowNear(out.logits.data() + c.vocab_size, want_a[12], 1e-4);
  // Out of range is refused.
  for (int bad : {0, 4}) {
    ForwardBatch s3;
    SequenceChunk ch{std::span(b).first(3), 0, table_b, true};
    ch.num_logits = bad;
    s3.chunks = {ch};
    EXPECT_EQ(runner->Forward(s3, &out).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CpuModelRunnerTest, EmptyBatchGivesNoRows) {
  auto runner = MakeRunner(TinyConfig(true), 3);
  ForwardOutput out;
  out.logits.assign(7, 1.0f);
  out.rows = 3;
  ASSERT_TRUE(runner->Forward(ForwardBatch{}, &out).ok());
  EXPECT_EQ(out.rows, 0);
  EXPECT_TRUE(out.logits.empty());
}

TEST(CpuModelRunnerTest, NumBlocksDerivedFromCacheBytes) {
  const ModelConfig c = TinyConfig(true);
  CpuRunnerOptions opts;
  opts.block_size = 8;
  // 2 (K,V) * 4 bytes * 2 layers * 8 slots * 2 kv heads * 6 dims = 1536 bytes per block.
  opts.kv_cache_bytes = 1536 * 10 + 100;
  auto runner = CreateCpuModelRunner(c, RandomWeights(c, 1), opts);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->num_blocks(), 10);
  EXPECT_EQ((*runner)->block_size(), 8);
  opts.kv_cache_bytes = 1000;
  EXPECT_EQ(CreateCpuModelRunner(c, RandomWeights(c, 1), opts).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuModelRunnerTest, RejectsWeightsThatDoNotMatchConfig) {
  const ModelConfig c = TinyConfig(true);
  ModelWeights w = RandomWeights(c, 1);
  w.layers[1].k_bias.pop_back();
  EXPECT_EQ(CreateCpuModelRunner(c, std::move(w), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelConfig bad = c;
  bad.num_kv_heads = 3;
  EXPECT_EQ(CreateCpuModelRunner(bad, RandomWeights(c, 1), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuModelRunnerTest, InvalidBatchesAreRejectedAndLeaveCacheIntact) {
  const ModelConfig c = TinyConfig(false);
  auto runner = MakeRunner(c, 5, /*block_size=*/4, /*num_blocks=*/8);
  const ModelWeights w = RandomWeights(c, 5);
  const std::vector<int32_t> tokens = Tokens(6, 9, c.vocab_size);
  const auto want = NaiveForward(c, w, tokens);
  const std::vector<int32_t> table = {2, 5};
  ForwardBatch prefill;
  prefill.chunks.push_back({std::span(tokens).first(5), 0, table, true});
  ForwardOutput out;
  ASSERT_TRUE(runner->Forward(prefill, &out).ok());

  const std::vector<int32_t> bad_token = {c.vocab_size};
  const std::vector<int32_t> negative_token = {-1};
  const std::vector<int32_t> empty;
  const std::vector<int32_t> bad_block = {2, 8};
  const std::vector<int32_t> short_table = {2};
  const std::vector<int32_t> long_chunk(c.max_position_embeddings, 1);
  const std::vector<int32_t> many_blocks(20, 0);
  std::vector<SequenceChunk> bad = {
      {bad_token, 5, table, true},
      {negative_token, 5, table, true},
      {empty, 5, table, true},
      {std::span(tokens).subspan(5), 5, bad_block, true},
      {std::span(tokens).subspan(5), 5, short_table, true},
      {std::span(tokens).subspan(5), -1, table, true},
      {long_chunk, 1, many_blocks, true},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    ForwardBatch batch;
    // A valid chunk first: a rejected batch must not run it either.
    batch.chunks.push_back({std::span(tokens).subspan(5), 5, table, true});
    batch.chunks.push_back(bad[i]);
    ForwardOutput rejected;
    EXPECT_EQ(runner->Forward(batch, &rejected).code(), absl::StatusCode::kInvalidArgument)
        << "case " << i;
    EXPECT_EQ(rejected.rows, 0) << "case " << i;
  }
  ForwardBatch decode;
  decode.chunks.push_back({std::span(tokens).subspan(5), 5, table, true});
  ASSERT_TRUE(runner->Forward(decode, &out).ok());
  ExpectRowNear(out.logits.data(), want[5], 1e-4);
}

// kv_layout() addresses exactly where Forward writes: after a prefill into blocks {5, 2} only those
// blocks are non-zero, and copying them (every layer, K and V) with the layout formula into other
// blocks of a second runner lets it continue the sequence as if it had computed the prompt.
TEST(CpuModelRunnerTest, KvLayoutIsOneContiguousCacheAndBlocksCopyBetweenRunners) {
  const ModelConfig c = TinyConfig(false);
  auto a = MakeRunner(c, 13, /*block_size=*/4, /*num_blocks=*/8);
  auto b = MakeRunner(c, 13, /*block_size=*/4, /*num_blocks=*/8);
  const ModelWeights w = RandomWeights(c, 13);
  const KvCacheLayout la = a->kv_layout(), lb = b->kv_layout();
  ASSERT_NE(la.base, nullptr);
  EXPECT_NE(la.base, lb.base);
  EXPECT_EQ(la.num_layers, c.num_layers);
  EXPECT_EQ(la.num_blocks, 8);
  EXPECT_EQ(la.block_size, 4);
  EXPECT_EQ(la.num_kv_heads, c.num_kv_heads);
  EXPECT_EQ(la.head_dim, c.head_dim);
  EXPECT_EQ(la.elem_bytes, 4);
  EXPECT_EQ(la.block_bytes, size_t{4} * 4 * c.num_kv_heads * c.head_dim);
  EXPECT_EQ(la.block_stride, la.block_bytes);
  EXPECT_EQ(la.kv_stride, 8 * la.block_stride);
  EXPECT_EQ(la.layer_stride, 2 * la.kv_stride);
  EXPECT_EQ(la.bytes, c.num_layers * la.layer_stride);

  const std::vector<int32_t> tokens = Tokens(8, 21, c.vocab_size);
  const auto want = NaiveForward(c, w, tokens);
  const std::vector<int32_t> src_table = {5, 2}, dst_table = {0, 3};
  ForwardBatch prefill;
  prefill.chunks.push_back({std::span(tokens).first(7), 0, src_table, true});
  ForwardOutput out;
  ASSERT_TRUE(a->Forward(prefill, &out).ok());
  auto nonzero = [&](const KvCacheLayout& l, int layer, int kv, int block) {
    const char* p = l.BlockPtr(layer, kv, block);
    return std::any_of(p, p + l.block_bytes, [](char ch) { return ch != 0; });
  };
  for (int layer = 0; layer < c.num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int block = 0; block < 8; ++block) {
        EXPECT_EQ(nonzero(la, layer, kv, block), block == 5 || block == 2)
            << "layer " << layer << " kv " << kv << " block " << block;
      }
    }
  }
  for (int layer = 0; layer < c.num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (size_t i = 0; i < src_table.size(); ++i) {
        std::memcpy(lb.BlockPtr(layer, kv, dst_table[i]), la.BlockPtr(layer, kv, src_table[i]),
                    la.block_bytes);
      }
    }
  }
  ForwardBatch decode;
  decode.chunks.push_back({std::span(tokens).subspan(7), 7, dst_table, true});
  ASSERT_TRUE(b->Forward(decode, &out).ok());
  ExpectRowNear(out.logits.data(), want[7], 1e-4);
}

}  // namespace
}  // namespace tandem

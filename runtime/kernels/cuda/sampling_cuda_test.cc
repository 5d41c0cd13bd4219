// Differential test of the GPU sampler against tandem::Sample (the CPU reference): thousands of
// (row, params, seed, step) cases on random logits (normal, peaked, quantized with exact ties,
// all equal), vocab 128256 and small vocabs, top_k 1/50/>2048/vocab, top_p 0.1..1, min_p 0..0.5,
// temperature 0.3..2 and greedy rows mixed into one batch, plus exact-tie rows where top_p * total
// lands on a prefix sum (all-equal and quantized logits with top_p 0.5 / 0.25 / 0.75). Tokens must
// match exactly (both sides use the integer weights of runtime/sampling/sampling_math.h, so there
// is no tolerance); logprobs within 1e-4. Also prints the time of one 64 x 128256 launch. Skipped
// without a GPU.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cuda/cuda_kernel_test_util.h"
#include "runtime/kernels/cuda/sampling_kernels.h"
#include "runtime/sampling/sampler.h"
#include "runtime/sampling/sampling_params.h"

namespace tandem {
namespace {

using cuda::SamplingRow;
using testing_util::CudaKernelTest;
using testing_util::FastRng;

enum class LogitKind { kNormal, kPeaked, kQuantized, kAllEqual };

float Normal(FastRng& rng) {
  const double u1 = (static_cast<double>(rng.Next() >> 11) + 1.0) / 9007199254740993.0;
  const double u2 = static_cast<double>(rng.Next() >> 11) / 9007199254740992.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

std::vector<float> MakeLogits(LogitKind kind, int vocab, FastRng& rng) {
  std::vector<float> v(vocab);
  switch (kind) {
    case LogitKind::kNormal:
      for (float& x : v) x = 2.0f * Normal(rng);
      break;
    case LogitKind::kPeaked:
      // An LLM-like row: a few large logits over a normal background.
      for (float& x : v) x = 1.5f * Normal(rng) - 3.0f;
      for (int j = 0; j < 5; ++j) v[rng.UniformInt(0, vocab - 1)] = rng.Uniform(8.0f, 20.0f);
      break;
    case LogitKind::kQuantized:
      // Few distinct values: large groups of exactly tied tokens.
      for (float& x : v) x = std::round(2.0f * Normal(rng)) * 0.5f;
      break;
    case LogitKind::kAllEqual:
      for (float& x : v) x = 1.25f;
      break;
  }
  return v;
}

// Random parameters covering each filter alone and combined, plus greedy rows.
SamplingParams RandomParams(int vocab, FastRng& rng) {
  SamplingParams p;
  const int mode = rng.UniformInt(0, 9);
  if (mode == 0) {
    p.temperature = 0.0f;  // greedy
    return p;
  }
  p.temperature = rng.Uniform(0.3f, 2.0f);
  if (mode == 1) return p;  // temperature only: every token kept
  const int k_choice = rng.UniformInt(0, 5);
  if (mode != 2) {
    const int ks[] = {0, 1, 50, vocab, std::min(vocab, 3000), rng.UniformInt(1, vocab)};
    p.top_k = ks[k_choice];
  }
  if (mode != 3 && rng.UniformInt(0, 2) != 0) {
    const float tps[] = {1.0f, 0.9f, 0.5f, rng.Uniform(0.1f, 1.0f)};
    p.top_p = tps[rng.UniformInt(0, 3)];
  }
  if (mode == 2 || mode == 4 || rng.UniformInt(0, 3) == 0) {
    const float mps[] = {0.0f, 0.05f, rng.Uniform(0.0f, 0.5f)};
    p.min_p = mps[rng.UniformInt(0, 2)];
  }
  return p;
}

SamplingRow ToRow(const SamplingParams& p, uint64_t seed, uint64_t step) {
  SamplingRow r;
  r.seed = seed;
  r.step = step;
  r.temperature = p.temperature;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.top_k = p.top_k;
  r.greedy = p.greedy() ? 1 : 0;
  return r;
}

std::string Describe(const SamplingParams& p, uint64_t seed, uint64_t step) {
  return absl::StrCat("T=", p.temperature, " top_k=", p.top_k, " top_p=", p.top_p,
                      " min_p=", p.min_p, " seed=", seed, " step=", step);
}

class SamplingCudaTest : public CudaKernelTest {
 protected:
  // Samples `rounds` parameter sets on one batch of `rows` rows of `kind` logits and compares
  // every row with tandem::Sample. Returns the number of cases.
  // A positive `force_top_p` replaces top_p in every non-greedy row.
  int Compare(LogitKind kind, int rows, int vocab, int rounds, uint64_t seed,
              float force_top_p = 0.0f) {
    FastRng rng(seed);
    std::vector<float> logits;
    logits.reserve(static_cast<size_t>(rows) * vocab);
    for (int r = 0; r < rows; ++r) {
      const std::vector<float> row = MakeLogits(kind, vocab, rng);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    const DeviceBuffer d_logits = Upload(logits);
    const DeviceBuffer d_params = Alloc(rows * sizeof(SamplingRow));
    const DeviceBuffer d_tokens = Alloc(rows * sizeof(int32_t));
    const DeviceBuffer d_logprobs = Alloc(rows * sizeof(float));
    int cases = 0;
    for (int round = 0; round < rounds; ++round) {
      std::vector<SamplingParams> params(rows);
      std::vector<SamplingRow> host_rows(rows);
      for (int r = 0; r < rows; ++r) {
        params[r] = RandomParams(vocab, rng);
        if (force_top_p > 0.0f && !params[r].greedy()) params[r].top_p = force_top_p;
        host_rows[r] = ToRow(params[r], rng.Next(), rng.Next() % 4096);
        EXPECT_TRUE(cuda::ValidateSamplingRow(host_rows[r]).ok());
      }
      EXPECT_TRUE(
          device_
              ->CopyHostToDevice(host_rows.data(), rows * sizeof(SamplingRow), d_params, 0, stream_)
              .ok());
      cuda::SamplingArgs a;
      a.logits = static_cast<const float*>(d_logits.data);
      a.params = static_cast<const SamplingRow*>(d_params.data);
      a.rows = rows;
      a.vocab = vocab;
      a.tokens = static_cast<int32_t*>(d_tokens.data);
      a.logprobs = static_cast<float*>(d_logprobs.data);
      const absl::Status s = cuda::LaunchSampling(a, stream());
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) return cases;
      const std::vector<int32_t> tokens = Download<int32_t>(d_tokens, rows);
      const std::vector<float> logprobs = Download<float>(d_logprobs, rows);
      for (int r = 0; r < rows; ++r) {
        const std::span<const float> row(logits.data() + static_cast<size_t>(r) * vocab, vocab);
        const SampleResult want =
            Sample(params[r], row, {}, {}, host_rows[r].seed, host_rows[r].step);
        ++cases;
        EXPECT_EQ(tokens[r], want.token)
            << "kind " << static_cast<int>(kind) << " vocab " << vocab << " row " << r << ": "
            << Describe(params[r], host_rows[r].seed, host_rows[r].step);
        EXPECT_NEAR(logprobs[r], want.logprob, 1e-4)
            << "vocab " << vocab << " row " << r << " token " << tokens[r];
      }
    }
    FreeAll();
    return cases;
  }
};

TEST_F(SamplingCudaTest, MatchesCpuOnLlama3Vocab) {
  int cases = 0;
  cases += Compare(LogitKind::kNormal, 64, 128256, 3, 1);
  cases += Compare(LogitKind::kPeaked, 64, 128256, 3, 2);
  cases += Compare(LogitKind::kQuantized, 64, 128256, 3, 3);
  cases += Compare(LogitKind::kAllEqual, 8, 128256, 4, 4);
  std::printf("vocab 128256: %d cases\n", cases);
}

TEST_F(SamplingCudaTest, MatchesCpuOnSmallVocabs) {
  int cases = 0;
  uint64_t seed = 100;
  for (const int vocab : {1, 2, 7, 100, 1000, 2048, 2049, 5000, 32000}) {
    for (const LogitKind kind :
         {LogitKind::kNormal, LogitKind::kPeaked, LogitKind::kQuantized, LogitKind::kAllEqual}) {
      cases += Compare(kind, vocab >= 32000 ? 64 : 256, vocab, vocab >= 32000 ? 2 : 3, ++seed);
    }
  }
  std::printf("small vocabs: %d cases\n", cases);
}

// The cases that split CPU and GPU when each side summed doubles in its own order: many exactly
// tied tokens and a top_p that puts the cut on a tie boundary.
TEST_F(SamplingCudaTest, MatchesCpuOnExactTopPTies) {
  int cases = 0;
  uint64_t seed = 500;
  for (const int vocab : {2, 7, 1000, 2048, 2049, 4096, 5000, 10000, 128256}) {
    for (const float top_p : {0.5f, 0.25f, 0.75f}) {
      for (const LogitKind kind : {LogitKind::kAllEqual, LogitKind::kQuantized}) {
        cases += Compare(kind, vocab >= 10000 ? 64 : 256, vocab, 2, ++seed, top_p);
      }
    }
  }
  std::printf("exact top_p ties: %d cases\n", cases);
  EXPECT_GT(cases, 5000);
}

TEST_F(SamplingCudaTest, MaxShape) {
  // 256 rows x 256K: every row a different filter set.
  const int cases = Compare(LogitKind::kNormal, 256, cuda::kSamplingMaxVocab, 1, 7);
  EXPECT_EQ(cases, 256);
}

TEST_F(SamplingCudaTest, TimesOneBatch) {
  constexpr int kRows = 64;
  constexpr int kVocab = 128256;
  FastRng rng(9);
  std::vector<float> logits;
  for (int r = 0; r < kRows; ++r) {
    const std::vector<float> row =
        MakeLogits(r % 2 ? LogitKind::kPeaked : LogitKind::kNormal, kVocab, rng);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  const DeviceBuffer d_logits = Upload(logits);
  const DeviceBuffer d_params = Alloc(kRows * sizeof(SamplingRow));
  const DeviceBuffer d_tokens = Alloc(kRows * sizeof(int32_t));
  const DeviceBuffer d_logprobs = Alloc(kRows * sizeof(float));
  struct Config {
    const char* name;
    float temperature;
    int top_k;
    float top_p;
    float min_p;
  };
  for (const Config& c :
       {Config{"greedy", 0.0f, 0, 1.0f, 0.0f}, Config{"T=0.8 top_k=50", 0.8f, 50, 1.0f, 0.0f},
        Config{"T=0.8 top_p=0.9", 0.8f, 0, 0.9f, 0.0f},
        Config{"T=0.8 top_k=50 top_p=0.9 min_p=0.05", 0.8f, 50, 0.9f, 0.05f},
        Config{"T=1 keep all", 1.0f, 0, 1.0f, 0.0f}}) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    std::vector<SamplingRow> rows;
    for (int r = 0; r < kRows; ++r) rows.push_back(ToRow(p, 1234 + r, 7));
    ASSERT_TRUE(
        device_->CopyHostToDevice(rows.data(), kRows * sizeof(SamplingRow), d_params, 0, stream_)
            .ok());
    cuda::SamplingArgs a;
    a.logits = static_cast<const float*>(d_logits.data);
    a.params = static_cast<const SamplingRow*>(d_params.data);
    a.rows = kRows;
    a.vocab = kVocab;
    a.tokens = static_cast<int32_t*>(d_tokens.data);
    a.logprobs = static_cast<float*>(d_logprobs.data);
    ASSERT_TRUE(cuda::LaunchSampling(a, stream()).ok());  // warm-up
    ASSERT_TRUE(device_->SynchronizeStream(stream_).ok());
    constexpr int kIters = 20;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kIters; ++i) ASSERT_TRUE(cuda::LaunchSampling(a, stream()).ok());
    ASSERT_TRUE(device_->SynchronizeStream(stream_).ok());
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() /
        kIters;
    std::printf("sampling %d x %d, %s: %.1f us per launch\n", kRows, kVocab, c.name, us);
  }
}

}  // namespace
}  // namespace tandem

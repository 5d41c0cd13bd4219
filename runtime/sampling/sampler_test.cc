#include "runtime/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/sampling/sampling_math.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

std::vector<float> LogitsOf(std::vector<double> probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

SamplingParams Random(float temperature = 1.0f) {
  SamplingParams p;
  p.temperature = temperature;
  return p;
}

TEST(SamplerTest, LogSoftmaxMatchesHandValues) {
  std::vector<float> lp = LogSoftmax(std::vector<float>{0.0f, std::log(3.0f)});
  EXPECT_NEAR(lp[0], std::log(0.25), 1e-6);
  EXPECT_NEAR(lp[1], std::log(0.75), 1e-6);
}

TEST(SamplerTest, RepetitionPenaltyHfSemantics) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 3.0f};
  ApplyPenalties(p, std::vector<int32_t>{0}, std::vector<int32_t>{1, 1}, logits);
  EXPECT_THAT(logits, ::testing::ElementsAre(1.0f, -4.0f, 1.0f, 3.0f));
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesOpenAiSemanticsOnOutputOnly) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f};
  ApplyPenalties(p, /*prompt=*/std::vector<int32_t>{3, 3}, std::vector<int32_t>{2, 2, 0}, logits);
  EXPECT_FLOAT_EQ(logits[0], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[1], 1.0f);
  EXPECT_FLOAT_EQ(logits[2], 1.0f - 0.5f - 0.5f);
  EXPECT_FLOAT_EQ(logits[3], 1.0f);  // prompt tokens are not penalized
}

TEST(SamplerTest, TemperatureScalesLogits) {
  std::vector<double> probs = FilteredProbs(Random(0.5f), LogitsOf({1.0 / 3, 2.0 / 3}));
  // softmax([0, ln2] / 0.5) = [1, 4] / 5
  EXPECT_NEAR(probs[0], 0.2, 1e-6);
  EXPECT_NEAR(probs[1], 0.8, 1e-6);
}

TEST(SamplerTest, TopKKeepsKMostLikely) {
  SamplingParams p = Random();
  p.top_k = 2;
  std::vector<double> probs = FilteredProbs(p, LogitsOf({0.1, 0.2, 0.3, 0.4}));
  EXPECT_NEAR(probs[0], 0.0, 1e-12);
  EXPECT_NEAR(probs[1], 0.0, 1e-12);
  EXPECT_NEAR(probs[2], 3.0 / 7, 1e-6);
  EXPECT_NEAR(probs[3], 4.0 / 7, 1e-6);
}

TEST(SamplerTest, TopPKeepsSmallestNucleusIncludingCrossingToken) {
  SamplingParams p = Random();
  p.top_p = 0.5f;  // 0.4 < 0.5, 0.4 + 0.3 >= 0.5
  std::vector<double> probs = FilteredProbs(p, LogitsOf({0.1, 0.2, 0.3, 0.4}));
  EXPECT_NEAR(probs[0], 0.0, 1e-12);
  EXPECT_NEAR(probs[1], 0.0, 1e-12);
  EXPECT_NEAR(probs[2], 3.0 / 7, 1e-6);
  EXPECT_NEAR(probs[3], 4.0 / 7, 1e-6);
  p.top_p = 0.35f;
  probs = FilteredProbs(p, LogitsOf({0.1, 0.2, 0.3, 0.4}));
  EXPECT_NEAR(probs[3], 1.0, 1e-9);
}

TEST(SamplerTest, MinPDropsTokensBelowFractionOfMax) {
  SamplingParams p = Random();
  p.min_p = 0.45f;  // threshold 0.18
  std::vector<double> probs = FilteredProbs(p, LogitsOf({0.1, 0.2, 0.3, 0.4}));
  EXPECT_NEAR(probs[0], 0.0, 1e-12);
  EXPECT_NEAR(probs[1], 0.2 / 0.9, 1e-6);
  EXPECT_NEAR(probs[2], 0.3 / 0.9, 1e-6);
  EXPECT_NEAR(probs[3], 0.4 / 0.9, 1e-6);
}

TEST(SamplerTest, GreedyIsArgmaxAfterPenaltiesLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0.0f;
  std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f};
  EXPECT_EQ(Sample(p, logits, {}, {}, 0, 0).token, 1);
  p.repetition_penalty = 2.0f;  // 3 -> 1.5 for token 1 and 2, token 3 wins
  std::vector<int32_t> prompt = {1, 2};
  SampleResult r = Sample(p, logits, prompt, {}, 0, 0);
  EXPECT_EQ(r.token, 3);
  // The reported logprob is of the raw logits, not the penalized ones.
  EXPECT_NEAR(r.logprob, LogSoftmax(logits)[3], 1e-6);
}

TEST(SamplerTest, TopLogprobsOfRawLogits) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 2;
  std::vector<float> logits = LogitsOf({0.1, 0.2, 0.3, 0.4});
  SampleResult r = Sample(p, logits, {}, {}, 0, 0);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].token, 3);
  EXPECT_NEAR(r.top_logprobs[0].logprob, std::log(0.4), 1e-6);
  EXPECT_EQ(r.top_logprobs[1].token, 2);
  EXPECT_NEAR(r.top_logprobs[1].logprob, std::log(0.3), 1e-6);
}

TEST(SamplerTest, SameSeedAndStepGiveSameToken) {
  SamplingParams p = Random();
  std::vector<float> logits = LogitsOf({0.25, 0.25, 0.25, 0.25});
  for (uint64_t step = 0; step < 50; ++step) {
    EXPECT_EQ(Sample(p, logits, {}, {}, 1234, step).token,
              Sample(p, logits, {}, {}, 1234, step).token);
  }
  int differ = 0;
  for (uint64_t step = 0; step < 50; ++step) {
    differ += Sample(p, logits, {}, {}, 1, step).token != Sample(p, logits, {}, {}, 2, step).token;
  }
  EXPECT_GT(differ, 10);  // different seeds give different streams
}

// Empirical frequencies over a fixed budget of seeds against the exact distribution.
TEST(SamplerTest, StatisticalTemperatureAndTopP) {
  const std::vector<double> base = {0.1, 0.2, 0.3, 0.4};
  const std::vector<float> logits = LogitsOf(base);
  const int n = 40000;
  struct Case {
    float temperature;
    float top_p;
    std::vector<double> expected;
  };
  // T=0.5 squares the probabilities: [1, 4, 9, 16] / 30. top_p 0.5 keeps {0.3, 0.4}.
  std::vector<Case> cases = {
      {1.0f, 1.0f, base},
      {0.5f, 1.0f, {1.0 / 30, 4.0 / 30, 9.0 / 30, 16.0 / 30}},
      {1.0f, 0.5f, {0.0, 0.0, 3.0 / 7, 4.0 / 7}},
  };
  for (const Case& c : cases) {
    SamplingParams p = Random(c.temperature);
    p.top_p = c.top_p;
    std::vector<int> counts(4, 0);
    for (int i = 0; i < n; ++i) ++counts[Sample(p, logits, {}, {}, i, 0).token];
    for (int t = 0; t < 4; ++t) {
      const double freq = static_cast<double>(counts[t]) / n;
      const double sigma = std::sqrt(c.expected[t] * (1 - c.expected[t]) / n);
      EXPECT_NEAR(freq, c.expected[t], 5 * sigma + 1e-12)
          << "T=" << c.temperature << " top_p=" << c.top_p << " token " << t;
    }
  }
}

TEST(SamplingMathTest, QuantizedWeightIsExpTimes2To40) {
  namespace sm = sampling_math;
  EXPECT_EQ(sm::QuantizedWeight(0.0), sm::kWeightOne);
  EXPECT_EQ(sm::QuantizedWeight(-std::numeric_limits<double>::infinity()), 0u);
  EXPECT_EQ(sm::QuantizedWeight(-30.5), 0u);
  double worst = 0.0;
  for (int i = 0; i <= 300000; ++i) {
    const double a = -30.0 * i / 300000.0;
    const double want = std::exp(a) * 0x1p40;
    const double got = static_cast<double>(sm::QuantizedWeight(a));
    ASSERT_LE(std::abs(got - want), 0.5 + 1e-14 * want) << a;
    if (want > 1e6) worst = std::max(worst, std::abs(got - want) / want);
  }
  EXPECT_LT(worst, 1e-6);
}

TEST(SamplingMathTest, DrawThresholdIsFloorOfUTimesTotal) {
  namespace sm = sampling_math;
  const uint64_t max_bits = (uint64_t{1} << 53) - 1;
  EXPECT_EQ(sm::DrawThreshold(0, 1000), 0u);
  EXPECT_EQ(sm::DrawThreshold(max_bits, 1000), 999u);
  EXPECT_EQ(sm::DrawThreshold(uint64_t{1} << 52, 1001), 500u);  // u = 0.5
  const uint64_t big = (uint64_t{1} << 58) + 12345;
  // u = 1 - 2^-53: floor(big - big / 2^53) = big - 33 (big / 2^53 is just above 32).
  EXPECT_EQ(sm::DrawThreshold(max_bits, big), big - 33);
  EXPECT_EQ(sm::MinPWeight(0.0f), 1u);
  EXPECT_EQ(sm::MinPWeight(1.0f), sm::kWeightOne);
  EXPECT_EQ(sm::MinPWeight(0.5f), sm::kWeightOne / 2);
  EXPECT_EQ(sm::TopPTarget(0.5f, 5000), 2500u);
  EXPECT_EQ(sm::TopPTarget(0.5f, 5001), 2501u);
  EXPECT_EQ(sm::TopPTarget(1.0f, 77), 77u);
}

// The case that split CPU and GPU before integer weights: all-equal logits with top_p 0.5, where
// top_p * total lands exactly on a prefix sum. The nucleus is exactly the first half.
TEST(SamplerTest, TopPOnExactTieKeepsExactlyTheCrossingPrefix) {
  for (const int vocab : {2, 7, 100, 5000}) {
    const std::vector<float> logits(vocab, 1.25f);
    SamplingParams p = Random(1.58135f);
    p.top_p = 0.5f;
    const std::vector<uint64_t> w = FilteredWeights(p, logits);
    const int kept =
        static_cast<int>(std::count_if(w.begin(), w.end(), [](uint64_t q) { return q != 0; }));
    EXPECT_EQ(kept, (vocab + 1) / 2) << vocab;
    for (int i = 0; i < kept; ++i) EXPECT_EQ(w[i], sampling_math::kWeightOne);
    // The draw is uniform over the kept ids: floor(u * kept).
    for (uint64_t step = 0; step < 100; ++step) {
      const int want = static_cast<int>(
          sampling_math::DrawThreshold(sampling_math::UniformBits(5769797641725598749ULL, step),
                                       static_cast<uint64_t>(kept) * sampling_math::kWeightOne) /
          sampling_math::kWeightOne);
      EXPECT_EQ(Sample(p, logits, {}, {}, 5769797641725598749ULL, step).token, want);
    }
  }
}

TEST(SamplerTest, SampleFromRequestEqualsSample) {
  std::vector<float> logits;
  for (int i = 0; i < 500; ++i) logits.push_back(std::sin(i * 0.37f) * 4.0f);
  const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
  const int top_ks[] = {0, 1, 7, 500};
  const float top_ps[] = {1.0f, 0.9f, 0.3f};
  const float min_ps[] = {0.0f, 0.1f};
  int n = 0;
  for (float t : temps) {
    for (int k : top_ks) {
      for (float tp : top_ps) {
        for (float mp : min_ps) {
          SamplingParams p;
          p.temperature = t;
          p.top_k = k;
          p.top_p = tp;
          p.min_p = mp;
          ASSERT_TRUE(SamplesFromLogitsOnly(p));
          for (uint64_t step = 0; step < 5; ++step) {
            const SampleRequest req = MakeSampleRequest(p, 99 + n, step);
            ASSERT_TRUE(ValidateSampleRequest(req).ok());
            const SampleResult want = Sample(p, logits, {}, {}, 99 + n, step);
            const SampleResult got = SampleFromRequest(req, logits);
            EXPECT_EQ(got.token, want.token);
            EXPECT_EQ(got.logprob, want.logprob);
          }
          ++n;
        }
      }
    }
  }
}

TEST(SamplerTest, SamplesFromLogitsOnlyExcludesPenaltiesAndTopLogprobs) {
  SamplingParams p;
  EXPECT_TRUE(SamplesFromLogitsOnly(p));
  p.logprobs = 0;  // only the sampled token's logprob: still from the logits alone
  EXPECT_TRUE(SamplesFromLogitsOnly(p));
  p.logprobs = 1;
  EXPECT_FALSE(SamplesFromLogitsOnly(p));
  p = SamplingParams{};
  p.repetition_penalty = 1.1f;
  EXPECT_FALSE(SamplesFromLogitsOnly(p));
  p = SamplingParams{};
  p.presence_penalty = 0.5f;
  EXPECT_FALSE(SamplesFromLogitsOnly(p));
  p = SamplingParams{};
  p.frequency_penalty = -0.5f;
  EXPECT_FALSE(SamplesFromLogitsOnly(p));
}

TEST(SamplerTest, SamplesFromLogitsOnlyExcludesLogitControlsAndMinTokens) {
  SamplingParams p;
  p.logit_bias = {{1, 2.0f}};
  EXPECT_FALSE(SamplesFromLogitsOnly(p));
  p = SamplingParams{};
  p.allowed_token_ids = {1};
  EXPECT_FALSE(SamplesFromLogitsOnly(p));
  p = SamplingParams{};
  p.min_tokens = 3;
  EXPECT_FALSE(SamplesFromLogitsOnly(p));
}

TEST(SamplerTest, LogitBiasIsAddedToTheLogits) {
  SamplingParams p;
  p.logit_bias = {{0, 1.5f}, {3, -100.0f}, {99, 5.0f}};  // 99: outside, skipped
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f};
  ApplyLogitControls(p, {}, logits);
  EXPECT_THAT(logits, ::testing::ElementsAre(2.5f, 2.0f, 3.0f, -96.0f));
}

TEST(SamplerTest, AllowedTokenIdsAndSuppressedTokensGetMinusInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  SamplingParams p;
  p.allowed_token_ids = {1, 2};
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f};
  ApplyLogitControls(p, std::vector<int32_t>{2}, logits);
  EXPECT_THAT(logits, ::testing::ElementsAre(-inf, 2.0f, -inf, -inf));
}

TEST(SamplerTest, GreedyAndSampledDrawsNeverPickASuppressedOrDisallowedToken) {
  // Token 3 is by far the most likely; suppressed, greedy takes the next one.
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 9.0f};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(Sample(greedy, logits, {}, {}, 1, 0).token, 3);
  EXPECT_EQ(Sample(greedy, logits, {}, {}, 1, 0, std::vector<int32_t>{3}).token, 2);
  // A +100 bias makes token 0 the argmax; the logprob reported stays the raw one.
  greedy.logit_bias = {{0, 100.0f}};
  const SampleResult biased = Sample(greedy, logits, {}, {}, 1, 0);
  EXPECT_EQ(biased.token, 0);
  EXPECT_NEAR(biased.logprob, LogSoftmax(logits)[0], 1e-6);
  SamplingParams random = Random();
  random.allowed_token_ids = {0, 1};
  for (uint64_t step = 0; step < 200; ++step) {
    const int32_t t = Sample(random, logits, {}, {}, 7, step, std::vector<int32_t>{1}).token;
    EXPECT_EQ(t, 0) << "step " << step;
  }
}

TEST(SamplerTest, WhenEverythingAllowedIsSuppressedTheSuppressionYields) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.allowed_token_ids = {2};  // only a stop token is allowed, and min_tokens suppresses it
  const std::vector<float> logits = {5.0f, 1.0f, 0.0f};
  EXPECT_EQ(Sample(p, logits, {}, {}, 1, 0, std::vector<int32_t>{2}).token, 2);
}

TEST(SamplerTest, LogitBiasShiftsTheSampledDistributionByExpOfTheBias) {
  // Two equally likely tokens; +ln(3) on token 1 makes it 3 times as likely: p = 0.75.
  SamplingParams p = Random();
  p.logit_bias = {{1, std::log(3.0f)}};
  const std::vector<float> logits = {0.0f, 0.0f};
  int ones = 0;
  constexpr int kDraws = 20000;
  for (uint64_t step = 0; step < kDraws; ++step) ones += Sample(p, logits, {}, {}, 11, step).token;
  // Binomial(20000, 0.75): sd 61; 5 sd.
  EXPECT_NEAR(ones, 0.75 * kDraws, 310);
}

TEST(SamplingParamsTest, ValidatesTheLogitControlsAndMinTokens) {
  SamplingParams p;
  p.min_tokens = -1;
  EXPECT_THAT(ValidateSamplingParams(p, 10).message(), HasSubstr("min_tokens"));
  p = SamplingParams{};
  p.max_tokens = 4;
  p.min_tokens = 5;
  EXPECT_THAT(ValidateSamplingParams(p, 10).message(), HasSubstr("min_tokens"));
  p.min_tokens = 4;
  EXPECT_TRUE(ValidateSamplingParams(p, 10).ok());
  p = SamplingParams{};
  p.logit_bias = {{10, 1.0f}};
  EXPECT_THAT(ValidateSamplingParams(p, 10).message(), HasSubstr("logit_bias"));
  p.logit_bias = {{1, 100.5f}};
  EXPECT_THAT(ValidateSamplingParams(p, 10).message(), HasSubstr("logit_bias"));
  p.logit_bias = {{1, std::numeric_limits<float>::quiet_NaN()}};
  EXPECT_THAT(ValidateSamplingParams(p, 10).message(), HasSubstr("logit_bias"));
  p.logit_bias = {{1, 1.0f}, {1, 2.0f}};
  EXPECT_THAT(ValidateSamplingParams(p, 10).message(), HasSubstr("twice"));
  p = SamplingParams{};
  p.allowed_token_ids = {3, 12};
  EXPECT_THAT(ValidateSamplingParams(p, 10).message(), HasSubstr("allowed_token_ids"));
}

TEST(SamplerTest, ValidateSampleRequestNamesTheField) {
  SampleRequest r;
  EXPECT_TRUE(ValidateSampleRequest(r).ok());
  r.temperature = 0.0f;
  EXPECT_THAT(std::string(ValidateSampleRequest(r).message()), HasSubstr("temperature"));
  r.greedy = 1;  // greedy ignores the rest
  EXPECT_TRUE(ValidateSampleRequest(r).ok());
  r = SampleRequest{};
  r.top_p = 0.0f;
  EXPECT_THAT(std::string(ValidateSampleRequest(r).message()), HasSubstr("top_p"));
  r = SampleRequest{};
  r.min_p = NAN;
  EXPECT_THAT(std::string(ValidateSampleRequest(r).message()), HasSubstr("min_p"));
}

TEST(SamplingParamsTest, ValidationNamesTheParameter) {
  auto check = [](auto mutate, const char* name) {
    SamplingParams p;
    mutate(p);
    absl::Status s = ValidateSamplingParams(p, 100);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(s.message()), HasSubstr(name));
  };
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}, 100).ok());
  check([](SamplingParams& p) { p.temperature = -0.1f; }, "temperature");
  check([](SamplingParams& p) { p.temperature = NAN; }, "temperature");
  check([](SamplingParams& p) { p.top_k = -2; }, "top_k");
  check([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p");
  check([](SamplingParams& p) { p.top_p = 1.5f; }, "top_p");
  check([](SamplingParams& p) { p.min_p = -0.5f; }, "min_p");
  check([](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  check([](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty");
  check([](SamplingParams& p) { p.frequency_penalty = -3.0f; }, "frequency_penalty");
  check([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens");
  check([](SamplingParams& p) { p.logprobs = 21; }, "logprobs");
  check([](SamplingParams& p) { p.stop_token_ids = {100}; }, "stop_token_ids");
  check([](SamplingParams& p) { p.stop = {""}; }, "stop");
}

}  // namespace
}  // namespace tandem

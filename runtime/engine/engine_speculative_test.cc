// Speculative decoding in the engine. Outputs never depend on the drafter: with an oracle (every
// draft right), a half-right oracle, random drafts, the n-gram drafter, and drafters that fail,
// answer late, too long or outside the vocabulary, every request's tokens and logprobs equal
// those without speculation, for greedy and seeded sampling, penalties and stop tokens, in mixed
// batches, on the contract-checking fake runner (its KV check fails if a rolled-back slot is
// read) and on the CPU runner over a tiny Llama. A chi-square test checks that sampled tokens
// follow the target distribution computed independently from the fake runner's reference
// logits.
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/fake_model_runner.h"
#include "runtime/engine/tiny_model_test_util.h"
#include "runtime/sampling/sampler.h"
#include "speculative/ngram_drafter.h"

namespace tandem {
namespace {

constexpr int kVocab = 48;

struct Job {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

struct Result {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  std::optional<FinishReason> finish;
};

// Runs every job at once (one engine), returns results by job index and the engine's stats.
std::vector<Result> RunJobs(std::unique_ptr<ModelRunner> runner, const std::vector<Job>& jobs,
                            const EngineOptions& options, EngineStats* stats = nullptr) {
  auto engine = Engine::Create(std::move(runner), nullptr, options);
  CHECK(engine.ok()) << engine.status();
  absl::Mutex mu;
  std::vector<Result> results(jobs.size());
  size_t finished = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    GenerateRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = jobs[i].prompt;
    r.params = jobs[i].params;
    r.on_output = [&, i](const GenerationOutput& out) {
      absl::MutexLock lock(&mu);
      Result& res = results[i];
      res.tokens.insert(res.tokens.end(), out.token_ids.begin(), out.token_ids.end());
      res.logprobs.insert(res.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      EXPECT_NE(out.finish_reason, FinishReason::kError) << out.error;
      if (out.finish_reason.has_value()) {
        res.finish = out.finish_reason;
        ++finished;
      }
    };
    CHECK((*engine)->Submit(std::move(r)).ok());
  }
  {
    absl::MutexLock lock(&mu);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return finished == jobs.size(); };
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(120)));
  }
  (*engine)->Shutdown(absl::Seconds(5));
  if (stats != nullptr) *stats = (*engine)->stats();
  absl::MutexLock lock(&mu);
  return results;
}

void ExpectSame(const std::vector<Result>& got, const std::vector<Result>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ", job " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << what << ", job " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << what << ", job " << i;
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      EXPECT_EQ(got[i].logprobs[t].token, want[i].logprobs[t].token);
      EXPECT_NEAR(got[i].logprobs[t].logprob, want[i].logprobs[t].logprob, 1e-4)
          << what << ", job " << i << " token " << t;
    }
  }
}

// Proposes from known outputs (prompt -> the tokens generated without speculation): exact
// continuations, or with every `corrupt_every`-th proposal's last token wrong.
class OracleDrafter : public speculative::Drafter {
 public:
  OracleDrafter(std::map<std::vector<int32_t>, std::vector<int32_t>> outputs, int corrupt_every)
      : outputs_(std::move(outputs)), corrupt_every_(corrupt_every) {}
  std::string_view name() const override { return "oracle"; }
  absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(
      std::span<const speculative::DraftRequest> requests, absl::Time) override {
    std::vector<std::vector<int32_t>> out;
    for (const speculative::DraftRequest& r : requests) {
      std::vector<int32_t> prompt(r.tokens.begin(), r.tokens.begin() + r.num_prompt_tokens);
      const std::vector<int32_t>& full = outputs_.at(prompt);
      std::vector<int32_t> d;
      for (size_t p = r.tokens.size() - r.num_prompt_tokens;
           p < full.size() && static_cast<int>(d.size()) < r.max_tokens; ++p) {
        d.push_back(full[p]);
      }
      if (corrupt_every_ > 0 && !d.empty() && ++calls_ % corrupt_every_ == 0) {
        d.back() = (d.back() + 1) % kVocab;
      }
      out.push_back(std::move(d));
    }
    return out;
  }
  void Release(int64_t, std::span<const int32_t>, int) override { ++released; }
  int released = 0;

 private:
  std::map<std::vector<int32_t>, std::vector<int32_t>> outputs_;
  int corrupt_every_;
  int calls_ = 0;
};

// Misbehaves in one of several ways, or proposes random tokens.
class BadDrafter : public speculative::Drafter {
 public:
  enum Mode { kRandom, kError, kWrongCount, kTooLong, kOutOfVocab, kLate };
  explicit BadDrafter(Mode mode) : mode_(mode) {}
  std::string_view name() const override { return "bad"; }
  absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(
      std::span<const speculative::DraftRequest> requests, absl::Time deadline) override {
    if (mode_ == kError) return absl::UnavailableError("drafter is down");
    if (mode_ == kLate) {
      std::this_thread::sleep_until(absl::ToChronoTime(deadline + absl::Milliseconds(2)));
    }
    std::vector<std::vector<int32_t>> out;
    for (const speculative::DraftRequest& r : requests) {
      std::vector<int32_t> d(static_cast<size_t>(r.max_tokens) + (mode_ == kTooLong ? 1 : 0));
      for (int32_t& t : d) t = static_cast<int32_t>(rng_() % kVocab);
      if (mode_ == kOutOfVocab) d[0] = kVocab + 3;
      out.push_back(std::move(d));
    }
    if (mode_ == kWrongCount) out.emplace_back();
    return out;
  }
  void Release(int64_t, std::span<const int32_t>, int) override {}

 private:
  Mode mode_;
  std::mt19937 rng_{11};
};

std::unique_ptr<ModelRunner> Fake(int num_blocks = 256) {
  return std::make_unique<FakeModelRunner>(kVocab, num_blocks, 4, 512, std::vector<int>{1});
}

// A mixed batch: greedy, seeded sampling with top-k, penalties, stop tokens, logprobs, short and
// long outputs, a shared prefix.
std::vector<Job> MixedJobs() {
  std::vector<Job> jobs;
  std::mt19937 rng(5);
  for (int i = 0; i < 12; ++i) {
    Job j;
    const int len = 3 + static_cast<int>(rng() % 20);
    for (int t = 0; t < len; ++t) j.prompt.push_back(2 + static_cast<int32_t>(rng() % 6));
    if (i % 4 == 3) j.prompt.insert(j.prompt.begin(), jobs[0].prompt.begin(), jobs[0].prompt.end());
    j.params.max_tokens = 1 + static_cast<int>(rng() % 40);
    j.params.ignore_eos = i % 3 != 0;
    if (i % 2 == 1) {
      j.params.temperature = 0.9f;
      j.params.top_k = 20;
      j.params.seed = 100 + i;
    } else {
      j.params.temperature = 0;
    }
    if (i % 5 == 2) {
      j.params.repetition_penalty = 1.3f;
      j.params.frequency_penalty = 0.5f;
    }
    if (i % 6 == 4) j.params.stop_token_ids = {7};
    if (i % 3 == 1) j.params.logprobs = 2;
    jobs.push_back(std::move(j));
  }
  return jobs;
}

EngineOptions Speculating(std::shared_ptr<speculative::Drafter> drafter, int k) {
  EngineOptions o;
  o.drafter = std::move(drafter);
  o.num_speculative_tokens = k;
  return o;
}

TEST(EngineSpeculativeTest, OutputsNeverDependOnTheDrafter) {
  const std::vector<Job> jobs = MixedJobs();
  const std::vector<Result> plain = RunJobs(Fake(), jobs, EngineOptions{});
  std::map<std::vector<int32_t>, std::vector<int32_t>> outputs;
  for (size_t i = 0; i < jobs.size(); ++i) outputs[jobs[i].prompt] = plain[i].tokens;
  // Jobs with equal prompts would share an oracle entry: the mix has none.
  ASSERT_EQ(outputs.size(), jobs.size());

  struct Case {
    std::string name;
    std::shared_ptr<speculative::Drafter> drafter;
    int k;
  };
  std::vector<Case> cases;
  cases.push_back({"oracle k=4", std::make_shared<OracleDrafter>(outputs, 0), 4});
  cases.push_back({"oracle k=1", std::make_shared<OracleDrafter>(outputs, 0), 1});
  cases.push_back({"half-right oracle k=6", std::make_shared<OracleDrafter>(outputs, 2), 6});
  cases.push_back({"random k=3", std::make_shared<BadDrafter>(BadDrafter::kRandom), 3});
  auto ngram = speculative::NgramDrafter::Create(speculative::NgramDrafterOptions{});
  ASSERT_TRUE(ngram.ok());
  cases.push_back({"ngram k=5", std::shared_ptr<speculative::Drafter>(*std::move(ngram)), 5});
  for (const Case& c : cases) {
    auto runner = std::make_unique<FakeModelRunner>(kVocab, 256, 4, 512, std::vector<int>{1});
    FakeModelRunner* fake = runner.get();
    EngineStats stats;
    const std::vector<Result> got =
        RunJobs(std::move(runner), jobs, Speculating(c.drafter, c.k), &stats);
    ExpectSame(got, plain, c.name);
    EXPECT_TRUE(fake->violations().empty()) << c.name << ": " << fake->violations()[0];
    EXPECT_GT(stats.spec_verifications, 0) << c.name;
    EXPECT_EQ(stats.spec_fallbacks, 0) << c.name;
    if (c.name.rfind("oracle", 0) == 0) {
      EXPECT_GT(stats.spec_accepted_tokens, stats.spec_draft_tokens / 3) << c.name;
      // Fewer steps than tokens: accepted drafts came for free.
      EXPECT_LT(stats.steps, stats.generated_tokens) << c.name;
    }
    if (c.name == "oracle k=4") {
      EXPECT_EQ(stats.spec_accepted_tokens, stats.spec_draft_tokens);  // every draft right
      EXPECT_EQ(static_cast<OracleDrafter&>(*c.drafter).released, static_cast<int>(jobs.size()));
    }
  }
}

// A runner that samples: a verifying chunk gets a request per row (each with its own seed step),
// so the rows of a verification are sampled on the runner, and the outputs stay plain decoding's.
TEST(EngineSpeculativeTest, RunnerSampledVerificationMatchesPlain) {
  std::vector<Job> all = MixedJobs(), plain_jobs;
  for (const Job& j : all) {
    if (SamplesFromLogitsOnly(j.params)) plain_jobs.push_back(j);
  }
  ASSERT_GE(plain_jobs.size(), 4u);
  for (const std::vector<Job>* jobs : {&plain_jobs, &all}) {
    const std::vector<Result> plain = RunJobs(Fake(), *jobs, EngineOptions{});
    std::map<std::vector<int32_t>, std::vector<int32_t>> outputs;
    for (size_t i = 0; i < jobs->size(); ++i) outputs[(*jobs)[i].prompt] = plain[i].tokens;
    auto runner = std::make_unique<FakeModelRunner>(kVocab, 256, 4, 512, std::vector<int>{1});
    FakeModelRunner* fake = runner.get();
    fake->EnableDeviceSampling();
    EngineStats stats;
    const std::vector<Result> got = RunJobs(
        std::move(runner), *jobs,
        Speculating(std::make_shared<OracleDrafter>(outputs, /*corrupt_every=*/3), 4), &stats);
    const std::string name = jobs == &all ? "mixed jobs" : "plain jobs";
    ExpectSame(got, plain, name);
    EXPECT_TRUE(fake->violations().empty()) << name << ": " << fake->violations()[0];
    EXPECT_GT(stats.spec_accepted_tokens, 0) << name;
    if (jobs == &plain_jobs) {
      // Every row of every step, verifications included, was sampled on the runner: a token
      // each, and a row for each rejected draft (rows past a finishing token are sampled too).
      EXPECT_GE(fake->runner_sampled_rows(),
                stats.generated_tokens + stats.spec_draft_tokens - stats.spec_accepted_tokens)
          << name;
      EXPECT_GT(stats.spec_draft_tokens, stats.spec_accepted_tokens) << name;
    }
  }
}

// The decode-only and prefill-only step counters (tandem profile calibrate reads them): one
// request of a 10-token prompt and 6 output tokens has 5 decode steps after its prefill, at
// contexts 10..14; steps that verify drafts are not decode-only.
TEST(EngineStatsTest, DecodeAndPrefillOnlyStepsAreCountedWithTheirBatchAndContext) {
  Job job;
  job.prompt = {2, 3, 4, 5, 6, 7, 2, 3, 4, 5};
  job.params.max_tokens = 6;
  job.params.ignore_eos = true;
  job.params.temperature = 0;
  EngineStats stats;
  const std::vector<Result> plain = RunJobs(Fake(), {job}, EngineOptions{}, &stats);
  ASSERT_EQ(plain[0].tokens.size(), 6u);
  EXPECT_EQ(stats.decode_steps, 5);
  EXPECT_EQ(stats.decode_sequences, 5);
  EXPECT_EQ(stats.decode_context_tokens, 10 + 11 + 12 + 13 + 14);
  EXPECT_GT(stats.decode_forward_seconds, 0);
  EXPECT_LT(stats.decode_forward_seconds, stats.forward_seconds);  // the prefill step is not one
  EXPECT_EQ(stats.steps, 6);
  // The prompt was one prefill-only step of 10 tokens, nothing cached.
  EXPECT_EQ(stats.prefill_steps, 1);
  EXPECT_EQ(stats.prefill_chunks, 1);
  EXPECT_EQ(stats.prefill_tokens, 10);
  EXPECT_EQ(stats.prefill_cached_tokens, 0);
  EXPECT_GT(stats.prefill_forward_seconds, 0);
  // Every step but the last left work behind (the next began without waiting for input).
  EXPECT_EQ(stats.backlogged_steps, 5);
  EXPECT_GE(stats.gap_seconds, 0);

  // Chunked: a budget of 4 tokens a step prefills the prompt in chunks of 4, 4 and 2, after 0, 4
  // and 8 cached tokens.
  EngineOptions chunked;
  chunked.max_num_batched_tokens = 4;
  RunJobs(Fake(), {job}, chunked, &stats);
  EXPECT_EQ(stats.prefill_steps, 3);
  EXPECT_EQ(stats.prefill_chunks, 3);
  EXPECT_EQ(stats.prefill_tokens, 10);
  EXPECT_EQ(stats.prefill_cached_tokens, 0 + 4 + 8);
  EXPECT_EQ(stats.decode_steps, 5);

  std::map<std::vector<int32_t>, std::vector<int32_t>> outputs = {{job.prompt, plain[0].tokens}};
  RunJobs(Fake(), {job}, Speculating(std::make_shared<OracleDrafter>(outputs, 0), 4), &stats);
  EXPECT_GT(stats.spec_verifications, 0);
  EXPECT_EQ(stats.decode_steps, stats.steps - 1 - stats.spec_verifications);
}

TEST(EngineSpeculativeTest, MisbehavingDraftersFallBackToPlainDecoding) {
  const std::vector<Job> jobs = MixedJobs();
  const std::vector<Result> plain = RunJobs(Fake(), jobs, EngineOptions{});
  for (BadDrafter::Mode mode : {BadDrafter::kError, BadDrafter::kWrongCount, BadDrafter::kTooLong,
                                BadDrafter::kOutOfVocab, BadDrafter::kLate}) {
    EngineOptions options = Speculating(std::make_shared<BadDrafter>(mode), 3);
    options.drafter_deadline = absl::Milliseconds(1);
    EngineStats stats;
    ExpectSame(RunJobs(Fake(), jobs, options, &stats), plain, absl::StrCat("mode ", mode));
    EXPECT_GT(stats.spec_fallbacks, 0) << "mode " << mode;
    EXPECT_EQ(stats.spec_verifications, 0) << "mode " << mode;
  }
}

TEST(EngineSpeculativeTest, DraftsUnderPreemptionAndATightBudget) {
  // 24 blocks of 4 for 12 sequences of up to 84 tokens: preemptions; a budget of 32 tokens a
  // step is less than 12 sequences with 4 drafts each: some drafts are left out.
  const std::vector<Job> jobs = MixedJobs();
  EngineOptions tight;
  tight.max_num_batched_tokens = 32;
  const std::vector<Result> plain = RunJobs(Fake(24), jobs, tight);
  std::map<std::vector<int32_t>, std::vector<int32_t>> outputs;
  for (size_t i = 0; i < jobs.size(); ++i) outputs[jobs[i].prompt] = plain[i].tokens;
  EngineOptions options = Speculating(std::make_shared<OracleDrafter>(outputs, 3), 4);
  options.max_num_batched_tokens = 32;
  auto runner = std::make_unique<FakeModelRunner>(kVocab, 24, 4, 512, std::vector<int>{1});
  FakeModelRunner* fake = runner.get();
  EngineStats stats;
  ExpectSame(RunJobs(std::move(runner), jobs, options, &stats), plain, "tight");
  EXPECT_TRUE(fake->violations().empty()) << fake->violations()[0];
  EXPECT_GT(stats.preemptions, 0);
  EXPECT_GT(stats.spec_accepted_tokens, 0);
}

// Pearson's chi-square of `counts` against probabilities `p` (cells with expectation < 5 merged
// into one).
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& p, int n, int* df) {
  double chi = 0, rest_obs = 0, rest_exp = 0;
  int cells = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    const double e = p[t] * n;
    if (e < 5) {
      rest_obs += counts[t];
      rest_exp += e;
      continue;
    }
    chi += (counts[t] - e) * (counts[t] - e) / e;
    ++cells;
  }
  if (rest_exp > 0) {
    chi += (rest_obs - rest_exp) * (rest_obs - rest_exp) / rest_exp;
    ++cells;
  }
  *df = cells - 1;
  return chi;
}

std::vector<double> Softmax(const std::vector<float>& logits) {
  double m = *std::max_element(logits.begin(), logits.end()), z = 0;
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp(logits[i] - m);
  for (double& x : p) x /= z;
  return p;
}

TEST(EngineSpeculativeTest, SampledTokensFollowTheTargetDistribution) {
  // Vocabulary 6; every request samples 3 tokens after the same prompt with its own seed, with
  // a drafter that always proposes token 0, twice (accepted exactly when sampling draws it).
  constexpr int kV = 6, kN = 3000;
  const std::vector<int32_t> prompt = {2, 3, 4};
  std::vector<Job> jobs(kN);
  for (int i = 0; i < kN; ++i) {
    jobs[i].prompt = prompt;
    jobs[i].params.temperature = 1.0f;
    jobs[i].params.seed = 1000 + i;
    jobs[i].params.max_tokens = 3;
    jobs[i].params.ignore_eos = true;
  }
  class Zeros : public speculative::Drafter {
   public:
    std::string_view name() const override { return "zeros"; }
    absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(
        std::span<const speculative::DraftRequest> rs, absl::Time) override {
      std::vector<std::vector<int32_t>> out;
      for (const auto& r : rs) out.emplace_back(static_cast<size_t>(r.max_tokens), 0);
      return out;
    }
    void Release(int64_t, std::span<const int32_t>, int) override {}
  };
  EngineOptions options = Speculating(std::make_shared<Zeros>(), 2);
  options.max_num_seqs = 256;
  EngineStats stats;
  const std::vector<Result> got =
      RunJobs(std::make_unique<FakeModelRunner>(kV, 1024, 4, 64), jobs, options, &stats);
  EXPECT_GT(stats.spec_accepted_tokens, 0);
  EXPECT_LT(stats.spec_accepted_tokens, stats.spec_draft_tokens);
  // The exact marginals of the 2nd and 3rd tokens, from the reference logits alone.
  const std::vector<double> p1 = Softmax(FakeModelRunner::ReferenceLogits(prompt, kV));
  std::vector<double> m2(kV, 0), m3(kV, 0);
  for (int a = 0; a < kV; ++a) {
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(a);
    const std::vector<double> p2 = Softmax(FakeModelRunner::ReferenceLogits(ctx, kV));
    for (int b = 0; b < kV; ++b) {
      m2[b] += p1[a] * p2[b];
      std::vector<int32_t> ctx2 = ctx;
      ctx2.push_back(b);
      const std::vector<double> p3 = Softmax(FakeModelRunner::ReferenceLogits(ctx2, kV));
      for (int c = 0; c < kV; ++c) m3[c] += p1[a] * p2[b] * p3[c];
    }
  }
  std::vector<int> c2(kV, 0), c3(kV, 0);
  for (const Result& r : got) {
    ASSERT_EQ(r.tokens.size(), 3u);
    ++c2[r.tokens[1]];
    ++c3[r.tokens[2]];
  }
  // Critical values at p = 0.001 by degrees of freedom (1..5).
  const double critical[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52};
  int df = 0;
  const double chi2 = ChiSquare(c2, m2, kN, &df);
  ASSERT_GE(df, 1);
  EXPECT_LT(chi2, critical[df]) << "2nd token, df " << df;
  const double chi3 = ChiSquare(c3, m3, kN, &df);
  ASSERT_GE(df, 1);
  EXPECT_LT(chi3, critical[df]) << "3rd token, df " << df;
  // The test has power: the same counts against the uniform distribution are rejected.
  const double uniform = ChiSquare(c3, std::vector<double>(kV, 1.0 / kV), kN, &df);
  EXPECT_GT(uniform, critical[df]);
}

TEST(EngineSpeculativeTest, CpuRunnerGreedyAndSampledMatchPlain) {
  TinyModel model("engine_speculative_tiny", 9);
  std::vector<Job> jobs;
  for (int i = 0; i < 4; ++i) {
    Job j;
    // Repetitive prompts, so that the n-gram drafter finds matches.
    for (int r = 0; r < 4; ++r) {
      for (int t = 0; t < 5; ++t) j.prompt.push_back(10 + 3 * i + t);
    }
    j.params.max_tokens = 24;
    j.params.ignore_eos = true;
    j.params.logprobs = 1;
    if (i % 2 == 1) {
      j.params.temperature = 0.8f;
      j.params.seed = 7 + i;
    } else {
      j.params.temperature = 0;
    }
    jobs.push_back(std::move(j));
  }
  const std::vector<Result> plain = RunJobs(model.MakeCpuRunner(128), jobs, EngineOptions{});
  std::map<std::vector<int32_t>, std::vector<int32_t>> outputs;
  for (size_t i = 0; i < jobs.size(); ++i) outputs[jobs[i].prompt] = plain[i].tokens;
  EngineStats stats;
  ExpectSame(RunJobs(model.MakeCpuRunner(128), jobs,
                     Speculating(std::make_shared<OracleDrafter>(outputs, 2), 4), &stats),
             plain, "cpu oracle");
  EXPECT_GT(stats.spec_accepted_tokens, 0);
  auto ngram = speculative::NgramDrafter::Create(speculative::NgramDrafterOptions{});
  ASSERT_TRUE(ngram.ok());
  ExpectSame(RunJobs(model.MakeCpuRunner(128), jobs,
                     Speculating(std::shared_ptr<speculative::Drafter>(*std::move(ngram)), 4)),
             plain, "cpu ngram");
}

TEST(EngineSpeculativeTest, OptionsAreChecked) {
  EngineOptions o;
  o.num_speculative_tokens = 2;  // no drafter
  EXPECT_FALSE(Engine::Create(Fake(), nullptr, o).ok());
  o.drafter = std::make_shared<BadDrafter>(BadDrafter::kRandom);
  o.num_speculative_tokens = 65;
  EXPECT_FALSE(Engine::Create(Fake(), nullptr, o).ok());
}

}  // namespace
}  // namespace tandem

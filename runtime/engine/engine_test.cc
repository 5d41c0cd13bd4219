#include "runtime/engine/engine.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/engine/fake_model_runner.h"
#include "runtime/kvcache/block_pool.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr int kVocab = 64;

// One character per id ('0'..'9', 'a'..'z', 'A'..'Z', ' ', '.'); no special tokens.
class FakeTokenizer : public Tokenizer {
 public:
  static char Char(int32_t id) {
    static const char* kChars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .";
    return kChars[id];
  }
  std::vector<int32_t> Encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    for (char c : text) {
      for (int32_t i = 0; i < kVocab; ++i) {
        if (Char(i) == c) ids.push_back(i);
      }
    }
    return ids;
  }
  std::string Decode(std::span<const int32_t> ids, bool) const override {
    std::string s;
    for (int32_t id : ids) s += Char(id);
    return s;
  }
  int vocab_size() const override { return kVocab; }
  std::optional<int32_t> TokenToId(std::string_view) const override { return std::nullopt; }
  std::string IdToToken(int32_t id) const override { return std::string(1, Char(id)); }
  bool IsSpecial(int32_t) const override { return false; }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::optional<int32_t> eos_id() const override { return std::nullopt; }
  std::string bos_token() const override { return ""; }
  std::string eos_token() const override { return ""; }
};

using Collector = OutputCollector;
using Result = OutputCollector::Result;

std::vector<int32_t> RandomPrompt(std::mt19937& rng, int len, int alphabet = kVocab) {
  std::vector<int32_t> p(len);
  for (auto& t : p) t = rng() % alphabet;
  return p;
}

struct Harness {
  explicit Harness(int num_blocks, int block_size = 4, EngineOptions options = {},
                   const Tokenizer* tokenizer = nullptr, std::vector<int> eos = {},
                   int max_pos = 1024, bool device_sampling = false) {
    auto owned = std::make_unique<FakeModelRunner>(kVocab, num_blocks, block_size, max_pos, eos);
    if (device_sampling) owned->EnableDeviceSampling();
    runner = owned.get();
    auto created = Engine::Create(std::move(owned), tokenizer, options);
    CHECK(created.ok()) << created.status();
    engine = std::move(*created);
  }
  absl::Status Submit(const std::string& id, std::vector<int32_t> prompt, SamplingParams p) {
    GenerateRequest r;
    r.request_id = id;
    r.prompt_token_ids = std::move(prompt);
    r.params = std::move(p);
    r.on_output = collector.Callback();
    return engine->Submit(std::move(r));
  }
  FakeModelRunner* runner;
  Collector collector;
  std::unique_ptr<Engine> engine;
};

SamplingParams Greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

// Runs `prompts` greedily to completion and returns generated tokens by index.
std::vector<std::vector<int32_t>> RunGreedy(int num_blocks, const EngineOptions& options,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            int max_tokens, int64_t* preemptions = nullptr) {
  Harness h(num_blocks, 4, options);
  // The first forward pass waits until every request is queued: same batching on every run.
  absl::Notification all_submitted;
  h.runner->set_forward_hook(
      [&] { all_submitted.WaitForNotificationWithTimeout(absl::Seconds(30)); });
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(h.Submit(std::to_string(i), prompts[i], Greedy(max_tokens)).ok());
  }
  all_submitted.Notify();
  EXPECT_TRUE(h.collector.WaitFinished(prompts.size()));
  h.engine->Shutdown(absl::Seconds(5));
  EXPECT_THAT(h.runner->violations(), ::testing::IsEmpty());
  if (preemptions != nullptr) *preemptions = h.engine->stats().preemptions;
  EXPECT_EQ(h.engine->stats().blocks_used, 0);
  std::vector<std::vector<int32_t>> out(prompts.size());
  auto results = h.collector.results();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Result& r = results[std::to_string(i)];
    EXPECT_EQ(r.finish, FinishReason::kLength);
    EXPECT_EQ(r.outputs_after_finish, 0);
    out[i] = r.tokens;
  }
  return out;
}

TEST(EngineTest, GreedyMatchesUncachedReference) {
  std::mt19937 rng(1);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(RandomPrompt(rng, 1 + rng() % 30));
  auto got = RunGreedy(256, EngineOptions{}, prompts, 20);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i], FakeModelRunner::ReferenceGreedy(prompts[i], 20, kVocab)) << i;
  }
}

TEST(EngineTest, ChunkedPrefillAndSmallBudgetMatchReference) {
  EngineOptions options;
  options.max_num_batched_tokens = 7;
  options.max_num_seqs = 3;
  std::mt19937 rng(2);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(RandomPrompt(rng, 20 + rng() % 30));
  auto got = RunGreedy(256, options, prompts, 12);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i], FakeModelRunner::ReferenceGreedy(prompts[i], 12, kVocab)) << i;
  }
}

TEST(EngineTest, PreemptionProducesSameTokensAsNoPreemption) {
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(RandomPrompt(rng, 5 + rng() % 10, 4));
  int64_t roomy_preemptions = 0, tight_preemptions = 0;
  auto roomy = RunGreedy(512, EngineOptions{}, prompts, 24, &roomy_preemptions);
  // 14 blocks of 4 = 56 tokens for 8 sequences of up to 38 tokens each.
  auto tight = RunGreedy(14, EngineOptions{}, prompts, 24, &tight_preemptions);
  EXPECT_EQ(roomy_preemptions, 0);
  EXPECT_GT(tight_preemptions, 0);
  EXPECT_EQ(roomy, tight);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(tight[i], FakeModelRunner::ReferenceGreedy(prompts[i], 24, kVocab)) << i;
  }
}

TEST(EngineTest, PrefixCacheHitAccountingAndCorrectReuse) {
  Harness h(64, 4);
  std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  ASSERT_TRUE(h.Submit("a", a, Greedy(3)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(1));
  std::vector<int32_t> b(a.begin(), a.begin() + 10);  // shares 2 full blocks
  b.push_back(40);
  ASSERT_TRUE(h.Submit("b", b, Greedy(5)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(2));
  h.engine->Shutdown(absl::Seconds(5));
  auto results = h.collector.results();
  EXPECT_EQ(results["a"].usage.cached_prompt_tokens, 0);
  EXPECT_EQ(results["a"].usage.prompt_tokens, 13);
  EXPECT_EQ(results["b"].usage.cached_prompt_tokens, 8);
  EXPECT_EQ(results["b"].usage.prompt_tokens, 11);
  EXPECT_EQ(results["b"].usage.completion_tokens, 5);
  EXPECT_EQ(results["b"].tokens, FakeModelRunner::ReferenceGreedy(b, 5, kVocab));
  EngineStats stats = h.engine->stats();
  EXPECT_EQ(stats.prefix_query_tokens, 13 + 11);
  EXPECT_EQ(stats.prefix_hit_tokens, 8);
  // 13 + 3 prompt-and-generated tokens computed for a, only 3 + 5 - 1 + 1 new ones for b.
  EXPECT_EQ(h.runner->tokens_computed(), (13 + 2) + (3 + 4));
  EXPECT_THAT(h.runner->violations(), ::testing::IsEmpty());
}

TEST(EngineTest, SeededSamplingIndependentOfBatchAndPreemption) {
  std::mt19937 rng(4);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 77;
  p.max_tokens = 16;
  std::vector<int32_t> prompt = RandomPrompt(rng, 9);
  std::vector<int32_t> alone;
  {
    Harness h(128);
    ASSERT_TRUE(h.Submit("x", prompt, p).ok());
    ASSERT_TRUE(h.collector.WaitFinished(1));
    alone = h.collector.results()["x"].tokens;
  }
  Harness h(12);
  absl::Notification all_submitted;
  h.runner->set_forward_hook(
      [&] { all_submitted.WaitForNotificationWithTimeout(absl::Seconds(30)); });
  SamplingParams other = p;
  other.seed.reset();
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(h.Submit(absl::StrCat("o", i), RandomPrompt(rng, 9), other).ok());
  ASSERT_TRUE(h.Submit("x", prompt, p).ok());
  all_submitted.Notify();
  ASSERT_TRUE(h.collector.WaitFinished(6));
  h.engine->Shutdown(absl::Seconds(5));
  EXPECT_EQ(h.collector.results()["x"].tokens, alone);
  EXPECT_GT(h.engine->stats().preemptions, 0);
  EXPECT_THAT(h.runner->violations(), ::testing::IsEmpty());
}

TEST(EngineTest, RejectsBadRequestsWithoutCallback) {
  Harness h(16, 4, EngineOptions{}, nullptr, {}, /*max_pos=*/32);
  EXPECT_EQ(h.engine->max_model_len(), 32);
  auto code = [&](const std::string& id, std::vector<int32_t> prompt, SamplingParams p) {
    return h.Submit(id, std::move(prompt), std::move(p));
  };
  absl::Status s = code("e", {}, Greedy(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("prompt"));
  s = code("v", {1, kVocab}, Greedy(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("vocabulary"));
  EXPECT_EQ(code("n", {-1}, Greedy(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("l", std::vector<int32_t>(32, 1), Greedy(1)).code(),
            absl::StatusCode::kInvalidArgument);
  s = code("m", std::vector<int32_t>(30, 1), Greedy(3));
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_tokens"));
  SamplingParams bad = Greedy(1);
  bad.top_p = 2.0f;
  EXPECT_THAT(std::string(code("p", {1}, bad).message()), HasSubstr("top_p"));
  SamplingParams stops = Greedy(1);
  stops.stop = {"x"};
  EXPECT_THAT(std::string(code("s", {1}, stops).message()), HasSubstr("tokenizer"));
  EXPECT_EQ(code("", {1}, Greedy(1)).code(), absl::StatusCode::kInvalidArgument);
  // Hold the engine inside the first forward pass so that "dup" is certainly still live.
  absl::Notification in_forward, release;
  h.runner->set_forward_hook([&] {
    if (!in_forward.HasBeenNotified()) in_forward.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(30));
  });
  ASSERT_TRUE(code("dup", {1}, Greedy(20)).ok());
  ASSERT_TRUE(in_forward.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(code("dup", {1}, Greedy(20)).code(), absl::StatusCode::kAlreadyExists);
  release.Notify();
  ASSERT_TRUE(h.collector.WaitFinished(1));
  h.engine->Shutdown(absl::Seconds(5));
  EXPECT_EQ(code("late", {1}, Greedy(1)).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(h.collector.results().size(), 1u);
}

TEST(EngineTest, EosAndStopTokensFinishWithStop) {
  std::vector<int32_t> prompt = {5, 6, 7};
  std::vector<int32_t> ref = FakeModelRunner::ReferenceGreedy(prompt, 10, kVocab);
  const int eos = ref[3];
  const std::vector<int32_t> expected = FakeModelRunner::ReferenceGreedy(prompt, 10, kVocab, {eos});
  Harness h(64, 4, EngineOptions{}, nullptr, {eos});
  ASSERT_TRUE(h.Submit("eos", prompt, Greedy(10)).ok());
  SamplingParams ignore = Greedy(10);
  ignore.ignore_eos = true;
  ASSERT_TRUE(h.Submit("ignore", prompt, ignore).ok());
  SamplingParams stop_id = Greedy(10);
  stop_id.ignore_eos = true;
  stop_id.stop_token_ids = {ref[1]};
  ASSERT_TRUE(h.Submit("stop_id", prompt, stop_id).ok());
  ASSERT_TRUE(h.collector.WaitFinished(3));
  auto results = h.collector.results();
  EXPECT_EQ(results["eos"].finish, FinishReason::kStop);
  EXPECT_EQ(results["eos"].tokens, expected);  // includes the EOS id itself
  EXPECT_EQ(results["ignore"].finish, FinishReason::kLength);
  EXPECT_EQ(results["ignore"].tokens, ref);
  EXPECT_EQ(results["stop_id"].finish, FinishReason::kStop);
  EXPECT_EQ(results["stop_id"].tokens.back(), ref[1]);
}

TEST(EngineTest, TextDeltasAndStopStringsExcludeTheStop) {
  FakeTokenizer tok;
  std::vector<int32_t> prompt = {20, 21, 22, 23};
  std::vector<int32_t> ref = FakeModelRunner::ReferenceGreedy(prompt, 12, kVocab);
  const std::string full = tok.Decode(ref, true);
  // Stop at the 2-character string that starts at generated character 5.
  const std::string stop = full.substr(5, 2);
  const size_t cut = full.find(stop);
  Harness h(64, 4, EngineOptions{}, &tok);
  ASSERT_TRUE(h.Submit("plain", prompt, Greedy(12)).ok());
  SamplingParams p = Greedy(12);
  p.stop = {stop, "not-there"};
  ASSERT_TRUE(h.Submit("stopped", prompt, p).ok());
  ASSERT_TRUE(h.collector.WaitFinished(2));
  auto results = h.collector.results();
  EXPECT_EQ(results["plain"].text, full);
  EXPECT_EQ(results["plain"].finish, FinishReason::kLength);
  EXPECT_EQ(results["stopped"].finish, FinishReason::kStop);
  EXPECT_EQ(results["stopped"].text, full.substr(0, cut));
  EXPECT_EQ(results["stopped"].tokens.size(), cut + stop.size());
}

TEST(EngineTest, MinTokensSuppressesEosAndStopTokensUntilReached) {
  std::vector<int32_t> prompt = {5, 6, 7};
  const std::vector<int32_t> ref = FakeModelRunner::ReferenceGreedy(prompt, 10, kVocab);
  const int eos = ref[1];
  Harness h(64, 4, EngineOptions{}, nullptr, {eos});
  ASSERT_TRUE(h.Submit("plain", prompt, Greedy(10)).ok());
  SamplingParams p = Greedy(10);
  p.min_tokens = 4;
  ASSERT_TRUE(h.Submit("min4", prompt, p).ok());
  SamplingParams q = Greedy(10);
  q.ignore_eos = true;
  q.stop_token_ids = {ref[0]};
  q.min_tokens = 3;
  ASSERT_TRUE(h.Submit("stop-id", prompt, q).ok());
  ASSERT_TRUE(h.collector.WaitFinished(3));
  auto results = h.collector.results();
  EXPECT_EQ(results["plain"].tokens, FakeModelRunner::ReferenceGreedy(prompt, 10, kVocab, {eos}));
  EXPECT_LE(results["plain"].tokens.size(), 2u);
  const std::vector<int32_t> want = FakeModelRunner::ReferenceGreedy(prompt, 10, kVocab, {eos}, 4);
  EXPECT_EQ(results["min4"].tokens, want);
  EXPECT_GE(results["min4"].tokens.size(), 5u);  // four tokens, then EOS may come
  for (int k = 0; k < 4; ++k) EXPECT_NE(results["min4"].tokens[k], eos);
  EXPECT_EQ(results["stop-id"].tokens,
            FakeModelRunner::ReferenceGreedy(prompt, 10, kVocab, {ref[0]}, 3));
  EXPECT_NE(results["stop-id"].tokens[0], ref[0]);
}

TEST(EngineTest, StopStringsWaitForMinTokensAndMayStayInTheOutput) {
  FakeTokenizer tok;
  std::vector<int32_t> prompt = {20, 21, 22, 23};
  const std::vector<int32_t> ref = FakeModelRunner::ReferenceGreedy(prompt, 12, kVocab);
  const std::string full = tok.Decode(ref, true);  // one character per token
  const std::string stop = full.substr(0, 2);
  Harness h(64, 4, EngineOptions{}, &tok);
  SamplingParams plain = Greedy(12);
  plain.stop = {stop};
  ASSERT_TRUE(h.Submit("plain", prompt, plain).ok());
  SamplingParams late = plain;
  late.min_tokens = 3;  // matching starts with the third token's text: character 2
  ASSERT_TRUE(h.Submit("late", prompt, late).ok());
  SamplingParams kept = plain;
  kept.include_stop_str_in_output = true;
  ASSERT_TRUE(h.Submit("kept", prompt, kept).ok());
  ASSERT_TRUE(h.collector.WaitFinished(3));
  auto results = h.collector.results();
  EXPECT_EQ(results["plain"].text, "");
  EXPECT_EQ(results["plain"].finish, FinishReason::kStop);
  EXPECT_EQ(results["kept"].text, stop);
  const size_t again = full.find(stop, 2);
  if (again == std::string::npos) {
    EXPECT_EQ(results["late"].text, full);
    EXPECT_EQ(results["late"].finish, FinishReason::kLength);
  } else {
    EXPECT_EQ(results["late"].text, full.substr(0, again));
    EXPECT_EQ(results["late"].finish, FinishReason::kStop);
  }
}

TEST(EngineTest, GuidedChoiceAndRegexConstrainEveryOutput) {
  FakeTokenizer tok;
  // EOS is 'Z', which no output below uses (an EOS is never taken for its bytes).
  Harness h(256, 4, EngineOptions{}, &tok, {61});
  const std::vector<std::string> choices = {"yes", "no", "maybe later"};
  std::mt19937 rng(5);
  for (int i = 0; i < 12; ++i) {
    SamplingParams p;
    p.temperature = i < 2 ? 0.0f : 1.5f;  // greedy and sampled
    p.seed = i;
    p.max_tokens = 40;
    p.guided.choices = choices;
    ASSERT_TRUE(h.Submit("choice-" + std::to_string(i), RandomPrompt(rng, 5), p).ok());
    SamplingParams r = p;
    r.guided.choices.clear();
    r.guided.regex = "[0-9]{3}\\.[a-c]+x";
    ASSERT_TRUE(h.Submit("regex-" + std::to_string(i), RandomPrompt(rng, 5), r).ok());
  }
  ASSERT_TRUE(h.collector.WaitFinished(24));
  const std::regex want("[0-9]{3}\\.[a-c]+x");
  for (const auto& [id, result] : h.collector.results()) {
    SCOPED_TRACE(id);
    EXPECT_EQ(result.finish, FinishReason::kStop) << result.text << " " << result.error;
    if (absl::StartsWith(id, "choice")) {
      EXPECT_THAT(choices, ::testing::Contains(result.text));
    } else {
      EXPECT_TRUE(std::regex_match(result.text, want)) << result.text;
    }
  }
  // A pattern the engine cannot take is refused at Submit, naming the field.
  SamplingParams bad = Greedy(4);
  bad.guided.regex = "(?=x)";
  const absl::Status s = h.Submit("bad", {1, 2}, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("guided_regex"));
  // Without a tokenizer there are no token bytes to constrain.
  Harness bare(16);
  SamplingParams choice = Greedy(4);
  choice.guided.choices = {"a"};
  EXPECT_EQ(bare.Submit("x", {1}, choice).code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineTest, PrefetchedGrammarMasksChangeNoOutput) {
  FakeTokenizer tok;
  std::map<std::string, std::string> texts[2];
  for (const bool prefetch : {false, true}) {
    EngineOptions options;
    options.prefetch_grammar_masks = prefetch;
    Harness h(256, 4, options, &tok, {61});
    std::mt19937 rng(9);
    for (int i = 0; i < 8; ++i) {
      SamplingParams p;
      p.temperature = i < 2 ? 0.0f : 1.2f;
      p.seed = 100 + i;
      p.max_tokens = 40;
      p.guided.regex = i % 2 ? "[0-9]{2,6}\\.[a-d]{1,5}x" : "(ab|ba){1,4}[0-9]x";
      ASSERT_TRUE(h.Submit("g-" + std::to_string(i), RandomPrompt(rng, 5), p).ok());
    }
    ASSERT_TRUE(h.collector.WaitFinished(8));
    for (const auto& [id, result] : h.collector.results()) {
      EXPECT_EQ(result.finish, FinishReason::kStop) << id << " " << result.error;
      texts[prefetch][id] = result.text;
    }
  }
  EXPECT_EQ(texts[0], texts[1]);
  EXPECT_EQ(texts[1].size(), 8u);
}

// Guided rows sampled by the runner under their grammar mask give exactly what the host sampler
// gives: tokens, texts and logprobs, greedy and seeded, mixed with unguided rows in one batch.
TEST(EngineTest, RunnerSampledGrammarMasksMatchTheHostSampler) {
  FakeTokenizer tok;
  struct Run {
    std::map<std::string, std::string> texts;
    std::map<std::string, std::vector<float>> logprobs;
    int64_t masked_rows = 0;
  };
  std::vector<Run> runs;
  // A runner without sampling (every row on the host sampler), then one that samples.
  for (const bool device : {false, true}) {
    Harness h(256, 4, EngineOptions{}, &tok, {61}, 1024, device);
    std::mt19937 rng(17);
    for (int i = 0; i < 10; ++i) {
      SamplingParams p;
      p.temperature = i < 3 ? 0.0f : 0.9f;
      p.top_p = i % 4 == 3 ? 0.8f : 1.0f;
      p.seed = 500 + i;
      p.max_tokens = 30;
      p.logprobs = 0;
      if (i % 3 != 2) p.guided.regex = i % 2 ? "[0-9]{2,6}\\.[a-d]{1,5}x" : "(ab|ba){1,4}[0-9]x";
      ASSERT_TRUE(h.Submit("r-" + std::to_string(i), RandomPrompt(rng, 5), p).ok());
    }
    ASSERT_TRUE(h.collector.WaitFinished(10));
    h.engine->Shutdown(absl::Seconds(5));
    Run run;
    for (const auto& [id, result] : h.collector.results()) {
      EXPECT_NE(result.finish, FinishReason::kError) << id << " " << result.error;
      run.texts[id] = result.text;
      for (const auto& lp : result.logprobs) run.logprobs[id].push_back(lp.logprob);
    }
    run.masked_rows = h.runner->masked_rows();
    runs.push_back(std::move(run));
  }
  EXPECT_EQ(runs[0].masked_rows, 0);
  EXPECT_GT(runs[1].masked_rows, 50);  // the guided rows did go through the runner's mask
  EXPECT_EQ(runs[1].texts, runs[0].texts);
  EXPECT_EQ(runs[1].logprobs, runs[0].logprobs);
  EXPECT_EQ(runs[0].texts.size(), 10u);
  ASSERT_FALSE(runs[1].logprobs.empty());
  EXPECT_FALSE(runs[1].logprobs.begin()->second.empty());
}

TEST(FakeModelRunnerTest, MultiRowLogitsAreEachPrefixsReference) {
  FakeModelRunner runner(kVocab, 8, 4, 64);
  const std::vector<int32_t> tokens = {5, 9, 2, 7}, table = {0, 1};
  ForwardBatch batch;
  SequenceChunk ch{tokens, 0, table, true};
  ch.num_logits = 3;
  batch.chunks = {ch};
  ForwardOutput out;
  ASSERT_TRUE(runner.Forward(batch, &out).ok());
  ASSERT_EQ(out.rows, 3);
  for (int k = 0; k < 3; ++k) {
    const std::vector<float> want = FakeModelRunner::ReferenceLogits(
        std::span<const int32_t>(tokens).first(static_cast<size_t>(k) + 2), kVocab);
    EXPECT_EQ(
        std::vector<float>(out.logits.begin() + k * kVocab, out.logits.begin() + (k + 1) * kVocab),
        want)
        << k;
  }
}

TEST(EngineTest, LogprobsAreLogSoftmaxOfRawLogits) {
  std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  Harness h(64);
  SamplingParams p = Greedy(3);
  p.logprobs = 5;
  ASSERT_TRUE(h.Submit("lp", prompt, p).ok());
  ASSERT_TRUE(h.collector.WaitFinished(1));
  Result r = h.collector.results()["lp"];
  ASSERT_EQ(r.logprobs.size(), 3u);
  std::vector<int32_t> context = prompt;
  for (int i = 0; i < 3; ++i) {
    std::vector<float> logits = FakeModelRunner::ReferenceLogits(context, kVocab);
    std::vector<float> lp = LogSoftmax(logits);
    const int32_t best = std::max_element(lp.begin(), lp.end()) - lp.begin();
    EXPECT_EQ(r.logprobs[i].token, r.tokens[i]);
    EXPECT_NEAR(r.logprobs[i].logprob, lp[r.tokens[i]], 1e-5);
    ASSERT_EQ(r.logprobs[i].top.size(), 5u);
    EXPECT_EQ(r.logprobs[i].top[0].token, best);
    for (const TokenLogprob& t : r.logprobs[i].top) EXPECT_NEAR(t.logprob, lp[t.token], 1e-5);
    context.push_back(r.tokens[i]);
  }
}

// prompt_logprobs over the fake runner's reference logits: chunked prefill beside other prompts,
// preemptions (few blocks), a runner that samples the other rows itself, a cached prefix that
// the scored request must compute again. Every entry once, on the first output.
TEST(EngineTest, PromptLogprobsScoreEveryPromptTokenOnce) {
  for (bool tight : {false, true}) {
    SCOPED_TRACE(tight ? "preempting" : "roomy");
    EngineOptions options;
    options.max_num_batched_tokens = 5;
    Harness h(tight ? 9 : 256, 4, options, nullptr, {}, 1024, /*device_sampling=*/true);
    std::mt19937 rng(11);
    const std::vector<int32_t> shared = RandomPrompt(rng, 12);
    ASSERT_TRUE(h.Submit("warm", shared, Greedy(1)).ok());
    ASSERT_TRUE(h.collector.WaitFinished(1));
    std::vector<std::vector<int32_t>> prompts = {shared, RandomPrompt(rng, 9), RandomPrompt(rng, 2),
                                                 RandomPrompt(rng, 17)};
    prompts[0].push_back(7);
    absl::Notification all_submitted;
    h.runner->set_forward_hook(
        [&] { all_submitted.WaitForNotificationWithTimeout(absl::Seconds(30)); });
    for (size_t i = 0; i < prompts.size(); ++i) {
      SamplingParams p = Greedy(12);
      if (i != 1) p.prompt_logprobs = static_cast<int>(i);  // 0: the token's own entry only
      ASSERT_TRUE(h.Submit(absl::StrCat("p", i), prompts[i], p).ok());
    }
    all_submitted.Notify();
    ASSERT_TRUE(h.collector.WaitFinished(1 + static_cast<int>(prompts.size())));
    if (tight) {
      EXPECT_GT(h.engine->stats().preemptions, 0);
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      SCOPED_TRACE(i);
      const Result r = h.collector.Get(absl::StrCat("p", i));
      ASSERT_EQ(r.finish, FinishReason::kLength) << r.error;
      EXPECT_EQ(r.tokens, FakeModelRunner::ReferenceGreedy(prompts[i], 12, kVocab));
      if (i == 1) {
        EXPECT_EQ(r.outputs_with_prompt_logprobs, 0);
        continue;
      }
      EXPECT_EQ(r.outputs_with_prompt_logprobs, 1);
      EXPECT_EQ(r.usage.cached_prompt_tokens, 0);
      ASSERT_EQ(r.prompt_logprobs.size(), prompts[i].size() - 1);
      for (size_t pos = 0; pos + 1 < prompts[i].size(); ++pos) {
        const std::vector<float> lp = LogSoftmax(FakeModelRunner::ReferenceLogits(
            std::span<const int32_t>(prompts[i]).first(pos + 1), kVocab));
        const ScoredToken& got = r.prompt_logprobs[pos];
        const int32_t want = prompts[i][pos + 1];
        EXPECT_EQ(got.token, want);
        EXPECT_NEAR(got.logprob, lp[want], 1e-5);
        EXPECT_EQ(got.rank,
                  1 + std::count_if(lp.begin(), lp.end(), [&](float x) { return x > lp[want]; }));
        ASSERT_EQ(got.top.size(), i);
        for (const TokenLogprob& t : got.top) EXPECT_NEAR(t.logprob, lp[t.token], 1e-5);
      }
    }
    h.engine->Shutdown(absl::Seconds(5));
    EXPECT_THAT(h.runner->violations(), ::testing::IsEmpty());
    EXPECT_EQ(h.engine->stats().blocks_used, 0);
  }
}

TEST(EngineTest, PromptLogprobsAreRefusedWhereThisEngineDoesNotScoreThePrompt) {
  Harness h(64);
  SamplingParams p = Greedy(2);
  p.prompt_logprobs = 21;
  EXPECT_THAT(h.Submit("big", {1, 2, 3}, p).message(), ::testing::HasSubstr("prompt_logprobs"));
  p.prompt_logprobs = 1;
  GenerateRequest held;
  held.request_id = "held";
  held.prompt_token_ids = {1, 2, 3};
  held.params = p;
  held.hold_kv_after_prefill = true;
  held.on_prefilled = [](const PrefilledKv&) {};
  held.on_output = h.collector.Callback();
  EXPECT_THAT(h.engine->Submit(held).message(), ::testing::HasSubstr("prompt_logprobs"));
  GenerateRequest resumed = held;
  resumed.hold_kv_after_prefill = false;
  resumed.resumed_output_tokens = 1;
  EXPECT_THAT(h.engine->Submit(resumed).message(), ::testing::HasSubstr("prompt_logprobs"));
  GenerateRequest remote = resumed;
  remote.resumed_output_tokens = 0;
  const absl::Status st =
      h.engine->SubmitRemotePrefill(remote, [](absl::StatusOr<RemoteKvReservation>) {});
  EXPECT_THAT(st.message(), ::testing::HasSubstr("prompt_logprobs"));
  EXPECT_EQ(h.collector.finished(), 0);
}

TEST(EngineTest, ForwardFailureFailsOnlyThatBatchAndEngineKeepsServing) {
  Harness h(64);
  h.runner->FailNextForwards(1, absl::ResourceExhaustedError("injected"));
  ASSERT_TRUE(h.Submit("a", {1, 2, 3}, Greedy(4)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(1));
  ASSERT_TRUE(h.Submit("b", {1, 2, 3}, Greedy(4)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(2));
  h.engine->Shutdown(absl::Seconds(5));
  auto results = h.collector.results();
  EXPECT_EQ(results["a"].finish, FinishReason::kError);
  EXPECT_THAT(std::string(results["a"].error.message()), HasSubstr("injected"));
  EXPECT_EQ(results["b"].finish, FinishReason::kLength);
  EXPECT_EQ(results["b"].tokens, FakeModelRunner::ReferenceGreedy({1, 2, 3}, 4, kVocab));
  EXPECT_EQ(h.engine->stats().blocks_used, 0);
}

TEST(EngineTest, NanLogitsFailTheRequestNotTheEngine) {
  Harness h(64);
  h.runner->NanLogitsNextForwards(1);
  ASSERT_TRUE(h.Submit("nan", {1, 2, 3}, Greedy(4)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(1));
  ASSERT_TRUE(h.Submit("ok", {1, 2, 3}, Greedy(4)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(2));
  h.engine->Shutdown(absl::Seconds(5));
  auto results = h.collector.results();
  EXPECT_EQ(results["nan"].finish, FinishReason::kError);
  EXPECT_THAT(std::string(results["nan"].error.message()), HasSubstr("NaN"));
  EXPECT_EQ(results["ok"].tokens, FakeModelRunner::ReferenceGreedy({1, 2, 3}, 4, kVocab));
  EXPECT_EQ(h.engine->stats().blocks_used, 0);
}

TEST(EngineTest, ShutdownAbortsOutstandingRequests) {
  Harness h(512);
  // Hold the engine in its first forward pass until Shutdown has begun, so that no request can
  // finish on its own first.
  absl::Notification in_forward, release;
  h.runner->set_forward_hook([&] {
    if (!in_forward.HasBeenNotified()) in_forward.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(30));
  });
  int submitted = 0;
  for (; submitted < 4; ++submitted) {
    ASSERT_TRUE(h.Submit(std::to_string(submitted), {1, 2, 3}, Greedy(400)).ok());
  }
  ASSERT_TRUE(in_forward.WaitForNotificationWithTimeout(absl::Seconds(30)));
  std::thread stopper([&] { h.engine->Shutdown(absl::ZeroDuration()); });
  // Submit succeeds until Shutdown has flagged the engine; those requests are aborted too.
  for (absl::Status s; (s = h.Submit(absl::StrCat("late", submitted), {1}, Greedy(4))).ok();) {
    ++submitted;
  }
  release.Notify();
  stopper.join();
  EXPECT_EQ(h.collector.finished(), submitted);
  for (const auto& [id, r] : h.collector.results()) {
    EXPECT_EQ(r.finish, FinishReason::kAbort) << id;
  }
  EXPECT_EQ(h.engine->stats().blocks_used, 0);
  EXPECT_EQ(h.Submit("after", {1}, Greedy(1)).code(), absl::StatusCode::kUnavailable);
  h.engine->Shutdown(absl::ZeroDuration());  // idempotent
}

// Several threads submit and cancel at once under a tight block budget. Every request ends
// exactly once; non-cancelled ones produce the reference tokens; nothing leaks.
TEST(EngineTest, ConcurrentSubmittersAndCancellations) {
  EngineOptions options;
  options.max_num_seqs = 6;
  options.max_num_batched_tokens = 24;
  Harness h(40, 4, options);
  constexpr int kThreads = 4, kPerThread = 30;
  std::vector<std::vector<int32_t>> prompts(kThreads * kPerThread);
  std::vector<int> max_tokens(prompts.size());
  std::mt19937 rng(5);
  for (size_t i = 0; i < prompts.size(); ++i) {
    prompts[i] = RandomPrompt(rng, 1 + rng() % 20, 3);
    max_tokens[i] = 1 + rng() % 16;
  }
  std::atomic<int> cancelled{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 trng(100 + t);
      for (int k = 0; k < kPerThread; ++k) {
        const int i = t * kPerThread + k;
        ASSERT_TRUE(h.Submit(std::to_string(i), prompts[i], Greedy(max_tokens[i])).ok());
        if (trng() % 3 == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(trng() % 2000));
          h.engine->Cancel(std::to_string(i));
          ++cancelled;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(h.collector.WaitFinished(prompts.size(), absl::Seconds(60)));
  h.engine->Shutdown(absl::Seconds(5));
  auto results = h.collector.results();
  ASSERT_EQ(results.size(), prompts.size());
  int aborted = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Result& r = results[std::to_string(i)];
    ASSERT_TRUE(r.finish.has_value()) << i;
    EXPECT_EQ(r.outputs_after_finish, 0) << i;
    const auto ref = FakeModelRunner::ReferenceGreedy(prompts[i], max_tokens[i], kVocab);
    if (r.finish == FinishReason::kAbort) {
      ++aborted;
      ASSERT_LE(r.tokens.size(), ref.size());
      EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), ref.begin())) << i;
    } else {
      EXPECT_EQ(r.finish, FinishReason::kLength) << i;
      EXPECT_EQ(r.tokens, ref) << i;
      EXPECT_EQ(r.usage.completion_tokens, max_tokens[i]);
    }
  }
  EXPECT_LE(aborted, cancelled.load());
  EngineStats stats = h.engine->stats();
  EXPECT_EQ(stats.blocks_used, 0);
  EXPECT_EQ(stats.blocks_free, 40);
  EXPECT_EQ(stats.finished_requests, static_cast<int64_t>(prompts.size()));
  EXPECT_THAT(h.runner->violations(), ::testing::IsEmpty());
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(EngineTest, PriorityOrdersAdmissionLowerFirst) {
  EngineOptions options;
  options.max_num_seqs = 1;
  Harness h(64, 4, options);
  absl::Notification in_first_pass, release;
  std::atomic<bool> first{true};
  h.runner->set_forward_hook([&] {
    if (first.exchange(false)) {
      in_first_pass.Notify();
      release.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
  });
  absl::Mutex mu;
  std::vector<std::string> finished;
  auto submit = [&](const std::string& id, int priority) {
    GenerateRequest r;
    r.request_id = id;
    r.prompt_token_ids = {1, 2, 3, 4, 5};
    r.params = Greedy(3);
    r.priority = priority;
    r.on_output = [&](const GenerationOutput& out) {
      if (!out.finish_reason.has_value()) return;
      absl::MutexLock lock(&mu);
      finished.push_back(out.request_id);
    };
    return h.engine->Submit(std::move(r));
  };
  ASSERT_TRUE(submit("a", 0).ok());
  ASSERT_TRUE(in_first_pass.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // "a" holds the only batch slot; these queue behind it in priority order, FCFS among equals.
  ASSERT_TRUE(submit("b", 10).ok());
  ASSERT_TRUE(submit("c", -1).ok());
  ASSERT_TRUE(submit("d", 0).ok());
  ASSERT_TRUE(submit("e", -1).ok());
  release.Notify();
  {
    auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return finished.size() == 5; };
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_done), absl::Seconds(30)));
  }
  h.engine->Shutdown(absl::Seconds(5));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(finished, (std::vector<std::string>{"a", "c", "e", "d", "b"}));
}

TEST(EngineTest, PrefixCacheEventsDescribeWhatTheCacheHolds) {
  Harness h(64, 4);
  const std::vector<int32_t> prompt = {9, 8, 7, 6, 5, 4, 3, 2, 1, 11};
  ASSERT_TRUE(h.Submit("a", prompt, Greedy(2)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(1));
  h.engine->Shutdown(absl::Seconds(5));
  const PrefixCacheDelta snapshot = h.engine->prefix_cache_events().ReadSince(std::nullopt, 1000);
  EXPECT_TRUE(snapshot.reset);
  EXPECT_GT(snapshot.last_seq, 0u);
  std::set<uint64_t> cached;
  for (const PrefixCacheEvent& e : snapshot.events) cached.insert(e.block_hash);
  // The prompt's two full blocks are cached, under the hashes a router computes.
  for (uint64_t h : PrefixBlockHashes(prompt, 4, 2)) EXPECT_TRUE(cached.contains(h));
  // A reader from the start sees the same through deltas.
  const PrefixCacheDelta all = h.engine->prefix_cache_events().ReadSince(uint64_t{0}, 1000);
  EXPECT_FALSE(all.reset);
  EXPECT_EQ(all.last_seq, snapshot.last_seq);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// What one request streamed, output by output.
struct Stream {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> texts;
  std::optional<FinishReason> finish;
};

Stream RunOne(Harness& h, GenerateRequest r) {
  absl::Mutex mu;
  Stream s;
  r.on_output = [&](const GenerationOutput& out) {
    absl::MutexLock lock(&mu);
    s.tokens.push_back(out.token_ids);
    s.texts.push_back(out.text);
    if (out.finish_reason.has_value()) s.finish = out.finish_reason;
  };
  EXPECT_TRUE(h.engine->Submit(std::move(r)).ok());
  absl::MutexLock lock(&mu);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return s.finish.has_value(); };
  EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(30)));
  return s;
}

std::vector<int32_t> AllTokens(const Stream& s) {
  std::vector<int32_t> all;
  for (const auto& t : s.tokens) all.insert(all.end(), t.begin(), t.end());
  return all;
}

std::string AllText(const Stream& s, size_t outputs = SIZE_MAX) {
  std::string text;
  for (size_t i = 0; i < s.texts.size() && i < outputs; ++i) text += s.texts[i];
  return text;
}

// A request resumed after k of its tokens (migration) continues with exactly the tokens and text
// the uninterrupted run produced: seeded sampling at its seed position, penalties over the
// resumed output, and a stop string whose first characters were held back before the seam.
TEST(EngineTest, ResumedRequestContinuesExactlyWhereItStopped) {
  FakeTokenizer tok;
  const std::vector<int32_t> prompt = {20, 21, 22, 23, 24};
  SamplingParams params;
  params.temperature = 0.9f;
  params.seed = 42;
  params.presence_penalty = 0.7f;
  params.repetition_penalty = 1.3f;
  params.max_tokens = 24;
  // First an unconstrained run, to pick a stop string that occurs in its output.
  Harness probe(128, 4, EngineOptions{}, &tok);
  GenerateRequest r0;
  r0.request_id = "probe";
  r0.prompt_token_ids = prompt;
  r0.params = params;
  const std::string free_text = AllText(RunOne(probe, r0));
  ASSERT_GE(free_text.size(), 16u);
  params.stop = {free_text.substr(12, 3)};

  Harness a(128, 4, EngineOptions{}, &tok);
  GenerateRequest full;
  full.request_id = "full";
  full.prompt_token_ids = prompt;
  full.params = params;
  const Stream whole = RunOne(a, full);
  ASSERT_EQ(whole.finish, FinishReason::kStop);
  const std::vector<int32_t> tokens = AllTokens(whole);
  ASSERT_GE(tokens.size(), 14u);
  int held_back_cuts = 0;
  for (size_t k = 1; k < tokens.size(); ++k) {
    // The client has the tokens of the first k outputs (one token each) and their text.
    ASSERT_EQ(whole.tokens[k - 1].size(), 1u);
    const std::string delivered = AllText(whole, k);
    if (delivered.size() < k) ++held_back_cuts;  // the stop buffer was holding text back
    Harness b(128, 4, EngineOptions{}, &tok);
    GenerateRequest resumed;
    resumed.request_id = absl::StrCat("resumed-", k);
    resumed.prompt_token_ids = prompt;
    resumed.prompt_token_ids.insert(resumed.prompt_token_ids.end(), tokens.begin(),
                                    tokens.begin() + static_cast<std::ptrdiff_t>(k));
    resumed.params = params;
    resumed.params.max_tokens = *params.max_tokens - static_cast<int>(k);
    resumed.resumed_output_tokens = static_cast<int>(k);
    resumed.resumed_text_bytes = static_cast<int64_t>(delivered.size());
    const Stream rest = RunOne(b, resumed);
    EXPECT_EQ(rest.finish, whole.finish) << "cut at " << k;
    EXPECT_EQ(AllTokens(rest), std::vector<int32_t>(tokens.begin() + k, tokens.end()))
        << "cut at " << k;
    EXPECT_EQ(delivered + AllText(rest), AllText(whole)) << "cut at " << k;
    b.engine->Shutdown(absl::Seconds(5));
  }
  EXPECT_GT(held_back_cuts, 0) << "no cut fell inside a held-back stop-string prefix";
}

TEST(EngineTest, ResumeFieldsAreValidated) {
  Harness h(64);
  GenerateRequest r;
  r.request_id = "x";
  r.prompt_token_ids = {1, 2, 3};
  r.on_output = [](const GenerationOutput&) {};
  r.resumed_output_tokens = 3;  // the whole prompt: nothing left as prompt
  EXPECT_EQ(h.engine->Submit(r).code(), absl::StatusCode::kInvalidArgument);
  r.resumed_output_tokens = 1;
  r.resumed_text_bytes = -1;
  EXPECT_EQ(h.engine->Submit(r).code(), absl::StatusCode::kInvalidArgument);
  r.resumed_text_bytes = 0;
  r.params.temperature = 0.5f;  // sampled, but no seed to continue from
  EXPECT_EQ(h.engine->Submit(r).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem

// The engine over the real CPU runner (tiny synthesized Llama): batching, chunked prefill, prefix
// caching and preemption must not change greedy tokens compared with each prompt run alone in a
// roomy engine with prefix caching off and one full-prompt prefill.
#include <filesystem>
#include <map>
#include <set>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/engine/engine.h"
#include "runtime/model/cpu_model_runner.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/synth.h"
#include "runtime/model/tokenizer.h"
#include "runtime/model/weights.h"

namespace tandem {
namespace {

// Delegates to the CPU runner; the first Forward waits until every request is queued, so the
// batching (and hence preemption) is the same on every run.
class GatedRunner : public ModelRunner {
 public:
  GatedRunner(std::unique_ptr<ModelRunner> inner, absl::Notification* gate)
      : inner_(std::move(inner)), gate_(gate) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int block_size() const override { return inner_->block_size(); }
  int num_blocks() const override { return inner_->num_blocks(); }
  KvCacheLayout kv_layout() const override { return inner_->kv_layout(); }
  absl::Status Forward(const ForwardBatch& batch, ForwardOutput* out) override {
    gate_->WaitForNotificationWithTimeout(absl::Seconds(30));
    return inner_->Forward(batch, out);
  }

 private:
  std::unique_ptr<ModelRunner> inner_;
  absl::Notification* gate_;
};

class EngineCpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/engine_cpu_test_tiny");
    SynthOptions options;
    options.like = "tiny";
    options.out_dir = *dir_;
    options.seed = 7;
    options.num_threads = 2;
    absl::Status s = SynthesizeModel(options, nullptr);
    CHECK(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(*dir_, ec);
    delete dir_;
  }

  struct Generated {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;
  };

  // Runs `prompts`, all submitted at once, and returns what each generated, by index.
  static std::vector<Generated> Run(const std::vector<std::vector<int32_t>>& prompts,
                                    const SamplingParams& params, int num_blocks,
                                    const EngineOptions& options, EngineStats* stats = nullptr) {
    auto config = LoadModelConfig(*dir_);
    CHECK(config.ok()) << config.status();
    auto store = TensorStore::Open(*dir_);
    CHECK(store.ok()) << store.status();
    auto weights = LoadCpuWeights(*config, **store);
    CHECK(weights.ok()) << weights.status();
    CpuRunnerOptions runner_options;
    runner_options.block_size = 4;
    runner_options.num_blocks = num_blocks;
    auto runner = CreateCpuModelRunner(*config, std::move(*weights), runner_options);
    CHECK(runner.ok()) << runner.status();
    absl::Notification all_submitted;
    auto engine = Engine::Create(std::make_unique<GatedRunner>(std::move(*runner), &all_submitted),
                                 nullptr, options);
    CHECK(engine.ok()) << engine.status();

    absl::Mutex mu;
    std::map<std::string, Generated> generated;
    int finished = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateRequest r;
      r.request_id = std::to_string(i);
      r.prompt_token_ids = prompts[i];
      r.params = params;
      r.on_output = [&](const GenerationOutput& out) {
        absl::MutexLock lock(&mu);
        Generated& g = generated[out.request_id];
        g.tokens.insert(g.tokens.end(), out.token_ids.begin(), out.token_ids.end());
        g.logprobs.insert(g.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
        EXPECT_NE(out.finish_reason, FinishReason::kError) << out.error;
        if (out.finish_reason.has_value()) ++finished;
      };
      CHECK((*engine)->Submit(std::move(r)).ok());
    }
    all_submitted.Notify();
    {
      absl::MutexLock lock(&mu);
      auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return finished == static_cast<int>(prompts.size());
      };
      EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(120)));
    }
    (*engine)->Shutdown(absl::Seconds(5));
    if (stats != nullptr) *stats = (*engine)->stats();
    absl::MutexLock lock(&mu);
    std::vector<Generated> out;
    for (size_t i = 0; i < prompts.size(); ++i) out.push_back(generated[std::to_string(i)]);
    return out;
  }

  static std::string* dir_;
};

std::string* EngineCpuTest::dir_ = nullptr;

TEST_F(EngineCpuTest, BatchedPrefixCachedPreemptedMatchesSequential) {
  auto tokenizer = Tokenizer::FromModelDir(*dir_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string shared = "The quick brown fox jumps over the lazy dog. ";
  std::vector<std::vector<int32_t>> prompts;
  for (const char* tail : {"Once", "Twice upon a time", "Thrice", "A", "Zebras and more zebras"}) {
    prompts.push_back((*tokenizer)->Encode(shared + tail, true));
  }
  prompts.push_back((*tokenizer)->Encode("Short", true));
  const int max_tokens = 10;
  // Greedy with top-5 logprobs (the logprob values depend on attention over the whole KV), and
  // seeded sampling at temperature 1 (diverse tokens; the seed makes them batch-independent).
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = max_tokens;
  greedy.ignore_eos = true;
  greedy.logprobs = 5;
  SamplingParams sampled = greedy;
  sampled.temperature = 1.0f;
  sampled.seed = 1234;

  for (const SamplingParams& params : {greedy, sampled}) {
    std::vector<Generated> expected;
    EngineOptions alone;
    alone.enable_prefix_caching = false;
    alone.max_num_seqs = 1;
    alone.max_num_batched_tokens = 4096;
    for (const auto& p : prompts) expected.push_back(Run({p}, params, 256, alone)[0]);

    EngineOptions tight;
    tight.max_num_batched_tokens = 13;  // chunked prefill
    tight.max_num_seqs = 6;
    EngineStats stats;
    // 24 blocks of 4 tokens for 6 sequences of ~15-25 tokens each: preemption is certain.
    std::vector<Generated> got = Run(prompts, params, 24, tight, &stats);
    EXPECT_GT(stats.preemptions, 0);
    EXPECT_GT(stats.prefix_hit_tokens, 0);
    EXPECT_EQ(stats.blocks_used, 0);
    std::set<int32_t> distinct;
    for (const Generated& g : got) distinct.insert(g.tokens.begin(), g.tokens.end());
    if (params.temperature > 0.0f) {
      EXPECT_GT(distinct.size(), 20u) << "sampling did not explore";
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(got[i].tokens, expected[i].tokens) << "prompt " << i;
      ASSERT_EQ(static_cast<int>(got[i].tokens.size()), max_tokens);
      ASSERT_EQ(got[i].logprobs.size(), expected[i].logprobs.size());
      for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
        const auto& g = got[i].logprobs[t].top;
        const auto& e = expected[i].logprobs[t].top;
        ASSERT_EQ(g.size(), e.size());
        for (size_t k = 0; k < g.size(); ++k) {
          EXPECT_EQ(g[k].token, e[k].token) << "prompt " << i << " step " << t;
          EXPECT_NEAR(g[k].logprob, e[k].logprob, 1e-3) << "prompt " << i << " step " << t;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem

// The engine over the real CPU runner (tiny synthesized Llama): batching, chunked prefill, prefix
// caching and preemption must not change greedy tokens compared with each prompt run alone in a
// roomy engine with prefix caching off and one full-prompt prefill.
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/engine/disagg_test_util.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/tiny_model_test_util.h"
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
 public:
  static void SetUpTestSuite() { model_ = new TinyModel("engine_cpu_test_tiny", /*seed=*/7); }
  static void TearDownTestSuite() { delete model_; }

  struct Generated {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;
  };

  // A CPU runner over the tiny model with blocks of 4 tokens.
  static std::unique_ptr<ModelRunner> MakeRunner(int num_blocks) {
    return model_->MakeCpuRunner(num_blocks);
  }

  // Runs `prompts`, all submitted at once, and returns what each generated, by index.
  static std::vector<Generated> Run(const std::vector<std::vector<int32_t>>& prompts,
                                    const SamplingParams& params, int num_blocks,
                                    const EngineOptions& options, EngineStats* stats = nullptr) {
    absl::Notification all_submitted;
    auto engine = Engine::Create(
        std::make_unique<GatedRunner>(MakeRunner(num_blocks), &all_submitted), nullptr, options);
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

  static TinyModel* model_;
};

TinyModel* EngineCpuTest::model_ = nullptr;

TEST_F(EngineCpuTest, BatchedPrefixCachedPreemptedMatchesSequential) {
  auto tokenizer = Tokenizer::FromModelDir(model_->dir());
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

// Collects one engine's outputs by request id; thread-safe.
class Outputs {
 public:
  OutputCallback Callback() {
    return [this](const GenerationOutput& out) {
      absl::MutexLock lock(&mu_);
      EngineCpuTest::Generated& g = generated_[out.request_id];
      g.tokens.insert(g.tokens.end(), out.token_ids.begin(), out.token_ids.end());
      g.logprobs.insert(g.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      EXPECT_NE(out.finish_reason, FinishReason::kError) << out.error;
      if (out.finish_reason.has_value()) {
        finish_[out.request_id] = *out.finish_reason;
        usage_[out.request_id] = out.usage;
      }
    };
  }
  bool WaitFinished(const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finish_.contains(id); };
    return mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(120));
  }
  EngineCpuTest::Generated Get(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return generated_[id];
  }
  Usage usage(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return usage_[id];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, EngineCpuTest::Generated> generated_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, FinishReason> finish_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Usage> usage_ ABSL_GUARDED_BY(mu_);
};

void ExpectSameGeneration(const EngineCpuTest::Generated& got, const EngineCpuTest::Generated& want,
                          const std::string& what) {
  ASSERT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (size_t t = 0; t < got.logprobs.size(); ++t) {
    ASSERT_EQ(got.logprobs[t].top.size(), want.logprobs[t].top.size()) << what;
    for (size_t k = 0; k < got.logprobs[t].top.size(); ++k) {
      EXPECT_EQ(got.logprobs[t].top[k].token, want.logprobs[t].top[k].token) << what << " " << t;
      EXPECT_NEAR(got.logprobs[t].top[k].logprob, want.logprobs[t].top[k].logprob, 1e-3)
          << what << " step " << t;
    }
  }
}

absl::StatusOr<RemoteKvReservation> Reserve(Engine& d, GenerateRequest request) {
  auto slot = std::make_shared<Waitable<absl::StatusOr<RemoteKvReservation>>>();
  RETURN_IF_ERROR(d.SubmitRemotePrefill(
      std::move(request), [slot](absl::StatusOr<RemoteKvReservation> r) { slot->Set(r); }));
  auto r = slot->Wait(absl::Seconds(60));
  if (!r.has_value()) return absl::DeadlineExceededError("no on_reserved");
  return *r;
}

// Two engines over CPU runners of the same tiny model in one process: P prefills with
// hold_kv_after_prefill, the test memcpy's the KV from P's cache into the blocks D reserved
// (skipping D's prefix-cache hit), D completes with P's first token and continues. D's streams must
// equal a plain local engine's greedy tokens and logprobs, while local requests run on D at the
// same time.
TEST_F(EngineCpuTest, RemotePrefillBetweenTwoEnginesMatchesLocalGreedy) {
  auto tokenizer = Tokenizer::FromModelDir(model_->dir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string shared = "The quick brown fox jumps over the lazy dog. ";
  std::vector<std::vector<int32_t>> remote, local;
  for (const char* tail : {"Once", "Twice upon a time", "Thrice"}) {
    remote.push_back((*tokenizer)->Encode(shared + tail, true));
  }
  remote.push_back((*tokenizer)->Encode("Hi", true));  // a single, partial block
  for (const char* text : {"Short", "Zebras and more zebras", "The quick brown cat"}) {
    local.push_back((*tokenizer)->Encode(text, true));
  }
  ASSERT_GE(remote[0].size(), 9u);
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = 8;
  params.ignore_eos = true;
  params.logprobs = 3;
  EngineOptions alone;
  alone.enable_prefix_caching = false;
  alone.max_num_seqs = 1;
  alone.max_num_batched_tokens = 4096;
  std::vector<Generated> want_remote, want_local;
  for (const auto& p : remote) want_remote.push_back(Run({p}, params, 256, alone)[0]);
  for (const auto& p : local) want_local.push_back(Run({p}, params, 256, alone)[0]);

  auto p_engine = Engine::Create(MakeRunner(64), nullptr, EngineOptions{});
  ASSERT_TRUE(p_engine.ok()) << p_engine.status();
  EngineOptions d_options;
  d_options.max_num_batched_tokens = 16;  // chunked local prefills beside the remote decodes
  auto d_engine = Engine::Create(MakeRunner(64), nullptr, d_options);
  ASSERT_TRUE(d_engine.ok()) << d_engine.status();
  Engine& p = **p_engine;
  Engine& d = **d_engine;
  Outputs p_out, d_out;
  auto request = [&](const std::string& id, const std::vector<int32_t>& prompt, Outputs& out) {
    GenerateRequest r;
    r.request_id = id;
    r.prompt_token_ids = prompt;
    r.params = params;
    r.on_output = out.Callback();
    return r;
  };
  for (size_t i = 0; i < local.size(); ++i) {
    ASSERT_TRUE(d.Submit(request(absl::StrCat("local", i), local[i], d_out)).ok());
  }
  std::vector<int> cached(remote.size()), copied(remote.size());
  for (size_t i = 0; i < remote.size(); ++i) {
    const std::string id = absl::StrCat("remote", i);
    auto reservation = Reserve(d, request(id, remote[i], d_out));
    ASSERT_TRUE(reservation.ok()) << reservation.status();
    auto prefilled = std::make_shared<Waitable<PrefilledKv>>();
    GenerateRequest pr = request(id, remote[i], p_out);
    pr.hold_kv_after_prefill = true;
    pr.on_prefilled = [prefilled](const PrefilledKv& kv) { prefilled->Set(kv); };
    ASSERT_TRUE(p.Submit(std::move(pr)).ok());
    std::optional<PrefilledKv> kv = prefilled->Wait(absl::Seconds(60));
    ASSERT_TRUE(kv.has_value());
    ASSERT_EQ(kv->num_tokens, static_cast<int>(remote[i].size()));
    cached[i] = reservation->num_cached_tokens;
    copied[i] = CopyPromptKv(p.kv_layout(), kv->block_ids, d.kv_layout(), reservation->block_ids,
                             kv->num_tokens, reservation->num_cached_tokens);
    d.CompleteRemotePrefill(id, RemotePrefillResult{kv->first_token, kv->first_token_logprobs});
    p.ReleaseHeldKv(id);
  }
  for (size_t i = 0; i < remote.size(); ++i) {
    ASSERT_TRUE(d_out.WaitFinished(absl::StrCat("remote", i)));
    ASSERT_TRUE(p_out.WaitFinished(absl::StrCat("remote", i)));
  }
  for (size_t i = 0; i < local.size(); ++i)
    ASSERT_TRUE(d_out.WaitFinished(absl::StrCat("local", i)));
  // The first remote prompt shares at least 2 full blocks with the second and third on D.
  EXPECT_EQ(cached[0], 0);
  for (size_t i : {1u, 2u}) {
    EXPECT_GE(cached[i], 8) << i;
    EXPECT_EQ(copied[i], static_cast<int>((remote[i].size() + 3) / 4) - cached[i] / 4) << i;
    EXPECT_EQ(d_out.usage(absl::StrCat("remote", i)).cached_prompt_tokens, cached[i]);
  }
  for (size_t i = 0; i < remote.size(); ++i) {
    const std::string id = absl::StrCat("remote", i);
    ExpectSameGeneration(d_out.Get(id), want_remote[i], id);
    ASSERT_EQ(p_out.Get(id).tokens.size(), 1u);
    EXPECT_EQ(p_out.Get(id).tokens[0], want_remote[i].tokens[0]);
  }
  for (size_t i = 0; i < local.size(); ++i) {
    ExpectSameGeneration(d_out.Get(absl::StrCat("local", i)), want_local[i],
                         absl::StrCat("local", i));
  }
  p.Shutdown(absl::Seconds(5));
  d.Shutdown(absl::Seconds(5));
  EXPECT_EQ(p.stats().blocks_used, 0);
  EXPECT_EQ(d.stats().blocks_used, 0);
}

// A failed transfer (after garbage landed in the reserved blocks) falls back to a local prefill
// with exactly the local tokens.
TEST_F(EngineCpuTest, FailedRemotePrefillFallsBackToIdenticalLocalTokens) {
  auto tokenizer = Tokenizer::FromModelDir(model_->dir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<int32_t> prompt =
      (*tokenizer)->Encode("The quick brown fox jumps over the lazy dog. Twice", true);
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = 8;
  params.ignore_eos = true;
  params.logprobs = 3;
  EngineOptions alone;
  alone.enable_prefix_caching = false;
  alone.max_num_seqs = 1;
  const Generated want = Run({prompt}, params, 256, alone)[0];

  auto d_engine = Engine::Create(MakeRunner(64), nullptr, EngineOptions{});
  ASSERT_TRUE(d_engine.ok());
  Engine& d = **d_engine;
  Outputs out;
  GenerateRequest r;
  r.request_id = "x";
  r.prompt_token_ids = prompt;
  r.params = params;
  r.on_output = out.Callback();
  auto reservation = Reserve(d, std::move(r));
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  const KvCacheLayout layout = d.kv_layout();
  for (int32_t b : reservation->block_ids) {
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv)
        std::memset(layout.BlockPtr(layer, kv, b), 0x7f, layout.block_bytes);
    }
  }
  d.CompleteRemotePrefill("x", absl::DataLossError("transfer failed midway"));
  ASSERT_TRUE(out.WaitFinished("x"));
  ExpectSameGeneration(out.Get("x"), want, "fallback");
  d.Shutdown(absl::Seconds(5));
  EXPECT_EQ(d.stats().blocks_used, 0);
}

}  // namespace
}  // namespace tandem

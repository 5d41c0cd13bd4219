// Sampling on the runner (model_runner.h, SequenceChunk::sample) against sampling on the host,
// over the real CPU runner on a tiny synthesized Llama:
// - the CPU runner's sampled tokens and logprobs are SampleFromRequest on its own logits, it
//   returns logits when any row lacks a request and rejects a bad request;
// - an engine whose runner samples produces exactly the tokens (and the logprobs to 1e-5) of an
//   engine that samples every row on the host, for a mixed batch of greedy / top-k / top-p / min-p
//   / seeded and penalty / top-logprob requests (the latter keep the step on the host until they
//   finish, so both paths run in one engine);
// - a runner that samples rows nobody asked it to is an error, not a silent wrong token.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/tiny_model_test_util.h"
#include "runtime/model/cpu_model_runner.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/synth.h"
#include "runtime/model/weights.h"
#include "runtime/sampling/sampler.h"

namespace tandem {
namespace {

// What came back from a runner's Forward calls; outlives the engine that owns the runner.
struct StepCounts {
  absl::Mutex mu;
  int sampled ABSL_GUARDED_BY(mu) = 0;  // steps returned as tokens
  int logits ABSL_GUARDED_BY(mu) = 0;   // steps returned as logits
};

// Delegates to a runner. The first Forward waits until every request is queued (so two engines
// batch identically); `allow_sampling` is what SupportsDeviceSampling() reports.
class CountingRunner : public ModelRunner {
 public:
  CountingRunner(std::unique_ptr<ModelRunner> inner, absl::Notification* gate, bool allow_sampling,
                 StepCounts* counts)
      : inner_(std::move(inner)), gate_(gate), allow_sampling_(allow_sampling), counts_(counts) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int block_size() const override { return inner_->block_size(); }
  int num_blocks() const override { return inner_->num_blocks(); }
  KvCacheLayout kv_layout() const override { return inner_->kv_layout(); }
  bool SupportsDeviceSampling() const override { return allow_sampling_; }
  absl::Status Forward(const ForwardBatch& batch, ForwardOutput* out) override {
    gate_->WaitForNotificationWithTimeout(absl::Seconds(30));
    RETURN_IF_ERROR(inner_->Forward(batch, out));
    absl::MutexLock lock(&counts_->mu);
    if (!out->tokens.empty()) ++counts_->sampled;
    if (!out->logits.empty()) ++counts_->logits;
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<ModelRunner> inner_;
  absl::Notification* gate_;
  const bool allow_sampling_;
  StepCounts* counts_;
};

// Returns sampled tokens for every row although it reports no support and nobody asked.
class RogueRunner : public ModelRunner {
 public:
  explicit RogueRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int block_size() const override { return inner_->block_size(); }
  int num_blocks() const override { return inner_->num_blocks(); }
  KvCacheLayout kv_layout() const override { return inner_->kv_layout(); }
  absl::Status Forward(const ForwardBatch& batch, ForwardOutput* out) override {
    RETURN_IF_ERROR(inner_->Forward(batch, out));
    out->tokens.assign(out->rows, 1);
    out->logprobs.assign(out->rows, -1.0f);
    out->logits.clear();
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<ModelRunner> inner_;
};

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  std::vector<FinishReason> finish;
};

class EngineSamplingTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() { model_ = new TinyModel("engine_sampling_test_tiny", /*seed=*/11); }
  static void TearDownTestSuite() { delete model_; }

  static std::unique_ptr<ModelRunner> MakeRunner() { return model_->MakeCpuRunner(512); }

  // Submits every request before the first step and waits for all of them.
  static std::map<std::string, Generated> Run(std::unique_ptr<ModelRunner> runner,
                                              std::vector<GenerateRequest> requests,
                                              absl::Notification* gate) {
    EngineOptions options;
    options.max_num_batched_tokens = 24;  // chunked prefill: prompt chunks mix with decodes
    auto engine = Engine::Create(std::move(runner), nullptr, options);
    CHECK(engine.ok()) << engine.status();
    absl::Mutex mu;
    std::map<std::string, Generated> generated;
    int finished = 0;
    const int total = static_cast<int>(requests.size());
    for (GenerateRequest& r : requests) {
      r.on_output = [&](const GenerationOutput& out) {
        absl::MutexLock lock(&mu);
        Generated& g = generated[out.request_id];
        g.tokens.insert(g.tokens.end(), out.token_ids.begin(), out.token_ids.end());
        g.logprobs.insert(g.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
        if (out.finish_reason.has_value()) {
          g.finish.push_back(*out.finish_reason);
          ++finished;
        }
      };
      CHECK((*engine)->Submit(std::move(r)).ok());
    }
    if (gate != nullptr) gate->Notify();
    {
      absl::MutexLock lock(&mu);
      auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return finished == total; };
      EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(120)));
    }
    (*engine)->Shutdown(absl::Seconds(5));
    absl::MutexLock lock(&mu);
    return generated;
  }

  static TinyModel* model_;
};

TinyModel* EngineSamplingTest::model_ = nullptr;

std::vector<int32_t> Prompt(int n, int salt, int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 101 + 5) % vocab);
  return p;
}

// Every row sampler-friendly or not: the kinds a serving mix has.
std::vector<SamplingParams> MixedParams() {
  std::vector<SamplingParams> out;
  auto add = [&](float t, int top_k, float top_p, float min_p, int max_tokens) -> SamplingParams& {
    SamplingParams p;
    p.temperature = t;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.seed = 100 + out.size();  // the engine's own seeds are random: fix them to compare engines
    out.push_back(p);
    return out.back();
  };
  add(0.0f, 0, 1.0f, 0.0f, 14);                           // greedy
  add(0.8f, 5, 1.0f, 0.0f, 16);                           // top-k
  add(1.0f, 0, 0.9f, 0.0f, 15);                           // top-p
  add(1.2f, 0, 1.0f, 0.1f, 13);                           // min-p
  add(0.7f, 40, 0.8f, 0.05f, 16);                         // all filters
  add(1.5f, 0, 1.0f, 0.0f, 12).logprobs = 0;              // the sampled token's logprob only
  add(1.0f, 0, 1.0f, 0.0f, 5).repetition_penalty = 1.3f;  // host: penalties
  add(0.9f, 0, 0.95f, 0.0f, 4).presence_penalty = 0.5f;   // host
  add(0.0f, 0, 1.0f, 0.0f, 6).frequency_penalty = 0.4f;   // host, greedy
  add(1.0f, 0, 1.0f, 0.0f, 3).logprobs = 3;               // host: top-logprob list
  return out;
}

std::vector<GenerateRequest> MakeRequests(const std::vector<SamplingParams>& params, int vocab) {
  std::vector<GenerateRequest> out;
  for (size_t i = 0; i < params.size(); ++i) {
    GenerateRequest r;
    r.request_id = absl::StrCat("r", i);
    r.prompt_token_ids = Prompt(5 + static_cast<int>(i) * 3, static_cast<int>(i), vocab);
    r.params = params[i];
    out.push_back(std::move(r));
  }
  return out;
}

TEST_F(EngineSamplingTest, CpuRunnerSamplesItsOwnLogits) {
  std::unique_ptr<ModelRunner> plain = MakeRunner();
  std::unique_ptr<ModelRunner> sampling = MakeRunner();
  ASSERT_TRUE(sampling->SupportsDeviceSampling());
  const int vocab = plain->config().vocab_size;
  const std::vector<SamplingParams> params = MixedParams();
  // One prefill chunk per sequence (blocks 8 apart), then a decode step for each.
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int32_t>> tables;
  for (size_t i = 0; i < params.size(); ++i) {
    tokens.push_back(Prompt(6 + static_cast<int>(i), static_cast<int>(i), vocab));
    std::vector<int32_t> table;
    for (int b = 0; b < 8; ++b) table.push_back(static_cast<int32_t>(i) * 8 + b);
    tables.push_back(table);
  }
  std::vector<SampleRequest> requests;
  for (size_t i = 0; i < params.size(); ++i) {
    SamplingParams p = params[i];
    p.repetition_penalty = 1.0f;  // the runner only sees the logits-only part
    requests.push_back(MakeSampleRequest(p, 1000 + i, i));
  }
  auto batch_of = [&](bool with_requests, bool skip_one) {
    ForwardBatch batch;
    for (size_t i = 0; i < params.size(); ++i) {
      SequenceChunk ch;
      ch.tokens = tokens[i];
      ch.block_table = tables[i];
      ch.need_logits = i != 2;  // one chunk without logits: rows != chunks
      if (with_requests && !(skip_one && i == 4)) ch.sample = &requests[i];
      batch.chunks.push_back(ch);
    }
    return batch;
  };
  ForwardOutput logits_out, sampled_out;
  ASSERT_TRUE(plain->Forward(batch_of(false, false), &logits_out).ok());
  ASSERT_TRUE(sampling->Forward(batch_of(true, false), &sampled_out).ok());
  ASSERT_EQ(logits_out.rows, static_cast<int>(params.size()) - 1);
  EXPECT_TRUE(logits_out.tokens.empty());
  EXPECT_EQ(sampled_out.rows, logits_out.rows);
  EXPECT_TRUE(sampled_out.logits.empty());
  ASSERT_EQ(sampled_out.tokens.size(), static_cast<size_t>(logits_out.rows));
  ASSERT_EQ(sampled_out.logprobs.size(), static_cast<size_t>(logits_out.rows));
  int row = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (i == 2) continue;
    const std::span<const float> logits(logits_out.logits.data() + row * vocab, vocab);
    const SampleResult want = SampleFromRequest(requests[i], logits);
    EXPECT_EQ(sampled_out.tokens[row], want.token) << "row " << row;
    EXPECT_EQ(sampled_out.logprobs[row], want.logprob) << "row " << row;
    ++row;
  }
  // A row without a request: logits for every row, nothing sampled.
  std::unique_ptr<ModelRunner> partial = MakeRunner();
  ForwardOutput partial_out;
  ASSERT_TRUE(partial->Forward(batch_of(true, true), &partial_out).ok());
  EXPECT_TRUE(partial_out.tokens.empty());
  EXPECT_EQ(partial_out.logits, logits_out.logits);
  // A bad request is rejected before anything runs.
  requests[1].temperature = -1.0f;  // requests[0] is greedy, which ignores temperature
  ForwardOutput rejected;
  const absl::Status s = MakeRunner()->Forward(batch_of(true, false), &rejected);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST_F(EngineSamplingTest, RunnerSamplingMatchesHostSamplingTokenForToken) {
  const int vocab = MakeRunner()->config().vocab_size;
  const std::vector<SamplingParams> params = MixedParams();
  StepCounts host_counts, device_counts;
  absl::Notification host_gate, device_gate;
  const std::map<std::string, Generated> host =
      Run(std::make_unique<CountingRunner>(MakeRunner(), &host_gate, false, &host_counts),
          MakeRequests(params, vocab), &host_gate);
  const std::map<std::string, Generated> device =
      Run(std::make_unique<CountingRunner>(MakeRunner(), &device_gate, true, &device_counts),
          MakeRequests(params, vocab), &device_gate);
  {
    absl::MutexLock lock(&host_counts.mu);
    EXPECT_EQ(host_counts.sampled, 0);
    EXPECT_GT(host_counts.logits, 0);
  }
  {
    // Penalty and top-logprob requests (max_tokens <= 6) keep the first steps on the host; the
    // longer logits-only requests finish on the runner.
    absl::MutexLock lock(&device_counts.mu);
    EXPECT_GT(device_counts.sampled, 3);
    EXPECT_GT(device_counts.logits, 0);
  }

  ASSERT_EQ(host.size(), params.size());
  ASSERT_EQ(device.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string id = absl::StrCat("r", i);
    const Generated& h = host.at(id);
    const Generated& d = device.at(id);
    EXPECT_EQ(d.tokens, h.tokens) << id;
    EXPECT_EQ(static_cast<int>(d.tokens.size()), *params[i].max_tokens) << id;
    ASSERT_EQ(d.finish.size(), 1u) << id;
    EXPECT_EQ(d.finish[0], FinishReason::kLength) << id;
    ASSERT_EQ(d.logprobs.size(), h.logprobs.size()) << id;
    EXPECT_EQ(d.logprobs.empty(), !params[i].logprobs.has_value()) << id;
    for (size_t t = 0; t < d.logprobs.size(); ++t) {
      EXPECT_EQ(d.logprobs[t].token, h.logprobs[t].token) << id << " step " << t;
      // Top-logprob rows are sampled on the host in both runs, from logits of the same row; the
      // engine may batch it with different rows in the two runs (scheduling follows arrival
      // timing), and the CPU GEMM's summation order depends on the batch shape, so the logits
      // and hence the logprob can differ in their last bits.
      EXPECT_NEAR(d.logprobs[t].logprob, h.logprobs[t].logprob,
                  1e-5 * std::max(1.0f, std::fabs(h.logprobs[t].logprob)))
          << id << " step " << t;
      EXPECT_EQ(d.logprobs[t].top.size(), h.logprobs[t].top.size()) << id << " step " << t;
    }
  }
}

TEST_F(EngineSamplingTest, UnrequestedRunnerSamplingIsAnError) {
  const int vocab = MakeRunner()->config().vocab_size;
  SamplingParams p;
  p.max_tokens = 3;
  const std::map<std::string, Generated> got =
      Run(std::make_unique<RogueRunner>(MakeRunner()), MakeRequests({p}, vocab), nullptr);
  ASSERT_EQ(got.size(), 1u);
  const Generated& g = got.begin()->second;
  EXPECT_TRUE(g.tokens.empty());
  ASSERT_EQ(g.finish.size(), 1u);
  EXPECT_EQ(g.finish[0], FinishReason::kError);
}

}  // namespace
}  // namespace tandem

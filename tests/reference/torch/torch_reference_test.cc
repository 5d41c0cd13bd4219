// The CPU model runner against an independent PyTorch implementation (make_reference.py): greedy
// ids and last-position logits at each of 32 steps, for a tied-embedding GQA Llama with llama3
// RoPE scaling and a Qwen2 with biases; and the engine's prompt logprobs against the log-softmax
// at every prompt position. Runs on model directories the python generator wrote
// (ctest fixture torch_reference; TANDEM_TORCH_REFERENCE_DIR points at them), loading them through
// the real loader: LoadModelConfig, TensorStore, LoadCpuWeights, CreateCpuModelRunner.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/kernels/cpu_ops.h"
#include "runtime/model/cpu_model_runner.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weights.h"

namespace tandem {
namespace {

constexpr double kLogitTolerance = 1e-4;

struct PromptRef {
  std::string name;
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;             // [steps]
  std::vector<std::vector<float>> logits;  // [steps][vocab]
  // [prompt length - 1][vocab]: log-softmax at each position but the last.
  std::vector<std::vector<double>> prompt_log_softmax;
};

struct ModelRef {
  std::string dir;
  std::vector<PromptRef> prompts;
  std::string shared_first, shared_second;
  int common_len = 0;
  const PromptRef& Get(const std::string& name) const {
    for (const PromptRef& p : prompts) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << "no prompt " << name;
    return prompts.front();
  }
};

std::string ReferenceDir() {
  const char* dir = std::getenv("TANDEM_TORCH_REFERENCE_DIR");
  return dir == nullptr ? "" : dir;
}

ModelRef LoadReference(const std::string& model) {
  ModelRef ref;
  ref.dir = ReferenceDir() + "/" + model;
  std::ifstream in(ref.dir + "/reference.json");
  EXPECT_TRUE(in.good()) << "cannot read " << ref.dir << "/reference.json";
  if (!in.good()) return ref;
  const nlohmann::json j = nlohmann::json::parse(in);
  for (const auto& p : j.at("prompts")) {
    PromptRef pr;
    pr.name = p.at("name").get<std::string>();
    pr.prompt = p.at("prompt_ids").get<std::vector<int32_t>>();
    pr.greedy = p.at("greedy_ids").get<std::vector<int32_t>>();
    pr.logits = p.at("logits").get<std::vector<std::vector<float>>>();
    pr.prompt_log_softmax = p.at("prompt_log_softmax").get<std::vector<std::vector<double>>>();
    ref.prompts.push_back(std::move(pr));
  }
  ref.shared_first = j.at("shared_prefix").at("first").get<std::string>();
  ref.shared_second = j.at("shared_prefix").at("second").get<std::string>();
  ref.common_len = j.at("shared_prefix").at("common_len").get<int>();
  return ref;
}

std::unique_ptr<ModelRunner> LoadRunner(const std::string& dir, int block_size, int num_blocks) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return nullptr;
  absl::StatusOr<ModelWeights> weights = LoadCpuWeights(*config, **store);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return nullptr;
  CpuRunnerOptions options;
  options.block_size = block_size;
  options.num_blocks = num_blocks;
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateCpuModelRunner(*config, *std::move(weights), options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return nullptr;
  return *std::move(runner);
}

// Largest |got - want| over a logits row.
double MaxAbsDiff(const float* got, const std::vector<float>& want) {
  double m = 0;
  for (size_t i = 0; i < want.size(); ++i) m = std::max(m, std::abs(double{got[i]} - want[i]));
  return m;
}

// One sequence being decoded greedily; its tokens are its prompt followed by its own argmax ids.
struct Sequence {
  const PromptRef* ref = nullptr;
  std::vector<int32_t> tokens;       // prompt + generated so far
  std::vector<int32_t> block_table;  // enough blocks for prompt + steps
  int cached = 0;                    // positions whose KV is in the cache
  int generated = 0;
  std::vector<int> prefill_chunks;  // sizes of the prompt chunks still to run (front first)
  size_t next_chunk = 0;
  bool Done() const { return generated == static_cast<int>(ref->greedy.size()); }
};

class TorchReferenceTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (ReferenceDir().empty()) {
      GTEST_SKIP() << "TANDEM_TORCH_REFERENCE_DIR unset (run through ctest: the "
                      "torch_reference_models fixture writes the models)";
    }
    ref_ = LoadReference(GetParam());
    ASSERT_FALSE(ref_.prompts.empty());
  }

  // Checks one output row of `seq` against the reference step and appends the argmax id.
  void CheckStepAndAdvance(Sequence& seq, const float* logits, int vocab) {
    const int step = seq.generated;
    const double diff = MaxAbsDiff(logits, seq.ref->logits[step]);
    max_error_ = std::max(max_error_, diff);
    EXPECT_LE(diff, kLogitTolerance) << seq.ref->name << " step " << step;
    const int id = cpu::Argmax(logits, vocab);
    ASSERT_EQ(id, seq.ref->greedy[step]) << seq.ref->name << " step " << step;
    seq.tokens.push_back(id);
    ++seq.generated;
  }

  // Runs the sequences to completion, all in the same Forward calls: a sequence prefills its
  // prompt in its planned chunk sizes (the last chunk ends the prompt), then decodes one token
  // per step. `start_step[i]` delays sequence i.
  void RunTogether(ModelRunner& runner, std::vector<Sequence>& seqs,
                   const std::vector<int>& start_step) {
    const int vocab = runner.config().vocab_size;
    for (int step = 0; step < 1000; ++step) {
      ForwardBatch batch;
      std::vector<Sequence*> wants_logits;
      for (size_t i = 0; i < seqs.size(); ++i) {
        Sequence& s = seqs[i];
        if (s.Done() || step < start_step[i]) continue;
        const int prompt_len = static_cast<int>(s.ref->prompt.size());
        int n = 1;
        if (s.cached < prompt_len) {
          n = s.next_chunk < s.prefill_chunks.size() ? s.prefill_chunks[s.next_chunk++]
                                                     : prompt_len - s.cached;
          n = std::min(n, prompt_len - s.cached);
        }
        SequenceChunk chunk;
        chunk.tokens = std::span<const int32_t>(s.tokens).subspan(s.cached, n);
        chunk.start_pos = s.cached;
        chunk.block_table = s.block_table;
        chunk.need_logits = s.cached + n == static_cast<int>(s.tokens.size());
        s.cached += n;
        if (chunk.need_logits) wants_logits.push_back(&s);
        batch.chunks.push_back(chunk);
      }
      if (batch.chunks.empty()) {
        if (std::all_of(seqs.begin(), seqs.end(), [](const Sequence& s) { return s.Done(); }))
          return;
        continue;
      }
      ForwardOutput out;
      const absl::Status status = runner.Forward(batch, &out);
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_EQ(out.rows, static_cast<int>(wants_logits.size()));
      for (size_t r = 0; r < wants_logits.size(); ++r) {
        ASSERT_NO_FATAL_FAILURE(CheckStepAndAdvance(
            *wants_logits[r], out.logits.data() + r * static_cast<size_t>(vocab), vocab));
      }
    }
    FAIL() << "sequences did not finish";
  }

  // A sequence over fresh blocks [first_block, first_block + blocks needed).
  Sequence NewSequence(const PromptRef& ref, int block_size, int first_block) const {
    Sequence s;
    s.ref = &ref;
    s.tokens = ref.prompt;
    const int total = static_cast<int>(ref.prompt.size() + ref.greedy.size());
    for (int b = 0; b * block_size < total; ++b) s.block_table.push_back(first_block + b);
    return s;
  }

  void TearDown() override {
    if (max_error_ > 0) {
      std::printf("max |logit - torch| = %.3g\n", max_error_);
      RecordProperty("max_logit_error", std::to_string(max_error_));
    }
  }

  ModelRef ref_;
  double max_error_ = 0;
};

// Each prompt alone: prefill in one chunk, then one token per step, greedy.
TEST_P(TorchReferenceTest, GreedyDecodeMatchesTorch) {
  const int block_size = 16;
  std::unique_ptr<ModelRunner> runner = LoadRunner(ref_.dir, block_size, 64);
  ASSERT_NE(runner, nullptr);
  for (const PromptRef& p : ref_.prompts) {
    std::vector<Sequence> seqs = {NewSequence(p, block_size, 3)};
    ASSERT_NO_FATAL_FAILURE(RunTogether(*runner, seqs, {0}));
  }
}

// All prompts in the same Forward calls, started at different steps: some prefill in uneven
// chunks while others decode; small blocks so chunks straddle block boundaries.
TEST_P(TorchReferenceTest, MixedPrefillAndDecodeBatchMatchesTorch) {
  const int block_size = 4;
  std::unique_ptr<ModelRunner> runner = LoadRunner(ref_.dir, block_size, 256);
  ASSERT_NE(runner, nullptr);
  std::vector<Sequence> seqs;
  int next_block = 0;
  for (const PromptRef& p : ref_.prompts) {
    seqs.push_back(NewSequence(p, block_size, next_block));
    next_block += static_cast<int>(seqs.back().block_table.size());
  }
  // Interleave block ids across sequences so no sequence's blocks are contiguous.
  std::vector<int32_t> pool;
  for (const Sequence& s : seqs)
    pool.insert(pool.end(), s.block_table.begin(), s.block_table.end());
  std::reverse(pool.begin(), pool.end());
  size_t taken = 0;
  for (Sequence& s : seqs) {
    for (int32_t& b : s.block_table) b = pool[taken++];
  }
  const std::vector<std::vector<int>> chunk_plans = {{2, 3}, {1, 7, 2}, {13, 5, 1, 9}, {6}, {}};
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i].prefill_chunks = chunk_plans[i % 5];
  ASSERT_NO_FATAL_FAILURE(RunTogether(*runner, seqs, {0, 1, 3, 4, 20}));
}

// Prefix-cache hit: the second prompt shares >= 2 full blocks with the first and reuses them
// (start_pos = shared length, block table beginning with the first's blocks), while the first is
// still decoding in the same batches.
TEST_P(TorchReferenceTest, PrefixCacheHitReusesBlocksAndMatchesTorch) {
  const int block_size = 16;
  std::unique_ptr<ModelRunner> runner = LoadRunner(ref_.dir, block_size, 64);
  ASSERT_NE(runner, nullptr);
  const PromptRef& a = ref_.Get(ref_.shared_first);
  const PromptRef& b = ref_.Get(ref_.shared_second);
  const int shared = ref_.common_len / block_size * block_size;
  ASSERT_GE(shared, 2 * block_size);
  ASSERT_TRUE(std::equal(a.prompt.begin(), a.prompt.begin() + shared, b.prompt.begin()));

  // Prefill the first prompt alone.
  Sequence sa = NewSequence(a, block_size, 10);
  ForwardBatch prefill;
  prefill.chunks.push_back({sa.tokens, 0, sa.block_table, true});
  ForwardOutput out;
  ASSERT_TRUE(runner->Forward(prefill, &out).ok());
  sa.cached = static_cast<int>(sa.tokens.size());
  ASSERT_NO_FATAL_FAILURE(CheckStepAndAdvance(sa, out.logits.data(), runner->config().vocab_size));

  // The second sequence: shared blocks first, then its own fresh blocks (30, 31, ...). Its first
  // `shared` positions are already cached.
  Sequence sb = NewSequence(b, block_size, 30);
  for (int i = 0; i < shared / block_size; ++i) sb.block_table[i] = sa.block_table[i];
  sb.cached = shared;
  sb.prefill_chunks = {5};  // part of the unshared tail, then the rest
  std::vector<Sequence> both = {sa, sb};
  ASSERT_NO_FATAL_FAILURE(RunTogether(*runner, both, {0, 0}));
}

// prompt_logprobs through the Engine: prompts prefilled in chunks of at most 7 tokens beside
// each other, one of them sharing a cached prefix it must not reuse (its positions need logits).
// Each prompt token after the first: logprob and rank against torch's log-softmax at the position
// before it; the top 3 against torch's values for the same ids, in descending order.
TEST_P(TorchReferenceTest, EnginePromptLogprobsMatchTorch) {
  constexpr int kTop = 3;
  std::unique_ptr<ModelRunner> runner = LoadRunner(ref_.dir, 4, 256);
  ASSERT_NE(runner, nullptr);
  EngineOptions options;
  options.max_num_batched_tokens = 7;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::move(runner), nullptr, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  OutputCollector collector;
  const auto submit = [&](const PromptRef& p, std::optional<int> prompt_logprobs) {
    GenerateRequest r;
    r.request_id = p.name + (prompt_logprobs.has_value() ? "+lp" : "");
    r.prompt_token_ids = p.prompt;
    r.params.max_tokens = 2;
    r.params.temperature = 0.0f;
    r.params.prompt_logprobs = prompt_logprobs;
    r.on_output = collector.Callback();
    ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
  };
  // The shared prefix enters the prefix cache first.
  ASSERT_NO_FATAL_FAILURE(submit(ref_.Get(ref_.shared_first), std::nullopt));
  ASSERT_TRUE(collector.WaitFinished(1));
  for (const PromptRef& p : ref_.prompts) ASSERT_NO_FATAL_FAILURE(submit(p, kTop));
  ASSERT_TRUE(collector.WaitFinished(1 + static_cast<int>(ref_.prompts.size())));
  double max_error = 0;
  for (const PromptRef& p : ref_.prompts) {
    SCOPED_TRACE(p.name);
    const OutputCollector::Result got = collector.Get(p.name + "+lp");
    ASSERT_EQ(got.finish, FinishReason::kLength) << got.error;
    EXPECT_EQ(got.tokens, std::vector<int32_t>(p.greedy.begin(), p.greedy.begin() + 2));
    EXPECT_EQ(got.outputs_with_prompt_logprobs, 1);
    EXPECT_EQ(got.usage.cached_prompt_tokens, 0);
    ASSERT_EQ(got.prompt_logprobs.size(), p.prompt.size() - 1);
    ASSERT_EQ(p.prompt_log_softmax.size(), p.prompt.size() - 1);
    for (size_t i = 0; i + 1 < p.prompt.size(); ++i) {
      const std::vector<double>& want = p.prompt_log_softmax[i];
      const ScoredToken& s = got.prompt_logprobs[i];
      ASSERT_EQ(s.token, p.prompt[i + 1]) << "position " << i;
      const double lp = want[static_cast<size_t>(s.token)];
      max_error = std::max(max_error, std::abs(s.logprob - lp));
      EXPECT_NEAR(s.logprob, lp, kLogitTolerance) << "position " << i;
      // Rank by torch, counting only clear winners (no near-ties in this random model).
      const int above = static_cast<int>(std::count_if(
          want.begin(), want.end(), [&](double x) { return x > lp + kLogitTolerance; }));
      const int tied = static_cast<int>(std::count_if(
          want.begin(), want.end(), [&](double x) { return std::abs(x - lp) <= kLogitTolerance; }));
      EXPECT_GE(s.rank, above + 1) << "position " << i;
      EXPECT_LE(s.rank, above + tied) << "position " << i;
      ASSERT_EQ(s.top.size(), static_cast<size_t>(kTop));
      std::vector<double> sorted = want;
      std::sort(sorted.rbegin(), sorted.rend());
      for (int k = 0; k < kTop; ++k) {
        EXPECT_NEAR(s.top[k].logprob, want[static_cast<size_t>(s.top[k].token)], kLogitTolerance);
        EXPECT_NEAR(s.top[k].logprob, sorted[static_cast<size_t>(k)], kLogitTolerance);
      }
    }
  }
  std::printf("max |prompt logprob - torch| = %.3g\n", max_error);
  (*engine)->Shutdown(absl::Seconds(5));
}

INSTANTIATE_TEST_SUITE_P(Models, TorchReferenceTest,
                         testing::Values("llama_tied_gqa", "qwen2_bias_untied"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace tandem

// The draft-model drafter: its drafts are the draft model's own greedy continuation (computed
// independently by a fresh runner, one token at a time, without a cache carried between calls),
// across calls that roll back rejected drafts and feed accepted tokens; a draft cache too small
// for a sequence gives it no drafts; the registry refuses a draft model of another vocabulary;
// and in the engine, a draft model that is the target itself has every greedy draft accepted,
// with outputs identical to plain decoding.
#include "speculative/draft_model_drafter.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/generate_test_util.h"
#include "runtime/engine/tiny_model_test_util.h"
#include "speculative/registry.h"

namespace tandem::speculative {
namespace {

using ::testing::HasSubstr;

// The greedy continuation of `tokens` by `n` tokens on a fresh runner: prefill, then one token
// per forward pass.
std::vector<int32_t> ReferenceGreedy(const TinyModel& model, std::vector<int32_t> tokens, int n) {
  std::unique_ptr<ModelRunner> runner = model.MakeCpuRunner(256);
  std::vector<int32_t> table(256);
  for (int i = 0; i < 256; ++i) table[i] = i;
  std::vector<int32_t> out;
  int start = 0;
  const int vocab = runner->config().vocab_size;
  while (static_cast<int>(out.size()) < n) {
    ForwardBatch batch;
    SequenceChunk chunk;
    chunk.tokens = std::span<const int32_t>(tokens).subspan(start);
    chunk.start_pos = start;
    chunk.block_table = std::span<const int32_t>(table).first((tokens.size() + 3) / 4);
    batch.chunks.push_back(chunk);
    ForwardOutput fo;
    CHECK(runner->Forward(batch, &fo).ok());
    const int32_t t = static_cast<int32_t>(
        std::max_element(fo.logits.begin(), fo.logits.begin() + vocab) - fo.logits.begin());
    out.push_back(t);
    start = static_cast<int>(tokens.size());
    tokens.push_back(t);
  }
  return out;
}

class DraftModelDrafterTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    target_ = new TinyModel("draft_drafter_target", 21);
    draft_ = new TinyModel("draft_drafter_draft", 22);
  }
  static void TearDownTestSuite() {
    delete target_;
    delete draft_;
  }
  static TinyModel* target_;
  static TinyModel* draft_;
};
TinyModel* DraftModelDrafterTest::target_ = nullptr;
TinyModel* DraftModelDrafterTest::draft_ = nullptr;

TEST_F(DraftModelDrafterTest, DraftsAreTheDraftModelsGreedyContinuationAcrossRollbacks) {
  DraftModelOptions options;
  options.max_batch_tokens = 16;  // prompts of up to 40 tokens are fed in several passes
  auto d = DraftModelDrafter::Create(draft_->MakeCpuRunner(256), options);
  ASSERT_TRUE(d.ok()) << d.status();
  std::mt19937 rng(4);
  const int vocab = (*d)->config().vocab_size;
  std::vector<std::vector<int32_t>> seqs(3);
  for (auto& s : seqs) {
    s.resize(5 + rng() % 36);
    for (int32_t& t : s) t = static_cast<int32_t>(rng() % vocab);
  }
  for (int round = 0; round < 6; ++round) {
    std::vector<DraftRequest> requests;
    for (size_t i = 0; i < seqs.size(); ++i) {
      DraftRequest r;
      r.key = static_cast<int64_t>(i);
      r.tokens = seqs[i];
      r.num_prompt_tokens = 5;
      r.max_tokens = 1 + static_cast<int>((i + round) % 4);
      requests.push_back(r);
    }
    absl::StatusOr<std::vector<std::vector<int32_t>>> drafts =
        (*d)->Propose(requests, absl::InfiniteFuture());
    ASSERT_TRUE(drafts.ok()) << drafts.status();
    ASSERT_EQ(drafts->size(), seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      EXPECT_EQ((*drafts)[i], ReferenceGreedy(*draft_, seqs[i], requests[i].max_tokens))
          << "round " << round << " sequence " << i;
    }
    // The verifier accepts some drafts and adds a token of its own (a different one).
    for (size_t i = 0; i < seqs.size(); ++i) {
      const std::vector<int32_t>& dr = (*drafts)[i];
      const size_t keep = rng() % (dr.size() + 1);
      seqs[i].insert(seqs[i].end(), dr.begin(), dr.begin() + keep);
      seqs[i].push_back(static_cast<int32_t>(rng() % vocab));
    }
  }
  EXPECT_EQ((*d)->live_sequences(), 3);
  (*d)->Release(1, seqs[1], 5);
  EXPECT_EQ((*d)->live_sequences(), 2);
}

TEST_F(DraftModelDrafterTest, ASequenceThatDoesNotFitGetsNoDrafts) {
  auto d = DraftModelDrafter::Create(draft_->MakeCpuRunner(4), DraftModelOptions{});  // 16 tokens
  ASSERT_TRUE(d.ok());
  std::vector<int32_t> small(6, 3), big(30, 4);
  DraftRequest a{1, small, 6, 3}, b{2, big, 30, 3};
  std::vector<DraftRequest> requests = {a, b};
  absl::StatusOr<std::vector<std::vector<int32_t>>> drafts =
      (*d)->Propose(requests, absl::InfiniteFuture());
  ASSERT_TRUE(drafts.ok());
  EXPECT_EQ((*drafts)[0].size(), 3u);
  EXPECT_TRUE((*drafts)[1].empty());
  EXPECT_EQ((*d)->live_sequences(), 1);
}

TEST_F(DraftModelDrafterTest, RegistryChecksTheVocabulary) {
  DrafterContext context;
  context.target_vocab_size = 7;
  absl::StatusOr<std::unique_ptr<Drafter>> d = CreateDrafter("draft:" + draft_->dir(), context);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("share the target's tokenizer"));
  EXPECT_FALSE(CreateDrafter("draft:/nonexistent/model").ok());
  context.target_vocab_size = 0;
  EXPECT_TRUE(CreateDrafter("draft:" + draft_->dir(), context).ok());
}

// Runs `prompts` through an engine over the target; returns each request's tokens.
std::vector<std::vector<int32_t>> Generate(const TinyModel& target,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const SamplingParams& params,
                                           const EngineOptions& options, EngineStats* stats) {
  auto engine = Engine::Create(target.MakeCpuRunner(256), nullptr, options);
  CHECK(engine.ok()) << engine.status();
  return GenerateAll(*std::move(engine), prompts, params, stats);
}

TEST_F(DraftModelDrafterTest, InTheEngineOutputsMatchPlainDecoding) {
  std::vector<std::vector<int32_t>> prompts = {{5, 6, 7, 8}, {9, 10, 11}, {12, 13, 14, 15, 16}};
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 20;
  greedy.ignore_eos = true;
  EngineStats plain_stats;
  const auto plain = Generate(*target_, prompts, greedy, EngineOptions{}, &plain_stats);
  for (const bool self : {true, false}) {
    EngineOptions options;
    auto d = DraftModelDrafter::Create((self ? target_ : draft_)->MakeCpuRunner(256),
                                       DraftModelOptions{});
    ASSERT_TRUE(d.ok());
    options.drafter = std::shared_ptr<Drafter>(*std::move(d));
    options.num_speculative_tokens = 4;
    EngineStats stats;
    EXPECT_EQ(Generate(*target_, prompts, greedy, options, &stats), plain)
        << (self ? "self-drafting" : "draft model");
    EXPECT_GT(stats.spec_draft_tokens, 0);
    if (self) {
      // The target drafting for itself: every greedy draft is the target's own choice.
      EXPECT_EQ(stats.spec_accepted_tokens, stats.spec_draft_tokens);
      EXPECT_LT(stats.steps, plain_stats.steps);
    }
  }
}

}  // namespace
}  // namespace tandem::speculative

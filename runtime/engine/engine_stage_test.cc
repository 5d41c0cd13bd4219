// KV staging between a device KV cache and its host transfer mirror, over fake runners whose
// transfer_layout() is a separate buffer (FakeModelRunner::EnableTransferMirror). The test moves
// KV between the two engines' MIRRORS only, as a transfer backend does, so D's history check
// fails unless P staged device -> mirror before on_prefilled and D staged mirror -> device before
// decoding. Checks which blocks are staged (all of P's prompt blocks; D's blocks past its
// prefix-cache hit), the failure paths (P: the request ends in error and D recomputes; D: local
// recompute) and that every block is back in the pool afterwards.
#include <map>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/engine/disagg_test_util.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/engine/fake_model_runner.h"

namespace tandem {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int kVocab = 64;
constexpr int kBlock = 4;
constexpr int kNumBlocks = 48;

using Collector = OutputCollector;
using Result = OutputCollector::Result;

struct Node {
  explicit Node(bool mirror, bool ask_transfer_layout = true) {
    auto owned = std::make_unique<FakeModelRunner>(kVocab, kNumBlocks, kBlock, 1024);
    if (mirror) owned->EnableTransferMirror();
    runner = owned.get();
    auto created = Engine::Create(std::move(owned), nullptr, EngineOptions{});
    CHECK(created.ok()) << created.status();
    engine = std::move(*created);
    if (!ask_transfer_layout) return;
    // As a worker does before it serves: this turns staging on for a mirror.
    auto layout = engine->transfer_layout();
    CHECK(layout.ok()) << layout.status();
    transfer = *layout;
  }
  GenerateRequest Request(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
    GenerateRequest r;
    r.request_id = id;
    r.prompt_token_ids = std::move(prompt);
    r.params.temperature = 0.0f;
    r.params.max_tokens = max_tokens;
    r.on_output = collector.Callback();
    return r;
  }
  // Stops the engine; then every block must be back in the pool (free or cached-idle).
  void ExpectNothingLeaked() {
    engine->Shutdown(absl::Seconds(5));
    const EngineStats stats = engine->stats();
    EXPECT_EQ(stats.blocks_used, 0);
    EXPECT_EQ(stats.blocks_free, stats.blocks_total);
    EXPECT_EQ(stats.held_kv, 0);
    EXPECT_EQ(stats.awaiting_kv, 0);
    EXPECT_THAT(runner->violations(), IsEmpty());
  }
  FakeModelRunner* runner;
  Collector collector;
  std::unique_ptr<Engine> engine;
  KvCacheLayout transfer;
};

// What P's on_prefilled saw: the KV report and how many StageKv calls had happened by then.
struct Prefilled {
  PrefilledKv kv;
  size_t stage_calls_at_report = 0;
};

// Submits a held prefill on P; its slot is set when on_prefilled runs.
std::shared_ptr<Waitable<Prefilled>> SubmitHeld(Node& p, const std::string& id,
                                                std::vector<int32_t> prompt) {
  auto slot = std::make_shared<Waitable<Prefilled>>();
  GenerateRequest r = p.Request(id, std::move(prompt), 1);
  r.hold_kv_after_prefill = true;
  FakeModelRunner* runner = p.runner;
  // on_prefilled runs on P's engine thread, so reading the runner's log here is safe.
  r.on_prefilled = [slot, runner](const PrefilledKv& kv) {
    slot->Set(Prefilled{kv, runner->stage_calls().size()});
  };
  CHECK(p.engine->Submit(std::move(r)).ok());
  return slot;
}

std::optional<Prefilled> PrefillAndHold(Node& p, const std::string& id,
                                        std::vector<int32_t> prompt) {
  return SubmitHeld(p, id, std::move(prompt))->Wait();
}

TEST(EngineStageTest, StagesThePromptBlocksBeforeReportingAndBeforeDecoding) {
  Node p(/*mirror=*/true), d(/*mirror=*/true);
  ASSERT_NE(p.transfer.base, p.engine->kv_layout().base);
  ASSERT_NE(d.transfer.base, d.engine->kv_layout().base);
  ASSERT_EQ(p.engine->transfer_layout()->base, p.transfer.base);  // fixed once obtained
  std::mt19937 rng(5);
  // D computes `base` itself: its first two blocks enter D's prefix cache while D's mirror never
  // holds them, so staging them from the mirror would destroy them.
  const std::vector<int32_t> base = RandomPrompt(rng, 9, kVocab);
  ASSERT_TRUE(d.engine->Submit(d.Request("base", base, 1)).ok());
  ASSERT_TRUE(d.collector.WaitFinished(1));
  ASSERT_THAT(d.runner->stage_calls(), IsEmpty());  // local requests stage nothing

  std::vector<int32_t> with_prefix(base.begin(), base.begin() + 8);
  for (int32_t t : RandomPrompt(rng, 6, kVocab)) with_prefix.push_back(t);
  const std::vector<std::vector<int32_t>> prompts = {RandomPrompt(rng, 3, kVocab),
                                                     RandomPrompt(rng, 8, kVocab),
                                                     RandomPrompt(rng, 13, kVocab), with_prefix};
  int finished = 1;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = absl::StrCat("r", i);
    const std::vector<int32_t>& prompt = prompts[i];
    const size_t prompt_blocks = (prompt.size() + kBlock - 1) / kBlock;
    auto reservation = ReserveRemotePrefill(*d.engine, d.Request(id, prompt, 7));
    ASSERT_TRUE(reservation.ok()) << reservation.status();
    EXPECT_EQ(reservation->num_cached_tokens, i == 3 ? 8 : 0);

    const size_t p_calls_before = p.runner->stage_calls().size();
    std::optional<Prefilled> prefilled = PrefillAndHold(p, id, prompt);
    ASSERT_TRUE(prefilled.has_value()) << id;
    // Exactly one device -> mirror copy of every prompt block, done before the report.
    EXPECT_EQ(prefilled->stage_calls_at_report, p_calls_before + 1) << id;
    const FakeModelRunner::StageCall& staged = p.runner->stage_calls().back();
    EXPECT_EQ(staged.dir, KvStage::kToMirror) << id;
    EXPECT_THAT(staged.blocks, ElementsAreArray(prefilled->kv.block_ids)) << id;
    EXPECT_EQ(staged.blocks.size(), prompt_blocks) << id;

    // The "transfer": mirror to mirror, skipping D's cached blocks.
    CopyPromptKv(p.transfer, prefilled->kv.block_ids, d.transfer, reservation->block_ids,
                 prefilled->kv.num_tokens, reservation->num_cached_tokens);
    d.engine->CompleteRemotePrefill(id, RemotePrefillResult{prefilled->kv.first_token, {}});
    p.engine->ReleaseHeldKv(id);
    ASSERT_TRUE(d.collector.WaitFinished(++finished)) << id;
    const Result r = d.collector.Get(id);
    EXPECT_EQ(r.finish, FinishReason::kLength) << id;
    EXPECT_EQ(r.tokens, FakeModelRunner::ReferenceGreedy(prompt, 7, kVocab)) << id;
    // Exactly one mirror -> device copy of the blocks P wrote (not the cached ones).
    const FakeModelRunner::StageCall& received = d.runner->stage_calls().back();
    EXPECT_EQ(d.runner->stage_calls().size(), i + 1) << id;
    EXPECT_EQ(received.dir, KvStage::kFromMirror) << id;
    const size_t skip = reservation->num_cached_tokens / kBlock;
    EXPECT_THAT(received.blocks, ElementsAreArray(reservation->block_ids.begin() + skip,
                                                  reservation->block_ids.begin() + prompt_blocks))
        << id;
  }
  // D computed only "base" and the decode steps: every remote prompt came through the mirror.
  p.ExpectNothingLeaked();
  d.ExpectNothingLeaked();
}

TEST(EngineStageTest, HostRunnersAreNeverAskedToStage) {
  Node p(/*mirror=*/false), d(/*mirror=*/false);
  EXPECT_EQ(p.transfer.base, p.engine->kv_layout().base);
  std::mt19937 rng(6);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 10, kVocab);
  auto reservation = ReserveRemotePrefill(*d.engine, d.Request("a", prompt, 4));
  ASSERT_TRUE(reservation.ok());
  std::optional<Prefilled> prefilled = PrefillAndHold(p, "a", prompt);
  ASSERT_TRUE(prefilled.has_value());
  CopyPromptKv(p.transfer, prefilled->kv.block_ids, d.transfer, reservation->block_ids,
               prefilled->kv.num_tokens, 0);
  d.engine->CompleteRemotePrefill("a", RemotePrefillResult{prefilled->kv.first_token, {}});
  p.engine->ReleaseHeldKv("a");
  ASSERT_TRUE(d.collector.WaitFinished(1));
  EXPECT_EQ(d.collector.Get("a").tokens, FakeModelRunner::ReferenceGreedy(prompt, 4, kVocab));
  p.ExpectNothingLeaked();
  d.ExpectNothingLeaked();
  EXPECT_THAT(p.runner->stage_calls(), IsEmpty());
  EXPECT_THAT(d.runner->stage_calls(), IsEmpty());
}

TEST(EngineStageTest, NoStagingUntilSomebodyAsksForTheTransferLayout) {
  Node p(/*mirror=*/true, /*ask_transfer_layout=*/false);
  std::mt19937 rng(9);
  ASSERT_TRUE(PrefillAndHold(p, "a", RandomPrompt(rng, 7, kVocab)).has_value());
  p.engine->ReleaseHeldKv("a");
  p.ExpectNothingLeaked();
  EXPECT_THAT(p.runner->stage_calls(), IsEmpty());
}

TEST(EngineStageTest, PrefillStagingFailureEndsTheRequestAndDecodeRecomputes) {
  Node p(/*mirror=*/true), d(/*mirror=*/true);
  std::mt19937 rng(7);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 11, kVocab);
  auto reservation = ReserveRemotePrefill(*d.engine, d.Request("a", prompt, 6));
  ASSERT_TRUE(reservation.ok());

  p.runner->FailNextStages(1, absl::InternalError("cudaMemcpy2DAsync: injected"));
  // No report: the request ends with an error instead, and its blocks are not held.
  auto report = SubmitHeld(p, "a", prompt);
  ASSERT_TRUE(p.collector.WaitFinished(1));
  EXPECT_EQ(report->sets(), 0);
  const Result failed = p.collector.Get("a");
  EXPECT_EQ(failed.finish, FinishReason::kError);
  EXPECT_EQ(failed.error.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(failed.error.message(), HasSubstr("staging"));
  EXPECT_THAT(failed.error.message(), HasSubstr("injected"));
  const EngineStats p_stats = p.engine->stats();
  EXPECT_EQ(p_stats.held_kv, 0);
  EXPECT_EQ(p_stats.blocks_used, 0);

  // The prefill worker reports the failure; D prefills the prompt itself.
  const int64_t computed_before = d.runner->tokens_computed();
  d.engine->CompleteRemotePrefill("a", absl::InternalError("prefill failed: staging"));
  ASSERT_TRUE(d.collector.WaitFinished(1));
  const Result r = d.collector.Get("a");
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_EQ(r.tokens, FakeModelRunner::ReferenceGreedy(prompt, 6, kVocab));
  EXPECT_GE(d.runner->tokens_computed() - computed_before, static_cast<int64_t>(prompt.size()));
  EXPECT_THAT(d.runner->stage_calls(), IsEmpty());  // nothing staged on the fallback

  // P's request id is free again and the next attempt goes through (its mirror is whole).
  std::optional<Prefilled> again = PrefillAndHold(p, "a", prompt);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->kv.first_token, FakeModelRunner::ReferenceGreedy(prompt, 1, kVocab)[0]);
  p.engine->ReleaseHeldKv("a");
  p.ExpectNothingLeaked();
  d.ExpectNothingLeaked();
}

TEST(EngineStageTest, DecodeStagingFailureFallsBackToLocalRecompute) {
  Node p(/*mirror=*/true), d(/*mirror=*/true);
  std::mt19937 rng(8);
  for (int len : {6, 12}) {
    const std::string id = absl::StrCat("len", len);
    const std::vector<int32_t> prompt = RandomPrompt(rng, len, kVocab);
    auto reservation = ReserveRemotePrefill(*d.engine, d.Request(id, prompt, 5));
    ASSERT_TRUE(reservation.ok());
    std::optional<Prefilled> prefilled = PrefillAndHold(p, id, prompt);
    ASSERT_TRUE(prefilled.has_value());
    CopyPromptKv(p.transfer, prefilled->kv.block_ids, d.transfer, reservation->block_ids,
                 prefilled->kv.num_tokens, reservation->num_cached_tokens);
    p.engine->ReleaseHeldKv(id);
    // The failed copy leaves the device blocks torn (zero-filled by the fake).
    d.runner->FailNextStages(1, absl::InternalError("cudaMemcpy2DAsync: injected"));
    const int64_t computed_before = d.runner->tokens_computed();
    d.engine->CompleteRemotePrefill(id, RemotePrefillResult{prefilled->kv.first_token, {}});
    ASSERT_TRUE(d.collector.WaitFinished(len == 6 ? 1 : 2));
    const Result r = d.collector.Get(id);
    EXPECT_EQ(r.finish, FinishReason::kLength) << id;
    EXPECT_EQ(r.tokens, FakeModelRunner::ReferenceGreedy(prompt, 5, kVocab)) << id;
    // Recomputed locally: the whole prompt went through D's forward pass.
    EXPECT_GE(d.runner->tokens_computed() - computed_before, len) << id;
    EXPECT_EQ(d.runner->stage_calls().back().dir, KvStage::kFromMirror) << id;
  }
  EXPECT_EQ(d.runner->stage_calls().size(), 2u);
  p.ExpectNothingLeaked();
  d.ExpectNothingLeaked();
}

// A transfer layout with another geometry than the KV cache cannot be addressed by block id.
class MismatchedMirrorRunner : public FakeModelRunner {
 public:
  MismatchedMirrorRunner() : FakeModelRunner(kVocab, kNumBlocks, kBlock, 1024) {
    EnableTransferMirror();
  }
  absl::StatusOr<KvCacheLayout> transfer_layout() override {
    absl::StatusOr<KvCacheLayout> l = FakeModelRunner::transfer_layout();
    l->block_stride *= 2;
    return l;
  }
};

TEST(EngineStageTest, RejectsATransferLayoutOfAnotherGeometry) {
  auto created = Engine::Create(std::make_unique<MismatchedMirrorRunner>(), nullptr, {});
  ASSERT_TRUE(created.ok()) << created.status();
  const absl::StatusOr<KvCacheLayout> layout = (*created)->transfer_layout();
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("transfer_layout"));
}

}  // namespace
}  // namespace tandem

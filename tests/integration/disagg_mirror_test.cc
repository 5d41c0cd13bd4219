// The prefill and decode workers over engines whose runners keep a separate transfer mirror
// (FakeModelRunner::EnableTransferMirror: the CPU stand-in for the CUDA runner's pinned host
// mirror), KV moving through the loopback backend and Decode.Generate over real gRPC. The workers
// must register the mirror (transfer_layout()), not the KV cache: the loopback writes then land
// in D's mirror, and only the engines' staging carries them to and from the caches the fake
// runners check. Also: a staging failure on P (D recomputes) and on D (local recompute), with
// the reference tokens and every block back in both pools.
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/fake_model_runner.h"
#include "tests/integration/disagg_stack.h"

namespace tandem {
namespace {

using ::testing::IsEmpty;
using testing_util::DisaggStack;
using testing_util::Streamed;
using testing_util::WaitIdle;

constexpr int kVocab = 64;
constexpr int kBlock = 4;
constexpr int kMaxTokens = 8;

struct Side {
  Side() {
    auto owned = std::make_unique<FakeModelRunner>(kVocab, 64, kBlock, 1024);
    owned->EnableTransferMirror();
    runner = owned.get();
    auto created = Engine::Create(std::move(owned), nullptr, EngineOptions{});
    CHECK(created.ok()) << created.status();
    engine = std::move(*created);
  }
  FakeModelRunner* runner;  // owned by engine; read it after engine->Shutdown
  std::unique_ptr<Engine> engine;
};

class DisaggMirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status started = stack_.Start(p_.engine.get(), d_.engine.get());
    ASSERT_TRUE(started.ok()) << started;
  }
  // Stops everything and checks that both engines ended with every block free.
  void StopAndCheck() {
    EXPECT_TRUE(WaitIdle(*p_.engine));
    EXPECT_TRUE(WaitIdle(*d_.engine));
    stack_.Stop();
    p_.engine->Shutdown(absl::ZeroDuration());
    d_.engine->Shutdown(absl::ZeroDuration());
    EXPECT_THAT(p_.runner->violations(), IsEmpty());
    EXPECT_THAT(d_.runner->violations(), IsEmpty());
  }
  static std::vector<int32_t> Prompt(int length, int seed) {
    std::vector<int32_t> p(length);
    for (int i = 0; i < length; ++i) p[i] = (seed * 31 + i * 17) % kVocab;
    return p;
  }
  Side p_, d_;
  DisaggStack stack_;
};

TEST_F(DisaggMirrorTest, KvTravelsMirrorToMirrorAndMatchesTheReference) {
  int seed = 1;
  for (int length : {3, 8, 13}) {
    const std::vector<int32_t> prompt = Prompt(length, seed++);
    const Streamed got = stack_.Generate(prompt, kMaxTokens);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_TRUE(got.prefilled_remotely) << length;
    EXPECT_EQ(got.tokens, FakeModelRunner::ReferenceGreedy(prompt, kMaxTokens, kVocab)) << length;
  }
  EXPECT_EQ(stack_.prefill().metrics().metrics().kv_transfer.failures(), 0);
  StopAndCheck();
  // One device -> mirror copy per prompt on P, one mirror -> device copy per prompt on D.
  ASSERT_EQ(p_.runner->stage_calls().size(), 3u);
  ASSERT_EQ(d_.runner->stage_calls().size(), 3u);
  for (const auto& call : p_.runner->stage_calls()) EXPECT_EQ(call.dir, KvStage::kToMirror);
  for (const auto& call : d_.runner->stage_calls()) EXPECT_EQ(call.dir, KvStage::kFromMirror);
  // D computed only the decode steps: every prompt position came through the mirrors.
  EXPECT_EQ(d_.runner->tokens_computed(), 3 * (kMaxTokens - 1));
}

TEST_F(DisaggMirrorTest, PrefillStagingFailureMakesDecodeRecompute) {
  p_.runner->FailNextStages(1, absl::InternalError("injected staging failure"));
  const std::vector<int32_t> prompt = Prompt(11, 7);
  const Streamed got = stack_.Generate(prompt, kMaxTokens);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_FALSE(got.prefilled_remotely);
  EXPECT_EQ(got.tokens, FakeModelRunner::ReferenceGreedy(prompt, kMaxTokens, kVocab));
  // The next request goes through P again.
  const Streamed next = stack_.Generate(Prompt(9, 8), kMaxTokens);
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_TRUE(next.prefilled_remotely);
  EXPECT_EQ(next.tokens, FakeModelRunner::ReferenceGreedy(Prompt(9, 8), kMaxTokens, kVocab));
  StopAndCheck();
}

TEST_F(DisaggMirrorTest, DecodeStagingFailureFallsBackToLocalRecompute) {
  d_.runner->FailNextStages(1, absl::InternalError("injected staging failure"));
  const std::vector<int32_t> prompt = Prompt(14, 9);
  const Streamed got = stack_.Generate(prompt, kMaxTokens);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, FakeModelRunner::ReferenceGreedy(prompt, kMaxTokens, kVocab));
  StopAndCheck();
  ASSERT_EQ(d_.runner->stage_calls().size(), 1u);
  // The prompt was computed on D after the failed copy, plus the decode steps.
  EXPECT_EQ(d_.runner->tokens_computed(), 14 + kMaxTokens - 1);
}

}  // namespace
}  // namespace tandem

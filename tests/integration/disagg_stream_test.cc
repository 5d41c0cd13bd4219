// Layer-wise KV streaming on the CPU: a prefill worker whose engine reports each chunk of a held
// prompt before its step (FakeModelRunner's layer progress stands in for the CUDA runner's) posts
// the chunk's writes while the step is still running, KV moving through the loopback backend
// into a decode worker over real gRPC. Prompts span several chunks (8-token steps), end in
// partial blocks, and hit the prefix cache on either side. D's fake runner checks every position
// of every sequence it decodes, so a block written wrong, late or not at all fails the test.
// Every transfer failure point (post, mid-transfer, release) falls back to D's recompute with
// the same tokens and leaves no block held on either side.
#include <memory>
#include <vector>

#include "decode/decode_worker.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "kvtransfer/fault_injecting_backend.h"
#include "prefill/prefill_worker.h"
#include "runtime/base/logging.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/fake_model_runner.h"
#include "tests/integration/disagg_stack.h"

namespace tandem {
namespace {

using ::testing::IsEmpty;
using testing_util::Streamed;
using testing_util::TestIdentity;
using testing_util::UniqueId;
using testing_util::WaitIdle;
using testing_util::WithIdentity;

constexpr int kVocab = 64;
constexpr int kBlock = 4;
constexpr int kMaxTokens = 6;

struct Side {
  explicit Side(bool layer_progress) {
    auto owned = std::make_unique<FakeModelRunner>(kVocab, 96, kBlock, 1024);
    runner = owned.get();
    EngineOptions options;
    options.kv_layer_progress = layer_progress;
    options.max_num_batched_tokens = 8;  // prompts span several steps
    auto created = Engine::Create(std::move(owned), nullptr, options);
    CHECK(created.ok()) << created.status();
    engine = std::move(*created);
  }
  FakeModelRunner* runner;
  std::unique_ptr<Engine> engine;
};

class DisaggStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(p_.engine->reports_kv_chunks());
    ASSERT_FALSE(d_.engine->reports_kv_chunks());
    kvtransfer::BackendOptions options;
    options.agent_name = UniqueId("p-loopback");
    auto p_backend = kvtransfer::CreateTransferBackend("loopback", options);
    options.agent_name = UniqueId("d-loopback");
    auto d_backend = kvtransfer::CreateTransferBackend("loopback", options);
    ASSERT_TRUE(p_backend.ok() && d_backend.ok());
    auto faults = std::make_unique<kvtransfer::FaultInjectingBackend>(std::move(*p_backend));
    faults_ = faults.get();
    auto p = prefill::PrefillWorker::Create(p_.engine.get(), std::move(faults),
                                            WithIdentity(prefill::PrefillWorkerOptions{}));
    ASSERT_TRUE(p.ok()) << p.status();
    prefill_ = std::move(*p);
    auto d = decode::DecodeWorker::Create(d_.engine.get(), std::move(*d_backend),
                                          WithIdentity(decode::DecodeWorkerOptions{}));
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
    stub_ = v1::Decode::NewStub(TestIdentity()->Dial(decode_->address()));
  }
  void TearDown() override {
    EXPECT_TRUE(WaitIdle(*p_.engine));
    EXPECT_TRUE(WaitIdle(*d_.engine));
    stub_.reset();
    decode_->Shutdown(absl::ZeroDuration());
    prefill_->Shutdown(absl::ZeroDuration());
    p_.engine->Shutdown(absl::ZeroDuration());
    d_.engine->Shutdown(absl::ZeroDuration());
    EXPECT_THAT(p_.runner->violations(), IsEmpty());
    EXPECT_THAT(d_.runner->violations(), IsEmpty());
  }
  Streamed Generate(const std::vector<int32_t>& prompt) {
    return testing_util::GreedyGenerate(*stub_, prompt, kMaxTokens, prefill_->address());
  }
  static std::vector<int32_t> Prompt(int length, int seed) {
    std::vector<int32_t> p(length);
    for (int i = 0; i < length; ++i) p[i] = (seed * 31 + i * 17 + i * i) % kVocab;
    return p;
  }
  const metrics::WorkerMetrics& p_metrics() { return prefill_->metrics().metrics(); }

  Side p_{/*layer_progress=*/true}, d_{/*layer_progress=*/false};
  kvtransfer::FaultInjectingBackend* faults_ = nullptr;
  std::unique_ptr<prefill::PrefillWorker> prefill_;
  std::unique_ptr<decode::DecodeWorker> decode_;
  std::unique_ptr<v1::Decode::Stub> stub_;
};

TEST_F(DisaggStreamTest, ChunkedPromptsStreamAndMatchTheReference) {
  // Each step of P takes 20 ms, so the transfer thread (polling every 50 us) sees a chunk's layer
  // progress, and posts its writes, before the prompt's next step ends: some bytes are sent under
  // compute however loaded the machine is.
  p_.runner->set_forward_hook([] { absl::SleepFor(absl::Milliseconds(20)); });
  // 1 token, one partial block, exactly two steps, and many steps with a partial last block.
  int seed = 1;
  for (int length : {1, 3, 16, 37}) {
    const std::vector<int32_t> prompt = Prompt(length, seed++);
    const Streamed got = Generate(prompt);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_TRUE(got.prefilled_remotely) << length;
    EXPECT_EQ(got.tokens, FakeModelRunner::ReferenceGreedy(prompt, kMaxTokens, kVocab)) << length;
  }
  EXPECT_EQ(p_metrics().kv_transfer.failures(), 0);
  EXPECT_EQ(p_metrics().kv_transfer.transfers(), 4);
  // Every chunk but the last is sent while later steps still run.
  EXPECT_GT(p_metrics().kv_transfer.streamed_bytes(), 0);
  EXPECT_LE(p_metrics().kv_transfer.streamed_bytes(), p_metrics().kv_transfer.bytes());
}

TEST_F(DisaggStreamTest, PrefixCacheHitsOnEitherSide) {
  const std::vector<int32_t> a = Prompt(29, 5);
  ASSERT_TRUE(Generate(a).status.ok());
  // The same prompt again: D holds all of it but the last partial block; P too.
  const Streamed again = Generate(a);
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.tokens, FakeModelRunner::ReferenceGreedy(a, kMaxTokens, kVocab));
  // A prompt sharing 20 tokens with `a`: P's prefix-cache part goes first, then the new chunks.
  std::vector<int32_t> b(a.begin(), a.begin() + 20);
  for (int i = 0; i < 15; ++i) b.push_back((i * 7 + 3) % kVocab);
  const Streamed got = Generate(b);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_TRUE(got.prefilled_remotely);
  EXPECT_EQ(got.tokens, FakeModelRunner::ReferenceGreedy(b, kMaxTokens, kVocab));
  EXPECT_EQ(p_metrics().kv_transfer.failures(), 0);
}

TEST_F(DisaggStreamTest, EveryFailurePointFallsBackToIdenticalTokens) {
  const struct {
    kvtransfer::FaultStage stage;
    const char* name;
    bool fails;
  } cases[] = {{kvtransfer::FaultStage::kPost, "post", true},
               {kvtransfer::FaultStage::kMidTransfer, "mid-transfer", true},
               {kvtransfer::FaultStage::kRelease, "release", false}};
  int seed = 40;
  double failures = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    kvtransfer::FaultPlan plan;
    plan.stage = c.stage;
    plan.once = true;
    plan.polls_before_failure = 2;
    const int injected = faults_->faults_injected();
    faults_->SetPlan(plan);
    const std::vector<int32_t> prompt = Prompt(27, seed++);
    const Streamed got = Generate(prompt);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, FakeModelRunner::ReferenceGreedy(prompt, kMaxTokens, kVocab));
    EXPECT_EQ(faults_->faults_injected(), injected + 1);
    EXPECT_EQ(got.prefilled_remotely, !c.fails);
    if (c.fails) ++failures;
    EXPECT_EQ(p_metrics().kv_transfer.failures(), failures);
    EXPECT_TRUE(WaitIdle(*p_.engine));
    EXPECT_TRUE(WaitIdle(*d_.engine));
    // The next request streams again.
    const std::vector<int32_t> next = Prompt(19, seed++);
    const Streamed again = Generate(next);
    ASSERT_TRUE(again.status.ok());
    EXPECT_TRUE(again.prefilled_remotely);
    EXPECT_EQ(again.tokens, FakeModelRunner::ReferenceGreedy(next, kMaxTokens, kVocab));
  }
}

}  // namespace
}  // namespace tandem

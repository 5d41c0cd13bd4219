// Disaggregated serving in one process: a PrefillWorker and a DecodeWorker (each with its own
// Engine over the CPU runner on a tiny synthesized Llama) on localhost gRPC, KV moving through
// the loopback or the UCX backend. Driven through a real gRPC client of Decode.Generate.
//
// References are independent of the code under test: greedy tokens come from a plain local Engine
// run of each prompt alone; expected KV bytes are computed from config.json
// (ceil(len / block_size) blocks x 2 (K, V) x layers x block_size x kv_heads x head_dim x 4 bytes).
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "decode/decode_worker.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "kvtransfer/fault_injecting_backend.h"
#include "kvtransfer/transfer_backend.h"
#include "nlohmann/json.hpp"
#include "prefill/prefill_worker.h"
#include "runtime/auth/kv_grant.h"
#include "runtime/base/logging.h"
#include "runtime/engine/engine.h"
#include "runtime/model/synth.h"
#include "runtime/server/kv_layout_convert.h"
#include "runtime/server/model_loader.h"
#include "tandem/v1/decode.grpc.pb.h"
#include "tandem/v1/prefill.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/integration/disagg_stack.h"

namespace tandem {
namespace {

using kvtransfer::FaultInjectingBackend;
using kvtransfer::FaultPlan;
using kvtransfer::FaultStage;
using testing_util::TestIdentity;
using testing_util::WithIdentity;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 96;
constexpr int kMaxTokens = 10;

std::string UniqueId(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return absl::StrCat(prefix, "-", counter.fetch_add(1));
}

struct Streamed {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::vector<v1::TokenLogprobs> logprobs;
  std::string finish_reason;
  bool prefilled_remotely = false;
  bool first_has_ttft = false;
  v1::TtftBreakdown ttft;
  v1::Usage usage;
  int messages = 0;
};

class DisaggTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    // Per process: ctest runs the tests of this binary in parallel processes.
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/disagg_test_tiny_", getpid()));
    SynthOptions options;
    options.like = "tiny";
    options.out_dir = *dir_;
    options.seed = 11;
    options.num_threads = 2;
    absl::Status s = SynthesizeModel(options, nullptr);
    CHECK(s.ok()) << s;
    std::ifstream in(*dir_ + "/config.json");
    config_ = new nlohmann::json(nlohmann::json::parse(in));
    reference_ = NewEngine(/*prefix_caching=*/false).release();
  }
  static void TearDownTestSuite() {
    reference_->engine->Shutdown(absl::ZeroDuration());
    delete reference_;
    delete config_;
    std::error_code ec;
    std::filesystem::remove_all(*dir_, ec);
    delete dir_;
  }

  static std::unique_ptr<server::LoadedModel> NewEngine(bool prefix_caching = true,
                                                        int block_size = kBlockSize) {
    server::ModelLoadOptions options;
    options.model_dir = *dir_;
    options.block_size = block_size;
    options.num_blocks = kNumBlocks * kBlockSize / block_size;
    options.engine.enable_prefix_caching = prefix_caching;
    auto model = server::LoadModel(options);
    CHECK(model.ok()) << model.status();
    return std::make_unique<server::LoadedModel>(std::move(*model));
  }

  // Bytes of KV for `tokens` prompt tokens at block granularity, from config.json alone.
  static int64_t KvBytes(int tokens) {
    const nlohmann::json& c = *config_;
    const int64_t layers = c["num_hidden_layers"];
    const int64_t heads = c["num_attention_heads"];
    const int64_t kv_heads = c.value("num_key_value_heads", heads);
    const int64_t head_dim = c.contains("head_dim") ? c["head_dim"].get<int64_t>()
                                                    : c["hidden_size"].get<int64_t>() / heads;
    const int64_t blocks = (tokens + kBlockSize - 1) / kBlockSize;
    return blocks * 2 * layers * kBlockSize * kv_heads * head_dim * 4;
  }

  static std::vector<int32_t> Prompt(int length, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> id(3, 250);
    std::vector<int32_t> prompt(length);
    for (int32_t& t : prompt) t = id(rng);
    return prompt;
  }

  // The prompt run alone through a plain local engine (greedy, EOS ignored).
  static std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_tokens,
                                        std::vector<TokenLogprobs>* logprobs = nullptr) {
    absl::Mutex mu;
    std::vector<int32_t> tokens;
    bool done = false;
    GenerateRequest request;
    request.request_id = UniqueId("ref");
    request.prompt_token_ids = prompt;
    request.params.temperature = 0.0f;
    request.params.max_tokens = max_tokens;
    request.params.ignore_eos = true;
    if (logprobs != nullptr) request.params.logprobs = 2;
    request.on_output = [&](const GenerationOutput& out) {
      absl::MutexLock lock(&mu);
      tokens.insert(tokens.end(), out.token_ids.begin(), out.token_ids.end());
      if (logprobs != nullptr)
        logprobs->insert(logprobs->end(), out.logprobs.begin(), out.logprobs.end());
      if (out.finish_reason.has_value()) done = true;
    };
    CHECK(reference_->engine->Submit(std::move(request)).ok());
    absl::MutexLock lock(&mu);
    CHECK(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(60)));
    return tokens;
  }

  std::unique_ptr<kvtransfer::TransferBackend> Backend(const std::string& kind,
                                                       const std::string& role) {
    kvtransfer::BackendOptions options;
    options.agent_name = UniqueId(absl::StrCat(role, "-", kind));
    options.ucx_transports = "tcp,sm,self";
    auto backend = kvtransfer::CreateTransferBackend(kind, options);
    CHECK(backend.ok()) << backend.status();
    return std::move(*backend);
  }

  // Starts P and D with `kind` backends; P's backend is wrapped for fault injection.
  // `allow_only_this_prefill`: D may dial only the stack's P (allowed_prefill_workers).
  void StartStack(const std::string& kind, decode::DecodeWorkerOptions d_options = {},
                  int d_block_size = kBlockSize, bool allow_only_this_prefill = false,
                  prefill::PrefillWorkerOptions p_options = {}) {
    p_model_ = NewEngine();
    d_model_ = NewEngine(/*prefix_caching=*/true, d_block_size);
    auto faults = std::make_unique<FaultInjectingBackend>(Backend(kind, "p"));
    p_faults_ = faults.get();
    auto p = prefill::PrefillWorker::Create(p_model_->engine.get(), std::move(faults),
                                            WithIdentity(std::move(p_options)));
    ASSERT_TRUE(p.ok()) << p.status();
    prefill_ = std::move(*p);
    if (allow_only_this_prefill) d_options.service.allowed_prefill_workers = {prefill_->address()};
    auto d = decode::DecodeWorker::Create(d_model_->engine.get(), Backend(kind, "d"),
                                          WithIdentity(d_options));
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
    channel_ = TestIdentity()->Dial(decode_->address());
    stub_ = v1::Decode::NewStub(channel_);
  }

  void TearDown() override {
    stub_.reset();
    if (decode_ != nullptr) decode_->Shutdown(absl::ZeroDuration());
    if (prefill_ != nullptr) prefill_->Shutdown(absl::ZeroDuration());
    decode_.reset();
    prefill_.reset();
    if (d_model_ != nullptr) d_model_->engine->Shutdown(absl::ZeroDuration());
    if (p_model_ != nullptr) p_model_->engine->Shutdown(absl::ZeroDuration());
    d_model_.reset();
    p_model_.reset();
  }

  static v1::GenerateRequest Request(const std::vector<int32_t>& prompt, int max_tokens,
                                     const std::string& prefill_worker) {
    return testing_util::GreedyRequest(prompt, max_tokens, prefill_worker);
  }

  Streamed Generate(const v1::GenerateRequest& request, int cancel_after_messages = -1) {
    Streamed out;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto reader = stub_->Generate(&context, request);
    v1::GenerateResponse message;
    while (reader->Read(&message)) {
      if (out.messages == 0) {
        out.prefilled_remotely = message.prefilled_remotely();
        out.first_has_ttft = message.has_ttft();
        out.ttft = message.ttft();
      }
      ++out.messages;
      out.tokens.insert(out.tokens.end(), message.token_ids().begin(), message.token_ids().end());
      out.logprobs.insert(out.logprobs.end(), message.logprobs().begin(), message.logprobs().end());
      out.usage = message.usage();
      if (!message.finish_reason().empty()) out.finish_reason = message.finish_reason();
      if (out.messages == cancel_after_messages) context.TryCancel();
    }
    out.status = reader->Finish();
    return out;
  }

  double PrefillBytes() { return prefill_->metrics().metrics().kv_transfer.bytes(); }
  double DecodeBytes() { return decode_->metrics().metrics().kv_transfer.bytes(); }

  // Waits until D holds no blocks and runs nothing.
  bool DecodeDrained(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      const EngineStats stats = d_model_->engine->stats();
      if (stats.blocks_used == 0 && stats.running == 0 && stats.waiting == 0) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  static std::string* dir_;
  static nlohmann::json* config_;
  static server::LoadedModel* reference_;

  std::unique_ptr<server::LoadedModel> p_model_;
  std::unique_ptr<server::LoadedModel> d_model_;
  FaultInjectingBackend* p_faults_ = nullptr;  // owned by prefill_'s transfer thread
  std::unique_ptr<prefill::PrefillWorker> prefill_;
  std::unique_ptr<decode::DecodeWorker> decode_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Decode::Stub> stub_;
};

std::string* DisaggTest::dir_ = nullptr;
nlohmann::json* DisaggTest::config_ = nullptr;
server::LoadedModel* DisaggTest::reference_ = nullptr;

TEST_P(DisaggTest, RemotePrefillMatchesLocalEngineAndMovesThePromptKv) {
  StartStack(GetParam());
  int seed = 1;
  for (int length : {5, 16, 17, 40}) {
    const std::vector<int32_t> prompt = Prompt(length, seed++);
    const double p_before = PrefillBytes();
    const double d_before = DecodeBytes();
    const Streamed got = Generate(Request(prompt, kMaxTokens, prefill_->address()));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, Reference(prompt, kMaxTokens)) << "prompt length " << length;
    EXPECT_EQ(got.finish_reason, "length");
    EXPECT_TRUE(got.prefilled_remotely);
    EXPECT_TRUE(got.first_has_ttft);
    EXPECT_GT(got.ttft.prefill_us(), 0);  // P's forward pass
    EXPECT_GE(got.ttft.transfer_us(), 0);
    EXPECT_GE(got.ttft.queue_us(), 0);
    EXPECT_GE(got.ttft.first_decode_us(), 0);
    EXPECT_EQ(got.usage.prompt_tokens(), length);
    EXPECT_EQ(got.usage.completion_tokens(), kMaxTokens);
    EXPECT_EQ(PrefillBytes() - p_before, KvBytes(length)) << "prompt length " << length;
    EXPECT_EQ(DecodeBytes() - d_before, KvBytes(length)) << "prompt length " << length;
  }
  EXPECT_EQ(prefill_->metrics().metrics().kv_transfer.failures(), 0);
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
  EXPECT_NE(prefill_->metrics().Scrape().find("tandem_kv_transfer_bytes_total"), std::string::npos);
}

TEST_P(DisaggTest, ConcurrentRequestsAllMatchTheLocalEngine) {
  StartStack(GetParam());
  constexpr int kRequests = 6;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) prompts.push_back(Prompt(9 + 7 * i, 100 + i));
  std::vector<Streamed> got(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      // Half go through P, half are prefilled on D, all at once.
      got[i] = Generate(Request(prompts[i], kMaxTokens, i % 2 == 0 ? prefill_->address() : ""));
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, Reference(prompts[i], kMaxTokens)) << "request " << i;
    EXPECT_EQ(got[i].prefilled_remotely, i % 2 == 0);
  }
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
}

// P's transfer never completes; D's Prefill deadline passes. P must release the transfer and
// its held blocks, D must fall back, and the client still gets the right tokens.
TEST_P(DisaggTest, PrefillDeadlineReleasesEverythingOnBothSides) {
  decode::DecodeWorkerOptions options;
  options.service.prefill_timeout = absl::Milliseconds(400);
  StartStack(GetParam(), options);
  FaultPlan plan;
  plan.stage = FaultStage::kMidTransfer;
  plan.once = true;
  plan.polls_before_failure = 1 << 30;
  p_faults_->SetPlan(plan);
  const std::vector<int32_t> prompt = Prompt(26, 77);
  const Streamed got = Generate(Request(prompt, kMaxTokens, prefill_->address()));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_FALSE(got.prefilled_remotely);
  EXPECT_EQ(got.tokens, Reference(prompt, kMaxTokens));
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  EngineStats p = p_model_->engine->stats();
  while ((p.held_kv != 0 || p.blocks_used != 0) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    p = p_model_->engine->stats();
  }
  EXPECT_EQ(p.held_kv, 0);
  EXPECT_EQ(p.blocks_used, 0);
  EXPECT_EQ(prefill_->metrics().metrics().kv_transfer.failures(), 1);
}

// The decode worker vanishes while P's write into it is stuck: its Prefill call is cancelled,
// and P gives back the held KV at once, long before its own deadlines (60 s prefill, 20 s
// transfer), which are the last resort.
TEST_P(DisaggTest, PrefillWorkerFreesHeldKvWhenTheDecodeWorkerVanishes) {
  decode::DecodeWorkerOptions options;
  options.service.prefill_timeout = absl::Seconds(30);
  options.service.fence_lease = absl::Seconds(1);
  StartStack(GetParam(), options);
  FaultPlan plan;
  plan.stage = FaultStage::kMidTransfer;
  plan.once = true;
  plan.polls_before_failure = 1 << 30;
  p_faults_->SetPlan(plan);
  const std::vector<int32_t> prompt = Prompt(30, 85);
  std::thread client([&] { (void)Generate(Request(prompt, kMaxTokens, prefill_->address())); });
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (p_model_->engine->stats().held_kv == 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(p_model_->engine->stats().held_kv, 1) << "the stuck transfer never held the KV";
  // The write only looks stuck: its bytes must have landed before D goes. A write really in
  // flight to a peer in this same process could not be recalled, and P would rightly hold its
  // blocks until D's process died (which is how P detects a same-host peer's death).
  while (p_faults_->mid_transfers_landed() == 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(p_faults_->mid_transfers_landed(), 1) << "the wrapped write never finished";
  const absl::Time vanished = absl::Now();
  decode_->Shutdown(absl::ZeroDuration());
  EngineStats p = p_model_->engine->stats();
  while ((p.held_kv != 0 || p.blocks_used != 0) && absl::Now() < vanished + absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(10));
    p = p_model_->engine->stats();
  }
  const absl::Duration took = absl::Now() - vanished;
  client.join();
  EXPECT_EQ(p.held_kv, 0);
  EXPECT_EQ(p.blocks_used, 0);
  EXPECT_LT(took, absl::Seconds(3)) << "P waited for a deadline instead of the cancellation";
}

// A decode worker given its prefill workers dials no other address a request names (no SSRF,
// no endpoint blobs sent to strangers): PERMISSION_DENIED, and its own prefill worker still works.
// Two-phase admission: D reserves KV blocks only for prompts P has admitted, so a request
// queued behind P's admission window holds nothing on D. P admits one prompt at a time here and
// every transfer sticks until D's prefill deadline, so the window stays full for a second per
// request. With two-phase admission off, D reserves for all three at once.
TEST_P(DisaggTest, DecodeBlocksAreReservedOnlyForAdmittedPrompts) {
  for (bool two_phase : {true, false}) {
    SCOPED_TRACE(two_phase ? "two-phase" : "reserve at once");
    decode::DecodeWorkerOptions d_options;
    d_options.service.prefill_timeout = absl::Seconds(1);
    d_options.service.two_phase_admission = two_phase;
    prefill::PrefillWorkerOptions p_options;
    p_options.service.admission.window_tokens = 1;  // one prompt at a time
    StartStack(GetParam(), d_options, kBlockSize, false, p_options);
    FaultPlan plan;
    plan.stage = FaultStage::kMidTransfer;
    plan.once = false;
    plan.polls_before_failure = 1 << 30;
    p_faults_->SetPlan(plan);
    constexpr int kRequests = 3;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < kRequests; ++i) prompts.push_back(Prompt(20, 300 + i));
    std::vector<Streamed> got(kRequests);
    std::vector<std::thread> clients;
    for (int i = 0; i < kRequests; ++i) {
      clients.emplace_back(
          [&, i] { got[i] = Generate(Request(prompts[i], kMaxTokens, prefill_->address())); });
    }
    // The first request's transfer is stuck: watch both sides while it is.
    int max_awaiting = 0;
    int max_queued_at_p = 0;
    const absl::Time until = absl::Now() + absl::Milliseconds(700);
    while (absl::Now() < until) {
      max_awaiting = std::max(max_awaiting, d_model_->engine->stats().awaiting_kv);
      max_queued_at_p = std::max(max_queued_at_p, p_model_->engine->stats().queued_outside);
      absl::SleepFor(absl::Milliseconds(5));
    }
    for (std::thread& t : clients) t.join();
    if (two_phase) {
      EXPECT_EQ(max_awaiting, 1) << "D reserved for a prompt P had not admitted";
      EXPECT_EQ(max_queued_at_p, kRequests - 1);
      EXPECT_EQ(prefill_->admission_stats().admitted, kRequests);
    } else {
      EXPECT_EQ(max_awaiting, kRequests);
      EXPECT_EQ(max_queued_at_p, 0);
      EXPECT_EQ(prefill_->admission_stats().admitted, 0);
    }
    for (int i = 0; i < kRequests; ++i) {
      ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
      EXPECT_FALSE(got[i].prefilled_remotely);  // every transfer was stuck: D prefilled itself
      EXPECT_EQ(got[i].tokens, Reference(prompts[i], kMaxTokens)) << "request " << i;
    }
    EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
    EXPECT_EQ(prefill_->admission_stats().waiting, 0);
    EXPECT_EQ(prefill_->admission_stats().window_used_tokens, 0);
    TearDown();
  }
}

TEST_P(DisaggTest, DecodeWorkerDialsOnlyItsPrefillWorkers) {
  StartStack(GetParam(), {}, kBlockSize, /*allow_only_this_prefill=*/true);
  const std::vector<int32_t> prompt = Prompt(20, 86);
  const Streamed stranger = Generate(Request(prompt, kMaxTokens, "127.0.0.1:1"));
  EXPECT_EQ(stranger.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << stranger.status.error_message();
  EXPECT_TRUE(stranger.tokens.empty());
  const Streamed ok = Generate(Request(prompt, kMaxTokens, prefill_->address()));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_TRUE(ok.prefilled_remotely);
  EXPECT_EQ(ok.tokens, Reference(prompt, kMaxTokens));
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
}

TEST_P(DisaggTest, LocalPrefillWhenNoPrefillWorkerIsNamed) {
  StartStack(GetParam());
  const std::vector<int32_t> prompt = Prompt(23, 99);
  const Streamed got = Generate(Request(prompt, kMaxTokens, ""));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, Reference(prompt, kMaxTokens));
  EXPECT_FALSE(got.prefilled_remotely);
  EXPECT_EQ(PrefillBytes(), 0);
}

TEST_P(DisaggTest, FirstTokenLogprobsComeFromThePrefillWorker) {
  StartStack(GetParam());
  const std::vector<int32_t> prompt = Prompt(20, 5);
  v1::GenerateRequest request = Request(prompt, 4, prefill_->address());
  request.mutable_sampling()->set_logprobs(2);
  const Streamed got = Generate(request);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  ASSERT_TRUE(got.prefilled_remotely);
  std::vector<TokenLogprobs> want;
  ASSERT_EQ(got.tokens, Reference(prompt, 4, &want));
  ASSERT_EQ(got.logprobs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got.logprobs[i].token_id(), want[i].token);
    EXPECT_NEAR(got.logprobs[i].logprob(), want[i].logprob, 1e-4) << "token " << i;
    ASSERT_EQ(got.logprobs[i].top_size(), 2);
    EXPECT_EQ(got.logprobs[i].top(0).token_id(), want[i].top[0].token);
  }
}

TEST_P(DisaggTest, PrefixCacheHitOnDecodeTransfersFewerBytes) {
  StartStack(GetParam());
  const std::vector<int32_t> first = Prompt(40, 7);
  std::vector<int32_t> second(first.begin(), first.begin() + 2 * kBlockSize);  // 2 full blocks
  for (int32_t t : Prompt(13, 8)) second.push_back(t);
  ASSERT_TRUE(Generate(Request(first, kMaxTokens, prefill_->address())).status.ok());
  const double before = PrefillBytes();
  const Streamed got = Generate(Request(second, kMaxTokens, prefill_->address()));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_TRUE(got.prefilled_remotely);
  EXPECT_EQ(got.tokens, Reference(second, kMaxTokens));
  EXPECT_EQ(got.usage.cached_prompt_tokens(), 2 * kBlockSize);
  // Only the blocks past the cached prefix move.
  EXPECT_EQ(PrefillBytes() - before, KvBytes(second.size()) - KvBytes(2 * kBlockSize));
}

TEST_P(DisaggTest, SameTokensAsTheOtherBackend) {
  // Both stacks are compared with each other directly (besides the reference in other tests).
  const std::vector<int32_t> prompt = Prompt(37, 21);
  StartStack(GetParam());
  const Streamed a = Generate(Request(prompt, kMaxTokens, prefill_->address()));
  TearDown();
  if (!kvtransfer::TransferBackendBuilt("ucx")) GTEST_SKIP() << "this build has no UCX";
  StartStack(GetParam() == "ucx" ? "loopback" : "ucx");
  const Streamed b = Generate(Request(prompt, kMaxTokens, prefill_->address()));
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_TRUE(a.prefilled_remotely && b.prefilled_remotely);
  EXPECT_EQ(a.tokens, b.tokens);
}

TEST_P(DisaggTest, ClientCancelMidStreamFreesDecodeBlocks) {
  StartStack(GetParam());
  const Streamed got = Generate(Request(Prompt(30, 3), 1200, prefill_->address()),
                                /*cancel_after_messages=*/3);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::CANCELLED) << got.status.error_message();
  EXPECT_LT(got.tokens.size(), 1200u);
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
  // The prefill side holds nothing either.
  const EngineStats p = p_model_->engine->stats();
  EXPECT_EQ(p.held_kv, 0);
  EXPECT_EQ(p.blocks_used, 0);
}

// Each delivered token is counted once over both workers' tandem_generation_tokens_total (the
// prefill worker's first token is the decode worker's to count), and the decode worker exports
// the vLLM-compatible gauges with its model name.
TEST_P(DisaggTest, GeneratedTokensAreCountedOnceAcrossTheWorkers) {
  StartStack(GetParam());
  const auto generated = [this] {
    prefill_->metrics().Refresh();
    decode_->metrics().Refresh();
    return prefill_->metrics().metrics().generation_tokens.Value() +
           decode_->metrics().metrics().generation_tokens.Value();
  };
  const double before = generated();
  const Streamed out = Generate(Request(Prompt(20, 9), kMaxTokens, prefill_->address()));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_TRUE(out.prefilled_remotely);
  ASSERT_EQ(out.tokens.size(), static_cast<size_t>(kMaxTokens));
  // The engine's counters settle when its step ends, just after the final output.
  ASSERT_TRUE(DecodeDrained(absl::Seconds(10)));
  EXPECT_EQ(generated() - before, kMaxTokens);
  EXPECT_EQ(prefill_->metrics().metrics().generation_tokens.Value(), 0);
  const std::string text = decode_->metrics().Scrape();
  EXPECT_NE(text.find("vllm:num_requests_waiting{model_name="), std::string::npos) << text;
  EXPECT_NE(text.find("tandem_kv_cache_usage_perc"), std::string::npos);
}

TEST_P(DisaggTest, DecodeCancelRpcAbortsTheStream) {
  StartStack(GetParam());
  v1::GenerateRequest request = Request(Prompt(12, 4), 1200, prefill_->address());
  request.set_cancel_token("the-callers-own-random-token");
  absl::Notification started;
  Streamed got;
  std::thread client([&] {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto reader = stub_->Generate(&context, request);
    v1::GenerateResponse message;
    while (reader->Read(&message)) {
      if (!started.HasBeenNotified()) started.Notify();
      got.tokens.insert(got.tokens.end(), message.token_ids().begin(), message.token_ids().end());
      if (!message.finish_reason().empty()) got.finish_reason = message.finish_reason();
    }
    got.status = reader->Finish();
  });
  const bool streaming = started.WaitForNotificationWithTimeout(absl::Seconds(30));
  if (!streaming) {
    client.join();
    FAIL() << "no message: " << got.status.error_message();
  }
  grpc::ClientContext context;
  v1::CancelRequest cancel;
  cancel.set_request_id(request.request_id());
  v1::CancelResponse response;
  // Only with the request's cancel token (attack_replay_test tries the others).
  ASSERT_TRUE(stub_->Cancel(&context, cancel, &response).ok());
  EXPECT_FALSE(response.found());
  cancel.set_cancel_token(request.cancel_token());
  grpc::ClientContext owner;
  ASSERT_TRUE(stub_->Cancel(&owner, cancel, &response).ok());
  EXPECT_TRUE(response.found());
  client.join();
  EXPECT_TRUE(got.status.ok());
  EXPECT_EQ(got.finish_reason, "abort");
  EXPECT_LT(got.tokens.size(), 1200u);
  grpc::ClientContext context2;
  cancel.set_request_id("no-such-request");
  ASSERT_TRUE(stub_->Cancel(&context2, cancel, &response).ok());
  EXPECT_FALSE(response.found());
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
}

TEST_P(DisaggTest, PrefillWorkerDownFallsBackToLocalPrefill) {
  StartStack(GetParam());
  const std::string dead = prefill_->address();
  prefill_->Shutdown(absl::ZeroDuration());
  const std::vector<int32_t> prompt = Prompt(25, 6);
  const absl::Time start = absl::Now();
  const Streamed got = Generate(Request(prompt, kMaxTokens, dead));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_FALSE(got.prefilled_remotely);
  EXPECT_EQ(got.tokens, Reference(prompt, kMaxTokens));
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
}

TEST_P(DisaggTest, BadRequestsAreRejectedWithStatusCodes) {
  StartStack(GetParam());
  v1::GenerateRequest bad = Request(Prompt(8, 1), 4, prefill_->address());
  bad.mutable_sampling()->set_temperature(-1.0f);
  EXPECT_EQ(Generate(bad).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad = Request({}, 4, "");
  EXPECT_EQ(Generate(bad).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // Prefill.Prefill naming no pair, with a whole target (region, layout, agent) of its own: the
  // arbitrary-address write of issue 21. Refused before anything is computed.
  auto prefill_stub = v1::Prefill::NewStub(TestIdentity()->Dial(prefill_->address()));
  v1::PrefillRequest request;
  request.set_request_id("unpaired");
  for (int32_t t : Prompt(8, 2)) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_logprobs(-1);
  v1::KvTarget* target = request.mutable_target();
  target->set_backend(GetParam());
  target->set_region("0x1000:1099511627776");
  target->add_block_ids(0);
  grpc::ClientContext context;
  v1::PrefillResponse response;
  const grpc::Status unpaired = prefill_stub->Prefill(&context, request, &response);
  EXPECT_EQ(unpaired.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(unpaired.error_message().find("pair_id"), std::string::npos)
      << unpaired.error_message();
  EXPECT_EQ(p_model_->engine->stats().blocks_used, 0);
}

// The pair handshake (Prefill.Connect): a model mismatch is refused before any byte moves; an
// endpoint the prefill worker cannot use is skipped, named and counted; pair ids are checked.
TEST_P(DisaggTest, PairHandshakeRefusesMismatchesAndFallsBackVisibly) {
  StartStack(GetParam());
  auto stub = v1::Prefill::NewStub(TestIdentity()->Dial(prefill_->address()));
  // D's real endpoint, as its first Generate offers it: take it from a successful pairing.
  const std::vector<int32_t> prompt = Prompt(21, 31);
  const Streamed first = Generate(Request(prompt, kMaxTokens, prefill_->address()));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_TRUE(first.prefilled_remotely);

  v1::ConnectRequest request;
  request.set_decode_worker("test");
  const ModelConfig& config = d_model_->engine->config();
  v1::KvCompatibility* compat = request.mutable_compatibility();
  server::CompatibilityToProto(config, compat);
  EXPECT_EQ(compat->model_fingerprint().size(), 16u);  // loaded from a directory: known
  // An endpoint of a backend P does not run, then one P can't connect to, then a usable one
  // made from scratch: a fresh D-side agent of the same kind over D's KV cache layout.
  v1::KvEndpoint* pigeon = request.add_endpoints();
  pigeon->set_backend("carrier-pigeon");
  auto agent = Backend(GetParam(), "extra");
  std::vector<char> memory(d_model_->engine->kv_layout().bytes);
  auto region = agent->RegisterMemory(memory.data(), memory.size(), kvtransfer::MemoryKind::kHost);
  ASSERT_TRUE(region.ok());
  v1::KvEndpoint good;
  good.set_backend(GetParam());
  good.set_agent_name(agent->agent_name());
  good.set_agent_address(*agent->LocalAddress());
  good.set_region(*agent->ExportRegion(region->id));
  const KvCacheLayout& l = d_model_->engine->kv_layout();
  v1::KvLayout* layout = good.mutable_layout();
  layout->set_num_layers(l.num_layers);
  layout->set_num_blocks(l.num_blocks);
  layout->set_block_size(l.block_size);
  layout->set_num_kv_heads(l.num_kv_heads);
  layout->set_head_dim(l.head_dim);
  layout->set_elem_bytes(l.elem_bytes);
  layout->set_block_bytes(l.block_bytes);
  layout->set_block_stride(l.block_stride);
  layout->set_kv_stride(l.kv_stride);
  layout->set_layer_stride(l.layer_stride);
  v1::KvEndpoint* unreachable = request.add_endpoints();
  *unreachable = good;
  unreachable->set_agent_name("nobody");
  unreachable->set_agent_address(GetParam() == "loopback" ? "nobody" : std::string(32, '\x01'));
  *request.add_endpoints() = good;
  {
    // The pair's grant key is required, of the right size.
    grpc::ClientContext context;
    v1::ConnectResponse response;
    const grpc::Status s = stub->Connect(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("grant_key"), std::string::npos) << s.error_message();
  }
  const std::string grant_key(auth::kGrantKeyBytes, '\x5a');
  request.set_grant_key(grant_key);
  // A backend this worker does not run is counted as "other" (peers do not mint label values).
  const double fallbacks_before =
      prefill_->metrics()
          .metrics()
          .kv_transfer_fallbacks.Add({{"backend", "other"}, {"reason", "UNIMPLEMENTED"}})
          .Value();
  {
    // The extra agent needs target-side progress (UCX wireup) while P connects to it.
    std::atomic<bool> connected{false};
    std::thread progress([&] {
      while (!connected.load()) agent->Progress();
    });
    grpc::ClientContext context;
    v1::ConnectResponse response;
    const grpc::Status s = stub->Connect(&context, request, &response);
    connected.store(true);
    progress.join();
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.backend(), GetParam());
    EXPECT_EQ(response.pair_id().size(), 32u);
    ASSERT_EQ(response.fallbacks_size(), 2);
    EXPECT_NE(response.fallbacks(0).find("carrier-pigeon"), std::string::npos);
    EXPECT_NE(response.fallbacks(1).find(GetParam()), std::string::npos);
    EXPECT_EQ(prefill_->metrics()
                  .metrics()
                  .kv_transfer_fallbacks.Add({{"backend", "other"}, {"reason", "UNIMPLEMENTED"}})
                  .Value(),
              fallbacks_before + 1);

    // A forged pair id, and a pair id with target fields besides the blocks.
    v1::PrefillRequest prefill;
    prefill.set_request_id("forged-pair");
    for (int32_t t : Prompt(8, 2)) prefill.add_prompt_token_ids(t);
    prefill.mutable_sampling()->set_logprobs(-1);
    prefill.mutable_target()->add_block_ids(0);
    prefill.set_pair_id("00000000000000000000000000000000");
    grpc::ClientContext c1;
    v1::PrefillResponse r1;
    EXPECT_EQ(stub->Prefill(&c1, prefill, &r1).error_code(), grpc::StatusCode::NOT_FOUND);
    prefill.set_pair_id(response.pair_id());
    prefill.set_transfer_epoch(7);
    prefill.mutable_target()->set_region("0x1000:1099511627776");
    grpc::ClientContext c2;
    EXPECT_EQ(stub->Prefill(&c2, prefill, &r1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    // Replays: an epoch is accepted once per pair, and never far below the highest one.
    prefill.mutable_target()->clear_region();
    prefill.set_transfer_epoch(0);
    grpc::ClientContext c3;
    EXPECT_EQ(stub->Prefill(&c3, prefill, &r1).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << "no epoch";
    // Block ids the decode worker did not grant (no grant, or one for other blocks): refused
    // before the epoch is used, so a forger cannot burn the decode worker's epochs either.
    const auto grant = [&](uint64_t epoch) {
      return *auth::KvGrant(grant_key, response.pair_id(), epoch, prefill.request_id(),
                            prefill.target().num_cached_tokens(),
                            absl::MakeConstSpan(prefill.target().block_ids().data(),
                                                prefill.target().block_ids_size()));
    };
    prefill.set_transfer_epoch(7);
    grpc::ClientContext c4;
    EXPECT_EQ(stub->Prefill(&c4, prefill, &r1).error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << "no grant";
    prefill.set_grant(grant(7));
    prefill.mutable_target()->add_block_ids(1);  // the grant covers block 0 only
    grpc::ClientContext c5;
    EXPECT_EQ(stub->Prefill(&c5, prefill, &r1).error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << "a block the grant does not cover";
    prefill.mutable_target()->mutable_block_ids()->RemoveLast();
    const auto call = [&](uint64_t epoch) {
      prefill.set_transfer_epoch(epoch);
      prefill.set_grant(grant(epoch));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
      return stub->Prefill(&ctx, prefill, &r1).error_code();
    };
    (void)call(7);  // accepted (its outcome does not matter here)
    EXPECT_EQ(call(7), grpc::StatusCode::ALREADY_EXISTS) << "a replayed epoch";
    (void)call(7 + 10000);
    EXPECT_EQ(call(8), grpc::StatusCode::FAILED_PRECONDITION) << "far below the highest epoch";
  }
  // Another model: refused outright.
  compat->set_num_layers(config.num_layers + 1);
  grpc::ClientContext context;
  v1::ConnectResponse response;
  const grpc::Status refused = stub->Connect(&context, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("num_layers"), std::string::npos)
      << refused.error_message();
  // Same shapes, other weights (another checkpoint): refused, naming the fingerprint.
  compat->set_num_layers(config.num_layers);
  compat->set_model_fingerprint("0123456789abcdef");
  grpc::ClientContext c3;
  const grpc::Status other_weights = stub->Connect(&c3, request, &response);
  EXPECT_EQ(other_weights.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(other_weights.error_message().find("fingerprint"), std::string::npos)
      << other_weights.error_message();
  // RoPE scaling that differs: refused.
  server::CompatibilityToProto(config, compat);
  compat->set_rope_scaling_factor(compat->rope_scaling_factor() + 1.0f);
  grpc::ClientContext c4;
  EXPECT_NE(stub->Connect(&c4, request, &response).error_message().find("rope_scaling"),
            std::string::npos);
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
}

// A decode worker with another block size: P converts its KV into D's layout (kv_convert.h). The
// tokens equal the plain local engine's, the bytes written are D's blocks (at D's block size), and
// a prefix cached on D at D's block granularity is skipped.
TEST_P(DisaggTest, DecodeBlockSizeDiffersKvIsConvertedAndTokensMatch) {
  for (const int d_block_size : {8, 32}) {
    SCOPED_TRACE(absl::StrCat("decode block size ", d_block_size));
    StartStack(GetParam(), {}, d_block_size);
    const int64_t per_token = KvBytes(kBlockSize) / kBlockSize;
    for (const int length : {5, 21, 40, 77}) {
      const std::vector<int32_t> prompt = Prompt(length, 500 + length);
      const double before = PrefillBytes();
      const Streamed out = Generate(Request(prompt, kMaxTokens, prefill_->address()));
      ASSERT_TRUE(out.status.ok()) << out.status.error_message();
      EXPECT_TRUE(out.prefilled_remotely) << length;
      EXPECT_EQ(out.tokens, Reference(prompt, kMaxTokens)) << length;
      // Converted KV is written token by token: the prompt's tokens, no block padding.
      EXPECT_EQ(PrefillBytes() - before, static_cast<double>(length * per_token)) << length;
    }
    // The same 40-token prefix again with another tail: D holds its full blocks of the prefix.
    std::vector<int32_t> prompt = Prompt(40, 540);
    prompt.resize(35);
    for (int32_t t : Prompt(9, 7)) prompt.push_back(t);
    const double before = PrefillBytes();
    const Streamed again = Generate(Request(prompt, kMaxTokens, prefill_->address()));
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    EXPECT_EQ(again.tokens, Reference(prompt, kMaxTokens));
    const int cached = 35 / d_block_size * d_block_size;
    EXPECT_EQ(PrefillBytes() - before, static_cast<double>((44 - cached) * per_token));
    EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
    TearDown();
  }
}

// A prefill worker that restarts forgets its pairs: the decode worker's next request falls back
// to a local prefill (same tokens) and the one after that pairs again.
TEST_P(DisaggTest, DecodeWorkerPairsAgainAfterThePrefillWorkerRestarts) {
  StartStack(GetParam());
  const Streamed first = Generate(Request(Prompt(19, 3), kMaxTokens, prefill_->address()));
  ASSERT_TRUE(first.status.ok());
  EXPECT_TRUE(first.prefilled_remotely);
  // A new prefill worker on the same port: same address, no pairs.
  const int port = prefill_->port();
  prefill_->Shutdown(absl::ZeroDuration());
  prefill_.reset();
  prefill::PrefillWorkerOptions options;
  options.port = port;
  auto p = prefill::PrefillWorker::Create(p_model_->engine.get(), Backend(GetParam(), "p2"),
                                          WithIdentity(options));
  ASSERT_TRUE(p.ok()) << p.status();
  prefill_ = std::move(*p);
  const std::vector<int32_t> prompt = Prompt(23, 4);
  const Streamed forgotten = Generate(Request(prompt, kMaxTokens, prefill_->address()));
  ASSERT_TRUE(forgotten.status.ok()) << forgotten.status.error_message();
  EXPECT_FALSE(forgotten.prefilled_remotely);
  EXPECT_EQ(forgotten.tokens, Reference(prompt, kMaxTokens));
  const Streamed again = Generate(Request(Prompt(17, 5), kMaxTokens, prefill_->address()));
  ASSERT_TRUE(again.status.ok());
  EXPECT_TRUE(again.prefilled_remotely);
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
}

// grpc.health.v1.Health/Check for `service` on `address`, by hand-encoded messages
// (HealthCheckRequest{service = 1}, HealthCheckResponse{status = 1}): -1 when the call fails,
// else the status (1 SERVING).
int HealthStatus(const std::string& address, const std::string& service) {
  grpc::GenericStub stub(TestIdentity()->Dial(address));
  std::string bytes;
  if (!service.empty()) {
    bytes.push_back(0x0a);
    bytes.push_back(static_cast<char>(service.size()));  // names here are < 128 bytes
    bytes += service;
  }
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string body;
  for (const grpc::Slice& s : slices)
    body.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (body.empty()) return 0;  // proto3 default: UNKNOWN
  return body.size() == 2 && body[0] == 0x08 ? body[1] : -1;
}

TEST_P(DisaggTest, HealthIsServingPerService) {
  StartStack(GetParam());
  EXPECT_EQ(HealthStatus(decode_->address(), ""), 1);
  EXPECT_EQ(HealthStatus(decode_->address(), "tandem.v1.Decode"), 1);
  EXPECT_EQ(HealthStatus(decode_->address(), "tandem.v1.Worker"), 1);
  EXPECT_EQ(HealthStatus(prefill_->address(), "tandem.v1.Prefill"), 1);
  EXPECT_EQ(HealthStatus(prefill_->address(), "tandem.v1.Decode"), -1);  // NOT_FOUND
}

TEST_P(DisaggTest, StreamStatsReportsTheEngine) {
  StartStack(GetParam());
  auto stub = v1::Worker::NewStub(channel_);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::StatsRequest request;
  request.set_interval_ms(20);
  auto reader = stub->StreamStats(&context, request);
  v1::WorkerStats stats;
  ASSERT_TRUE(reader->Read(&stats));
  EXPECT_EQ(stats.role(), "decode");
  EXPECT_EQ(stats.kv_blocks_total(), kNumBlocks);
  EXPECT_EQ(stats.kv_blocks_used(), 0);
  EXPECT_EQ(stats.block_size(), kBlockSize);
  ASSERT_TRUE(reader->Read(&stats));  // it keeps streaming
  context.TryCancel();
  while (reader->Read(&stats)) {
  }
  reader->Finish();
}

// Fencing: D gives up on a Prefill call whose writes P still has in flight (stuck mid-transfer).
// D quarantines the request's blocks and asks P (Prefill.Fence); P abandons the transfer on its
// transfer thread and releases it; only then does D recompute into the blocks. The tokens equal
// the local engine's, the quarantine ends confirmed well inside the lease, and nothing stays held
// or quarantined on either side.
TEST_P(DisaggTest, GivenUpTransferIsFencedBeforeItsBlocksAreReused) {
  decode::DecodeWorkerOptions d_options;
  d_options.service.prefill_timeout = absl::Milliseconds(400);
  d_options.service.fence_lease = absl::Seconds(20);
  StartStack(GetParam(), d_options);
  FaultPlan plan;
  plan.stage = FaultStage::kMidTransfer;
  plan.once = true;
  plan.polls_before_failure = 1 << 30;  // in progress until someone releases it
  p_faults_->SetPlan(plan);
  const std::vector<int32_t> prompt = Prompt(45, 77);
  const absl::Time start = absl::Now();
  const Streamed got = Generate(Request(prompt, kMaxTokens, prefill_->address()));
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_FALSE(got.prefilled_remotely);
  EXPECT_EQ(got.tokens, Reference(prompt, kMaxTokens));
  EXPECT_EQ(p_faults_->faults_injected(), 1);
  auto& dm = decode_->metrics().metrics();
  EXPECT_EQ(dm.kv_fences.Add({{"result", "confirmed"}}).Value(), 1);
  EXPECT_EQ(dm.kv_fences.Add({{"result", "lease"}}).Value(), 0);
  EXPECT_EQ(dm.kv_quarantined_blocks.Value(), 0);
  EXPECT_LT(took, absl::Seconds(10)) << "the fence, not the lease, ended the quarantine";
  EXPECT_TRUE(testing_util::WaitIdle(*p_model_->engine));
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
  // The blocks are clean for the next request, which goes through P again.
  const std::vector<int32_t> next = Prompt(33, 78);
  const Streamed again = Generate(Request(next, kMaxTokens, prefill_->address()));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_TRUE(again.prefilled_remotely);
  EXPECT_EQ(again.tokens, Reference(next, kMaxTokens));
}

// A late write: P's backend cannot recall a write it already issued (UCX keeps such puts until
// they finish), and this one lands long after D gave up and P released it. P's fence waits for
// it (TransferBackend::Lingering), so D's blocks stay quarantined until the bytes have landed and
// only then are recomputed: the quarantine outlives the late write, and ends confirmed.
TEST_P(DisaggTest, LateWriteAfterTheDecodeWorkerGaveUpIsWaitedOutByTheFence) {
  decode::DecodeWorkerOptions d_options;
  d_options.service.prefill_timeout = absl::Milliseconds(400);
  d_options.service.fence_lease = absl::Seconds(20);
  StartStack(GetParam(), d_options);
  FaultPlan plan;
  plan.stage = FaultStage::kLateWrite;
  plan.once = true;
  plan.late_write_delay = absl::Milliseconds(1500);
  plan.late_write_survives_release = true;
  p_faults_->SetPlan(plan);
  const std::vector<int32_t> prompt = Prompt(45, 81);
  const absl::Time start = absl::Now();
  const Streamed got = Generate(Request(prompt, kMaxTokens, prefill_->address()));
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_FALSE(got.prefilled_remotely);
  EXPECT_EQ(got.tokens, Reference(prompt, kMaxTokens));
  EXPECT_EQ(p_faults_->faults_injected(), 1);
  EXPECT_EQ(p_faults_->late_writes_pending(), 0) << "recomputed while a write was still due";
  EXPECT_GE(took, absl::Milliseconds(1500)) << "the blocks were reused before the late write";
  auto& dm = decode_->metrics().metrics();
  EXPECT_EQ(dm.kv_fences.Add({{"result", "confirmed"}}).Value(), 1);
  EXPECT_EQ(dm.kv_fences.Add({{"result", "lease"}}).Value(), 0);
  EXPECT_EQ(dm.kv_quarantined_blocks.Value(), 0);
  EXPECT_TRUE(testing_util::WaitIdle(*p_model_->engine));
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
  const std::vector<int32_t> next = Prompt(33, 82);
  const Streamed again = Generate(Request(next, kMaxTokens, prefill_->address()));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_TRUE(again.prefilled_remotely);
  EXPECT_EQ(again.tokens, Reference(next, kMaxTokens));
}

// Corrupted bytes: P's backend reports a write done whose bytes landed wrong. With verify_kv the
// decode worker compares the KV in its blocks with P's checksum of what it sent, sees the
// mismatch, and recomputes: the client gets the local engine's tokens, and the failure is counted
// with stage "checksum". Clean transfers verify equal (no false alarm) and stay remote.
TEST_P(DisaggTest, CorruptedKvIsCaughtByTheChecksumAndRecomputed) {
  decode::DecodeWorkerOptions d_options;
  d_options.service.verify_kv = true;
  StartStack(GetParam(), d_options);
  const std::vector<int32_t> clean = Prompt(40, 83);
  const Streamed ok = Generate(Request(clean, kMaxTokens, prefill_->address()));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_TRUE(ok.prefilled_remotely) << "a clean transfer failed verification";
  EXPECT_EQ(ok.tokens, Reference(clean, kMaxTokens));

  FaultPlan plan;
  plan.stage = FaultStage::kCorruptBytes;
  plan.once = true;
  p_faults_->SetPlan(plan);
  const std::vector<int32_t> prompt = Prompt(52, 84);
  const Streamed got = Generate(Request(prompt, kMaxTokens, prefill_->address()));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(p_faults_->faults_injected(), 1);
  EXPECT_FALSE(got.prefilled_remotely) << "corrupted KV was used";
  EXPECT_EQ(got.tokens, Reference(prompt, kMaxTokens));
  EXPECT_NE(
      decode_->metrics().Scrape().find(absl::StrCat("tandem_kv_transfer_failures_total{backend=\"",
                                                    GetParam(), "\",stage=\"checksum\"} 1")),
      std::string::npos)
      << decode_->metrics().Scrape();
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
}

// The prefill worker goes away mid-request, so nobody can confirm its transfer stopped: D keeps
// the blocks quarantined for the whole lease, then recomputes. Same tokens; counted as "lease".
TEST_P(DisaggTest, UnconfirmedTransferWaitsOutTheLease) {
  decode::DecodeWorkerOptions d_options;
  d_options.service.fence_lease = absl::Milliseconds(1500);
  d_options.service.fence_timeout = absl::Milliseconds(500);
  StartStack(GetParam(), d_options);
  FaultPlan plan;
  plan.stage = FaultStage::kMidTransfer;
  plan.once = true;
  plan.polls_before_failure = 1 << 30;
  p_faults_->SetPlan(plan);
  const std::vector<int32_t> prompt = Prompt(38, 79);
  std::thread kill([this] {
    absl::SleepFor(absl::Milliseconds(300));
    prefill_->Shutdown(absl::ZeroDuration());
  });
  const absl::Time start = absl::Now();
  const Streamed got = Generate(Request(prompt, kMaxTokens, prefill_->address()));
  const absl::Duration took = absl::Now() - start;
  kill.join();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_FALSE(got.prefilled_remotely);
  EXPECT_EQ(got.tokens, Reference(prompt, kMaxTokens));
  auto& dm = decode_->metrics().metrics();
  EXPECT_EQ(dm.kv_fences.Add({{"result", "lease"}}).Value(), 1);
  EXPECT_EQ(dm.kv_quarantined_blocks.Value(), 0);
  EXPECT_GE(took, absl::Milliseconds(1500)) << "reused before the lease expired";
  EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
}

// Every failure point of P's transfer (STYLE.md 10): the client still gets exactly the local
// engine's tokens (D recomputes), and the next request goes through P again.
// Every failure point of the transfer (and a write that lands late) ends in the local engine's
// tokens. A bystander request decoding on D meanwhile, whose KV came through P before the fault
// was armed, keeps its tokens: no write of the faulty transfer lands in its blocks.
TEST_P(DisaggTest, EveryTransferFailurePointFallsBackToIdenticalTokens) {
  const struct {
    FaultStage stage;
    const char* name;
    bool fails;
    bool bystander;  // connect fails before the first transfer: there is none to run beside it
  } cases[] = {{FaultStage::kConnect, "connect", true, false},
               {FaultStage::kPost, "post", true, true},
               {FaultStage::kMidTransfer, "mid-transfer", true, true},
               {FaultStage::kRelease, "release", false, true},
               {FaultStage::kLateWrite, "late-write", false, true}};
  constexpr int kBystanderTokens = 256;
  int seed = 40;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    StartStack(GetParam());
    const std::vector<int32_t> bystander = Prompt(41, seed++);
    const std::vector<int32_t> bystander_want = Reference(bystander, kBystanderTokens);
    // Computed before the bystander starts, so it runs while the faulty request does.
    const std::vector<int32_t> prompt = Prompt(29, seed++);
    const std::vector<int32_t> want = Reference(prompt, kMaxTokens);
    Streamed bystander_got;
    absl::Time bystander_done;
    std::thread bystander_client([&] {
      if (!c.bystander) return;
      bystander_got = Generate(Request(bystander, kBystanderTokens, prefill_->address()));
      bystander_done = absl::Now();
    });
    // Arm the fault once the bystander's KV has landed (its transfer is counted).
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (c.bystander && prefill_->metrics().metrics().kv_transfer.transfers() < 1 &&
           absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    FaultPlan plan;
    plan.stage = c.stage;
    plan.once = true;
    plan.polls_before_failure = 2;
    p_faults_->SetPlan(plan);
    const absl::Time faulty_start = absl::Now();
    const Streamed got = Generate(Request(prompt, kMaxTokens, prefill_->address()));
    bystander_client.join();
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, want);
    EXPECT_EQ(p_faults_->faults_injected(), 1);
    EXPECT_EQ(got.prefilled_remotely, !c.fails);
    EXPECT_EQ(prefill_->metrics().metrics().kv_transfer.failures(), c.fails ? 1 : 0);
    if (c.bystander) {
      ASSERT_TRUE(bystander_got.status.ok()) << bystander_got.status.error_message();
      EXPECT_TRUE(bystander_got.prefilled_remotely);
      EXPECT_EQ(bystander_got.tokens, bystander_want) << "the bystander's KV was written into";
      EXPECT_GT(bystander_done, faulty_start) << "the bystander was done before the fault";
    }
    // The fault fired once; the next request is prefilled remotely again.
    const std::vector<int32_t> next = Prompt(18, seed++);
    const Streamed again = Generate(Request(next, kMaxTokens, prefill_->address()));
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    EXPECT_TRUE(again.prefilled_remotely);
    EXPECT_EQ(again.tokens, Reference(next, kMaxTokens));
    EXPECT_TRUE(DecodeDrained(absl::Seconds(10)));
    const EngineStats p = p_model_->engine->stats();
    EXPECT_EQ(p.held_kv, 0);
    TearDown();
  }
}

// ucx only where this build has UCX (TANDEM_UCX).
std::vector<std::string> DisaggBackends() {
  std::vector<std::string> params = {"loopback"};
  if (kvtransfer::TransferBackendBuilt("ucx")) params.push_back("ucx");
  return params;
}

INSTANTIATE_TEST_SUITE_P(Backends, DisaggTest, ::testing::ValuesIn(DisaggBackends()),
                         [](const auto& info) { return info.param; });

TEST(DisaggSetupTest, RegistrationFailureLeavesNothingRunning) {
  server::ModelLoadOptions options;
  const std::string dir = absl::StrCat(::testing::TempDir(), "/disagg_setup_tiny_", getpid());
  SynthOptions synth;
  synth.like = "tiny";
  synth.out_dir = dir;
  synth.num_threads = 2;
  ASSERT_TRUE(SynthesizeModel(synth, nullptr).ok());
  options.model_dir = dir;
  options.num_blocks = 8;
  auto model = server::LoadModel(options);
  ASSERT_TRUE(model.ok()) << model.status();
  kvtransfer::BackendOptions backend_options;
  backend_options.agent_name = UniqueId("setup");
  auto backend = kvtransfer::CreateTransferBackend("loopback", backend_options);
  ASSERT_TRUE(backend.ok());
  FaultPlan plan;
  plan.stage = FaultStage::kRegister;
  auto worker = decode::DecodeWorker::Create(
      model->engine.get(), std::make_unique<FaultInjectingBackend>(std::move(*backend), plan),
      WithIdentity(decode::DecodeWorkerOptions{}));
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(worker.status().message().find("injected fault"), std::string::npos);
  model->engine->Shutdown(absl::ZeroDuration());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace tandem

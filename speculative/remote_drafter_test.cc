// The drafter service and its client, in one process over loopback gRPC: drafts through the
// service equal the local drafter's, with only new tokens sent after the first call; a restarted
// service resyncs; calls without the deployment's credential, or with bad fields, are refused
// and change nothing; a dead or frozen service costs at most one deadline per backoff; and in the
// engine, outputs equal plain decoding even when the service dies mid-run.
#include "speculative/remote_drafter.h"

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/fake_model_runner.h"
#include "runtime/engine/generate_test_util.h"
#include "runtime/server/grpc_server.h"
#include "speculative/drafter_service.h"
#include "speculative/ngram_drafter.h"

namespace tandem::speculative {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const auth::ServiceIdentity> Identity(const std::string& token) {
  auto identity = auth::ServiceIdentity::FromTokens({token});
  CHECK(identity.ok()) << identity.status();
  return *identity;
}
const std::string kToken = "drafter-test-token-0123456789abcdef";

std::unique_ptr<Drafter> Ngram() {
  auto d = NgramDrafter::Create(NgramDrafterOptions{});
  CHECK(d.ok());
  return *std::move(d);
}

// A drafter service on a loopback port (0: a free one).
struct Service {
  explicit Service(std::unique_ptr<Drafter> drafter, int port = 0,
                   DrafterServiceOptions options = {}) {
    service = std::make_unique<DrafterService>(std::move(drafter), Identity(kToken), options);
    auto started = server::StartGrpcServer("127.0.0.1", port, {service.get()},
                                           {"tandem.v1.Drafter"}, Identity(kToken));
    CHECK(started.ok()) << started.status();
    grpc = *std::move(started);
  }
  ~Service() { Stop(); }
  void Stop() {
    if (service != nullptr) service->Shutdown();
    grpc.Shutdown(absl::ZeroDuration());
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", grpc.port); }
  std::unique_ptr<DrafterService> service;
  server::GrpcServer grpc;
};

// Repetitive random sequences, so that the n-gram drafter proposes something.
std::vector<std::vector<int32_t>> Sequences(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> out(n);
  for (auto& s : out) {
    for (int t = 0; t < 30; ++t) s.push_back(static_cast<int32_t>(rng() % 5));
  }
  return out;
}

std::vector<DraftRequest> Requests(const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<DraftRequest> r;
  for (size_t i = 0; i < seqs.size(); ++i) r.push_back({static_cast<int64_t>(i), seqs[i], 10, 4});
  return r;
}

TEST(RemoteDrafterTest, DraftsEqualTheLocalDrafterAndOnlyNewTokensTravel) {
  Service service(Ngram());
  auto remote = RemoteDrafter::Create({service.address()}, Identity(kToken));
  ASSERT_TRUE(remote.ok());
  std::unique_ptr<Drafter> local = Ngram();
  std::vector<std::vector<int32_t>> seqs = Sequences(5, 1);
  int64_t total = 0;
  for (int round = 0; round < 8; ++round) {
    const std::vector<DraftRequest> requests = Requests(seqs);
    for (const auto& s : seqs) total += static_cast<int64_t>(s.size());
    auto got = (*remote)->Propose(requests, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    auto want = local->Propose(requests, absl::InfiniteFuture());
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(*got, *want) << "round " << round;
    for (size_t i = 0; i < seqs.size(); ++i) {
      // Accept half the drafts, then a token of the verifier's own.
      const auto& d = (*got)[i];
      seqs[i].insert(seqs[i].end(), d.begin(), d.begin() + static_cast<long>(d.size() / 2));
      seqs[i].push_back(static_cast<int32_t>(round % 5));
    }
  }
  // The first call sends everything, later ones what changed.
  EXPECT_LT((*remote)->stats().tokens_sent, total / 3);
  EXPECT_EQ(service.service->stats().resyncs, 0);
  EXPECT_EQ(service.service->live_sequences(), 5);
  // Finished sequences are forgotten on the next call.
  (*remote)->Release(0, seqs[0], 10);
  (*remote)->Release(1, seqs[1], 10);
  std::vector<std::vector<int32_t>> rest(seqs.begin() + 2, seqs.end());
  std::vector<DraftRequest> requests = Requests(rest);
  for (size_t i = 0; i < requests.size(); ++i) requests[i].key = static_cast<int64_t>(i + 2);
  ASSERT_TRUE((*remote)->Propose(requests, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(service.service->live_sequences(), 3);
}

TEST(RemoteDrafterTest, ARestartedServiceResyncs) {
  auto first = std::make_unique<Service>(Ngram());
  const int port = first->grpc.port;
  auto remote = RemoteDrafter::Create({first->address()}, Identity(kToken));
  ASSERT_TRUE(remote.ok());
  const std::vector<std::vector<int32_t>> seqs = Sequences(3, 2);
  ASSERT_TRUE((*remote)->Propose(Requests(seqs), absl::Now() + absl::Seconds(5)).ok());
  first.reset();
  Service second(Ngram(), port);
  // The client either sees the restart as a failure (and backs off) or gets resync answers;
  // within a few backoffs it drafts again, from the start.
  std::unique_ptr<Drafter> local = Ngram();
  const auto want = local->Propose(Requests(seqs), absl::InfiniteFuture());
  bool drafted = false;
  for (int i = 0; i < 100 && !drafted; ++i) {
    auto got = (*remote)->Propose(Requests(seqs), absl::Now() + absl::Seconds(1));
    if (got.ok() && *got == *want) drafted = true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(drafted);
  EXPECT_GT(second.service->stats().resyncs + (*remote)->stats().failed_calls, 0);
}

TEST(RemoteDrafterTest, CallsWithoutTheCredentialOrWithBadFieldsChangeNothing) {
  Service service(Ngram(), 0, DrafterServiceOptions{.vocab_size = 100});
  auto intruder = RemoteDrafter::Create({service.address()}, Identity("not-this-deployment-12345"));
  ASSERT_TRUE(intruder.ok());
  auto refused = (*intruder)->Propose(Requests(Sequences(2, 3)), absl::Now() + absl::Seconds(5));
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("UNAUTHENTICATED"));
  EXPECT_EQ(service.service->live_sequences(), 0);

  auto stub = tandem::v1::Drafter::NewStub(Identity(kToken)->Dial(service.address()));
  auto call = [&](const tandem::v1::ProposeRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    tandem::v1::ProposeResponse response;
    return stub->Propose(&context, request, &response);
  };
  auto good = [] {
    tandem::v1::ProposeRequest r;
    r.set_client("worker-a");
    tandem::v1::DraftSequence* s = r.add_sequences();
    s->set_sequence(1);
    for (int t : {1, 2, 3, 1, 2}) s->add_tokens(t);
    s->set_num_prompt_tokens(2);
    s->set_max_tokens(3);
    return r;
  };
  struct Bad {
    std::string field;
    std::function<void(tandem::v1::ProposeRequest&)> mutate;
  };
  const std::vector<Bad> bad = {
      {"client", [](auto& r) { r.set_client(""); }},
      {"client", [](auto& r) { r.set_client(std::string(65, 'x')); }},
      {"client", [](auto& r) { r.set_client("has space"); }},
      {"max_tokens", [](auto& r) { r.mutable_sequences(0)->set_max_tokens(0); }},
      {"max_tokens", [](auto& r) { r.mutable_sequences(0)->set_max_tokens(65); }},
      {"tokens", [](auto& r) { r.mutable_sequences(0)->set_tokens(1, -4); }},
      {"tokens", [](auto& r) { r.mutable_sequences(0)->set_tokens(1, 100); }},
      {"tokens", [](auto& r) { r.mutable_sequences(0)->clear_tokens(); }},
      {"num_prompt_tokens", [](auto& r) { r.mutable_sequences(0)->set_num_prompt_tokens(9); }},
      {"longer than", [](auto& r) { r.mutable_sequences(0)->set_start(2000000000); }},
  };
  for (const Bad& b : bad) {
    tandem::v1::ProposeRequest r = good();
    b.mutate(r);
    const grpc::Status status = call(r);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.field;
    EXPECT_THAT(status.error_message(), HasSubstr(b.field));
  }
  EXPECT_EQ(service.service->live_sequences(), 0);
  // A sequence the server does not hold, sent from the middle: resync, no drafts.
  tandem::v1::ProposeRequest middle = good();
  middle.mutable_sequences(0)->set_start(3);
  grpc::ClientContext context;
  tandem::v1::ProposeResponse response;
  ASSERT_TRUE(stub->Propose(&context, middle, &response).ok());
  ASSERT_EQ(response.drafts_size(), 1);
  EXPECT_TRUE(response.drafts(0).resync());
  EXPECT_TRUE(call(good()).ok());
  EXPECT_EQ(service.service->live_sequences(), 1);
}

// Blocks every Propose for `delay` (a frozen or overloaded drafter).
class SlowDrafter : public Drafter {
 public:
  explicit SlowDrafter(absl::Duration delay) : delay_(delay) {}
  std::string_view name() const override { return "slow"; }
  absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(std::span<const DraftRequest> r,
                                                            absl::Time) override {
    absl::SleepFor(delay_);
    return std::vector<std::vector<int32_t>>(r.size());
  }
  void Release(int64_t, std::span<const int32_t>, int) override {}

 private:
  absl::Duration delay_;
};

TEST(RemoteDrafterTest, DeadOrFrozenServicesCostOneDeadlinePerBackoff) {
  for (const bool frozen : {false, true}) {
    auto service = std::make_unique<Service>(
        frozen ? std::unique_ptr<Drafter>(new SlowDrafter(absl::Milliseconds(400))) : Ngram());
    RemoteDrafterOptions options;
    options.backoff_initial = absl::Milliseconds(300);
    auto remote = RemoteDrafter::Create({service->address()}, Identity(kToken), options);
    ASSERT_TRUE(remote.ok());
    if (!frozen) service->Stop();
    const auto requests = Requests(Sequences(2, 4));
    absl::Time start = absl::Now();
    EXPECT_FALSE((*remote)->Propose(requests, start + absl::Milliseconds(30)).ok());
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(250)) << (frozen ? "frozen" : "dead");
    // Within the backoff: no call at all.
    start = absl::Now();
    auto skipped = (*remote)->Propose(requests, start + absl::Milliseconds(30));
    EXPECT_FALSE(skipped.ok());
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(5));
    EXPECT_EQ((*remote)->stats().skipped_calls, 1);
  }
}

TEST(RemoteDrafterTest, EngineOutputsEqualPlainDecodingWhenTheServiceDiesMidRun) {
  constexpr int kVocab = 12;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back({2, 3, 4, 2, 3, 4, static_cast<int32_t>(5 + i)});
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 40;
  params.ignore_eos = true;
  auto run = [&](std::shared_ptr<Drafter> drafter, std::function<void()> hook, EngineStats* stats) {
    auto runner = std::make_unique<FakeModelRunner>(kVocab, 256, 4, 512);
    if (hook) runner->set_forward_hook(hook);
    EngineOptions options;
    options.drafter = std::move(drafter);
    options.num_speculative_tokens = options.drafter ? 4 : 0;
    options.drafter_deadline = absl::Seconds(1);
    auto engine = Engine::Create(std::move(runner), nullptr, options);
    CHECK(engine.ok()) << engine.status();
    return GenerateAll(*std::move(engine), prompts, params, stats);
  };
  const auto plain = run(nullptr, nullptr, nullptr);
  Service service(Ngram());
  auto remote = RemoteDrafter::Create({service.address()}, Identity(kToken));
  ASSERT_TRUE(remote.ok());
  std::atomic<int> forwards{0};
  EngineStats stats;
  const auto got = run(
      std::shared_ptr<Drafter>(*std::move(remote)),
      [&] {
        if (++forwards == 12) service.Stop();  // mid-run, on the engine thread
      },
      &stats);
  EXPECT_EQ(got, plain);
  EXPECT_GT(stats.spec_draft_tokens, 0);
  EXPECT_GT(stats.spec_fallbacks, 0);
}

}  // namespace
}  // namespace tandem::speculative

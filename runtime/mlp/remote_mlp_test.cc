// The remote MLP backend against real `tandem mlp-shard` services in this process, and against
// shards that fail: killed, frozen, answering the wrong size, serving another model or not every
// layer. Every fault ends in a failover, the fallback or a clean error, within the call's
// deadline; nothing hangs.
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/mlp/cpu_mlp_backend.h"
#include "runtime/mlp/dense_mlp.h"
#include "runtime/mlp/ipc_doorbell.h"
#include "runtime/mlp/mlp_shard_checks.h"
#include "runtime/mlp/mlp_shard_service.h"
#include "runtime/mlp/remote_mlp_backend.h"
#include "runtime/mlp/shard_server_for_test.h"
#include "runtime/mlp/tiny_model_for_test.h"
#include "runtime/server/grpc_server.h"

namespace tandem::mlp {
namespace {

using ::testing::HasSubstr;

// A shard service that never answers Compute (a frozen process) until destroyed, or answers
// with `bytes` bytes of zeros.
class BadShard final : public tandem::v1::MlpShard::CallbackService {
 public:
  BadShard(MlpShape shape, int answer_bytes) : shape_(shape), answer_bytes_(answer_bytes) {}
  ~BadShard() override { Release(); }
  void Release() {
    absl::MutexLock lock(&mu_);
    for (grpc::ServerUnaryReactor* r : held_) r->Finish(grpc::Status::CANCELLED);
    held_.clear();
  }
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const tandem::v1::MlpInfoRequest*,
                                 tandem::v1::MlpInfo* info) override {
    info->set_model_fingerprint("fp");
    info->set_first_layer(static_cast<uint32_t>(shape_.first_layer));
    info->set_end_layer(static_cast<uint32_t>(shape_.end_layer));
    info->set_hidden_size(static_cast<uint32_t>(shape_.hidden_size));
    info->set_intermediate_size(static_cast<uint32_t>(shape_.intermediate_size));
    info->set_max_rows(64);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Compute(grpc::CallbackServerContext* context,
                                    const tandem::v1::MlpComputeRequest*,
                                    tandem::v1::MlpComputeResponse* response) override {
    auto* reactor = context->DefaultReactor();
    if (answer_bytes_ >= 0) {
      response->set_output(std::string(static_cast<size_t>(answer_bytes_), '\0'));
      reactor->Finish(grpc::Status::OK);
    } else {
      absl::MutexLock lock(&mu_);
      held_.push_back(reactor);
    }
    return reactor;
  }

 private:
  const MlpShape shape_;
  const int answer_bytes_;  // -1: never answer
  absl::Mutex mu_;
  std::vector<grpc::ServerUnaryReactor*> held_;
};

class RemoteMlpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = new TinyModelDir("tandem-mlp-remote", 11); }
  static void TearDownTestSuite() { delete model_; }
  void SetUp() override {
    model_->Open(&config_, &store_);
    all_ = *ParseLayerRange("all", config_);
  }

  std::shared_ptr<const DenseMlpWeights> Weights(const std::string& range) {
    auto weights = LoadDenseMlpWeights(config_, *store_, *ParseLayerRange(range, config_));
    CHECK(weights.ok()) << weights.status();
    return std::make_shared<const DenseMlpWeights>(*std::move(weights));
  }

  // A real shard of `range`, serving on its own gRPC server.
  struct Shard {
    std::unique_ptr<MlpShardService> service;
    std::unique_ptr<Server> server;
    std::string address() const { return server->address(); }
    void Kill() {
      service->Shutdown();  // answers what is queued while the server is up
      server.reset();
      service.reset();
    }
  };
  Shard StartShard(const std::string& range, const std::string& fingerprint = "fp") {
    Shard s;
    MlpShardOptions options;
    options.model_fingerprint = fingerprint;
    s.service = std::make_unique<MlpShardService>(Weights(range), Identity(), options);
    s.server = std::make_unique<Server>(s.service.get(), "tandem.v1.MlpShard");
    return s;
  }

  absl::StatusOr<std::unique_ptr<RemoteMlpBackend>> Connect(
      const std::vector<std::string>& addresses, std::unique_ptr<MlpBackend> fallback = nullptr,
      absl::Duration call_timeout = absl::Milliseconds(300)) {
    RemoteMlpOptions options;
    options.connect_timeout = absl::Seconds(10);
    options.call_timeout = call_timeout;
    // Long enough that a test's next call surely finds a failed shard still backing off, on a
    // loaded machine too.
    options.backoff_initial = absl::Seconds(10);
    options.backoff_max = absl::Seconds(20);
    return RemoteMlpBackend::Create(addresses, Identity(), all_, "fp", std::move(fallback),
                                    options);
  }

  std::vector<float> Rows(int rows, uint32_t seed) {
    return RandomRows(rows, config_.hidden_size, seed);
  }

  std::vector<float> Reference(int layer, const std::vector<float>& x, int rows) {
    CpuMlpBackend cpu(Weights("all"));
    std::vector<float> y(x.size());
    CHECK(cpu.Run(layer, x.data(), rows, y.data(), absl::InfiniteFuture()).ok());
    return y;
  }

  static TinyModelDir* model_;
  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
  MlpShape all_;
};
TinyModelDir* RemoteMlpTest::model_ = nullptr;

TEST_F(RemoteMlpTest, TwoShardsOfHalfTheLayersComputeWhatTheCpuDoes) {
  Shard low = StartShard("0:2"), high = StartShard("2:4");
  auto remote = Connect({low.address(), high.address()});
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ((*remote)->resident_weight_bytes(), 0);
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    for (int rows : {1, 7}) {
      const std::vector<float> x = Rows(rows, static_cast<uint32_t>(layer * 10 + rows));
      std::vector<float> y(x.size());
      ASSERT_TRUE((*remote)->Run(layer, x.data(), rows, y.data(), absl::InfiniteFuture()).ok());
      // Alone in its batch, a call gives the local path's bits.
      const std::vector<float> want = Reference(layer, x, rows);
      EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0)
          << "layer " << layer << ", " << rows << " rows";
    }
  }
  EXPECT_EQ(low.service->stats().rows + high.service->stats().rows, config_.num_layers * (1 + 7));
}

TEST_F(RemoteMlpTest, CallsOfManyWorkersAreBatchedPerLayerAndEachGetsItsRows) {
  Shard shard = StartShard("all");
  constexpr int kWorkers = 4, kSteps = 20;
  std::vector<std::thread> workers;
  std::atomic<int> bad{0};
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      // No fault here: a deadline that a loaded machine cannot miss.
      auto remote = Connect({shard.address()}, nullptr, absl::Seconds(30));
      if (!remote.ok()) {
        ++bad;
        return;
      }
      for (int step = 0; step < kSteps; ++step) {
        const int rows = 1 + (w + step) % 5;
        const std::vector<float> x = Rows(rows, static_cast<uint32_t>(w * 1000 + step));
        std::vector<float> y(x.size());
        const int layer = step % config_.num_layers;
        if (!(*remote)->Run(layer, x.data(), rows, y.data(), absl::InfiniteFuture()).ok()) {
          ++bad;
          continue;
        }
        // Batched with other workers' rows the GEMM's shape differs: equal within float error.
        const std::vector<float> want = Reference(layer, x, rows);
        for (size_t i = 0; i < y.size(); ++i) {
          if (std::abs(y[i] - want[i]) > 1e-4f * (1 + std::abs(want[i]))) {
            ++bad;
            break;
          }
        }
      }
    });
  }
  for (std::thread& t : workers) t.join();
  EXPECT_EQ(bad.load(), 0);
  const MlpShardStats stats = shard.service->stats();
  EXPECT_EQ(stats.calls, kWorkers * kSteps);
  EXPECT_LE(stats.batches, stats.calls);
  EXPECT_EQ(stats.rejected, 0);
}

TEST_F(RemoteMlpTest, AKilledShardFailsOverToAnotherOfTheSameLayers) {
  Shard a = StartShard("all"), b = StartShard("all");
  auto remote = Connect({a.address(), b.address()});
  ASSERT_TRUE(remote.ok()) << remote.status();
  const std::vector<float> x = Rows(3, 5);
  const std::vector<float> want = Reference(1, x, 3);
  a.Kill();
  for (int i = 0; i < 6; ++i) {  // round robin reaches the dead one
    std::vector<float> y(x.size());
    const absl::Time start = absl::Now();
    ASSERT_TRUE((*remote)->Run(1, x.data(), 3, y.data(), absl::InfiniteFuture()).ok());
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0);
  }
  EXPECT_GE((*remote)->stats().failovers, 1);
  EXPECT_EQ((*remote)->stats().failures, 0);
}

TEST_F(RemoteMlpTest, WithNoShardLeftTheFallbackComputesOrTheCallFailsCleanly) {
  Shard only = StartShard("all");
  const std::vector<float> x = Rows(2, 9);
  const std::vector<float> want = Reference(2, x, 2);
  auto with_fallback = Connect({only.address()}, std::make_unique<CpuMlpBackend>(Weights("all")));
  auto without = Connect({only.address()});
  ASSERT_TRUE(with_fallback.ok() && without.ok());
  EXPECT_GT((*with_fallback)->resident_weight_bytes(), 0);
  only.Kill();
  std::vector<float> y(x.size());
  ASSERT_TRUE((*with_fallback)->Run(2, x.data(), 2, y.data(), absl::InfiniteFuture()).ok());
  EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0);
  // Backing off, the next call goes to the fallback at once.
  ASSERT_TRUE((*with_fallback)->Run(2, x.data(), 2, y.data(), absl::InfiniteFuture()).ok());
  EXPECT_GE((*with_fallback)->stats().failovers, 2);

  const absl::Time start = absl::Now();
  absl::Status s = (*without)->Run(2, x.data(), 2, y.data(), absl::InfiniteFuture());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("layer 2"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // While it backs off, a call fails at once.
  const absl::Time again = absl::Now();
  s = (*without)->Run(2, x.data(), 2, y.data(), absl::InfiniteFuture());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("backing off"));
  EXPECT_LT(absl::Now() - again, absl::Milliseconds(500));  // no call: no 300 ms timeout
}

TEST_F(RemoteMlpTest, AFrozenShardCostsOneCallTimeoutThenItsTwinServes) {
  BadShard frozen(all_, /*answer_bytes=*/-1);
  Server frozen_server(&frozen, "tandem.v1.MlpShard");
  Shard good = StartShard("all");
  auto remote = Connect({frozen_server.address(), good.address()});
  ASSERT_TRUE(remote.ok()) << remote.status();
  const std::vector<float> x = Rows(1, 2);
  const std::vector<float> want = Reference(0, x, 1);
  const absl::Time start = absl::Now();
  for (int i = 0; i < 4; ++i) {
    std::vector<float> y(x.size());
    ASSERT_TRUE((*remote)->Run(0, x.data(), 1, y.data(), absl::InfiniteFuture()).ok());
    EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0);
  }
  // At most one 300 ms call timeout (plus grace) for the four calls.
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500));
  // A deadline shorter than the call timeout is kept.
  auto only_frozen = Connect({frozen_server.address()});
  ASSERT_TRUE(only_frozen.ok());
  std::vector<float> y(x.size());
  const absl::Time t = absl::Now();
  absl::Status s =
      (*only_frozen)->Run(0, x.data(), 1, y.data(), absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - t, absl::Milliseconds(900));
  frozen.Release();
}

TEST_F(RemoteMlpTest, AnAnswerOfTheWrongSizeIsNeverCopied) {
  BadShard liar(all_, /*answer_bytes=*/12);
  Server liar_server(&liar, "tandem.v1.MlpShard");
  auto remote = Connect({liar_server.address()}, std::make_unique<CpuMlpBackend>(Weights("all")));
  ASSERT_TRUE(remote.ok());
  const std::vector<float> x = Rows(2, 4);
  std::vector<float> y(x.size(), -7.0f);
  ASSERT_TRUE((*remote)->Run(3, x.data(), 2, y.data(), absl::InfiniteFuture()).ok());
  const std::vector<float> want = Reference(3, x, 2);
  EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0);
  EXPECT_EQ((*remote)->stats().failovers, 1);
}

TEST_F(RemoteMlpTest, CreationChecksModelShapeAndCoverage) {
  Shard low = StartShard("0:2");
  auto gap = Connect({low.address()});
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gap.status().message(), HasSubstr("no shard serves layer(s) 2,3"));
  Shard other = StartShard("all", "another-model");
  auto wrong = Connect({other.address()});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.status().message(), HasSubstr("another-model"));
  BadShard narrow(MlpShape{0, 4, config_.hidden_size / 2, config_.intermediate_size}, 0);
  Server narrow_server(&narrow, "tandem.v1.MlpShard");
  EXPECT_EQ(Connect({narrow_server.address()}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Nobody listening: Unavailable after the connect timeout.
  RemoteMlpOptions quick;
  quick.connect_timeout = absl::Milliseconds(300);
  auto nobody = RemoteMlpBackend::Create({"127.0.0.1:1"}, Identity(), all_, "fp", nullptr, quick);
  EXPECT_EQ(nobody.status().code(), absl::StatusCode::kUnavailable);
  // A wrong credential is refused at once, not retried.
  auto stranger = RemoteMlpBackend::Create(
      {low.address()}, Identity("some-other-token-abcdef0123456789"), all_, "fp", nullptr, {});
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(stranger.status().message(), HasSubstr("gRPC 16"));
}

// Shards found through DNS names (a headless Service's answer), resolved again every refresh:
// one that leaves the answer is dropped, one that joins is used once its Info matches, one of
// another model never is, and a layer nobody serves any more fails at once.
TEST_F(RemoteMlpTest, DiscoveredShardsJoinAndLeaveWithTheDnsAnswer) {
  Shard a = StartShard("all"), b = StartShard("all");
  Shard stranger = StartShard("all", "another-model");
  absl::Mutex mu;
  std::set<std::string> up = {"a.test"};  // names that resolve now
  RemoteMlpOptions options;
  options.connect_timeout = absl::Seconds(10);
  options.call_timeout = absl::Milliseconds(300);
  options.refresh = absl::Milliseconds(50);
  options.backoff_initial = absl::Seconds(10);
  options.resolver = [&](const std::string& host,
                         absl::Duration) -> absl::StatusOr<std::vector<std::string>> {
    absl::MutexLock lock(&mu);
    if (!up.contains(host)) return absl::NotFoundError(host);
    return std::vector<std::string>{"127.0.0.1"};
  };
  const auto port = [](const Shard& s) { return s.address().substr(s.address().rfind(':') + 1); };
  const std::vector<std::string> names = {absl::StrCat("dns:a.test:", port(a)),
                                          absl::StrCat("dns:b.test:", port(b)),
                                          absl::StrCat("dns:c.test:", port(stranger))};
  auto remote = RemoteMlpBackend::Create(names, Identity(), all_, "fp", nullptr, options);
  ASSERT_TRUE(remote.ok()) << remote.status();
  const std::vector<float> x = Rows(2, 13);
  const std::vector<float> want = Reference(3, x, 2);
  const auto run = [&] {
    std::vector<float> y(x.size());
    absl::Status s = (*remote)->Run(3, x.data(), 2, y.data(), absl::Now() + absl::Seconds(5));
    if (s.ok() && std::memcmp(y.data(), want.data(), y.size() * sizeof(float)) != 0) {
      s = absl::InternalError("wrong rows");
    }
    return s;
  };
  ASSERT_TRUE(run().ok());

  // a's pod goes away (out of the answer, then killed); b's and the stranger's come.
  {
    absl::MutexLock lock(&mu);
    up = {"b.test", "c.test"};
  }
  absl::SleepFor(absl::Milliseconds(600));  // a few refreshes
  a.Kill();
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(run().ok()) << i;
  // Every call went to b: nothing failed over from a, and the stranger was never asked.
  EXPECT_EQ((*remote)->stats().failovers, 0);
  EXPECT_EQ((*remote)->stats().failures, 0);

  // Nobody serves the layers any more: a call fails at once, cleanly.
  {
    absl::MutexLock lock(&mu);
    up = {"c.test"};
  }
  absl::SleepFor(absl::Milliseconds(600));
  const absl::Time start = absl::Now();
  absl::Status gone = run();
  EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable) << gone;
  EXPECT_THAT(gone.message(), HasSubstr("none serves it now"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  // And b coming back makes it serve again.
  {
    absl::MutexLock lock(&mu);
    up = {"b.test"};
  }
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_TRUE(run().ok());
}

TEST_F(RemoteMlpTest, DiscoveryThatFindsNoCompleteSetIsAnErrorAtCreation) {
  Shard low = StartShard("0:2");
  RemoteMlpOptions options;
  options.connect_timeout = absl::Milliseconds(400);
  options.resolver = [](const std::string& host,
                        absl::Duration) -> absl::StatusOr<std::vector<std::string>> {
    if (host == "low.test") return std::vector<std::string>{"127.0.0.1"};
    return absl::NotFoundError(host);
  };
  const std::string port = low.address().substr(low.address().rfind(':') + 1);
  auto remote =
      RemoteMlpBackend::Create({absl::StrCat("dns:low.test:", port), "dns:missing.test:9"},
                               Identity(), all_, "fp", nullptr, options);
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(remote.status().message(), HasSubstr("serve no layer(s) 2,3"));
  // A malformed name is refused as such.
  auto bad = RemoteMlpBackend::Create({"dns:no-port"}, Identity(), all_, "fp", nullptr, options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RemoteMlpTest, TheShardRefusesBadCallsAndComputesNothing) {
  Shard shard = StartShard("0:2");
  auto stub = tandem::v1::MlpShard::NewStub(Identity()->Dial(shard.address()));
  const auto call = [&](uint32_t layer, uint32_t rows, size_t floats) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    tandem::v1::MlpComputeRequest request;
    request.set_layer(layer);
    request.set_rows(rows);
    request.set_activations(std::string(floats * sizeof(float), '\0'));
    tandem::v1::MlpComputeResponse response;
    return stub->Compute(&context, request, &response);
  };
  const size_t h = static_cast<size_t>(config_.hidden_size);
  EXPECT_TRUE(call(1, 2, 2 * h).ok());
  grpc::Status s = call(2, 1, h);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("layer: 2 is not served here"));
  EXPECT_EQ(call(0, 0, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(call(0, 100000, h).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = call(0, 2, h);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("activations"));
  auto stranger = tandem::v1::MlpShard::NewStub(
      Identity("some-other-token-abcdef0123456789")->Dial(shard.address()));
  grpc::ClientContext context;
  tandem::v1::MlpComputeRequest request;
  request.set_layer(0);
  request.set_rows(1);
  request.set_activations(std::string(h * sizeof(float), '\0'));
  tandem::v1::MlpComputeResponse response;
  EXPECT_EQ(stranger->Compute(&context, request, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const MlpShardStats stats = shard.service->stats();
  EXPECT_EQ(stats.rows, 2);
  EXPECT_EQ(stats.rejected, 5);
}

// The Attach call of the GPU data plane, with a session factory standing in for the GPU one: a
// session lives exactly as long as its call, bad and unauthenticated requests get no session,
// and a shard on the CPU answers UNIMPLEMENTED.
struct FakeSession : MlpShardSession {
  explicit FakeSession(std::atomic<int>* live) : live(live) { ++*live; }
  ~FakeSession() override { --*live; }
  std::atomic<int>* live;
};

tandem::v1::MlpAttachRequest GoodAttach(uint32_t rows) {
  tandem::v1::MlpAttachRequest request;
  request.set_max_rows(rows);
  request.set_gpu_uuid("0123456789abcdef0123456789abcdef");
  request.set_boot_id("4b2c6f0e-1a2b-4c3d-8e9f-0a1b2c3d4e5f");
  return request;
}

TEST_F(RemoteMlpTest, AnAttachSessionLivesAsLongAsItsCall) {
  std::atomic<int> live{0};
  auto bell = IpcDoorbell::Create();
  ASSERT_TRUE(bell.ok());
  MlpShardOptions options;
  options.model_fingerprint = "fp";
  options.max_sessions = 1;
  options.attach = [&](const tandem::v1::MlpAttachRequest& request,
                       tandem::v1::MlpAttachResponse* response)
      -> absl::StatusOr<std::unique_ptr<MlpShardSession>> {
    for (std::string* h : {response->mutable_input_memory(), response->mutable_output_memory(),
                           response->mutable_flags()}) {
      h->assign(kIpcHandleBytes, 'h');
    }
    response->set_doorbell(bell->name());
    response->set_max_rows(request.max_rows());
    return std::make_unique<FakeSession>(&live);
  };
  auto service = std::make_unique<MlpShardService>(Weights("all"), Identity(), options);
  Server server(service.get(), "tandem.v1.MlpShard");
  auto stub = tandem::v1::MlpShard::NewStub(Identity()->Dial(server.address()));
  const auto wait_live = [&](int want) {
    for (int i = 0; i < 500 && live.load() != want; ++i) absl::SleepFor(absl::Milliseconds(10));
    return live.load();
  };
  {
    grpc::ClientContext context;
    auto reader = stub->Attach(&context, GoodAttach(16));
    tandem::v1::MlpAttachResponse response;
    ASSERT_TRUE(reader->Read(&response));
    EXPECT_TRUE(CheckAttachResponse(response, 16).ok());
    EXPECT_EQ(live.load(), 1);
    // One session at most: a second Attach is refused while the first is open.
    grpc::ClientContext second;
    auto refused = stub->Attach(&second, GoodAttach(16));
    tandem::v1::MlpAttachResponse ignored;
    EXPECT_FALSE(refused->Read(&ignored));
    EXPECT_EQ(refused->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    context.TryCancel();  // the client ends the session
    EXPECT_FALSE(reader->Read(&response));
    reader->Finish();
  }
  EXPECT_EQ(wait_live(0), 0);
  // Bad and unauthenticated requests get no session.
  for (auto mutate : std::vector<std::function<void(tandem::v1::MlpAttachRequest*)>>{
           [](auto* r) { r->set_max_rows(0); }, [](auto* r) { r->set_max_rows(1 << 30); },
           [](auto* r) { r->set_gpu_uuid("GPU-0123"); }, [](auto* r) { r->set_boot_id(""); },
           [](auto* r) { r->set_boot_id(std::string(65, 'a')); }}) {
    tandem::v1::MlpAttachRequest request = GoodAttach(16);
    mutate(&request);
    grpc::ClientContext context;
    auto reader = stub->Attach(&context, request);
    tandem::v1::MlpAttachResponse response;
    EXPECT_FALSE(reader->Read(&response));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  auto stranger = tandem::v1::MlpShard::NewStub(
      Identity("some-other-token-abcdef0123456789")->Dial(server.address()));
  {
    grpc::ClientContext context;
    auto reader = stranger->Attach(&context, GoodAttach(16));
    tandem::v1::MlpAttachResponse response;
    EXPECT_FALSE(reader->Read(&response));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(live.load(), 0);
  // The shard stopping ends an open session.
  grpc::ClientContext context;
  auto reader = stub->Attach(&context, GoodAttach(8));
  tandem::v1::MlpAttachResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(live.load(), 1);
  service->Shutdown();
  EXPECT_EQ(live.load(), 0);
  EXPECT_FALSE(reader->Read(&response));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(service->stats().sessions, 2);
}

TEST_F(RemoteMlpTest, AShardOnTheCpuHasNoGpuDataPlane) {
  Shard shard = StartShard("all");
  auto stub = tandem::v1::MlpShard::NewStub(Identity()->Dial(shard.address()));
  grpc::ClientContext context;
  auto reader = stub->Attach(&context, GoodAttach(16));
  tandem::v1::MlpAttachResponse response;
  EXPECT_FALSE(reader->Read(&response));
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(s.error_message(), HasSubstr("--device cuda"));
}

TEST(MlpShardChecksTest, AttachAnswersFromAShardAreChecked) {
  tandem::v1::MlpAttachResponse good;
  for (std::string* h :
       {good.mutable_input_memory(), good.mutable_output_memory(), good.mutable_flags()}) {
    h->assign(kIpcHandleBytes, 'h');
  }
  good.set_doorbell("/tandem-mlp-0123456789abcdef0123456789abcdef");
  good.set_max_rows(32);
  EXPECT_TRUE(CheckAttachResponse(good, 32).ok());
  EXPECT_FALSE(CheckAttachResponse(good, 64).ok());
  for (auto mutate : std::vector<std::function<void(tandem::v1::MlpAttachResponse*)>>{
           [](auto* r) { r->mutable_input_memory()->pop_back(); },
           [](auto* r) { r->mutable_flags()->push_back('x'); }, [](auto* r) { r->clear_flags(); },
           [](auto* r) { r->set_doorbell("/dev/shm/../etc"); },
           [](auto* r) { r->set_doorbell(""); }}) {
    tandem::v1::MlpAttachResponse bad = good;
    mutate(&bad);
    EXPECT_EQ(CheckAttachResponse(bad, 32).code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace tandem::mlp

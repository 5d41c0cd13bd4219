// The MLP host data plane (runtime/mlp/host_plane/) between real `tandem mlp-shard` services and
// remote backends in this process, over each host backend this build has (cma, ucx): the rows
// and answers move through the sessions' slots bit for bit; calls that do not fit go in messages;
// the shard refuses bad sessions, slots and attach requests; and faults injected into either
// side's transfers (posts refused, reads that fail or never finish) end in a failover, the
// fallback or a clean error, within the call's deadline.
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "kvtransfer/fault_injecting_backend.h"
#include "kvtransfer/transfer_backend.h"
#include "runtime/mlp/cpu_mlp_backend.h"
#include "runtime/mlp/dense_mlp.h"
#include "runtime/mlp/host_plane/shard_host_plane.h"
#include "runtime/mlp/host_plane/worker_host_plane.h"
#include "runtime/mlp/mlp_shard_checks.h"
#include "runtime/mlp/mlp_shard_service.h"
#include "runtime/mlp/remote_mlp_backend.h"
#include "runtime/mlp/shard_server_for_test.h"
#include "runtime/mlp/tiny_model_for_test.h"

namespace tandem::mlp {
namespace {

using kvtransfer::FaultInjectingBackend;
using kvtransfer::FaultPlan;
using kvtransfer::FaultStage;
using kvtransfer::TransferBackend;
using ::testing::HasSubstr;

// Wraps a plane's backend in a fault injector the test can arm later.
struct Faults {
  FaultInjectingBackend* backend = nullptr;  // owned by the plane's transfer thread
  std::function<std::unique_ptr<TransferBackend>(std::unique_ptr<TransferBackend>)> Wrap() {
    return [this](std::unique_ptr<TransferBackend> inner) -> std::unique_ptr<TransferBackend> {
      auto wrapped = std::make_unique<FaultInjectingBackend>(std::move(inner));
      backend = wrapped.get();
      return wrapped;
    };
  }
};

class HostPlaneTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { model_ = new TinyModelDir("tandem-mlp-host-plane", 17); }
  static void TearDownTestSuite() { delete model_; }
  void SetUp() override {
    if (!kvtransfer::TransferBackendBuilt(GetParam())) {
      GTEST_SKIP() << "this build has no " << GetParam() << " backend";
    }
    model_->Open(&config_, &store_);
    all_ = *ParseLayerRange("all", config_);
  }

  std::shared_ptr<const DenseMlpWeights> Weights(const std::string& range) {
    auto weights = LoadDenseMlpWeights(config_, *store_, *ParseLayerRange(range, config_));
    CHECK(weights.ok()) << weights.status();
    return std::make_shared<const DenseMlpWeights>(*std::move(weights));
  }

  struct Shard {
    std::unique_ptr<MlpShardService> service;
    std::unique_ptr<Server> server;
    Faults faults;
    std::string address() const { return server->address(); }
    void Kill() {
      service->Shutdown();
      server.reset();
      service.reset();
    }
  };
  // A shard of `range` whose host plane runs `backends` ({} = none); `shard->faults` wraps its
  // transfer backend. Heap-allocated: the wrapper's hook points into it.
  std::unique_ptr<Shard> StartShard(const std::string& range,
                                    std::vector<std::string> backends = {"param"}, int port = 0) {
    auto s = std::make_unique<Shard>();
    MlpShardOptions options;
    options.model_fingerprint = "fp";
    if (!backends.empty()) {
      ShardHostPlaneOptions plane;
      plane.backends.clear();
      for (const std::string& b : backends) plane.backends.push_back(b == "param" ? GetParam() : b);
      plane.hidden_size = config_.hidden_size;
      plane.max_rows = 64;
      plane.wrap_backend = s->faults.Wrap();
      auto created = ShardHostPlane::Create(plane);
      CHECK(created.ok()) << created.status();
      options.host_plane = *std::move(created);
    }
    options.max_rows = 64;
    s->service = std::make_unique<MlpShardService>(Weights(range), Identity(), options);
    s->server = std::make_unique<Server>(s->service.get(), "tandem.v1.MlpShard", port);
    return s;
  }

  // No test here exercises the call deadline but the hung-read one, which passes its own: a
  // generous default, so a loaded machine (CI's two cores) cannot turn a slow call into a
  // failover.
  absl::StatusOr<std::unique_ptr<RemoteMlpBackend>> Connect(
      const std::vector<std::string>& addresses, std::unique_ptr<MlpBackend> fallback = nullptr,
      int slot_rows = 16, Faults* faults = nullptr, absl::Duration call_timeout = absl::Seconds(30),
      absl::Duration backoff = absl::Seconds(10)) {
    RemoteMlpOptions options;
    options.connect_timeout = absl::Seconds(10);
    options.call_timeout = call_timeout;
    // Long by default, so a test's next call surely finds a failed shard still backing off.
    options.backoff_initial = backoff;
    options.backoff_max = 2 * backoff;
    options.data_plane = GetParam();
    options.plane_slots = 4;
    options.plane_slot_rows = slot_rows;
    if (faults != nullptr) options.plane_wrap_backend = faults->Wrap();
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

  bool Same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }

  static TinyModelDir* model_;
  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
  MlpShape all_;
};
TinyModelDir* HostPlaneTest::model_ = nullptr;

TEST_P(HostPlaneTest, RowsAndAnswersMoveThroughTheSlotsBitForBit) {
  auto low = StartShard("0:2"), high = StartShard("2:4");
  auto remote = Connect({low->address(), high->address()});
  ASSERT_TRUE(remote.ok()) << remote.status();
  int calls = 0;
  for (int round = 0; round < 3; ++round) {
    for (int layer = 0; layer < config_.num_layers; ++layer) {
      for (int rows : {1, 7, 16}) {
        const std::vector<float> x =
            Rows(rows, static_cast<uint32_t>(round * 100 + layer * 10 + rows));
        std::vector<float> y(x.size());
        ASSERT_TRUE((*remote)->Run(layer, x.data(), rows, y.data(), absl::InfiniteFuture()).ok());
        EXPECT_TRUE(Same(y, Reference(layer, x, rows))) << "layer " << layer << ", " << rows;
        ++calls;
      }
    }
  }
  EXPECT_EQ((*remote)->stats().plane_calls, calls);
  EXPECT_EQ((*remote)->stats().failovers, 0);
  EXPECT_EQ(low->service->stats().plane_calls + high->service->stats().plane_calls, calls);
  EXPECT_EQ(low->service->stats().sessions, 1);
}

TEST_P(HostPlaneTest, CallsThatDoNotFitASlotGoInMessages) {
  auto shard = StartShard("all");
  auto remote = Connect({shard->address()}, nullptr, /*slot_rows=*/4);
  ASSERT_TRUE(remote.ok()) << remote.status();
  // 7 rows do not fit a slot of 4.
  std::vector<float> x = Rows(7, 1), y(x.size());
  ASSERT_TRUE((*remote)->Run(1, x.data(), 7, y.data(), absl::InfiniteFuture()).ok());
  EXPECT_TRUE(Same(y, Reference(1, x, 7)));
  EXPECT_EQ((*remote)->stats().plane_calls, 0);
  // Six calls in flight at once on 4 slots: four through the plane, two in messages; every
  // answer is its own call's.
  std::vector<std::vector<float>> xs, ys;
  std::vector<MlpBackend::Handle> handles;
  for (int i = 0; i < 6; ++i) {
    xs.push_back(Rows(3, static_cast<uint32_t>(50 + i)));
    ys.emplace_back(xs.back().size());
  }
  for (int i = 0; i < 6; ++i) {
    auto h = (*remote)->Submit(i % config_.num_layers, xs[i].data(), 3, ys[i].data(),
                               absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
  }
  for (int i = 0; i < 6; ++i) ASSERT_TRUE((*remote)->Wait(handles[i]).ok());
  for (int i = 0; i < 6; ++i) {
    // Batched with the others on the shard: equal within float error.
    const std::vector<float> want = Reference(i % config_.num_layers, xs[i], 3);
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_NEAR(ys[i][k], want[k], 1e-4f * (1 + std::abs(want[k]))) << "call " << i;
    }
  }
  EXPECT_EQ((*remote)->stats().plane_calls, 4);
  // The slots are free again.
  x = Rows(2, 9);
  y.assign(x.size(), 0);
  ASSERT_TRUE((*remote)->Run(0, x.data(), 2, y.data(), absl::InfiniteFuture()).ok());
  EXPECT_TRUE(Same(y, Reference(0, x, 2)));
  EXPECT_EQ((*remote)->stats().plane_calls, 5);
}

TEST_P(HostPlaneTest, AShardWithoutThePlaneOrThisBackendIsRefusedAtCreation) {
  auto none = StartShard("all", {});
  auto remote = Connect({none->address()});
  ASSERT_FALSE(remote.ok());
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kUnimplemented) << remote.status();
  EXPECT_THAT(remote.status().message(), HasSubstr("no host data plane"));
  const std::string other = GetParam() == "cma" ? "ucx" : "cma";
  if (kvtransfer::TransferBackendBuilt(other)) {
    auto elsewhere = StartShard("all", {other});
    remote = Connect({elsewhere->address()});
    ASSERT_FALSE(remote.ok());
    EXPECT_EQ(remote.status().code(), absl::StatusCode::kFailedPrecondition) << remote.status();
    EXPECT_THAT(remote.status().message(), HasSubstr("--data-planes"));
  }
}

// Raw AttachHost and Compute calls: what the shard refuses, and that it computes nothing then.
TEST_P(HostPlaneTest, TheShardRefusesBadAttachesSessionsAndSlots) {
  auto shard = StartShard("all");
  auto stub = tandem::v1::MlpShard::NewStub(Identity()->Dial(shard->address()));
  // A worker's side by hand: a backend, an input buffer of 2 slots x 4 rows.
  kvtransfer::BackendOptions b;
  b.agent_name = "raw-worker";
  auto backend = kvtransfer::CreateTransferBackend(GetParam(), b);
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::vector<float> input(2 * 4 * static_cast<size_t>(config_.hidden_size), 0.5f);
  auto region = (*backend)->RegisterMemory(input.data(), input.size() * sizeof(float),
                                           kvtransfer::MemoryKind::kHost);
  ASSERT_TRUE(region.ok());
  tandem::v1::MlpHostAttachRequest good;
  good.set_backend(GetParam());
  good.set_agent("raw-worker");
  good.set_address(*(*backend)->LocalAddress());
  good.set_input_region(*(*backend)->ExportRegion(region->id));
  good.set_slots(2);
  good.set_slot_rows(4);
  // The shard reads from this backend: UCX over tcp or shared memory needs it to progress. This
  // thread owns it until the end of the test.
  std::atomic<bool> stop{false};
  std::thread progress([&] {
    while (!stop.load()) {
      (*backend)->Progress();
      absl::SleepFor(absl::Microseconds(100));
    }
  });
  const auto attach_fails = [&](const tandem::v1::MlpHostAttachRequest& request,
                                tandem::v1::MlpShard::Stub& s) {
    grpc::ClientContext context;
    auto reader = s.AttachHost(&context, request);
    tandem::v1::MlpHostAttachResponse response;
    EXPECT_FALSE(reader->Read(&response));
    return reader->Finish().error_code();
  };
  for (auto mutate : std::vector<std::function<void(tandem::v1::MlpHostAttachRequest*)>>{
           [](auto* r) { r->set_backend("tcp"); }, [](auto* r) { r->set_agent(""); },
           [](auto* r) { r->set_agent(std::string(200, 'a')); },
           [](auto* r) { r->set_agent("a b"); }, [](auto* r) { r->clear_address(); },
           [](auto* r) { r->set_input_region(std::string(5000, 'r')); },
           [](auto* r) { r->set_slots(0); }, [](auto* r) { r->set_slots(17); },
           [](auto* r) { r->set_slot_rows(0); }, [](auto* r) { r->set_slot_rows(65); }}) {
    tandem::v1::MlpHostAttachRequest bad = good;
    mutate(&bad);
    EXPECT_EQ(attach_fails(bad, *stub), grpc::StatusCode::INVALID_ARGUMENT)
        << bad.ShortDebugString().substr(0, 200);
  }
  auto stranger = tandem::v1::MlpShard::NewStub(
      Identity("some-other-token-abcdef0123456789")->Dial(shard->address()));
  EXPECT_EQ(attach_fails(good, *stranger), grpc::StatusCode::UNAUTHENTICATED);
  // A garbled address is the backend's to refuse: no session.
  tandem::v1::MlpHostAttachRequest garbled = good;
  garbled.set_address("not an address");
  EXPECT_NE(attach_fails(garbled, *stub), grpc::StatusCode::OK);

  grpc::ClientContext attach_context;
  auto reader = stub->AttachHost(&attach_context, good);
  tandem::v1::MlpHostAttachResponse session;
  ASSERT_TRUE(reader->Read(&session));
  EXPECT_TRUE(CheckHostAttachResponse(session).ok());
  const auto compute = [&](uint64_t id, uint32_t slot, uint32_t rows, size_t floats) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    tandem::v1::MlpComputeRequest request;
    request.set_layer(1);
    request.set_rows(rows);
    request.set_session(id);
    request.set_slot(slot);
    if (floats > 0) request.set_activations(std::string(floats * sizeof(float), '\0'));
    tandem::v1::MlpComputeResponse response;
    grpc::Status s = stub->Compute(&context, request, &response);
    if (s.ok()) {
      EXPECT_TRUE(response.output().empty());
    }
    return s;
  };
  const size_t h = static_cast<size_t>(config_.hidden_size);
  const int64_t rejected = shard->service->stats().rejected;
  EXPECT_TRUE(compute(session.session(), 1, 4, 0).ok()) << "the good call";
  EXPECT_EQ(compute(session.session() ^ 1, 0, 1, 0).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(compute(session.session(), 2, 1, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(compute(session.session(), 0, 5, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(compute(session.session(), 0, 1, h).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(compute(0, 1, 1, h).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);  // slot, no session
  EXPECT_EQ(shard->service->stats().rows, 4);
  EXPECT_EQ(shard->service->stats().rejected - rejected, 5);

  // A slot is one call's at a time: while a read of slot 0 hangs (injected), a second call on
  // slot 0 is refused; the first ends at its deadline, and the slot serves again.
  ASSERT_NE(shard->faults.backend, nullptr);
  shard->faults.backend->SetPlan(
      {.stage = FaultStage::kMidTransfer, .once = true, .polls_before_failure = 1 << 30});
  grpc::ClientContext slow_context;
  slow_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(800)));
  tandem::v1::MlpComputeRequest slow;
  slow.set_layer(0);
  slow.set_rows(1);
  slow.set_session(session.session());
  slow.set_slot(0);
  tandem::v1::MlpComputeResponse slow_response;
  grpc::Status slow_status;
  absl::Notification slow_done;
  stub->async()->Compute(&slow_context, &slow, &slow_response, [&](grpc::Status s) {
    slow_status = s;
    slow_done.Notify();
  });
  for (int i = 0; i < 400 && shard->faults.backend->faults_injected() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(2));  // until the slow call's read hangs
  }
  ASSERT_EQ(shard->faults.backend->faults_injected(), 1);
  const grpc::Status busy = compute(session.session(), 0, 1, 0);
  EXPECT_EQ(busy.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << busy.error_message();
  ASSERT_TRUE(slow_done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(slow_status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  grpc::Status again;
  for (int i = 0; i < 100; ++i) {  // the hung read is released within its deadline's tick
    again = compute(session.session(), 0, 1, 0);
    if (again.ok()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(again.ok()) << again.error_message();

  // Ending the call ends the session.
  attach_context.TryCancel();
  EXPECT_FALSE(reader->Read(&session));
  reader->Finish();
  grpc::Status gone;
  for (int i = 0; i < 100; ++i) {
    gone = compute(session.session(), 1, 1, 0);
    if (gone.error_code() == grpc::StatusCode::NOT_FOUND) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND);
  stop = true;
  progress.join();
}

// Faults in the worker's reads of answers: every read refused, then every read hanging. The call
// moves to the other shard, then to the fallback, within its deadline; without a fallback it
// fails cleanly. Nothing hangs, and the answers that come are right.
TEST_P(HostPlaneTest, FailedOrHungReadsOfAnswersFailOverAndNeverHang) {
  auto a = StartShard("all"), b = StartShard("all");
  Faults faults;
  auto remote = Connect({a->address(), b->address()},
                        std::make_unique<CpuMlpBackend>(Weights("all")), 16, &faults);
  ASSERT_TRUE(remote.ok()) << remote.status();
  ASSERT_NE(faults.backend, nullptr);
  const std::vector<float> x = Rows(5, 3);
  const std::vector<float> want = Reference(2, x, 5);
  std::vector<float> y(x.size());
  ASSERT_TRUE((*remote)->Run(2, x.data(), 5, y.data(), absl::InfiniteFuture()).ok());
  EXPECT_TRUE(Same(y, want));

  faults.backend->SetPlan({.stage = FaultStage::kPost, .once = false});
  y.assign(y.size(), 0);
  absl::Time start = absl::Now();
  ASSERT_TRUE((*remote)->Run(2, x.data(), 5, y.data(), absl::Now() + absl::Seconds(5)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE(Same(y, want));
  EXPECT_GE((*remote)->stats().failovers, 2);  // the other shard, then the fallback
  EXPECT_GE(faults.backend->faults_injected(), 2);

  // A second backend without a fallback: its hung reads end the call within the call timeout.
  auto c = StartShard("all");
  Faults hung;
  auto bare = Connect({c->address()}, nullptr, 16, &hung, absl::Milliseconds(300));
  ASSERT_TRUE(bare.ok()) << bare.status();
  hung.backend->SetPlan(
      {.stage = FaultStage::kMidTransfer, .once = false, .polls_before_failure = 1 << 30});
  start = absl::Now();
  const absl::Status failed =
      (*bare)->Run(1, x.data(), 5, y.data(), absl::Now() + absl::Seconds(5));
  EXPECT_FALSE(failed.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_THAT(failed.message(), HasSubstr("layer 1"));
  EXPECT_EQ((*bare)->stats().failures, 1);
}

// Faults in the shard's reads of rows: the shard answers UNAVAILABLE and the worker fails over.
// A killed shard: its twin serves, through its own session.
TEST_P(HostPlaneTest, AShardThatCannotReadOrDiedIsFailedOver) {
  auto a = StartShard("all"), b = StartShard("all");
  auto remote = Connect({a->address(), b->address()});
  ASSERT_TRUE(remote.ok()) << remote.status();
  a->faults.backend->SetPlan({.stage = FaultStage::kPost, .once = false});
  const std::vector<float> x = Rows(4, 8);
  const std::vector<float> want = Reference(3, x, 4);
  for (int i = 0; i < 4; ++i) {  // round robin reaches a
    std::vector<float> y(x.size());
    ASSERT_TRUE((*remote)->Run(3, x.data(), 4, y.data(), absl::InfiniteFuture()).ok());
    EXPECT_TRUE(Same(y, want));
  }
  EXPECT_GE((*remote)->stats().failovers, 1);
  EXPECT_GE(a->service->stats().failed, 1);
  b->Kill();
  a->faults.backend->SetPlan({});
  // b is dead and a backs off after its failure: with no shard left the call fails, cleanly.
  std::vector<float> y(x.size());
  const absl::Time start = absl::Now();
  const absl::Status s = (*remote)->Run(3, x.data(), 4, y.data(), absl::Now() + absl::Seconds(5));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_FALSE(s.ok());
}

// A shard killed and started again on its address: calls go on (in messages, or to the
// fallback while the shard backs off), the session is opened again in the background, and calls
// go through the plane again, to the new shard.
TEST_P(HostPlaneTest, AShardRestartedOnItsAddressGetsANewSession) {
  auto a = StartShard("all");
  const int port = a->server->grpc.port;
  auto remote = Connect({a->address()}, std::make_unique<CpuMlpBackend>(Weights("all")), 16,
                        nullptr, absl::Seconds(30), absl::Milliseconds(200));
  ASSERT_TRUE(remote.ok()) << remote.status();
  const std::vector<float> x = Rows(3, 21);
  const std::vector<float> want = Reference(2, x, 3);
  std::vector<float> y(x.size());
  ASSERT_TRUE((*remote)->Run(2, x.data(), 3, y.data(), absl::InfiniteFuture()).ok());
  ASSERT_EQ((*remote)->stats().plane_calls, 1);
  a->Kill();
  auto b = StartShard("all", {"param"}, port);
  const int64_t before = (*remote)->stats().plane_calls;
  bool back = false;
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!back && absl::Now() < give_up) {
    y.assign(y.size(), 0);
    ASSERT_TRUE((*remote)->Run(2, x.data(), 3, y.data(), absl::Now() + absl::Seconds(5)).ok());
    EXPECT_TRUE(Same(y, want));
    back = (*remote)->stats().plane_calls > before;
    if (!back) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(back) << "the session was never opened again";
  EXPECT_GE(b->service->stats().plane_calls, 1);
  EXPECT_EQ(b->service->stats().sessions, 1);
  EXPECT_EQ((*remote)->stats().failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, HostPlaneTest, ::testing::Values("cma", "ucx"),
                         [](const auto& info) { return info.param; });

TEST(MlpShardChecksTest, HostAttachAnswersFromAShardAreChecked) {
  tandem::v1::MlpHostAttachResponse good;
  good.set_session(42);
  good.set_agent("mlp-shard-1");
  good.set_address("addr");
  good.set_output_region("region");
  EXPECT_TRUE(CheckHostAttachResponse(good).ok());
  for (auto mutate : std::vector<std::function<void(tandem::v1::MlpHostAttachResponse*)>>{
           [](auto* r) { r->set_session(0); }, [](auto* r) { r->set_agent(""); },
           [](auto* r) { r->set_agent("tab\there"); }, [](auto* r) { r->clear_address(); },
           [](auto* r) { r->set_output_region(std::string(4097, 'x')); }}) {
    tandem::v1::MlpHostAttachResponse bad = good;
    mutate(&bad);
    EXPECT_EQ(CheckHostAttachResponse(bad).code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace tandem::mlp

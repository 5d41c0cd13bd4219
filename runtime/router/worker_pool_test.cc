#include "runtime/router/worker_pool.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {
namespace {

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

// An in-process worker that serves Worker.StreamStats (every 20 ms) and grpc.health.v1.
class FakeWorker final : public v1::Worker::Service {
 public:
  explicit FakeWorker(int port = 0) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakeWorker() override { Shutdown(); }

  void Shutdown() {
    if (server_ == nullptr) return;
    shutting_down_ = true;
    server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  grpc::Server* server() { return server_.get(); }
  void set_running(int n) { running_ = n; }
  void set_silent(bool silent) { silent_ = silent; }

  grpc::Status StreamStats(grpc::ServerContext* context, const v1::StatsRequest*,
                           grpc::ServerWriter<v1::WorkerStats>* writer) override {
    while (!context->IsCancelled() && !shutting_down_) {
      if (!silent_) {
        v1::WorkerStats stats;
        stats.set_role("decode");
        stats.set_running_sequences(running_);
        stats.set_queue_depth(2);
        stats.set_kv_blocks_total(100);
        stats.set_kv_blocks_free(60);
        stats.set_block_size(16);
        stats.set_prompt_tokens_waiting(77);
        if (!writer->Write(stats)) break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return grpc::Status::OK;
  }

 private:
  int port_ = 0;
  std::atomic<bool> shutting_down_{false};
  std::atomic<int> running_{3};
  std::atomic<bool> silent_{false};
  std::unique_ptr<grpc::Server> server_;
};

WorkerPoolOptions FastOptions(metrics::RouterMetrics* metrics = nullptr) {
  WorkerPoolOptions options;
  options.role = "decode";
  options.stats_stale_after = absl::Milliseconds(400);
  options.health_interval = absl::Milliseconds(50);
  options.health_timeout = absl::Milliseconds(500);
  options.reconnect_min = absl::Milliseconds(20);
  options.reconnect_max = absl::Milliseconds(100);
  options.metrics = metrics;
  return options;
}

TEST(WorkerPoolTest, StatsStreamMakesWorkerHealthyAndItsLossUnhealthy) {
  FakeWorker fake;
  WorkerPool pool(FastOptions());
  pool.SetMembers({fake.address()});
  ASSERT_TRUE(WaitFor([&] { return pool.HealthyCount() == 1; }));
  const auto snapshot = pool.Snapshot();
  ASSERT_EQ(snapshot.size(), 1u);
  EXPECT_EQ(snapshot[0].address, fake.address());
  EXPECT_EQ(snapshot[0].running, 3);
  EXPECT_EQ(snapshot[0].queue_depth, 2);
  EXPECT_EQ(snapshot[0].kv_blocks_free, 60);
  EXPECT_EQ(snapshot[0].kv_blocks_total, 100);
  EXPECT_EQ(snapshot[0].block_size, 16);
  EXPECT_EQ(snapshot[0].prompt_tokens_waiting, 77);
  fake.set_running(5);
  EXPECT_TRUE(WaitFor([&] { return pool.Snapshot()[0].running == 5; }));

  fake.Shutdown();
  EXPECT_TRUE(WaitFor([&] { return pool.HealthyCount() == 0; }, absl::Seconds(3)));
  EXPECT_EQ(pool.size(), 1);  // still a member: it may come back
}

TEST(WorkerPoolTest, ReconnectsWhenTheWorkerComesBack) {
  auto fake = std::make_unique<FakeWorker>();
  const int port = fake->port();
  WorkerPool pool(FastOptions());
  pool.SetMembers({fake->address()});
  ASSERT_TRUE(WaitFor([&] { return pool.HealthyCount() == 1; }));
  fake.reset();
  ASSERT_TRUE(WaitFor([&] { return pool.HealthyCount() == 0; }));
  fake = std::make_unique<FakeWorker>(port);
  ASSERT_NE(fake->server(), nullptr) << "port " << port << " not free again";
  EXPECT_TRUE(WaitFor([&] { return pool.HealthyCount() == 1; }));
}

TEST(WorkerPoolTest, StaleStatsAreUnhealthy) {
  FakeWorker fake;
  WorkerPool pool(FastOptions());
  pool.SetMembers({fake.address()});
  ASSERT_TRUE(WaitFor([&] { return pool.HealthyCount() == 1; }));
  fake.set_silent(true);  // stream open, nothing on it: a hung worker
  EXPECT_TRUE(WaitFor([&] { return pool.HealthyCount() == 0; }));
  fake.set_silent(false);
  EXPECT_TRUE(WaitFor([&] { return pool.HealthyCount() == 1; }));
}

TEST(WorkerPoolTest, NotServingHealthStatusIsUnhealthy) {
  FakeWorker fake;
  WorkerPool pool(FastOptions());
  pool.SetMembers({fake.address()});
  ASSERT_TRUE(WaitFor([&] { return pool.HealthyCount() == 1; }));
  fake.server()->GetHealthCheckService()->SetServingStatus("tandem.v1.Decode", false);
  EXPECT_TRUE(WaitFor([&] { return pool.HealthyCount() == 0; }));
  fake.server()->GetHealthCheckService()->SetServingStatus("tandem.v1.Decode", true);
  EXPECT_TRUE(WaitFor([&] { return pool.HealthyCount() == 1; }));
  // Server-wide status applies when the role's service has none.
  fake.server()->GetHealthCheckService()->SetServingStatus(false);
  EXPECT_TRUE(WaitFor([&] { return pool.HealthyCount() == 0; }));
}

TEST(WorkerPoolTest, UnreachableWorkerIsUnhealthy) {
  int port = 0;
  {
    FakeWorker probe;  // take a free port, then close it
    port = probe.port();
  }
  WorkerPool pool(FastOptions());
  pool.SetMembers({absl::StrCat("127.0.0.1:", port)});
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(pool.HealthyCount(), 0);
  EXPECT_EQ(pool.size(), 1);
}

TEST(WorkerPoolTest, RemovedWorkersLeaveButTheirChannelsStayUsable) {
  FakeWorker a;
  FakeWorker b;
  prometheus::Registry registry;
  metrics::RouterMetrics metrics(registry);
  WorkerPool pool(FastOptions(&metrics));
  pool.SetMembers({a.address(), b.address()});
  ASSERT_TRUE(WaitFor([&] { return pool.HealthyCount() == 2; }));
  ASSERT_TRUE(WaitFor([&] {
    return metrics::Serialize(registry).find(absl::StrCat(
               "tandem_worker_requests_running{role=\"decode\",worker=\"", a.address(), "\"} 3")) !=
           std::string::npos;
  }));

  std::shared_ptr<WorkerChannel> held = pool.Get(a.address());
  ASSERT_NE(held, nullptr);
  held->AddInflight(1);
  EXPECT_EQ(pool.Snapshot()[a.address() < b.address() ? 0 : 1].router_inflight, 1);

  pool.SetMembers({b.address()});
  EXPECT_EQ(pool.Get(a.address()), nullptr);
  ASSERT_EQ(pool.Snapshot().size(), 1u);
  EXPECT_EQ(pool.Snapshot()[0].address, b.address());
  // The request still on `a` keeps its channel.
  EXPECT_EQ(held->address(), a.address());
  EXPECT_NE(held->channel(), nullptr);
  const std::string text = metrics::Serialize(registry);
  EXPECT_EQ(text.find(a.address()), std::string::npos) << text;
  EXPECT_NE(text.find(b.address()), std::string::npos) << text;
}

}  // namespace
}  // namespace tandem::router

#include "runtime/router/worker_pool.h"

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "runtime/kvcache/block_pool.h"
#include "runtime/kvcache/prefix_cache_events.h"
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

  // Prefix-cache events this worker streams when asked (as WorkerStatsService does).
  PrefixCacheEventLog& prefix_log() { return prefix_log_; }
  // The next delta claims to start one event later than it does: a lost event.
  void InjectGap() { inject_gap_ = true; }
  int streams_opened() const { return streams_opened_; }

  grpc::Status StreamStats(grpc::ServerContext* context, const v1::StatsRequest* request,
                           grpc::ServerWriter<v1::WorkerStats>* writer) override {
    ++streams_opened_;
    std::optional<uint64_t> cursor;
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
        if (request->prefix_cache_events()) {
          const PrefixCacheDelta delta = prefix_log_.ReadSince(cursor, 1000);
          cursor = delta.last_seq;
          v1::PrefixCacheEvents* out = stats.mutable_prefix_cache();
          out->set_reset(delta.reset);
          out->set_first_seq(delta.first_seq);
          out->set_last_seq(delta.last_seq);
          if (!delta.reset && !delta.events.empty() && inject_gap_.exchange(false)) {
            out->set_first_seq(delta.first_seq + 1);
          }
          for (const PrefixCacheEvent& e : delta.events) {
            v1::PrefixCacheEvent* event = out->add_events();
            event->set_block_hash(e.block_hash);
            event->set_removed(e.kind == PrefixCacheEvent::Kind::kRemoved);
          }
        }
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
  std::atomic<bool> inject_gap_{false};
  std::atomic<int> streams_opened_{0};
  PrefixCacheEventLog prefix_log_;
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

TEST(WorkerPoolTest, PrefixCacheEventsGiveEachWorkerItsCachedOverlap) {
  FakeWorker fake;
  prometheus::Registry registry;
  metrics::RouterMetrics metrics(registry);
  WorkerPoolOptions options = FastOptions(&metrics);
  options.track_prefix_cache = true;
  WorkerPool pool(options);
  std::vector<int32_t> prompt(64);
  for (int i = 0; i < 64; ++i) prompt[i] = 1000 + i;
  // 64 tokens of 16-token blocks: at most 3 blocks count (the last token is always computed).
  const std::vector<uint64_t> hashes = PrefixBlockHashes(prompt, 16, 4);
  ASSERT_EQ(hashes.size(), 4u);
  std::vector<PrefixCacheEvent> stored;
  for (uint64_t h : hashes)
    stored.push_back({.kind = PrefixCacheEvent::Kind::kStored, .block_hash = h});
  fake.prefix_log().Append(stored);  // before the router connects: it arrives as a snapshot
  pool.SetMembers({fake.address()});
  const auto cached = [&] {
    const auto snapshot = pool.Snapshot(prompt);
    return snapshot.empty() ? -1 : snapshot[0].cached_prefix_tokens;
  };
  ASSERT_TRUE(WaitFor([&] { return cached() == 48; })) << cached();
  EXPECT_EQ(pool.Snapshot()[0].cached_prefix_tokens, 0) << "no prompt, no overlap";

  const PrefixCacheEvent evict_1 = {.kind = PrefixCacheEvent::Kind::kRemoved,
                                    .block_hash = hashes[1]};
  fake.prefix_log().Append({&evict_1, 1});
  ASSERT_TRUE(WaitFor([&] { return cached() == 16; })) << cached();

  // A lost event: the pool notices the gap, reopens the stream and resyncs from a snapshot.
  const int streams = fake.streams_opened();
  fake.InjectGap();
  const PrefixCacheEvent store_1 = {.kind = PrefixCacheEvent::Kind::kStored,
                                    .block_hash = hashes[1]};
  fake.prefix_log().Append({&store_1, 1});
  ASSERT_TRUE(WaitFor([&] { return fake.streams_opened() > streams && cached() == 48; }))
      << cached();
  EXPECT_EQ(pool.HealthyCount(), 1) << "a resync does not take the worker out of rotation";
  const std::string text = metrics::Serialize(registry);
  EXPECT_NE(text.find("tandem_prefix_index_resyncs_total{pool=\"decode\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("tandem_worker_prefix_cache_blocks{role=\"decode\",worker=\"" +
                      fake.address() + "\"} 4"),
            std::string::npos)
      << text;

  // The stream breaks (the worker restarted, say): the index is dropped, not trusted.
  fake.set_silent(true);
  fake.Shutdown();
  ASSERT_TRUE(WaitFor([&] { return cached() == 0; }));
}

TEST(WorkerPoolTest, WithoutTrackingThereIsNoOverlap) {
  FakeWorker fake;
  std::vector<int32_t> prompt(64, 5);
  std::vector<PrefixCacheEvent> stored;
  for (uint64_t h : PrefixBlockHashes(prompt, 16, 3)) {
    stored.push_back({.kind = PrefixCacheEvent::Kind::kStored, .block_hash = h});
  }
  fake.prefix_log().Append(stored);
  WorkerPool pool(FastOptions());
  pool.SetMembers({fake.address()});
  ASSERT_TRUE(WaitFor([&] { return pool.HealthyCount() == 1; }));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(pool.Snapshot(prompt)[0].cached_prefix_tokens, 0);
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

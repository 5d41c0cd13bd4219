#include "kvtransfer/handoff/transfer_thread.h"

#include <atomic>
#include <set>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

// Records the threads that call it; transfers complete after `polls_to_done` polls.
class FakeBackend final : public TransferBackend {
 public:
  std::string_view name() const override { return "fake"; }
  Capabilities capabilities() const override { return {}; }
  const std::string& agent_name() const override { return agent_; }
  absl::StatusOr<std::string> LocalAddress() override { return Touch("addr"); }
  absl::StatusOr<MemoryRegion> RegisterMemory(void* base, size_t length, MemoryKind kind) override {
    Touch("");
    return MemoryRegion{1, kind, base, length};
  }
  absl::StatusOr<std::string> ExportRegion(uint64_t) override { return Touch("region"); }
  absl::Status DeregisterMemory(uint64_t) override { return absl::OkStatus(); }
  absl::Status Connect(const std::string&, const std::string&) override {
    Touch("");
    return absl::OkStatus();
  }
  absl::Status Disconnect(const std::string&) override { return absl::OkStatus(); }
  absl::StatusOr<TransferHandle> PostWrite(const TransferRequest&) override {
    Touch("");
    polls_left_ = 3;
    return 7;
  }
  absl::StatusOr<TransferState> Poll(TransferHandle) override {
    Touch("");
    return --polls_left_ > 0 ? TransferState::kInProgress : TransferState::kDone;
  }
  absl::Status Release(TransferHandle) override {
    Touch("");
    return absl::OkStatus();
  }
  void Progress() override {
    Touch("");
    progress_calls.fetch_add(1);
  }
  std::vector<Notification> GetNotifications() override { return {}; }

  std::string Touch(std::string value) {
    absl::MutexLock lock(&mu);
    threads.insert(std::this_thread::get_id());
    return value;
  }

  absl::Mutex mu;
  std::set<std::thread::id> threads ABSL_GUARDED_BY(mu);
  std::atomic<int> progress_calls{0};

 private:
  std::string agent_ = "fake-agent";
  int polls_left_ = 0;
};

TEST(TransferThreadTest, OneThreadRunsTasksPollersAndProgress) {
  auto owned = std::make_unique<FakeBackend>();
  FakeBackend* backend = owned.get();
  TransferThread thread(std::move(owned), absl::Microseconds(200));
  EXPECT_EQ(thread.backend_name(), "fake");

  std::vector<int> order;
  absl::Mutex order_mu;
  for (int i = 0; i < 5; ++i) {
    thread.Post([i, &order, &order_mu](TransferBackend&) {
      absl::MutexLock lock(&order_mu);
      order.push_back(i);
    });
  }
  std::string address;
  ASSERT_TRUE(thread
                  .Run(
                      [&address](TransferBackend& b) {
                        auto a = b.LocalAddress();
                        if (!a.ok()) return a.status();
                        address = *a;
                        return absl::OkStatus();
                      },
                      absl::Seconds(5))
                  .ok());
  EXPECT_EQ(address, "addr");
  {
    absl::MutexLock lock(&order_mu);
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  }
  EXPECT_EQ(
      thread.Run([](TransferBackend&) { return absl::NotFoundError("peer"); }, absl::Seconds(5))
          .code(),
      absl::StatusCode::kNotFound);

  // A transfer polled to completion by a poller.
  absl::Notification done;
  int polls = 0;
  thread.Post([&](TransferBackend& b) {
    auto h = b.PostWrite({});
    ASSERT_TRUE(h.ok());
    const TransferHandle handle = *h;
    thread.AddPoller([&, handle](TransferBackend& b, bool stopping) {
      ++polls;
      auto state = b.Poll(handle);
      if (!state.ok() || *state == TransferState::kInProgress) return false;
      EXPECT_TRUE(b.Release(handle).ok());
      done.Notify();
      return true;
    });
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(polls, 3);

  // Progress happens while idle (the target side of a transfer needs it).
  const int before = backend->progress_calls.load();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_GT(backend->progress_calls.load(), before);

  // Stop gives a live poller its last call, then refuses new work.
  bool stopped_poller_called = false;
  thread.AddPoller([&](TransferBackend&, bool stopping) {
    if (stopping) stopped_poller_called = true;
    return stopping;
  });
  absl::SleepFor(absl::Milliseconds(5));
  {
    absl::MutexLock lock(&backend->mu);
    EXPECT_EQ(backend->threads.size(), 1u);
  }
  thread.Stop();
  EXPECT_TRUE(stopped_poller_called);
  EXPECT_FALSE(thread.Post([](TransferBackend&) {}));
  EXPECT_EQ(thread.Run([](TransferBackend&) { return absl::OkStatus(); }, absl::Seconds(1)).code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::kvtransfer

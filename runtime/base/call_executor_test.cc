#include "runtime/base/call_executor.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(CallExecutorTest, RunsPostedAndTimedTasksInTimeOrder) {
  CallExecutor executor(1);
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification done;
  const absl::Time start = absl::Now();
  executor.PostAt(start + absl::Milliseconds(60), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(3);
    done.Notify();
  });
  executor.PostAt(start + absl::Milliseconds(30), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(2);
  });
  executor.Post([&] {
    absl::MutexLock lock(&mu);
    order.push_back(1);
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(60));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(CallExecutorTest, StopDropsPendingTasksAndPostAfterStopRunsNothing) {
  std::atomic<int> ran{0};
  {
    CallExecutor executor(2);
    executor.PostAt(absl::Now() + absl::Hours(1), [&] { ++ran; });
    executor.Stop();
    executor.Post([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 0);
}

TEST(StrandTest, StepsNeverOverlapAndAPokeDuringAStepRunsItAgain) {
  auto executor = std::make_shared<CallExecutor>(4);
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> steps{0};
  auto strand = Strand::Create(executor, [&] {
    if (inside.fetch_add(1) != 0) ++overlaps;
    absl::SleepFor(absl::Milliseconds(1));
    ++steps;
    inside.fetch_sub(1);
  });
  for (int i = 0; i < 200; ++i) strand->Poke();
  // Every Poke is followed by at least one step that starts after it.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (inside.load() != 0 || steps.load() == 0) {
    ASSERT_LT(absl::Now(), deadline);
    absl::SleepFor(absl::Milliseconds(5));
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_GE(steps.load(), 1);
  EXPECT_LE(steps.load(), 200);  // coalesced, not one per poke
  const int before = steps.load();
  strand->PokeAt(absl::Now() + absl::Milliseconds(20));
  while (steps.load() == before) {
    ASSERT_LT(absl::Now(), deadline);
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace
}  // namespace tandem

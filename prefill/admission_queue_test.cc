#include "prefill/admission_queue.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem::prefill {
namespace {

// One waiter's answer, when it came.
struct Answered {
  std::optional<absl::StatusOr<std::string>> result;
  AdmissionQueue::Answer Callback() {
    return [this](absl::StatusOr<std::string> r) {
      ASSERT_FALSE(result.has_value()) << "answered twice";
      result = std::move(r);
    };
  }
  bool admitted() const { return result.has_value() && result->ok(); }
};

const absl::Time kFar = absl::InfiniteFuture();

TEST(AdmissionQueueTest, AdmitsWithinTheWindowAndMoreAsSlotsEnd) {
  auto queue = AdmissionQueue::Create({.window_tokens = 100});
  AdmissionQueue& q = *queue;
  Answered a, b, c;
  q.Wait("a", 0, 60, kFar, a.Callback());
  q.Wait("b", 0, 30, kFar, b.Callback());
  q.Wait("c", 0, 30, kFar, c.Callback());
  EXPECT_TRUE(a.admitted());
  EXPECT_TRUE(b.admitted());
  EXPECT_FALSE(c.result.has_value());  // 60 + 30 + 30 > 100
  EXPECT_EQ(q.stats().waiting, 1);
  EXPECT_EQ(q.stats().waiting_tokens, 30);
  EXPECT_EQ(q.stats().window_used_tokens, 90);
  // Claiming keeps the tokens in the window; the slot's end gives them back.
  std::unique_ptr<AdmissionQueue::Slot> slot = q.Claim(**a.result, "a", 60);
  EXPECT_FALSE(c.result.has_value());
  slot.reset();
  EXPECT_TRUE(c.admitted());
  EXPECT_EQ(q.stats().window_used_tokens, 60);
  EXPECT_NE(**b.result, **c.result);  // tickets are distinct
}

TEST(AdmissionQueueTest, APromptLongerThanTheWindowIsAdmittedAlone) {
  auto queue = AdmissionQueue::Create({.window_tokens = 100});
  AdmissionQueue& q = *queue;
  Answered small, big;
  q.Wait("small", 0, 10, kFar, small.Callback());
  q.Wait("big", 0, 500, kFar, big.Callback());
  EXPECT_TRUE(small.admitted());
  EXPECT_FALSE(big.result.has_value());
  q.Drop(**small.result);
  EXPECT_TRUE(big.admitted());
}

TEST(AdmissionQueueTest, PriorityFirstThenArrivalAndNoOvertaking) {
  auto queue = AdmissionQueue::Create({.window_tokens = 100});
  AdmissionQueue& q = *queue;
  Answered first, late_urgent, early_lax, small_lax;
  q.Wait("first", 0, 100, kFar, first.Callback());  // fills the window
  q.Wait("lax", 5, 80, kFar, early_lax.Callback());
  q.Wait("urgent", 1, 90, kFar, late_urgent.Callback());
  q.Wait("small", 5, 5, kFar, small_lax.Callback());
  q.Drop(**first.result);
  // The more urgent one goes first although it came later; the small one, which would fit
  // beside it, does not overtake the 80-token one ahead of it.
  EXPECT_TRUE(late_urgent.admitted());
  EXPECT_FALSE(early_lax.result.has_value());
  EXPECT_FALSE(small_lax.result.has_value());
  q.Drop(**late_urgent.result);
  EXPECT_TRUE(early_lax.admitted());
  EXPECT_TRUE(small_lax.admitted());
}

TEST(AdmissionQueueTest, CancelRemovesAWaiterAndUnblocksThoseBehind) {
  auto queue = AdmissionQueue::Create({.window_tokens = 100});
  AdmissionQueue& q = *queue;
  Answered a, blocker, behind;
  q.Wait("a", 0, 50, kFar, a.Callback());
  const int64_t id = q.Wait("blocker", 0, 90, kFar, blocker.Callback());
  q.Wait("behind", 0, 40, kFar, behind.Callback());
  EXPECT_FALSE(behind.result.has_value());
  EXPECT_TRUE(q.Cancel(id));
  EXPECT_FALSE(blocker.result.has_value());  // a cancelled waiter is never answered
  EXPECT_TRUE(behind.admitted());
  EXPECT_FALSE(q.Cancel(id));  // once
  EXPECT_EQ(q.stats().waiting, 0);
  EXPECT_EQ(q.stats().waiting_tokens, 0);
}

TEST(AdmissionQueueTest, UnclaimedTicketsLapseAndWaitersExpire) {
  auto queue = AdmissionQueue::Create({.window_tokens = 100, .ticket_lease = absl::Seconds(30)});
  AdmissionQueue& q = *queue;
  const absl::Time now = absl::Now();
  Answered held, queued;
  q.Wait("held", 0, 100, kFar, held.Callback());
  q.Wait("queued", 0, 10, now + absl::Seconds(5), queued.Callback());
  ASSERT_TRUE(held.admitted());
  // Before the lease: nothing lapses; the next event is the waiter's deadline.
  EXPECT_LE(q.Expire(now), now + absl::Seconds(5));
  EXPECT_FALSE(queued.result.has_value());
  // Past the waiter's deadline, before the lease: it gets DEADLINE_EXCEEDED.
  q.Expire(now + absl::Seconds(6));
  ASSERT_TRUE(queued.result.has_value());
  EXPECT_EQ(queued.result->status().code(), absl::StatusCode::kDeadlineExceeded);
  // Past the lease: the ticket's tokens come back.
  EXPECT_EQ(q.Expire(now + absl::Seconds(31)), absl::InfiniteFuture());
  EXPECT_EQ(q.stats().window_used_tokens, 0);
  EXPECT_EQ(q.stats().lapsed, 1);
  // A lapsed ticket is still served when it is claimed, and counts again from then on.
  std::unique_ptr<AdmissionQueue::Slot> slot = q.Claim(**held.result, "held", 100);
  EXPECT_EQ(q.stats().window_used_tokens, 100);
  slot.reset();
  EXPECT_EQ(q.stats().window_used_tokens, 0);
}

TEST(AdmissionQueueTest, AForeignTicketDoesNotFreeAnothersShare) {
  auto queue = AdmissionQueue::Create({.window_tokens = 100});
  AdmissionQueue& q = *queue;
  Answered a;
  q.Wait("a", 0, 40, kFar, a.Callback());
  // Request "b" presents a's ticket: served, counted on its own, and a's ticket stays live.
  std::unique_ptr<AdmissionQueue::Slot> b = q.Claim(**a.result, "b", 30);
  EXPECT_EQ(q.stats().window_used_tokens, 70);
  std::unique_ptr<AdmissionQueue::Slot> a_slot = q.Claim(**a.result, "a", 40);
  EXPECT_EQ(q.stats().window_used_tokens, 70);
  b.reset();
  a_slot.reset();
  EXPECT_EQ(q.stats().window_used_tokens, 0);
}

TEST(AdmissionQueueTest, CloseAnswersEveryoneUnavailable) {
  auto queue = AdmissionQueue::Create({.window_tokens = 10});
  AdmissionQueue& q = *queue;
  Answered a, b, later;
  q.Wait("a", 0, 10, kFar, a.Callback());
  q.Wait("b", 0, 10, kFar, b.Callback());
  q.Close();
  ASSERT_TRUE(b.result.has_value());
  EXPECT_EQ(b.result->status().code(), absl::StatusCode::kUnavailable);
  q.Wait("later", 0, 1, kFar, later.Callback());
  ASSERT_TRUE(later.result.has_value());
  EXPECT_EQ(later.result->status().code(), absl::StatusCode::kUnavailable);
}

TEST(AdmissionQueueTest, ZeroWindowAdmitsEveryoneAtOnce) {
  auto queue = AdmissionQueue::Create({.window_tokens = 0});
  AdmissionQueue& q = *queue;
  std::vector<Answered> all(50);
  for (size_t i = 0; i < all.size(); ++i) {
    q.Wait(absl::StrCat("r", i), 0, 1000, kFar, all[i].Callback());
  }
  for (const Answered& a : all) EXPECT_TRUE(a.admitted());
}

}  // namespace
}  // namespace tandem::prefill

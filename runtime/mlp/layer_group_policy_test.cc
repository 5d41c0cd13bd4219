#include "runtime/mlp/layer_group_policy.h"

#include <gtest/gtest.h>

namespace tandem::mlp {
namespace {

class LayerGroupPolicyTest : public ::testing::Test {
 protected:
  GroupReady Ready(int layer, const std::vector<int>& members, int rows = 64) {
    return GroupReadiness(policy_, layer, members, rows, opened_, sessions_, now_);
  }
  LayerGroupPolicy policy_{
      .window = absl::Microseconds(200), .idle = absl::Milliseconds(20), .max_rows = 256};
  absl::Time opened_ = absl::FromUnixSeconds(1000);
  absl::Time now_ = opened_ + absl::Microseconds(10);
  std::map<int, GroupSession> sessions_;
};

TEST_F(LayerGroupPolicyTest, ALoneSessionNeverWaits) {
  sessions_[0] = {.last_layer = 5, .last_call = now_};
  EXPECT_EQ(Ready(5, {0}), GroupReady::kAll);
}

TEST_F(LayerGroupPolicyTest, AnActiveSessionBehindIsWaitedForWithinTheWindow) {
  sessions_[0] = {.last_layer = 6, .last_call = now_};
  sessions_[1] = {.last_layer = 4, .last_call = now_ - absl::Milliseconds(1)};
  EXPECT_EQ(Ready(6, {0}), GroupReady::kWait);
  now_ = opened_ + absl::Microseconds(200);
  EXPECT_EQ(Ready(6, {0}), GroupReady::kWindow);
}

TEST_F(LayerGroupPolicyTest, TheSessionBehindCatchesUpAndJoins) {
  // Worker 1 is behind at layer 4: its group is queued at once (worker 0 is ahead, at 6), and so
  // is layer 5's; at layer 6 it joins worker 0's waiting call and the group is complete.
  sessions_[0] = {.last_layer = 6, .last_call = now_};
  sessions_[1] = {.last_layer = 4, .last_call = now_};
  EXPECT_EQ(Ready(4, {1}), GroupReady::kAll);
  sessions_[1].last_layer = 5;
  EXPECT_EQ(Ready(5, {1}), GroupReady::kAll);
  EXPECT_EQ(Ready(6, {0}), GroupReady::kWait);
  sessions_[1].last_layer = 6;
  EXPECT_EQ(Ready(6, {0, 1}), GroupReady::kAll);
}

TEST_F(LayerGroupPolicyTest, IdleAndAheadSessionsAreNotWaitedFor) {
  sessions_[0] = {.last_layer = 3, .last_call = now_};
  sessions_[1] = {.last_layer = 0, .last_call = now_ - absl::Milliseconds(21)};  // idle
  sessions_[2] = {.last_layer = 9, .last_call = now_};                           // ahead
  sessions_[3] = {.last_layer = 3, .last_call = now_};  // served at 3 already
  EXPECT_EQ(Ready(3, {0}), GroupReady::kAll);
  sessions_[4] = {};  // attached, never called
  EXPECT_EQ(Ready(3, {0}), GroupReady::kAll);
}

TEST_F(LayerGroupPolicyTest, AFullGroupIsQueuedAtOnce) {
  sessions_[0] = {.last_layer = 6, .last_call = now_};
  sessions_[1] = {.last_layer = 2, .last_call = now_};
  EXPECT_EQ(Ready(6, {0}, 255), GroupReady::kWait);
  EXPECT_EQ(Ready(6, {0}, 256), GroupReady::kFull);
}

TEST_F(LayerGroupPolicyTest, AZeroWindowNeverWaits) {
  policy_.window = absl::ZeroDuration();
  now_ = opened_;
  sessions_[0] = {.last_layer = 6, .last_call = now_};
  sessions_[1] = {.last_layer = 2, .last_call = now_};
  EXPECT_EQ(Ready(6, {0}), GroupReady::kWindow);
}

}  // namespace
}  // namespace tandem::mlp

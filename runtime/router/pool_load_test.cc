#include "runtime/router/pool_load.h"

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

WorkerSnapshot Decode(int used, int total, int running, int waiting, bool healthy = true) {
  WorkerSnapshot w;
  w.healthy = healthy;
  w.live = healthy;
  w.kv_blocks_total = total;
  w.kv_blocks_free = total - used;
  w.running = running;
  w.queue_depth = waiting;
  return w;
}

TEST(PoolLoadTest, DecodeSaturationIsKvUseAndQueuePressure) {
  // Half full and no queue, on two workers: 0.5 each; 2 * 0.5 / 0.8 -> 2 (ceil 1.25).
  PoolLoad load = EstimatePoolLoad({Decode(50, 100, 4, 0), Decode(50, 100, 4, 0)}, "decode");
  EXPECT_EQ(load.healthy, 2);
  EXPECT_DOUBLE_EQ(load.saturation, 0.5);
  EXPECT_EQ(load.recommended, 2);
  // Full with as many waiting as running: 2 each -> 2 * 2 / 0.8 = 5 workers.
  load = EstimatePoolLoad({Decode(100, 100, 8, 8), Decode(100, 100, 8, 8)}, "decode");
  EXPECT_DOUBLE_EQ(load.saturation, 2.0);
  EXPECT_EQ(load.recommended, 5);
  // Idle: one worker is enough.
  load = EstimatePoolLoad({Decode(0, 100, 0, 0), Decode(0, 100, 0, 0)}, "decode");
  EXPECT_EQ(load.recommended, 1);
  // Unhealthy workers count as known, not in the mean.
  load = EstimatePoolLoad({Decode(80, 100, 4, 0), Decode(0, 100, 0, 0, false)}, "decode");
  EXPECT_EQ(load.known, 2);
  EXPECT_EQ(load.healthy, 1);
  EXPECT_DOUBLE_EQ(load.saturation, 0.8);
  EXPECT_EQ(load.recommended, 1);
}

TEST(PoolLoadTest, PrefillSaturationIsTheTokenBacklog) {
  WorkerSnapshot busy;
  busy.healthy = true;
  busy.prompt_tokens_waiting = 16384;
  WorkerSnapshot idle;
  idle.healthy = true;
  PoolLoad load = EstimatePoolLoad({busy, idle}, "prefill");
  EXPECT_DOUBLE_EQ(load.saturation, 1.0);  // (2 + 0) / 2 at 8192 tokens per worker
  EXPECT_EQ(load.recommended, 3);          // ceil(2 * 1 / 0.8)
}

TEST(PoolLoadTest, NoHealthyWorker) {
  PoolLoad load = EstimatePoolLoad({Decode(0, 100, 0, 0, false)}, "decode");
  EXPECT_EQ(load.healthy, 0);
  EXPECT_EQ(load.saturation, 0);
  EXPECT_EQ(load.recommended, 1);
  EXPECT_EQ(EstimatePoolLoad({}, "decode").recommended, 1);
}

}  // namespace
}  // namespace tandem::router

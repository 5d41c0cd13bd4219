#include "runtime/router/routing_policy.h"

#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

WorkerSnapshot Decode(std::string address, int running, int waiting, int free_blocks,
                      int block_size = 16) {
  WorkerSnapshot w;
  w.address = std::move(address);
  w.healthy = true;
  w.running = running;
  w.queue_depth = waiting;
  w.kv_blocks_free = free_blocks;
  w.kv_blocks_total = 1000;
  w.block_size = block_size;
  return w;
}

TEST(RoutingPolicyTest, ParsesNames) {
  EXPECT_EQ(*ParseRoutingPolicy("round-robin"), RoutingPolicy::kRoundRobin);
  EXPECT_EQ(*ParseRoutingPolicy("least-loaded"), RoutingPolicy::kLeastLoaded);
  EXPECT_EQ(ParseRoutingPolicy("random").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RoutingPolicyName(RoutingPolicy::kLeastLoaded), "least-loaded");
}

TEST(RoutingPolicyTest, RoundRobinCyclesOverHealthyWorkers) {
  std::vector<WorkerSnapshot> w = {Decode("a:1", 0, 0, 10), Decode("b:1", 0, 0, 10),
                                   Decode("c:1", 0, 0, 10)};
  w[1].healthy = false;
  std::vector<int> picks;
  for (uint64_t cursor = 0; cursor < 6; ++cursor) {
    picks.push_back(PickDecodeWorker(RoutingPolicy::kRoundRobin, w, 5, cursor));
  }
  // Cursor 1 lands on the unhealthy b and moves on to c.
  EXPECT_EQ(picks, (std::vector<int>{0, 2, 2, 0, 2, 2}));
  EXPECT_EQ(PickPrefillWorker(RoutingPolicy::kRoundRobin, w, 3), 0);
}

TEST(RoutingPolicyTest, NoHealthyWorkerIsNoWorker) {
  std::vector<WorkerSnapshot> w = {Decode("a:1", 0, 0, 10)};
  w[0].healthy = false;
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kLeastLoaded, w, 1, 0), kNoWorker);
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kRoundRobin, w, 1, 0), kNoWorker);
  EXPECT_EQ(PickPrefillWorker(RoutingPolicy::kLeastLoaded, w, 0), kNoWorker);
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kLeastLoaded, {}, 1, 0), kNoWorker);
}

TEST(RoutingPolicyTest, LeastLoadedDecodePrefersKvHeadroomOverLoad) {
  // A 100-token prompt needs 7 blocks of 16. "a" is idle but has only 6 free blocks.
  std::vector<WorkerSnapshot> w = {Decode("a:1", 0, 0, 6), Decode("b:1", 5, 2, 7)};
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kLeastLoaded, w, 100, 0), 1);
  // A 96-token prompt needs exactly 6 blocks: both fit, so the idle one wins.
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kLeastLoaded, w, 96, 0), 0);
}

TEST(RoutingPolicyTest, LeastLoadedDecodeCountsRunningWaitingAndRouterStreams) {
  std::vector<WorkerSnapshot> w = {Decode("a:1", 3, 1, 50), Decode("b:1", 2, 1, 50),
                                   Decode("c:1", 0, 0, 50)};
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kLeastLoaded, w, 10, 0), 2);
  // The router just sent 5 streams to c that its stats do not show yet.
  w[2].router_inflight = 5;
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kLeastLoaded, w, 10, 0), 1);
}

TEST(RoutingPolicyTest, LeastLoadedDecodeBreaksTiesByFreeBlocksThenCursor) {
  std::vector<WorkerSnapshot> w = {Decode("a:1", 1, 0, 20), Decode("b:1", 1, 0, 30)};
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kLeastLoaded, w, 10, 0), 1);
  w[0].kv_blocks_free = 30;
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kLeastLoaded, w, 10, 0), 0);
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kLeastLoaded, w, 10, 1), 1);
}

TEST(RoutingPolicyTest, LeastLoadedDecodeWithNoRoomStillPicksSomeone) {
  // Nobody can hold the prompt now; the least loaded one queues it rather than failing.
  std::vector<WorkerSnapshot> w = {Decode("a:1", 4, 0, 1), Decode("b:1", 1, 0, 0)};
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kLeastLoaded, w, 1000, 0), 1);
}

TEST(RoutingPolicyTest, LeastLoadedPrefillPrefersFewestWaitingPromptTokens) {
  std::vector<WorkerSnapshot> w = {Decode("a:1", 0, 1, 0), Decode("b:1", 0, 3, 0),
                                   Decode("c:1", 0, 0, 0)};
  w[0].prompt_tokens_waiting = 4000;
  w[1].prompt_tokens_waiting = 300;
  w[2].prompt_tokens_waiting = 300;
  w[2].running = 1;
  // b and c wait on the same tokens; c has the shorter queue (0 waiting + 1 running < 3).
  EXPECT_EQ(PickPrefillWorker(RoutingPolicy::kLeastLoaded, w, 0), 2);
  w[2].router_inflight = 4;
  EXPECT_EQ(PickPrefillWorker(RoutingPolicy::kLeastLoaded, w, 0), 1);
}

TEST(RoutingPolicyTest, LocalPrefillThreshold) {
  EXPECT_FALSE(PrefillLocallyForLength(3, 0));
  EXPECT_TRUE(PrefillLocallyForLength(31, 32));
  EXPECT_FALSE(PrefillLocallyForLength(32, 32));
}

TEST(RoutingPolicyTest, BlocksForTokens) {
  EXPECT_EQ(BlocksForTokens(0, 16), 0);
  EXPECT_EQ(BlocksForTokens(1, 16), 1);
  EXPECT_EQ(BlocksForTokens(16, 16), 1);
  EXPECT_EQ(BlocksForTokens(17, 16), 2);
  EXPECT_EQ(BlocksForTokens(17, 0), 0);
}

}  // namespace
}  // namespace tandem::router

namespace tandem::router {
namespace {

TEST(KvAwareRoutingTest, ParsesName) {
  EXPECT_EQ(*ParseRoutingPolicy("kv-aware"), RoutingPolicy::kKvAware);
  EXPECT_EQ(RoutingPolicyName(RoutingPolicy::kKvAware), "kv-aware");
}

TEST(KvAwareRoutingTest, FollowsTheCachedPrefixUntilLoadOutweighsIt) {
  // An 832-token prompt whose 800-token prefix "b" holds.
  // "a"'s free blocks all hold other cached prefixes, so a miss there evicts: weight 1.
  std::vector<WorkerSnapshot> w = {Decode("a:1", 0, 0, 500), Decode("b:1", 3, 0, 500)};
  w[0].kv_blocks_cached_idle = 500;
  w[1].cached_prefix_tokens = 800;
  const KvAwareOptions options{.request_cost_tokens = 64};
  // a: 800 + 0; b: 0 + 3 * 64 = 192.
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, 832, 0, options), 1);
  // b now has 13 requests: 832 > 800.
  w[1].running = 13;
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, 832, 0, options), 0);
  // The router's own open streams count when they exceed the worker's (stale) stats.
  w[1].running = 0;
  w[1].router_inflight = 20;
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, 832, 0, options), 0);
}

TEST(KvAwareRoutingTest, ReplicatesAHotPrefixIntoEmptyRoomSooner) {
  // 832 tokens = 52 blocks of 16. "b" caches 800 of them; "a" has 100 empty blocks.
  std::vector<WorkerSnapshot> w = {Decode("a:1", 0, 0, 100), Decode("b:1", 3, 0, 500)};
  w[1].cached_prefix_tokens = 800;
  const KvAwareOptions options{.request_cost_tokens = 64, .replicate_weight = 0.25};
  // a: 0.25 * 800 = 200; b: 3 * 64 = 192.
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, 832, 0, options), 1);
  // b: 4 * 64 = 256 > 200: the prefix gets a second home (with weight 1 it would take 13).
  w[1].running = 4;
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, 832, 0, options), 0);
  // The same free blocks, but holding other prefixes: replicating evicts them, weight 1.
  w[0].kv_blocks_cached_idle = 90;
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, 832, 0, options), 1);
  // Stats from a worker are untrusted: nonsense counts are clamped, not trusted.
  w[0].kv_blocks_cached_idle = -5;
  w[1].cached_prefix_tokens = 1 << 30;
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, 832, 0, options), 0);
  w[0].kv_blocks_cached_idle = 1 << 30;
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, 832, 0, options), 1);
}

TEST(KvAwareRoutingTest, WithoutReuseItIsLeastLoadedAndSpreadsTies) {
  std::vector<WorkerSnapshot> w = {Decode("a:1", 2, 0, 500), Decode("b:1", 1, 0, 500)};
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, 100, 0), 1);
  w[0].running = 1;
  std::vector<int> picks;
  for (uint64_t cursor = 0; cursor < 4; ++cursor) {
    picks.push_back(PickDecodeWorker(RoutingPolicy::kKvAware, w, 100, cursor));
  }
  EXPECT_EQ(picks, (std::vector<int>{0, 1, 0, 1}));
}

TEST(KvAwareRoutingTest, WithoutReuseEveryDecisionIsLeastLoaded) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<WorkerSnapshot> w;
    for (int i = 0; i < 4; ++i) {
      w.push_back(Decode(absl::StrCat("w", i, ":1"), rng() % 4, rng() % 3, rng() % 80));
      w.back().kv_blocks_cached_idle = rng() % 80;
      w.back().router_inflight = rng() % 6;
      w.back().healthy = rng() % 5 != 0;
    }
    const int prompt = 1 + rng() % 1000;
    const uint64_t cursor = rng();
    ASSERT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, prompt, cursor),
              PickDecodeWorker(RoutingPolicy::kLeastLoaded, w, prompt, cursor))
        << "trial " << trial;
  }
}

TEST(KvAwareRoutingTest, KvHeadroomCountsOnlyTheUncachedBlocks) {
  // 160 tokens = 10 blocks of 16; "a" has 4 free blocks but caches 128 tokens (8 blocks):
  // it needs only 2 more. "b" is idle and has room, but "a" is cheaper.
  std::vector<WorkerSnapshot> w = {Decode("a:1", 0, 0, 4), Decode("b:1", 0, 0, 100)};
  w[0].cached_prefix_tokens = 128;
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, 160, 0), 0);
  // Without the cache "a" cannot hold the prompt: the one that fits wins whatever the cost.
  w[0].cached_prefix_tokens = 0;
  w[1].running = 50;
  EXPECT_EQ(PickDecodeWorker(RoutingPolicy::kKvAware, w, 160, 0), 1);
}

TEST(KvAwareRoutingTest, PrefillSideWeighsCachedPrefixAgainstQueuedTokens) {
  std::vector<WorkerSnapshot> w = {Decode("p0:1", 0, 0, 500), Decode("p1:1", 0, 1, 500)};
  w[1].cached_prefix_tokens = 768;
  w[1].prompt_tokens_waiting = 300;
  // p0: 800; p1: 32 + 300 + 64 = 396.
  EXPECT_EQ(PickPrefillWorker(RoutingPolicy::kKvAware, w, 0, 800), 1);
  w[1].prompt_tokens_waiting = 1000;
  EXPECT_EQ(PickPrefillWorker(RoutingPolicy::kKvAware, w, 0, 800), 0);
}

TEST(KvAwareRoutingTest, ConditionalDisaggregationLooksAtTheUncachedPart) {
  EXPECT_TRUE(PrefillLocallyForLength(832 - 800, 64));
  EXPECT_FALSE(PrefillLocallyForLength(832, 64));
  EXPECT_FALSE(PrefillLocallyForLength(10, 0)) << "0 turns it off";
}

}  // namespace
}  // namespace tandem::router

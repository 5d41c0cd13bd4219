#include "runtime/router/prefix_index.h"

#include <vector>

#include "gtest/gtest.h"
#include "runtime/kvcache/block_pool.h"

namespace tandem::router {
namespace {

using Kind = PrefixCacheEvent::Kind;

PrefixCacheDelta Delta(uint64_t first, std::vector<PrefixCacheEvent> events, bool reset = false) {
  PrefixCacheDelta d;
  d.reset = reset;
  d.first_seq = first;
  d.last_seq = reset ? first : first + events.size() - 1;
  if (!reset && events.empty()) d.last_seq = first - 1;
  d.events = std::move(events);
  return d;
}

std::vector<PrefixCacheEvent> StoredAll(const std::vector<uint64_t>& hashes) {
  std::vector<PrefixCacheEvent> out;
  for (uint64_t h : hashes) out.push_back({.kind = Kind::kStored, .block_hash = h});
  return out;
}

TEST(WorkerPrefixIndexTest, MatchesLeadingCachedBlocksOfAPrompt) {
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[i] = 100 + i;
  const std::vector<uint64_t> hashes = PrefixBlockHashes(prompt, 8, 100);
  ASSERT_EQ(hashes.size(), 5u);

  WorkerPrefixIndex index;
  EXPECT_FALSE(index.synced());
  EXPECT_EQ(index.MatchedBlocks(hashes), 0);
  // Snapshot: the first three blocks are cached.
  ASSERT_TRUE(index.Apply(Delta(9, StoredAll({hashes[0], hashes[1], hashes[2]}), true)).ok());
  EXPECT_TRUE(index.synced());
  EXPECT_EQ(index.MatchedBlocks(hashes), 3);
  // Block 1 evicted: the match stops before it, as the worker's lookup would.
  ASSERT_TRUE(index.Apply(Delta(10, {{.kind = Kind::kRemoved, .block_hash = hashes[1]}})).ok());
  EXPECT_EQ(index.MatchedBlocks(hashes), 1);
  // An empty delta (nothing changed) keeps the cursor.
  ASSERT_TRUE(index.Apply(Delta(11, {})).ok());
  ASSERT_TRUE(index.Apply(Delta(11, StoredAll({hashes[1], hashes[3], hashes[4]}))).ok());
  EXPECT_EQ(index.MatchedBlocks(hashes), 5);
  // A different prompt shares nothing.
  std::vector<int32_t> other(prompt.rbegin(), prompt.rend());
  EXPECT_EQ(index.MatchedBlocks(PrefixBlockHashes(other, 8, 100)), 0);
}

TEST(WorkerPrefixIndexTest, GapClearsTheViewUntilTheNextSnapshot) {
  WorkerPrefixIndex index;
  EXPECT_FALSE(index.Apply(Delta(1, StoredAll({1}))).ok()) << "a delta before any snapshot";
  ASSERT_TRUE(index.Apply(Delta(0, {}, true)).ok());
  ASSERT_TRUE(index.Apply(Delta(1, StoredAll({1, 2}))).ok());
  EXPECT_EQ(index.num_blocks(), 2u);
  const absl::Status gap = index.Apply(Delta(5, StoredAll({3})));  // 3 and 4 were missed
  EXPECT_EQ(gap.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(gap.message().find("gap"), std::string::npos);
  EXPECT_FALSE(index.synced());
  EXPECT_EQ(index.num_blocks(), 0u);
  const uint64_t probe[] = {1};
  EXPECT_EQ(index.MatchedBlocks(probe), 0) << "an unsynced view matches nothing";
  ASSERT_TRUE(index.Apply(Delta(5, StoredAll({1, 3}), true)).ok());
  EXPECT_EQ(index.MatchedBlocks(probe), 1);
  EXPECT_EQ(index.resyncs(), 0) << "the view was empty when this snapshot came";
  ASSERT_TRUE(index.Apply(Delta(9, StoredAll({1}), true)).ok());
  EXPECT_EQ(index.resyncs(), 1);
  EXPECT_EQ(index.num_blocks(), 1u);
}

TEST(WorkerPrefixIndexTest, InconsistentDeltaIsAGap) {
  WorkerPrefixIndex index;
  ASSERT_TRUE(index.Apply(Delta(0, {}, true)).ok());
  PrefixCacheDelta lying = Delta(1, StoredAll({1, 2}));
  lying.last_seq = 7;  // claims more events than it carries
  EXPECT_FALSE(index.Apply(lying).ok());
  EXPECT_FALSE(index.synced());
}

}  // namespace
}  // namespace tandem::router

namespace tandem::router {
namespace {

TEST(WorkerPrefixIndexTest, RoutedPromptsCountUntilEventsSettleThemOrTheyExpire) {
  WorkerPrefixIndex index;
  const uint64_t hashes[] = {11, 12, 13};
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  index.NoteRouted(hashes, t0 + absl::Seconds(2));
  EXPECT_EQ(index.MatchedBlocks(hashes, t0), 0) << "an unsynced view matches nothing";
  ASSERT_TRUE(index.Apply(Delta(0, {}, true)).ok());
  index.NoteRouted(hashes, t0 + absl::Seconds(2));
  EXPECT_EQ(index.num_pending(), 3u);
  EXPECT_EQ(index.MatchedBlocks(hashes, t0), 3);
  EXPECT_EQ(index.MatchedBlocks(hashes, t0 + absl::Seconds(3)), 0) << "expired";
  // The worker stores the first two and evicts the third before the deadline.
  ASSERT_TRUE(index
                  .Apply(Delta(1, {{.kind = Kind::kStored, .block_hash = 11},
                                   {.kind = Kind::kStored, .block_hash = 12},
                                   {.kind = Kind::kRemoved, .block_hash = 13}}))
                  .ok());
  EXPECT_EQ(index.num_pending(), 0u);
  EXPECT_EQ(index.MatchedBlocks(hashes, t0), 2);
  EXPECT_EQ(index.MatchedBlocks(hashes, t0 + absl::Hours(1)), 2) << "confirmed blocks never expire";
  index.NoteRouted(hashes, t0 + absl::Seconds(2));
  EXPECT_EQ(index.num_pending(), 1u) << "only the block not already cached";
  index.Clear();
  EXPECT_EQ(index.num_pending(), 0u);
}

}  // namespace
}  // namespace tandem::router

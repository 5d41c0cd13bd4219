#include "runtime/kvcache/prefix_cache_events.h"

#include <numeric>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "runtime/kvcache/block_pool.h"

namespace tandem {
namespace {

using Kind = PrefixCacheEvent::Kind;

PrefixCacheEvent Stored(uint64_t h) { return {.kind = Kind::kStored, .block_hash = h}; }
PrefixCacheEvent Removed(uint64_t h) { return {.kind = Kind::kRemoved, .block_hash = h}; }

// A reader as the router keeps one: applies deltas in order, replaces on reset, and reports a
// gap instead of applying a delta that does not follow its cursor.
struct Reader {
  std::optional<uint64_t> cursor;
  std::set<uint64_t> cached;
  bool Apply(const PrefixCacheDelta& d) {
    if (d.reset) {
      cached.clear();
    } else if (!cursor.has_value() || d.first_seq != *cursor + 1) {
      return false;
    }
    for (const PrefixCacheEvent& e : d.events) {
      if (e.kind == Kind::kStored) {
        cached.insert(e.block_hash);
      } else {
        cached.erase(e.block_hash);
      }
    }
    cursor = d.last_seq;
    return true;
  }
};

TEST(PrefixCacheEventLogTest, NewReaderGetsSnapshotThenDeltas) {
  PrefixCacheEventLog log(16);
  std::vector<PrefixCacheEvent> first = {Stored(1), Stored(2), Stored(3), Removed(2)};
  log.Append(first);
  EXPECT_EQ(log.last_seq(), 4u);
  EXPECT_EQ(log.num_cached(), 2u);

  Reader reader;
  PrefixCacheDelta snap = log.ReadSince(std::nullopt, 100);
  EXPECT_TRUE(snap.reset);
  EXPECT_EQ(snap.last_seq, 4u);
  ASSERT_TRUE(reader.Apply(snap));
  EXPECT_EQ(reader.cached, (std::set<uint64_t>{1, 3}));

  std::vector<PrefixCacheEvent> second = {Stored(7), Removed(1)};
  log.Append(second);
  PrefixCacheDelta delta = log.ReadSince(reader.cursor, 100);
  EXPECT_FALSE(delta.reset);
  EXPECT_EQ(delta.first_seq, 5u);
  EXPECT_EQ(delta.last_seq, 6u);
  EXPECT_EQ(delta.events, second);
  ASSERT_TRUE(reader.Apply(delta));
  EXPECT_EQ(reader.cached, (std::set<uint64_t>{3, 7}));

  // Nothing new: an empty delta that keeps the cursor.
  PrefixCacheDelta empty = log.ReadSince(reader.cursor, 100);
  EXPECT_FALSE(empty.reset);
  EXPECT_TRUE(empty.events.empty());
  EXPECT_EQ(empty.last_seq, 6u);
}

TEST(PrefixCacheEventLogTest, MaxEventsSplitsDeltasInOrder) {
  PrefixCacheEventLog log(64);
  std::vector<PrefixCacheEvent> events;
  for (uint64_t h = 1; h <= 10; ++h) events.push_back(Stored(h));
  Reader reader;
  ASSERT_TRUE(reader.Apply(log.ReadSince(std::nullopt, 4)));  // empty snapshot at seq 0
  log.Append(events);
  int reads = 0;
  while (*reader.cursor < log.last_seq()) {
    PrefixCacheDelta d = log.ReadSince(reader.cursor, 4);
    EXPECT_LE(d.events.size(), 4u);
    ASSERT_TRUE(reader.Apply(d));
    ++reads;
  }
  EXPECT_EQ(reads, 3);
  EXPECT_EQ(reader.cached.size(), 10u);
}

TEST(PrefixCacheEventLogTest, ReaderBehindTheRingGetsASnapshot) {
  PrefixCacheEventLog log(4);
  Reader reader;
  ASSERT_TRUE(reader.Apply(log.ReadSince(std::nullopt, 100)));
  std::vector<PrefixCacheEvent> events = {Stored(1), Stored(2), Stored(3),
                                          Stored(4), Stored(5), Removed(1)};
  log.Append(events);  // seq 1..6; the ring keeps 3..6
  PrefixCacheDelta d = log.ReadSince(reader.cursor, 100);
  EXPECT_TRUE(d.reset) << "events 1 and 2 are gone: a delta would have a hole";
  ASSERT_TRUE(reader.Apply(d));
  EXPECT_EQ(reader.cached, (std::set<uint64_t>{2, 3, 4, 5}));
  EXPECT_EQ(*reader.cursor, 6u);
  // A cursor from the future (another process's numbering) also resyncs.
  EXPECT_TRUE(log.ReadSince(uint64_t{1000}, 100).reset);
}

TEST(PrefixCacheEventLogTest, ReaderDetectsAGapInsteadOfApplyingIt) {
  PrefixCacheEventLog log(64);
  std::vector<PrefixCacheEvent> events = {Stored(1), Stored(2), Stored(3)};
  log.Append(events);
  Reader reader;
  reader.cursor = 0;
  PrefixCacheDelta later = log.ReadSince(uint64_t{1}, 100);  // starts at seq 2
  EXPECT_FALSE(reader.Apply(later));
  EXPECT_TRUE(reader.cached.empty());
}

// The events a KvCacheManager records, replayed into a reader, always equal the hashes the pool
// has cached: random admissions, commits, frees and evictions.
TEST(PrefixCacheEventLogTest, ReplayedEventsTrackThePoolUnderChurn) {
  constexpr int kBlockSize = 4;
  KvCacheManager kv(/*num_blocks=*/24, kBlockSize, /*enable_prefix_caching=*/true);
  kv.set_record_events(true);
  PrefixCacheEventLog log(1 << 12);
  Reader reader;
  ASSERT_TRUE(reader.Apply(log.ReadSince(std::nullopt, 1 << 20)));
  std::mt19937_64 rng(7);
  std::vector<std::vector<int32_t>> prefixes(5);
  for (auto& p : prefixes) {
    p.resize(12);
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % 50);
  }
  std::set<int64_t> live;
  for (int64_t id = 0; id < 400; ++id) {
    std::vector<int32_t> tokens = prefixes[rng() % prefixes.size()];
    for (int i = 0, n = static_cast<int>(rng() % 9); i < n; ++i) {
      tokens.push_back(static_cast<int32_t>(rng() % 50));
    }
    const PrefixMatch match = kv.FindCachedPrefix(tokens);
    const int total = static_cast<int>(tokens.size());
    while (!kv.CanAllocate(id, &match, total) && !live.empty()) {
      kv.Free(*live.begin());
      live.erase(live.begin());
    }
    const PrefixMatch again = kv.FindCachedPrefix(tokens);  // frees may have evicted
    if (!kv.CanAllocate(id, &again, total)) continue;
    kv.Allocate(id, &again, total, total);
    kv.CommitComputed(id, tokens, total);
    live.insert(id);
    if (rng() % 3 == 0) {
      kv.Free(id);
      live.erase(id);
    }
    std::vector<PrefixCacheEvent> events = kv.TakeEvents();
    log.Append(events);
    ASSERT_TRUE(reader.Apply(log.ReadSince(reader.cursor, 1 << 20)));
    // Every cached hash is findable: the leading blocks of each prefix the reader believes
    // cached are exactly those the pool finds.
    for (const auto& p : prefixes) {
      std::vector<int32_t> probe = p;
      probe.push_back(0);
      const std::vector<uint64_t> hashes = PrefixBlockHashes(probe, kBlockSize, 3);
      int believed = 0;
      while (believed < static_cast<int>(hashes.size()) && reader.cached.contains(hashes[believed]))
        ++believed;
      EXPECT_EQ(believed * kBlockSize, kv.FindCachedPrefix(probe).num_tokens(kBlockSize));
    }
  }
  EXPECT_EQ(reader.cached.size(), static_cast<size_t>(kv.pool().NumCachedBlocks()));
  kv.CheckInvariants();
}

TEST(PrefixBlockHashesTest, MatchesWhatTheCacheRegisters) {
  KvCacheManager kv(8, 4, true);
  std::vector<int32_t> tokens(10);
  std::iota(tokens.begin(), tokens.end(), 3);
  const PrefixMatch none = kv.FindCachedPrefix(tokens);
  kv.Allocate(1, &none, 10, 10);
  kv.CommitComputed(1, tokens, 10);
  kv.Free(1);
  const PrefixMatch match = kv.FindCachedPrefix(tokens);
  ASSERT_EQ(match.hashes.size(), 2u);
  EXPECT_EQ(PrefixBlockHashes(tokens, 4, 100), match.hashes);  // 2 full blocks of 10 tokens
  EXPECT_EQ(PrefixBlockHashes(tokens, 4, 1).size(), 1u);
  EXPECT_TRUE(PrefixBlockHashes(tokens, 0, 100).empty());
}

}  // namespace
}  // namespace tandem

#include "runtime/kvcache/block_pool.h"

#include <map>
#include <numeric>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace tandem {
namespace {

std::vector<int32_t> Iota(int n, int start) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(BlockPoolTest, AllocateUntilEmptyThenFree) {
  BlockPool pool(4);
  std::set<int32_t> got;
  for (int i = 0; i < 4; ++i) got.insert(pool.Allocate());
  EXPECT_EQ(got, (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(pool.NumAvailable(), 0);
  EXPECT_EQ(pool.NumUsed(), 4);
  pool.Unref(2);
  EXPECT_EQ(pool.NumFree(), 1);
  EXPECT_EQ(pool.Allocate(), 2);
  pool.CheckConsistency();
}

TEST(BlockPoolTest, DoubleFreeIsCaught) {
  BlockPool pool(2);
  int32_t b = pool.Allocate();
  pool.Unref(b);
  EXPECT_DEATH(pool.Unref(b), "double free");
}

TEST(BlockPoolTest, LookupVerifiesTokensNotJustHash) {
  BlockPool pool(2);
  int32_t b = pool.Allocate();
  std::vector<int32_t> tokens = {1, 2, 3, 4};
  ASSERT_TRUE(pool.Register(b, /*hash=*/42, kRootBlockHash, tokens));
  EXPECT_EQ(pool.Lookup(42, kRootBlockHash, tokens), b);
  std::vector<int32_t> other = {1, 2, 3, 5};
  EXPECT_EQ(pool.Lookup(42, kRootBlockHash, other), -1);  // forged collision
  EXPECT_EQ(pool.Lookup(42, 7, tokens), -1);              // different parent
  EXPECT_FALSE(pool.Register(pool.Allocate(), 42, kRootBlockHash, tokens));
}

TEST(BlockPoolTest, EvictsLeastRecentlyReleasedCachedBlock) {
  BlockPool pool(3);
  std::vector<int32_t> t = {9};
  int32_t a = pool.Allocate(), b = pool.Allocate(), c = pool.Allocate();
  pool.Register(a, 1, kRootBlockHash, t);
  pool.Register(b, 2, kRootBlockHash, t);
  pool.Register(c, 3, kRootBlockHash, t);
  pool.Unref(b);  // released first: evicted first
  pool.Unref(a);
  pool.Unref(c);
  EXPECT_EQ(pool.NumCachedIdle(), 3);
  EXPECT_EQ(pool.Allocate(), b);
  EXPECT_EQ(pool.Lookup(2, kRootBlockHash, t), -1);
  EXPECT_EQ(pool.Lookup(1, kRootBlockHash, t), a);
  pool.Ref(a);  // a hit takes a out of the LRU list
  EXPECT_EQ(pool.Allocate(), c);
  EXPECT_EQ(pool.NumAvailable(), 0);
  pool.CheckConsistency();
}

TEST(KvCacheManagerTest, SharedPrefixIsReusedAndCounted) {
  KvCacheManager kv(/*num_blocks=*/8, /*block_size=*/4, /*enable_prefix_caching=*/true);
  std::vector<int32_t> a = Iota(10, 100);  // 2 full blocks + 2 tokens
  ASSERT_TRUE(kv.CanAllocate(1, nullptr, 10));
  PrefixMatch none = kv.FindCachedPrefix(a);
  EXPECT_TRUE(none.blocks.empty());
  kv.Allocate(1, &none, 10, 10);
  kv.CommitComputed(1, a, 10);
  EXPECT_EQ(kv.pool().NumCachedBlocks(), 2);

  std::vector<int32_t> b = a;
  b[9] = 7;  // same first 9 tokens
  PrefixMatch m = kv.FindCachedPrefix(b);
  ASSERT_EQ(m.blocks.size(), 2u);
  EXPECT_EQ(m.blocks[0], kv.BlockTable(1)[0]);
  EXPECT_EQ(m.blocks[1], kv.BlockTable(1)[1]);
  kv.Allocate(2, &m, 10, 10);
  EXPECT_EQ(kv.pool().ref_count(m.blocks[0]), 2);
  EXPECT_NE(kv.BlockTable(2)[2], kv.BlockTable(1)[2]);
  EXPECT_EQ(kv.counters().prefix_queries_tokens, 20);
  EXPECT_EQ(kv.counters().prefix_hit_tokens, 8);
  kv.CheckInvariants();

  // The hit leaves at least one token to compute: an exact 8-token prompt matches 1 block.
  std::vector<int32_t> exact(a.begin(), a.begin() + 8);
  EXPECT_EQ(kv.FindCachedPrefix(exact).blocks.size(), 1u);

  kv.Free(1);
  kv.Free(2);
  kv.CheckInvariants();
  EXPECT_EQ(kv.pool().NumAvailable(), 8);
  EXPECT_EQ(kv.pool().NumCachedIdle(), 2);
  // Still cached after both sequences are gone.
  EXPECT_EQ(kv.FindCachedPrefix(b).blocks.size(), 2u);
}

TEST(KvCacheManagerTest, DivergentSecondBlockMatchesOnlyFirst) {
  KvCacheManager kv(8, 4, true);
  std::vector<int32_t> a = Iota(9, 0);
  kv.Allocate(1, nullptr, 9);
  kv.CommitComputed(1, a, 9);
  std::vector<int32_t> b = a;
  b[5] = 99;
  EXPECT_EQ(kv.FindCachedPrefix(b).blocks.size(), 1u);
  // Same second block content under a different first block: no match (chained hash).
  std::vector<int32_t> c = a;
  c[0] = 99;
  EXPECT_EQ(kv.FindCachedPrefix(c).blocks.size(), 0u);
}

TEST(KvCacheManagerTest, CanAllocateCountsIdleHitBlocks) {
  KvCacheManager kv(3, 2, true);
  std::vector<int32_t> a = {1, 2, 3, 4, 5};
  kv.Allocate(1, nullptr, 5);
  kv.CommitComputed(1, a, 4);
  kv.Free(1);  // 2 cached-idle + 1 free
  PrefixMatch m = kv.FindCachedPrefix(a);
  ASSERT_EQ(m.blocks.size(), 2u);
  EXPECT_TRUE(kv.CanAllocate(2, &m, 6));   // 2 hits + 1 new = 3 blocks
  EXPECT_FALSE(kv.CanAllocate(2, &m, 7));  // would need 4
  EXPECT_FALSE(kv.CanAllocate(2, nullptr, 7));
  kv.Allocate(2, &m, 6);
  kv.CheckInvariants();
  EXPECT_EQ(kv.pool().NumAvailable(), 0);
}

TEST(KvCacheManagerTest, PrefixCachingOffNeverMatches) {
  KvCacheManager kv(4, 2, false);
  std::vector<int32_t> a = {1, 2, 3, 4, 5};
  kv.Allocate(1, nullptr, 5);
  kv.CommitComputed(1, a, 5);
  EXPECT_TRUE(kv.FindCachedPrefix(a).blocks.empty());
  kv.Free(1);
  EXPECT_EQ(kv.pool().NumFree(), 4);
  kv.CheckInvariants();
}

// Random allocate / grow / commit / free against a shadow model of the tables.
TEST(KvCacheManagerTest, RandomizedOperationsKeepRefCountsConsistent) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    KvCacheManager kv(16, 4, true);
    std::map<int64_t, std::vector<int32_t>> seqs;  // id -> tokens with KV "computed"
    int64_t next_id = 0;
    for (int op = 0; op < 3000; ++op) {
      const int kind = rng() % 3;
      if (kind == 0 || seqs.empty()) {
        // New sequence from a small alphabet so prefixes collide often.
        std::vector<int32_t> tokens(1 + rng() % 12);
        for (auto& t : tokens) t = rng() % 2;
        PrefixMatch m = kv.FindCachedPrefix(tokens);
        if (!kv.CanAllocate(next_id, &m, tokens.size())) continue;
        kv.Allocate(next_id, &m, tokens.size(), tokens.size());
        kv.CommitComputed(next_id, tokens, tokens.size());
        seqs[next_id++] = tokens;
      } else {
        auto it = std::next(seqs.begin(), rng() % seqs.size());
        if (kind == 1) {
          std::vector<int32_t>& tokens = it->second;
          if (!kv.CanAllocate(it->first, nullptr, tokens.size() + 1)) continue;
          kv.Allocate(it->first, nullptr, tokens.size() + 1);
          tokens.push_back(rng() % 2);
          kv.CommitComputed(it->first, tokens, tokens.size());
        } else {
          kv.Free(it->first);
          seqs.erase(it);
        }
      }
      kv.CheckInvariants();
      for (const auto& [id, tokens] : seqs) {
        ASSERT_EQ(kv.BlockTable(id).size(), (tokens.size() + 3) / 4);
      }
    }
    for (const auto& [id, tokens] : seqs) kv.Free(id);
    kv.CheckInvariants();
    EXPECT_EQ(kv.pool().NumAvailable(), 16);
  }
}

}  // namespace
}  // namespace tandem

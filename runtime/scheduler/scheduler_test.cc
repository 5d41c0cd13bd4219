#include "runtime/scheduler/scheduler.h"

#include <map>
#include <numeric>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace tandem {
namespace {

std::vector<int32_t> Iota(int n, int start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

SchedulerConfig Config(int num_blocks, int block_size, int budget, int max_seqs = 8) {
  SchedulerConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  return c;
}

// Runs one step, appending `token` to every sequence that gets logits.
SchedulerStep Step(Scheduler& s, int32_t token = 7) {
  SchedulerStep step = s.Schedule();
  s.OnStepComputed(step);
  for (const auto& c : step.chunks) {
    if (c.need_logits) s.AppendToken(c.seq_id, token);
  }
  s.CheckInvariants();
  return step;
}

TEST(SchedulerTest, ChunkedPrefillUnderTokenBudget) {
  Scheduler s(Config(16, 4, 8));
  s.Add(1, Iota(20));
  SchedulerStep a = Step(s);
  ASSERT_EQ(a.chunks.size(), 1u);
  EXPECT_EQ(a.chunks[0].start_pos, 0);
  EXPECT_EQ(a.chunks[0].num_tokens, 8);
  EXPECT_FALSE(a.chunks[0].need_logits);
  EXPECT_EQ(s.BlockTable(1).size(), 2u);
  SchedulerStep b = Step(s);
  EXPECT_EQ(b.chunks[0].start_pos, 8);
  EXPECT_EQ(b.chunks[0].num_tokens, 8);
  SchedulerStep c = Step(s);
  EXPECT_EQ(c.chunks[0].start_pos, 16);
  EXPECT_EQ(c.chunks[0].num_tokens, 4);
  EXPECT_TRUE(c.chunks[0].need_logits);
  SchedulerStep d = Step(s);  // decode of the sampled token
  EXPECT_EQ(d.chunks[0].start_pos, 20);
  EXPECT_EQ(d.chunks[0].num_tokens, 1);
  EXPECT_EQ(s.BlockTable(1).size(), 6u);
}

TEST(SchedulerTest, DecodesBeforePrefillChunks) {
  Scheduler s(Config(16, 4, 6));
  s.Add(1, Iota(3));
  Step(s);  // seq 1 prefilled, now decoding
  s.Add(2, Iota(10, 50));
  SchedulerStep step = Step(s);
  ASSERT_EQ(step.chunks.size(), 2u);
  EXPECT_EQ(step.chunks[0].seq_id, 1);
  EXPECT_EQ(step.chunks[0].num_tokens, 1);
  EXPECT_EQ(step.chunks[1].seq_id, 2);
  EXPECT_EQ(step.chunks[1].num_tokens, 5);
  EXPECT_EQ(step.num_batched_tokens, 6);
}

TEST(SchedulerTest, MaxRunningSequences) {
  Scheduler s(Config(64, 4, 100, /*max_seqs=*/2));
  for (int i = 0; i < 4; ++i) s.Add(i, Iota(5, i * 10));
  SchedulerStep step = Step(s);
  EXPECT_EQ(step.chunks.size(), 2u);
  EXPECT_EQ(s.NumRunning(), 2);
  EXPECT_EQ(s.NumWaiting(), 2);
  s.Finish(0);
  step = Step(s);
  ASSERT_EQ(step.chunks.size(), 2u);
  EXPECT_EQ(step.chunks[1].seq_id, 2);
}

TEST(SchedulerTest, PreemptsNewestByRecomputeWhenBlocksRunOut) {
  // 4 blocks of 2 tokens. Two 3-token prompts take 2 blocks each; the first decode that
  // crosses into a third block forces the newest sequence out.
  Scheduler s(Config(4, 2, 64));
  s.Add(1, {1, 2, 3});
  s.Add(2, {4, 5, 6});
  Step(s, 10);  // both prefilled: 3 tokens computed, 4 known, 2 blocks each
  EXPECT_TRUE(Step(s, 11).preempted.empty());  // position 3 still fits in block 2
  SchedulerStep step = Step(s, 12);            // position 4 needs a third block each
  ASSERT_EQ(step.preempted, std::vector<int64_t>{2});
  ASSERT_EQ(step.chunks.size(), 1u);
  EXPECT_EQ(step.chunks[0].seq_id, 1);
  EXPECT_EQ(s.num_preemptions(), 1);
  const Sequence* seq2 = s.Get(2);
  EXPECT_EQ(seq2->state, SequenceState::kWaiting);
  EXPECT_EQ(seq2->num_computed, 0);
  EXPECT_EQ(seq2->tokens, (std::vector<int32_t>{4, 5, 6, 10, 11}));  // prompt + generated kept
  // Seq 2's blocks went to the LRU list tail first; seq 1's new block evicted {6, 10}, so only
  // {4, 5} is still cached.
  s.Finish(1);
  step = Step(s, 13);
  ASSERT_EQ(step.chunks.size(), 1u);
  EXPECT_EQ(step.chunks[0].start_pos, 2);
  EXPECT_EQ(step.chunks[0].num_tokens, 3);
  EXPECT_TRUE(step.chunks[0].need_logits);
  EXPECT_EQ(s.Get(2)->num_cached_prompt_tokens, 0);  // only the first admission counts
  EXPECT_EQ(s.Get(2)->tokens.back(), 13);
}

TEST(SchedulerTest, PrefixCacheHitSkipsCachedBlocks) {
  Scheduler s(Config(16, 4, 64));
  s.Add(1, Iota(10));
  Step(s);
  s.Add(2, Iota(11));  // shares the first 10 tokens: 2 full blocks
  SchedulerStep step = Step(s);
  ASSERT_EQ(step.chunks.size(), 2u);
  EXPECT_EQ(step.chunks[1].seq_id, 2);
  EXPECT_EQ(step.chunks[1].start_pos, 8);
  EXPECT_EQ(step.chunks[1].num_tokens, 3);
  EXPECT_EQ(s.Get(2)->num_cached_prompt_tokens, 8);
  EXPECT_EQ(s.BlockTable(2)[0], s.BlockTable(1)[0]);
  EXPECT_EQ(s.BlockTable(2)[1], s.BlockTable(1)[1]);
  EXPECT_EQ(s.kv().counters().prefix_hit_tokens, 8);
  EXPECT_EQ(s.kv().counters().prefix_queries_tokens, 21);
}

TEST(SchedulerTest, AbortFreesBlocksOfRunningAndWaiting) {
  Scheduler s(Config(8, 4, 64, 1));
  s.Add(1, Iota(9));
  s.Add(2, Iota(9, 100));
  Step(s);
  EXPECT_EQ(s.kv().pool().NumUsed(), 3);
  EXPECT_TRUE(s.Abort(2));
  EXPECT_TRUE(s.Abort(1));
  EXPECT_FALSE(s.Abort(1));
  s.CheckInvariants();
  EXPECT_EQ(s.kv().pool().NumUsed(), 0);
  EXPECT_FALSE(s.HasWork());
  EXPECT_TRUE(s.Schedule().empty());
}

// Thousands of random admit / step / finish / cancel operations under tight block budgets.
// After every operation: no block leaked or double-freed, ref counts equal table references,
// the plan respects the budgets and covers its positions, and every request ends.
TEST(SchedulerTest, RandomizedOperationsUnderTightBlockBudget) {
  for (uint32_t seed : {11u, 22u, 33u, 44u}) {
    std::mt19937 rng(seed);
    const int block_size = 1 + seed % 4;
    const int num_blocks = 12 + seed % 7;
    const int max_len = num_blocks * block_size;  // a lone sequence always fits
    SchedulerConfig config = Config(num_blocks, block_size, 3 + seed % 9, 1 + seed % 5);
    Scheduler s(config);
    std::map<int64_t, int> target_len;  // live id -> length at which it finishes
    std::set<int64_t> ended;
    int64_t next_id = 0;
    int64_t added = 0;
    auto run_step = [&] {
      SchedulerStep step = s.Schedule();
      ASSERT_LE(step.num_batched_tokens, config.max_num_batched_tokens);
      std::set<int64_t> ids;
      int total = 0;
      for (const auto& c : step.chunks) {
        ASSERT_TRUE(ids.insert(c.seq_id).second) << "sequence scheduled twice";
        const Sequence* seq = s.Get(c.seq_id);
        ASSERT_NE(seq, nullptr);
        ASSERT_EQ(c.start_pos, seq->num_computed);
        ASSERT_GE(static_cast<int>(s.BlockTable(c.seq_id).size()) * block_size,
                  c.start_pos + c.num_tokens);
        total += c.num_tokens;
      }
      ASSERT_EQ(total, step.num_batched_tokens);
      for (int64_t p : step.preempted) ASSERT_FALSE(ids.contains(p));
      if (s.HasWork()) {
        ASSERT_FALSE(step.empty()) << "no progress with work queued";
      }
      s.OnStepComputed(step);
      for (const auto& c : step.chunks) {
        if (!c.need_logits) continue;
        const Sequence* seq = s.Get(c.seq_id);
        if (static_cast<int>(seq->tokens.size()) + 1 >= target_len[c.seq_id]) {
          s.Finish(c.seq_id);
          target_len.erase(c.seq_id);
          ASSERT_TRUE(ended.insert(c.seq_id).second);
        } else {
          s.AppendToken(c.seq_id, rng() % 3);
        }
      }
    };
    for (int op = 0; op < 4000; ++op) {
      const int kind = rng() % 10;
      if (kind < 3) {
        const int len = 1 + rng() % (max_len / 2);
        std::vector<int32_t> prompt(len);
        for (auto& t : prompt) t = rng() % 2;  // tiny alphabet: many shared prefixes
        target_len[next_id] = len + 1 + rng() % (max_len - len);
        s.Add(next_id++, std::move(prompt));
        ++added;
      } else if (kind < 9) {
        run_step();
        if (HasFatalFailure()) return;
      } else if (!target_len.empty()) {
        auto it = std::next(target_len.begin(), rng() % target_len.size());
        ASSERT_TRUE(s.Abort(it->first));
        ended.insert(it->first);
        target_len.erase(it);
      }
      s.CheckInvariants();
    }
    for (int guard = 0; s.HasWork(); ++guard) {
      ASSERT_LT(guard, 100000) << "requests never finish";
      run_step();
      if (HasFatalFailure()) return;
    }
    s.CheckInvariants();
    EXPECT_EQ(static_cast<int64_t>(ended.size()), added);
    EXPECT_EQ(s.kv().pool().NumUsed(), 0);
    EXPECT_GT(s.num_preemptions(), 0) << "budget not tight enough to exercise preemption";
  }
}

}  // namespace
}  // namespace tandem

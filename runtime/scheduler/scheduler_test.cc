#include "runtime/scheduler/scheduler.h"

#include <algorithm>
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

TEST(SchedulerTest, LongPrefillThresholdSharesTheStepWithoutWastingIt) {
  SchedulerConfig capped = Config(64, 4, 16);
  capped.long_prefill_token_threshold = 6;
  Scheduler s(capped);
  s.Add(1, Iota(40));
  // Alone, the long prompt still gets the whole budget: 6, then topped up by 10.
  SchedulerStep a = Step(s);
  ASSERT_EQ(a.chunks.size(), 1u);
  EXPECT_EQ(a.chunks[0].num_tokens, 16);
  EXPECT_EQ(a.num_batched_tokens, 16);
  // A short prompt arrives: it gets its share at once, and the long one the rest.
  s.Add(2, Iota(3, 100));
  SchedulerStep b = Step(s);
  ASSERT_EQ(b.chunks.size(), 2u);
  EXPECT_EQ(b.chunks[0].seq_id, 1);
  EXPECT_EQ(b.chunks[0].start_pos, 16);
  EXPECT_EQ(b.chunks[0].num_tokens, 13);
  EXPECT_FALSE(b.chunks[0].need_logits);
  EXPECT_EQ(b.chunks[1].seq_id, 2);
  EXPECT_EQ(b.chunks[1].num_tokens, 3);
  EXPECT_TRUE(b.chunks[1].need_logits);
  EXPECT_EQ(b.num_batched_tokens, 16);
  // The long prompt finishes in the step after: 11 tokens left, ending with its logits.
  SchedulerStep c = Step(s);
  ASSERT_EQ(c.chunks.size(), 2u);
  EXPECT_EQ(c.chunks[0].seq_id, 2);  // the short one decodes first
  EXPECT_EQ(c.chunks[1].seq_id, 1);
  EXPECT_EQ(c.chunks[1].num_tokens, 11);
  EXPECT_TRUE(c.chunks[1].need_logits);

  // Without the cap (the default) the short prompt waits behind the long one's chunk.
  Scheduler fcfs(Config(64, 4, 16));
  fcfs.Add(1, Iota(40));
  Step(fcfs);
  fcfs.Add(2, Iota(3, 100));
  SchedulerStep d = Step(fcfs);
  ASSERT_EQ(d.chunks.size(), 1u);
  EXPECT_EQ(d.chunks[0].seq_id, 1);
  EXPECT_EQ(d.chunks[0].num_tokens, 16);
}

TEST(SchedulerTest, LongPrefillThresholdTopUpNeverPreempts) {
  // 6 blocks of 4: seq 1 (a 20-token prompt) and seq 2 (8 tokens) cannot both be topped up.
  SchedulerConfig config = Config(6, 4, 32);
  config.long_prefill_token_threshold = 4;
  Scheduler s(config);
  s.Add(1, Iota(20));
  s.Add(2, Iota(8, 50));
  SchedulerStep a = Step(s);
  ASSERT_EQ(a.chunks.size(), 2u);
  EXPECT_TRUE(a.preempted.empty());
  // seq 1: 4 + a top-up to 20 (5 blocks); seq 2's 4 tokens hold the sixth block, and its top-up
  // would need a seventh.
  EXPECT_EQ(a.chunks[0].num_tokens, 20);
  EXPECT_EQ(a.chunks[1].num_tokens, 4);
  EXPECT_EQ(s.kv().pool().NumUsed(), 6);
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

TEST(SchedulerTest, PriorityOrdersAdmissionFcfsWithinAClass) {
  Scheduler s(Config(64, 4, 64, /*max_seqs=*/1));
  s.Add(1, {1, 2, 3}, 0);
  s.Add(2, {4, 5, 6}, 5);
  s.Add(3, {7, 8, 9}, -1);
  s.Add(4, {1, 1, 1}, 0);
  std::vector<int64_t> order;
  while (s.HasWork()) {
    SchedulerStep step = Step(s);
    ASSERT_EQ(step.chunks.size(), 1u);
    const int64_t id = step.chunks[0].seq_id;
    if (order.empty() || order.back() != id) order.push_back(id);
    s.Finish(id);  // one token each
  }
  EXPECT_EQ(order, (std::vector<int64_t>{3, 1, 4, 2}));
}

TEST(SchedulerTest, PreemptsTheLeastUrgentNotTheNewest) {
  // As PreemptsNewestByRecomputeWhenBlocksRunOut, but the older sequence is the less urgent one:
  // it is the victim, although it was scheduled first in the step.
  Scheduler s(Config(4, 2, 64));
  s.Add(1, {1, 2, 3}, 3);
  s.Add(2, {4, 5, 6}, 0);
  Step(s, 10);
  EXPECT_TRUE(Step(s, 11).preempted.empty());
  SchedulerStep step = Step(s, 12);
  ASSERT_EQ(step.preempted, std::vector<int64_t>{1});
  ASSERT_EQ(step.chunks.size(), 1u);
  EXPECT_EQ(step.chunks[0].seq_id, 2);
  EXPECT_EQ(s.Get(1)->state, SequenceState::kWaiting);
  // A newcomer of the same priority as the victim queues behind it (it was admitted first).
  s.Add(3, {9, 9, 9}, 3);
  s.Finish(2);
  step = Step(s, 13);
  ASSERT_FALSE(step.chunks.empty());
  EXPECT_EQ(step.chunks[0].seq_id, 1);
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
  for (uint32_t seed : {11u, 22u, 33u, 44u, 57u, 68u}) {
    std::mt19937 rng(seed);
    const int block_size = 1 + seed % 4;
    const int num_blocks = 12 + seed % 7;
    const int max_len = num_blocks * block_size;  // a lone sequence always fits
    SchedulerConfig config = Config(num_blocks, block_size, 3 + seed % 9, 1 + seed % 5);
    // Two seeds cap prefill chunks (the top-up round then runs too).
    if (seed >= 55) config.long_prefill_token_threshold = 1 + seed % 3;
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
        // Half the seeds mix priorities: victims then come from anywhere in the batch.
        const int priority = seed >= 33 ? static_cast<int>(rng() % 3) - 1 : 0;
        s.Add(next_id++, std::move(prompt), priority);
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
    EXPECT_GT(s.num_preemptions(), 0)
        << "budget not tight enough to exercise preemption, seed " << seed;
  }
}

// Blocks that `step` writes: those covering each chunk's new positions.
std::set<int32_t> WrittenBlocks(const Scheduler& s, const SchedulerStep& step) {
  std::set<int32_t> written;
  const int b = s.config().block_size;
  for (const auto& c : step.chunks) {
    const auto table = s.BlockTable(c.seq_id);
    for (int pos = c.start_pos; pos < c.start_pos + c.num_tokens; ++pos) {
      written.insert(table[pos / b]);
    }
  }
  return written;
}

TEST(SchedulerTest, AwaitingKvReservesWholePromptReusesPrefixAndIsNeverScheduled) {
  Scheduler s(Config(16, 4, 64));
  s.Add(1, Iota(10));
  Step(s);  // seq 1's first 2 blocks are cached
  const std::vector<int32_t> prompt = Iota(13);
  ASSERT_TRUE(s.CanAddAwaitingKv(2, prompt));
  const KvReservation r = s.AddAwaitingKv(2, prompt);
  s.CheckInvariants();
  ASSERT_EQ(r.block_ids.size(), 4u);  // ceil(13 / 4)
  EXPECT_EQ(r.num_cached_tokens, 8);
  EXPECT_EQ(r.block_ids[0], s.BlockTable(1)[0]);
  EXPECT_EQ(r.block_ids[1], s.BlockTable(1)[1]);
  EXPECT_EQ(s.BlockTable(2).size(), 4u);  // 14 positions (prompt + first token) fit in 4 blocks
  EXPECT_EQ(s.Get(2)->num_cached_prompt_tokens, 8);
  EXPECT_EQ(s.Get(2)->state, SequenceState::kAwaitingKv);
  EXPECT_EQ(s.NumAwaitingKv(), 1);
  EXPECT_EQ(s.NumWaiting(), 1);
  EXPECT_EQ(s.kv().counters().prefix_hit_tokens, 8);
  // Never scheduled; its third (full) block is not published before the KV is there.
  for (int i = 0; i < 3; ++i) {
    SchedulerStep step = Step(s);
    for (const auto& c : step.chunks) EXPECT_NE(c.seq_id, 2);
  }
  std::vector<int32_t> probe = Iota(14);
  EXPECT_EQ(s.kv().FindCachedPrefix(probe).blocks.size(), 2u);
  s.CompleteKv(2, 99);
  s.CheckInvariants();
  EXPECT_EQ(s.kv().FindCachedPrefix(probe).blocks.size(), 3u);
  EXPECT_EQ(s.kv().FindCachedPrefix(probe).blocks[2], r.block_ids[2]);
  EXPECT_EQ(s.Get(2)->state, SequenceState::kReady);
  EXPECT_EQ(s.Get(2)->tokens.back(), 99);
  const int used = s.kv().pool().NumUsed();
  SchedulerStep step = Step(s);
  EXPECT_EQ(s.kv().pool().NumUsed(), used + 0 - 0);  // seq 1 decodes in its own blocks
  bool found = false;
  for (const auto& c : step.chunks) {
    if (c.seq_id != 2) continue;
    found = true;
    EXPECT_EQ(c.start_pos, 13);
    EXPECT_EQ(c.num_tokens, 1);
    EXPECT_TRUE(c.need_logits);
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(s.Get(2)->state, SequenceState::kRunning);
  EXPECT_EQ(std::vector<int32_t>(s.BlockTable(2).begin(), s.BlockTable(2).end()), r.block_ids);
}

TEST(SchedulerTest, FailedKvPrefillsTheUncachedPartInTheReservedBlocks) {
  Scheduler s(Config(16, 4, 64));
  s.Add(1, Iota(10));
  Step(s);
  const KvReservation r = s.AddAwaitingKv(2, Iota(13));
  s.FailKv(2);
  s.CheckInvariants();
  SchedulerStep step = Step(s);
  const ScheduledChunk* chunk = nullptr;
  for (const auto& c : step.chunks) {
    if (c.seq_id == 2) chunk = &c;
  }
  ASSERT_NE(chunk, nullptr);
  EXPECT_EQ(chunk->start_pos, 8);
  EXPECT_EQ(chunk->num_tokens, 5);
  EXPECT_TRUE(chunk->need_logits);
  EXPECT_EQ(std::vector<int32_t>(s.BlockTable(2).begin(), s.BlockTable(2).end()), r.block_ids);
  EXPECT_EQ(s.Get(2)->tokens.size(), 14u);
}

TEST(SchedulerTest, ReservationNeedsBlocksAndAbortFreesThem) {
  Scheduler s(Config(6, 4, 64));
  const std::vector<int32_t> a = Iota(15, 100), b = Iota(9, 200);
  ASSERT_TRUE(s.CanAddAwaitingKv(1, a));
  s.AddAwaitingKv(1, a);  // 16 positions: 4 blocks
  EXPECT_FALSE(s.CanAddAwaitingKv(1, b)) << "id in use";
  EXPECT_FALSE(s.CanAddAwaitingKv(2, b));  // needs 3 of the 2 left
  EXPECT_EQ(s.kv().pool().NumUsed(), 4);
  EXPECT_TRUE(s.Abort(1));
  s.CheckInvariants();
  EXPECT_EQ(s.kv().pool().NumUsed(), 0);
  EXPECT_EQ(s.NumAwaitingKv(), 0);
  EXPECT_TRUE(s.CanAddAwaitingKv(2, b));
  // Aborting a ready sequence frees its blocks too.
  s.AddAwaitingKv(2, b);
  s.CompleteKv(2, 5);
  EXPECT_TRUE(s.Abort(2));
  s.CheckInvariants();
  EXPECT_EQ(s.kv().pool().NumUsed(), 0);
}

// Ready sequences own their blocks, so they are admitted even when the waiting queue's head cannot
// get blocks (no head-of-line deadlock), and they respect max_num_seqs.
TEST(SchedulerTest, ReadySequencesAdmittedAheadOfWaitingWithoutNewBlocks) {
  Scheduler s(Config(6, 4, 64, /*max_seqs=*/1));
  s.AddAwaitingKv(1, Iota(8));      // 9 positions: 3 blocks
  s.AddAwaitingKv(2, Iota(7, 50));  // 8 positions: 2 blocks
  s.Add(3, Iota(9, 90));            // needs 3 blocks: only 1 left
  EXPECT_TRUE(Step(s).empty());
  s.CompleteKv(2, 1);
  s.CompleteKv(1, 2);
  SchedulerStep step = Step(s);
  ASSERT_EQ(step.chunks.size(), 1u);  // max_num_seqs 1
  EXPECT_EQ(step.chunks[0].seq_id, 2);
  s.Finish(2);
  step = Step(s);
  ASSERT_EQ(step.chunks.size(), 1u);
  EXPECT_EQ(step.chunks[0].seq_id, 1);
  s.Finish(1);
  step = Step(s);
  ASSERT_EQ(step.chunks.size(), 1u);
  EXPECT_EQ(step.chunks[0].seq_id, 3);
}

TEST(SchedulerTest, HeldBlocksAreNeverHandedOutOrWrittenUntilAbort) {
  Scheduler s(Config(8, 2, 64));
  s.Add(1, Iota(5));  // 3 blocks
  Step(s);
  const std::vector<int32_t> held(s.BlockTable(1).begin(), s.BlockTable(1).end());
  ASSERT_EQ(held.size(), 3u);
  s.Hold(1);
  s.CheckInvariants();
  EXPECT_EQ(s.NumHeld(), 1);
  EXPECT_EQ(s.NumRunning(), 0);
  EXPECT_FALSE(s.HasWork());
  // Churn the other 5 blocks with sequences that share nothing with seq 1, with preemptions.
  std::mt19937 rng(9);
  int64_t next = 10;
  for (int round = 0; round < 200; ++round) {
    if (s.NumWaiting() + s.NumRunning() < 3) s.Add(next++, Iota(1 + rng() % 4, 1000 + rng() % 7));
    SchedulerStep step = s.Schedule();
    for (int32_t b : WrittenBlocks(s, step)) {
      ASSERT_TRUE(std::find(held.begin(), held.end(), b) == held.end()) << "held block written";
    }
    for (const auto& c : step.chunks) {
      for (int32_t b : s.BlockTable(c.seq_id)) {
        ASSERT_TRUE(std::find(held.begin(), held.end(), b) == held.end()) << "held block reused";
      }
    }
    s.OnStepComputed(step);
    for (const auto& c : step.chunks) {
      if (!c.need_logits) continue;
      if (s.Get(c.seq_id)->tokens.size() > 7) {
        s.Finish(c.seq_id);
      } else {
        s.AppendToken(c.seq_id, 3);
      }
    }
    s.CheckInvariants();
    EXPECT_EQ(std::vector<int32_t>(s.BlockTable(1).begin(), s.BlockTable(1).end()), held);
  }
  EXPECT_GT(s.num_preemptions(), 0);
  EXPECT_TRUE(s.Abort(1));
  s.CheckInvariants();
  EXPECT_EQ(s.NumHeld(), 0);
}

// Random admit / reserve / complete / fail / hold / release / step / cancel operations. After
// every one: no leaked or double-freed block, ref counts equal table references (CheckInvariants),
// no step writes a block of an awaiting or held sequence, and at the end everything drains.
TEST(SchedulerTest, RandomizedDisaggregationOperations) {
  for (uint32_t seed : {5u, 6u, 7u, 8u, 9u}) {
    std::mt19937 rng(seed);
    const int block_size = 1 + seed % 4;
    const int num_blocks = 14 + seed % 5;
    const int max_len = num_blocks * block_size / 2;
    SchedulerConfig config = Config(num_blocks, block_size, 2 + seed % 9, 1 + seed % 4);
    Scheduler s(config);
    std::map<int64_t, int> target_len;  // running-or-queued id -> finish length
    std::set<int64_t> awaiting, held, hold_after_prefill;
    int64_t next_id = 0;
    int completed = 0, failed = 0, holds = 0;
    auto protected_blocks = [&] {
      std::set<int32_t> p;
      for (int64_t id : awaiting) {
        auto t = s.BlockTable(id);
        // Cached prefix blocks are shared and read-only; the rest is the remote writer's.
        const int cached = s.Get(id)->num_cached_prompt_tokens / block_size;
        for (size_t i = cached; i < t.size(); ++i) p.insert(t[i]);
      }
      for (int64_t id : held) {
        for (int32_t b : s.BlockTable(id)) p.insert(b);
      }
      return p;
    };
    auto random_prompt = [&] {
      std::vector<int32_t> prompt(1 + rng() % max_len);
      for (auto& t : prompt) t = rng() % 2;
      return prompt;
    };
    auto run_step = [&] {
      const std::set<int32_t> guarded = protected_blocks();
      SchedulerStep step = s.Schedule();
      for (int32_t b : WrittenBlocks(s, step)) {
        ASSERT_FALSE(guarded.contains(b)) << "step writes a pinned block " << b;
      }
      if (s.HasWork() && awaiting.empty() && held.empty()) {
        ASSERT_FALSE(step.empty())
            << "no progress with work queued; preempted " << step.preempted.size() << " running "
            << s.NumRunning() << " waiting " << s.NumWaiting();
      }
      s.OnStepComputed(step);
      for (const auto& c : step.chunks) {
        if (!c.need_logits) continue;
        const Sequence* seq = s.Get(c.seq_id);
        if (hold_after_prefill.contains(c.seq_id) && seq->num_output_tokens() == 0) {
          s.Hold(c.seq_id);
          held.insert(c.seq_id);
          target_len.erase(c.seq_id);
        } else if (static_cast<int>(seq->tokens.size()) + 1 >= target_len[c.seq_id]) {
          s.Finish(c.seq_id);
          target_len.erase(c.seq_id);
        } else {
          s.AppendToken(c.seq_id, rng() % 3);
        }
      }
    };
    for (int op = 0; op < 3000; ++op) {
      const int kind = rng() % 16;
      if (kind < 3) {  // local request, maybe holding its KV after prefill
        std::vector<int32_t> prompt = random_prompt();
        const int len = static_cast<int>(prompt.size());
        target_len[next_id] = len + 1 + rng() % (max_len - len + 1);
        if (rng() % 3 == 0) hold_after_prefill.insert(next_id);
        s.Add(next_id++, std::move(prompt));
      } else if (kind < 5) {  // remote prefill reservation
        std::vector<int32_t> prompt = random_prompt();
        if (s.CanAddAwaitingKv(next_id, prompt)) {
          const int len = static_cast<int>(prompt.size());
          const KvReservation r = s.AddAwaitingKv(next_id, prompt);
          ASSERT_EQ(static_cast<int>(r.block_ids.size()), (len + block_size - 1) / block_size);
          ASSERT_EQ(r.num_cached_tokens % block_size, 0);
          ASSERT_LT(r.num_cached_tokens, len);
          target_len[next_id] = len + 1 + rng() % (max_len - len + 1);
          awaiting.insert(next_id++);
        }
      } else if (kind < 7 && !awaiting.empty()) {  // KV arrives, or the transfer fails
        auto it = std::next(awaiting.begin(), rng() % awaiting.size());
        const int64_t id = *it;
        awaiting.erase(it);
        if (rng() % 4 == 0) {
          s.FailKv(id);
          ++failed;
        } else {
          s.CompleteKv(id, rng() % 3);
          ++completed;
          if (static_cast<int>(s.Get(id)->tokens.size()) >= target_len[id]) {
            s.Finish(id);  // max_tokens reached by the first token
            target_len.erase(id);
          }
        }
      } else if (kind < 8 && !held.empty()) {  // release held KV
        auto it = std::next(held.begin(), rng() % held.size());
        ASSERT_TRUE(s.Abort(*it));
        held.erase(it);
        ++holds;
      } else if (kind < 15) {
        run_step();
        if (HasFatalFailure()) return;
      } else if (!target_len.empty()) {  // cancel anything live (awaiting included)
        auto it = std::next(target_len.begin(), rng() % target_len.size());
        ASSERT_TRUE(s.Abort(it->first));
        awaiting.erase(it->first);
        target_len.erase(it);
      }
      s.CheckInvariants();
    }
    for (int64_t id : awaiting) s.CompleteKv(id, 1);
    awaiting.clear();
    for (int64_t id : held) ASSERT_TRUE(s.Abort(id));
    held.clear();
    hold_after_prefill.clear();
    for (int guard = 0; s.HasWork(); ++guard) {
      ASSERT_LT(guard, 100000) << "requests never finish";
      run_step();
      if (HasFatalFailure()) return;
      s.CheckInvariants();
    }
    EXPECT_EQ(s.kv().pool().NumUsed(), 0);
    EXPECT_EQ(s.kv().NumSequences(), 0);
    EXPECT_GT(completed, 0);
    EXPECT_GT(failed, 0);
    EXPECT_GT(holds, 0);
  }
}

// Speculative decoding: a sequence decoding after a 6-token prompt (block size 4) gets 3 drafts.
TEST(SchedulerTest, DraftsAreScheduledWholeAndVerifiedTokenByToken) {
  Scheduler s(Config(16, 4, 16));
  s.Add(1, Iota(6));
  Step(s, 100);  // prefill; token 100 at position 6
  const std::vector<int32_t> drafts = {101, 102, 103};
  s.SetDrafts(1, drafts);
  SchedulerStep step = s.Schedule();
  ASSERT_EQ(step.chunks.size(), 1u);
  EXPECT_EQ(step.chunks[0].start_pos, 6);
  EXPECT_EQ(step.chunks[0].num_tokens, 4);  // the last token and its drafts, whole
  EXPECT_TRUE(step.chunks[0].need_logits);
  s.OnStepComputed(step);
  // Positions 0..9 are computed, but block 1 (positions 4..7) holds a draft: not cached.
  std::vector<int32_t> probe = Iota(6);
  probe.insert(probe.end(), {100, 101, 102, 103, 104});
  EXPECT_EQ(s.kv().FindCachedPrefix(probe).blocks.size(), 1u);
  EXPECT_EQ(s.TakeDrafts(1), drafts);
  EXPECT_EQ(s.Get(1)->tokens.size(), 7u);
  EXPECT_EQ(s.Get(1)->num_computed, 7);
  // 101 verified (its KV computed at position 7), then 55 instead of 102.
  s.AppendToken(1, 101);
  s.AcceptDraftKv(1);
  s.AppendToken(1, 55);
  s.CheckInvariants();
  EXPECT_EQ(s.Get(1)->num_computed, 8);
  EXPECT_EQ(s.Get(1)->tokens.size(), 9u);
  EXPECT_EQ(s.kv().FindCachedPrefix(probe).blocks.size(), 2u);  // block 1 is real now
  probe[8] = 102;  // the rejected draft's continuation is not cached
  EXPECT_EQ(s.kv().FindCachedPrefix(probe).blocks.size(), 2u);
  SchedulerStep next = Step(s);
  ASSERT_EQ(next.chunks.size(), 1u);
  EXPECT_EQ(next.chunks[0].start_pos, 8);
  EXPECT_EQ(next.chunks[0].num_tokens, 1);
  EXPECT_TRUE(s.TakeDrafts(1).empty());
}

TEST(SchedulerTest, DraftsThatDoNotFitAreDroppedNeverPreempting) {
  // Budget: 2 tokens, so 3 drafts do not fit; the sequence decodes one token.
  Scheduler s(Config(16, 4, 2));
  s.Add(1, Iota(2));
  Step(s);
  s.SetDrafts(1, std::vector<int32_t>{8, 9, 10});
  SchedulerStep step = Step(s);
  ASSERT_EQ(step.chunks.size(), 1u);
  EXPECT_EQ(step.chunks[0].num_tokens, 1);
  EXPECT_TRUE(s.TakeDrafts(1).empty());
  EXPECT_EQ(s.Get(1)->tokens.size(), 4u);

  // Blocks: 3 of 2 tokens. After the prefill each sequence holds one; decoding, sequence 1 takes
  // the last free block, and the drafts of sequence 2 would need another one, which only
  // preempting 1 would give: they are dropped instead.
  Scheduler t(Config(3, 2, 16));
  t.Add(1, Iota(2));
  t.Add(2, Iota(1, 50));
  Step(t);
  ASSERT_EQ(t.BlockTable(1).size(), 1u);
  ASSERT_EQ(t.BlockTable(2).size(), 1u);
  t.SetDrafts(2, std::vector<int32_t>{60, 61});
  SchedulerStep s2 = Step(t);
  EXPECT_TRUE(s2.preempted.empty());
  EXPECT_EQ(s2.chunks.size(), 2u);
  for (const auto& c : s2.chunks) EXPECT_EQ(c.num_tokens, 1);
}

TEST(SchedulerTest, PreemptionDropsDrafts) {
  // 4 blocks of 2, all taken by the prefills. Sequence 1 needs a third block to decode; the
  // victim is the newer sequence 2, which had drafts: it goes back to waiting with its real
  // tokens only.
  Scheduler s(Config(4, 2, 16));
  s.Add(1, Iota(4));
  s.Add(2, Iota(3, 50));
  Step(s);
  s.SetDrafts(2, std::vector<int32_t>{60});
  SchedulerStep step = Step(s);
  ASSERT_EQ(step.preempted, std::vector<int64_t>{2});
  EXPECT_EQ(s.Get(2)->state, SequenceState::kWaiting);
  EXPECT_EQ(s.Get(2)->tokens, (std::vector<int32_t>{50, 51, 52, 7}));
  EXPECT_EQ(s.Get(2)->num_draft, 0);
}

TEST(SchedulerDeathTest, AcceptingATokenThatIsNotTheDraftDies) {
  Scheduler s(Config(16, 4, 16));
  s.Add(1, Iota(3));
  Step(s);
  s.SetDrafts(1, std::vector<int32_t>{8, 9});
  SchedulerStep step = s.Schedule();
  s.OnStepComputed(step);
  s.TakeDrafts(1);
  s.AppendToken(1, 5);  // not 8
  EXPECT_DEATH(s.AcceptDraftKv(1), "not the draft");
}

}  // namespace
}  // namespace tandem

// Host planning of CUDA steps: row order, metadata sections, graph padding, validation.
// Expected values are worked out by hand from the batch, not taken from the planner.

#include "runtime/model/cuda/step_plan.h"

#include <gtest/gtest.h>

#include <vector>

namespace tandem::cuda_runner {
namespace {

std::vector<int32_t> Section(const StepPlan& p, size_t offset, size_t n) {
  return std::vector<int32_t>(p.meta.begin() + offset, p.meta.begin() + offset + n);
}

StepPlanLimits Limits(bool graphs) {
  StepPlanLimits l;
  l.block_size = 4;
  l.num_blocks = 32;
  l.vocab_size = 100;
  l.max_position_embeddings = 64;
  l.use_graphs = graphs;
  return l;
}

TEST(GraphBucketTest, Buckets) {
  EXPECT_EQ(GraphBucketFor(0), 0);
  EXPECT_EQ(GraphBucketFor(1), 1);
  EXPECT_EQ(GraphBucketFor(3), 4);
  EXPECT_EQ(GraphBucketFor(64), 64);
  EXPECT_EQ(GraphBucketFor(65), 128);
  EXPECT_EQ(GraphBucketFor(256), 256);
  EXPECT_EQ(GraphBucketFor(257), 0);
  EXPECT_EQ(RoundUpPow2(1), 1);
  EXPECT_EQ(RoundUpPow2(5), 8);
  EXPECT_EQ(RoundUpPow2(8), 8);
}

TEST(StepPlanTest, MixedBatchPutsDecodeRowsFirst) {
  // Chunk 0: prefill of 5 tokens from 0 (blocks 3, 4). Chunk 1: decode at position 7 (blocks 5,
  // 6). Chunk 2: 3 tokens after a 6-token cached prefix, positions 6..8 (blocks 9, 10, 11), no
  // logits. Chunk 3: decode at position 0 (block 12).
  const std::vector<int32_t> t0 = {11, 12, 13, 14, 15}, t1 = {21}, t2 = {31, 32, 33}, t3 = {41};
  const std::vector<int32_t> b0 = {3, 4}, b1 = {5, 6}, b2 = {9, 10, 11}, b3 = {12};
  ForwardBatch batch;
  batch.chunks = {{t0, 0, b0, true}, {t1, 7, b1, true}, {t2, 6, b2, false}, {t3, 0, b3, true}};
  StepPlan p;
  ASSERT_TRUE(PlanStep(batch, Limits(true), &p).ok());
  EXPECT_EQ(p.graph_bucket, 0) << "a batch with prefill rows is never graphed";
  EXPECT_EQ(p.num_rows, 10);
  EXPECT_EQ(p.num_real_rows, 10);
  EXPECT_EQ(p.num_decode, 2);
  EXPECT_EQ(p.num_prefill, 2);
  // Rows: decode (chunk 1, chunk 3), then chunk 0's 5 rows, then chunk 2's 3 rows.
  EXPECT_EQ(Section(p, p.off.ids, 10),
            (std::vector<int32_t>{21, 41, 11, 12, 13, 14, 15, 31, 32, 33}));
  EXPECT_EQ(Section(p, p.off.positions, 10), (std::vector<int32_t>{7, 0, 0, 1, 2, 3, 4, 6, 7, 8}));
  // slot = block_table[pos / 4] * 4 + pos % 4.
  EXPECT_EQ(Section(p, p.off.slots, 10),
            (std::vector<int32_t>{6 * 4 + 3, 12 * 4, 12, 13, 14, 15, 16, 10 * 4 + 2, 10 * 4 + 3,
                                  11 * 4}));
  EXPECT_EQ(p.decode_table_width, 2);
  EXPECT_EQ(p.decode_max_context, 8);
  EXPECT_EQ(Section(p, p.off.decode_tables, 4), (std::vector<int32_t>{5, 6, 12, 0}));
  EXPECT_EQ(Section(p, p.off.context_lens, 2), (std::vector<int32_t>{8, 1}));
  EXPECT_EQ(p.prefill_table_width, 3);
  EXPECT_EQ(Section(p, p.off.prefill_tables, 6), (std::vector<int32_t>{3, 4, 0, 9, 10, 11}));
  EXPECT_EQ(Section(p, p.off.seq_starts, 3), (std::vector<int32_t>{0, 5, 8}));
  EXPECT_EQ(Section(p, p.off.start_pos, 2), (std::vector<int32_t>{0, 6}));
  EXPECT_EQ(p.prefill_max_new_tokens, 5);
  // Logits: chunks 0, 1, 3 in chunk order -> rows 6 (chunk 0's last), 0, 1.
  EXPECT_EQ(p.num_logit_rows, 3);
  EXPECT_EQ(Section(p, p.off.logit_rows, 3), (std::vector<int32_t>{6, 0, 1}));
  EXPECT_EQ(p.output_rows, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(p.off.total, p.meta.size());
}

TEST(StepPlanTest, MultiRowLogitsGatherTheChunksLastTokens) {
  const std::vector<int32_t> t0 = {11, 12, 13, 14, 15}, t1 = {21};
  const std::vector<int32_t> b0 = {3, 4}, b1 = {5, 6};
  ForwardBatch batch;
  batch.chunks = {{t0, 0, b0, true}, {t1, 7, b1, true}};
  batch.chunks[0].num_logits = 3;
  StepPlan p;
  ASSERT_TRUE(PlanStep(batch, Limits(true), &p).ok());
  // Rows: decode (chunk 1) first, then chunk 0's 5 rows at 1..5; its last 3 are 3, 4, 5.
  EXPECT_EQ(p.num_logit_rows, 4);
  EXPECT_EQ(Section(p, p.off.logit_rows, 4), (std::vector<int32_t>{3, 4, 5, 0}));
  EXPECT_EQ(p.output_rows, (std::vector<int>{0, 1, 2, 3}));
  batch.chunks[0].num_logits = 6;
  EXPECT_EQ(PlanStep(batch, Limits(true), &p).code(), absl::StatusCode::kInvalidArgument);
  batch.chunks[0].num_logits = 0;
  EXPECT_EQ(PlanStep(batch, Limits(true), &p).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StepPlanTest, VerifyingChunksRunAsDecodeRowsAndAreGraphed) {
  // Chunk 0: a last token and 3 drafts at positions 6..9 (blocks 7, 8, 9), every row's logits.
  // Chunk 1: a plain decode at position 2 (block 1).
  const std::vector<int32_t> t0 = {50, 51, 52, 53}, t1 = {60};
  const std::vector<int32_t> b0 = {7, 8, 9}, b1 = {1};
  ForwardBatch batch;
  batch.chunks = {{t0, 6, b0, true}, {t1, 2, b1, true}};
  batch.chunks[0].num_logits = 4;
  StepPlan p;
  ASSERT_TRUE(PlanStep(batch, Limits(true), &p).ok());
  EXPECT_EQ(p.num_prefill, 0);
  EXPECT_EQ(p.num_real_rows, 5);
  EXPECT_EQ(p.graph_bucket, 8) << "5 decode rows pad to the bucket of 8";
  EXPECT_EQ(p.num_decode, 8);
  EXPECT_EQ(p.decode_table_width, 4) << "3 blocks round up to 4";
  // Each verify row attends to its own prefix: positions 0..6, 0..7, 0..8, 0..9.
  EXPECT_EQ(Section(p, p.off.context_lens, 8), (std::vector<int32_t>{7, 8, 9, 10, 3, 0, 0, 0}));
  EXPECT_EQ(Section(p, p.off.decode_tables, 20),
            (std::vector<int32_t>{7, 8, 0, 0, 7, 8, 0, 0, 7, 8, 9, 0, 7, 8, 9, 0, 1, 0, 0, 0}));
  EXPECT_EQ(Section(p, p.off.positions, 5), (std::vector<int32_t>{6, 7, 8, 9, 2}));
  // slot = block_table[pos / 4] * 4 + pos % 4: positions 6, 7 in block 8, 8, 9 in block 9.
  EXPECT_EQ(Section(p, p.off.slots, 6),
            (std::vector<int32_t>{8 * 4 + 2, 8 * 4 + 3, 9 * 4 + 0, 9 * 4 + 1, 1 * 4 + 2, -1}));
  EXPECT_EQ(Section(p, p.off.ids, 5), (std::vector<int32_t>{50, 51, 52, 53, 60}));
  EXPECT_EQ(p.output_rows, (std::vector<int>{0, 1, 2, 3, 4}));

  // Eagerly (graphs off) the same rows, unpadded, with their logits gathered.
  ASSERT_TRUE(PlanStep(batch, Limits(false), &p).ok());
  EXPECT_EQ(p.graph_bucket, 0);
  EXPECT_EQ(p.num_decode, 5);
  EXPECT_EQ(p.num_logit_rows, 5);
  EXPECT_EQ(Section(p, p.off.logit_rows, 5), (std::vector<int32_t>{0, 1, 2, 3, 4}));

  // Only the last rows' logits, or more than kMaxVerifyRows tokens: prefill rows, not graphed.
  batch.chunks[0].num_logits = 1;
  ASSERT_TRUE(PlanStep(batch, Limits(true), &p).ok());
  EXPECT_EQ(p.num_prefill, 1);
  EXPECT_EQ(p.num_decode, 1);
  EXPECT_EQ(p.graph_bucket, 0);
  std::vector<int32_t> long_tokens(kMaxVerifyRows + 1, 5);
  const std::vector<int32_t> long_blocks = {2, 3, 4, 5, 6};
  batch.chunks[0] = {long_tokens, 0, long_blocks, true};
  batch.chunks[0].num_logits = kMaxVerifyRows + 1;
  ASSERT_TRUE(PlanStep(batch, Limits(true), &p).ok());
  EXPECT_EQ(p.num_prefill, 1);
  EXPECT_EQ(p.num_logit_rows, kMaxVerifyRows + 2);
}

TEST(StepPlanTest, DecodeOnlyBatchIsPaddedToABucket) {
  const std::vector<int32_t> t = {7};
  const std::vector<int32_t> b0 = {1}, b1 = {2, 3, 4}, b2 = {5, 6};
  ForwardBatch batch;
  batch.chunks = {{t, 2, b0, true}, {t, 9, b1, false}, {t, 5, b2, true}};
  StepPlan p;
  ASSERT_TRUE(PlanStep(batch, Limits(true), &p).ok());
  EXPECT_EQ(p.graph_bucket, 4);
  EXPECT_EQ(p.num_rows, 4);
  EXPECT_EQ(p.num_decode, 4);
  EXPECT_EQ(p.num_real_rows, 3);
  EXPECT_EQ(p.decode_table_width, 4) << "3 blocks round up to 4";
  EXPECT_EQ(Section(p, p.off.decode_tables, 16),
            (std::vector<int32_t>{1, 0, 0, 0, 2, 3, 4, 0, 5, 6, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(Section(p, p.off.context_lens, 4), (std::vector<int32_t>{3, 10, 6, 0}));
  EXPECT_EQ(Section(p, p.off.slots, 4), (std::vector<int32_t>{6, 17, 25, -1}));
  EXPECT_EQ(Section(p, p.off.positions, 4), (std::vector<int32_t>{2, 9, 5, 0}));
  EXPECT_EQ(Section(p, p.off.ids, 4), (std::vector<int32_t>{7, 7, 7, 0}));
  // Every row gets logits in a graph; the output picks rows 0 and 2.
  EXPECT_EQ(p.num_logit_rows, 4);
  EXPECT_EQ(Section(p, p.off.logit_rows, 4), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.output_rows, (std::vector<int>{0, 2}));
}

TEST(StepPlanTest, GraphsOffMeansNoPadding) {
  const std::vector<int32_t> t = {7};
  const std::vector<int32_t> b = {1, 2};
  ForwardBatch batch;
  batch.chunks = {{t, 4, b, true}, {t, 5, b, true}, {t, 6, b, true}};
  StepPlan p;
  ASSERT_TRUE(PlanStep(batch, Limits(false), &p).ok());
  EXPECT_EQ(p.graph_bucket, 0);
  EXPECT_EQ(p.num_rows, 3);
  EXPECT_EQ(p.num_logit_rows, 3);
  EXPECT_EQ(Section(p, p.off.logit_rows, 3), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(p.decode_table_width, 2);
}

TEST(StepPlanTest, LargeDecodeBatchRunsEagerly) {
  StepPlanLimits limits = Limits(true);
  limits.num_blocks = 1000;
  const std::vector<int32_t> t = {1};
  std::vector<std::vector<int32_t>> tables(300);
  ForwardBatch batch;
  for (int i = 0; i < 300; ++i) {
    tables[i] = {i};
    batch.chunks.push_back({t, 0, tables[i], true});
  }
  StepPlan p;
  ASSERT_TRUE(PlanStep(batch, limits, &p).ok());
  EXPECT_EQ(p.graph_bucket, 0);
  EXPECT_EQ(p.num_rows, 300);
  EXPECT_EQ(p.meta[p.off.slots + 299], 299 * 4);
}

TEST(StepPlanTest, EmptyBatch) {
  StepPlan p;
  ASSERT_TRUE(PlanStep(ForwardBatch{}, Limits(true), &p).ok());
  EXPECT_EQ(p.num_rows, 0);
  EXPECT_EQ(p.graph_bucket, 0);
  EXPECT_TRUE(p.output_rows.empty());
}

TEST(StepPlanTest, RejectsBadBatches) {
  const std::vector<int32_t> ok_tokens = {1, 2}, bad_token = {1, 100}, negative = {-1};
  const std::vector<int32_t> table = {0, 1}, short_table = {0}, bad_block = {0, 32};
  const std::vector<int32_t> none;
  const StepPlanLimits limits = Limits(true);
  StepPlan p;
  auto check = [&](SequenceChunk ch) {
    ForwardBatch batch;
    batch.chunks = {ch};
    return PlanStep(batch, limits, &p).code();
  };
  EXPECT_EQ(check({ok_tokens, 0, table, true}), absl::StatusCode::kOk);
  EXPECT_EQ(check({none, 0, table, true}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check({ok_tokens, -1, table, true}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check({bad_token, 0, table, true}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check({negative, 0, table, true}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check({ok_tokens, 4, short_table, true}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check({ok_tokens, 4, bad_block, true}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check({ok_tokens, 63, table, true}), absl::StatusCode::kInvalidArgument)
      << "positions 63, 64 pass max_position_embeddings 64";
}

}  // namespace
}  // namespace tandem::cuda_runner

// Host-side checks of the model kernel launchers: argument validation (before any CUDA call, so no
// GPU is needed) and the flash-decoding split plan and its workspace bound.

#include "runtime/kernels/cuda/model_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem::cuda {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// The split plan with the default tuning unless one is given.
internal::DecodeSplitPlan Plan(int num_seqs, int num_heads, int max_context_len,
                               int num_kv_heads = 0, int num_sms = 0,
                               const DecodeAttentionTuning& tuning = {}) {
  return internal::PlanDecodeSplits(num_seqs, num_heads, max_context_len, num_kv_heads, num_sms,
                                    tuning);
}

// Fake device pointers: never dereferenced, since every call here fails validation or queues
// nothing.
alignas(16) uint16_t g_dummy[64];
alignas(16) int32_t g_ids[8];
alignas(16) float g_floats[8];

PagedKvCache ValidCache() {
  PagedKvCache c;
  c.k = g_dummy;
  c.v = g_dummy;
  c.num_layers = 2;
  c.num_blocks = 4;
  c.block_size = 16;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  return c;
}

TEST(ModelKernelsArgsTest, EmbeddingRejectsBadArguments) {
  EXPECT_EQ(LaunchEmbedding(g_ids, g_dummy, -1, 8, 10, g_dummy, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchEmbedding(g_ids, g_dummy, 1, 0, 10, g_dummy, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchEmbedding(g_ids, g_dummy, 1, 8, 0, g_dummy, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchEmbedding(nullptr, g_dummy, 1, 8, 10, g_dummy, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchEmbedding(g_ids, nullptr, 1, 8, 10, g_dummy, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchEmbedding(g_ids, g_dummy, 1, 8, 10, nullptr, nullptr).code(), kInvalid);
  EXPECT_TRUE(LaunchEmbedding(g_ids, g_dummy, 0, 8, 10, g_dummy, nullptr).ok());
}

TEST(ModelKernelsArgsTest, RopeRejectsBadArguments) {
  EXPECT_EQ(LaunchRope(g_dummy, g_ids, g_floats, 1, 4, 2, 7, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchRope(g_dummy, g_ids, g_floats, 1, 4, 2, 0, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchRope(g_dummy, g_ids, g_floats, 1, 0, 2, 8, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchRope(g_dummy, g_ids, g_floats, 1, 4, 0, 8, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchRope(g_dummy, g_ids, g_floats, -2, 4, 2, 8, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchRope(nullptr, g_ids, g_floats, 1, 4, 2, 8, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchRope(g_dummy, nullptr, g_floats, 1, 4, 2, 8, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchRope(g_dummy, g_ids, nullptr, 1, 4, 2, 8, nullptr).code(), kInvalid);
  EXPECT_TRUE(LaunchRope(g_dummy, g_ids, g_floats, 0, 4, 2, 8, nullptr).ok());
}

TEST(ModelKernelsArgsTest, KvAppendRejectsBadArguments) {
  PagedKvCache c = ValidCache();
  EXPECT_EQ(LaunchKvAppend(g_dummy, g_ids, 1, 4, c, 2, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchKvAppend(g_dummy, g_ids, 1, 4, c, -1, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchKvAppend(g_dummy, g_ids, 1, 0, c, 0, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchKvAppend(nullptr, g_ids, 1, 4, c, 0, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchKvAppend(g_dummy, nullptr, 1, 4, c, 0, nullptr).code(), kInvalid);
  c.layer_stride = 100;  // less than one layer
  EXPECT_EQ(LaunchKvAppend(g_dummy, g_ids, 1, 4, c, 0, nullptr).code(), kInvalid);
  c = ValidCache();
  c.block_size = 0;
  EXPECT_EQ(LaunchKvAppend(g_dummy, g_ids, 1, 4, c, 0, nullptr).code(), kInvalid);
  c = ValidCache();
  c.v = nullptr;
  EXPECT_EQ(LaunchKvAppend(g_dummy, g_ids, 1, 4, c, 0, nullptr).code(), kInvalid);
  EXPECT_TRUE(LaunchKvAppend(g_dummy, g_ids, 0, 4, ValidCache(), 1, nullptr).ok());
}

TEST(ModelKernelsArgsTest, SiluMulAndArgmaxRejectBadArguments) {
  EXPECT_EQ(LaunchSiluMul(g_dummy, 1, 0, g_dummy, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchSiluMul(g_dummy, -1, 8, g_dummy, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchSiluMul(nullptr, 1, 8, g_dummy, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchSiluMul(g_dummy, 1, 8, nullptr, nullptr).code(), kInvalid);
  EXPECT_TRUE(LaunchSiluMul(g_dummy, 0, 8, g_dummy, nullptr).ok());
  EXPECT_EQ(LaunchArgmax(g_floats, 1, 0, g_ids, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchArgmax(g_floats, -1, 8, g_ids, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchArgmax(nullptr, 1, 8, g_ids, nullptr).code(), kInvalid);
  EXPECT_EQ(LaunchArgmax(g_floats, 1, 8, nullptr, nullptr).code(), kInvalid);
  EXPECT_TRUE(LaunchArgmax(g_floats, 0, 8, g_ids, nullptr).ok());
}

DecodeAttentionArgs ValidDecode(const PagedKvCache* cache) {
  DecodeAttentionArgs a;
  a.q = g_dummy;
  a.q_row_stride = 4 * 64;
  a.cache = cache;
  a.layer = 1;
  a.block_tables = g_ids;
  a.max_blocks_per_seq = 4;
  a.context_lens = g_ids;
  a.num_seqs = 0;  // queues nothing once valid
  a.num_heads = 4;
  a.scale = 0.125f;
  a.out = g_dummy;
  a.max_context_len = 64;
  return a;
}

TEST(ModelKernelsArgsTest, DecodeAttentionRejectsBadArguments) {
  const PagedKvCache cache = ValidCache();
  EXPECT_TRUE(LaunchPagedDecodeAttention(ValidDecode(&cache), nullptr).ok());
  auto expect_invalid = [&](auto mutate, const char* what) {
    PagedKvCache c = cache;
    DecodeAttentionArgs a = ValidDecode(&c);
    mutate(a, c);
    EXPECT_EQ(LaunchPagedDecodeAttention(a, nullptr).code(), kInvalid) << what;
  };
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.cache = nullptr; }, "cache");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.q = nullptr; }, "q");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.out = nullptr; }, "out");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.block_tables = nullptr; },
                 "block_tables");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.context_lens = nullptr; },
                 "context_lens");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.layer = 2; }, "layer");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.num_heads = 3; },
                 "heads not a multiple of kv heads");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.q_row_stride = 100; },
                 "q_row_stride");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.num_seqs = -1; }, "num_seqs");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.max_blocks_per_seq = 0; },
                 "max_blocks_per_seq");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.scale = NAN; }, "scale");
  expect_invalid([](DecodeAttentionArgs&, PagedKvCache& c) { c.head_dim = 96; }, "head_dim");
  expect_invalid(
      [](DecodeAttentionArgs&, PagedKvCache& c) { c.k = reinterpret_cast<char*>(g_dummy) + 2; },
      "misaligned cache");
  expect_invalid(
      [](DecodeAttentionArgs&, PagedKvCache& c) { c.layer_stride = 4 * 16 * 2 * 64 + 4; },
      "misaligned layer");
  expect_invalid(
      [](DecodeAttentionArgs& a, PagedKvCache&) {
        a.num_seqs = 1;
        a.max_context_len = 0;
      },
      "max_context_len");
  expect_invalid(
      [](DecodeAttentionArgs& a, PagedKvCache&) {
        a.num_seqs = 1;
        a.max_context_len = 8192;  // splits: needs a workspace
        a.workspace = nullptr;
      },
      "missing workspace");
  expect_invalid(
      [](DecodeAttentionArgs& a, PagedKvCache&) {
        a.num_seqs = 1;
        a.max_context_len = 8192;
        a.workspace = g_floats;
        a.workspace_bytes = 16;
      },
      "small workspace");
  // A tuning field out of its range (decode_attention_tuning.h).
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.tuning.split_target = 31; },
                 "split_target");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.tuning.min_split_tokens = 0; },
                 "min_split_tokens 0");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.tuning.min_split_tokens = 100; },
                 "min_split_tokens not a multiple of a tile");
  expect_invalid([](DecodeAttentionArgs& a, PagedKvCache&) { a.tuning.max_chain = 5; },
                 "max_chain");
}

TEST(ModelKernelsArgsTest, PrefillAttentionRejectsBadArguments) {
  const PagedKvCache cache = ValidCache();
  auto valid = [&](const PagedKvCache* c) {
    PrefillAttentionArgs a;
    a.q = g_dummy;
    a.q_row_stride = 4 * 64;
    a.cache = c;
    a.layer = 0;
    a.block_tables = g_ids;
    a.max_blocks_per_seq = 4;
    a.seq_start_rows = g_ids;
    a.start_pos = g_ids;
    a.num_seqs = 0;
    a.max_new_tokens = 8;
    a.num_heads = 4;
    a.scale = 0.125f;
    a.out = g_dummy;
    return a;
  };
  EXPECT_TRUE(LaunchPrefillAttention(valid(&cache), nullptr).ok());
  PrefillAttentionArgs a = valid(&cache);
  a.seq_start_rows = nullptr;
  EXPECT_EQ(LaunchPrefillAttention(a, nullptr).code(), kInvalid);
  a = valid(&cache);
  a.start_pos = nullptr;
  EXPECT_EQ(LaunchPrefillAttention(a, nullptr).code(), kInvalid);
  a = valid(&cache);
  a.num_seqs = 1;
  a.max_new_tokens = 0;
  EXPECT_EQ(LaunchPrefillAttention(a, nullptr).code(), kInvalid);
  a = valid(&cache);
  a.num_heads = 5;  // not a multiple of the 2 KV heads
  EXPECT_EQ(LaunchPrefillAttention(a, nullptr).code(), kInvalid);
  PagedKvCache c = cache;
  c.head_dim = 256;
  a = valid(&c);
  a.q_row_stride = 4 * 256;
  EXPECT_EQ(LaunchPrefillAttention(a, nullptr).code(), kInvalid);
  a = valid(nullptr);
  EXPECT_EQ(LaunchPrefillAttention(a, nullptr).code(), kInvalid);
}

TEST(DecodeSplitPlanTest, SplitsOnlyWhenTheBatchCannotFillTheGpu) {
  // Batch 1 at long context: many splits of whole tiles covering the context.
  internal::DecodeSplitPlan p = Plan(1, 32, 8192);
  EXPECT_GT(p.num_splits, 16);
  EXPECT_EQ(p.partition_size % internal::kDecodeTileTokens, 0);
  EXPECT_GE(int64_t{p.num_splits} * p.partition_size, 8192);
  EXPECT_LT(int64_t{p.num_splits - 1} * p.partition_size, 8192);
  // Short contexts and big batches: no split.
  EXPECT_EQ(Plan(1, 32, internal::kDecodeTileTokens).num_splits, 1);
  EXPECT_EQ(Plan(1, 32, internal::kDecodeMinSplitTokens).num_splits, 1);
  // No split shorter than kDecodeMinSplitTokens: batch 1 at 1K gets 4 splits of 256 tokens.
  p = Plan(1, 32, 1024);
  EXPECT_EQ(p.num_splits, 1024 / internal::kDecodeMinSplitTokens);
  EXPECT_EQ(p.partition_size, internal::kDecodeMinSplitTokens);
  p = Plan(1, 32, 8192);
  EXPECT_EQ(p.num_splits, 8192 / internal::kDecodeMinSplitTokens);
  EXPECT_EQ(Plan(64, 32, 8192).num_splits, 1);
  EXPECT_EQ(Plan(256, 32, 100000).num_splits, 1);
}

TEST(DecodeSplitPlanTest, ShortContextsSplitFurtherToGiveEachSmACta) {
  // Llama-3-8B shape (32 query heads, 8 KV heads) on 132 SMs. Batch 1 at 1K: 16 splits of one
  // tile (128 CTAs) instead of 4 of 256 tokens.
  internal::DecodeSplitPlan p = Plan(1, 32, 1024, 8, 132);
  EXPECT_EQ(p.num_splits, 16);
  EXPECT_EQ(p.partition_size, internal::kDecodeTileTokens);
  // Batch 1 at 8K already has 32 splits (256 CTAs): unchanged.
  EXPECT_EQ(Plan(1, 32, 8192, 8, 132).num_splits, Plan(1, 32, 8192).num_splits);
  // Batch 8 at 1K: 64 CTAs per split, 4 splits already fill the SMs: unchanged.
  EXPECT_EQ(Plan(8, 32, 1024, 8, 132).num_splits, Plan(8, 32, 1024).num_splits);
  // Never shorter than a tile, never past the work-item target, no SM count: no raise.
  EXPECT_EQ(Plan(1, 32, 300, 8, 132).num_splits, 5);
  EXPECT_EQ(Plan(1, 32, internal::kDecodeTileTokens, 8, 132).num_splits, 1);
  EXPECT_EQ(Plan(1, 32, 1024, 8, 0).num_splits, 4);
  // Every plan covers the context with whole tiles.
  for (const int context : {65, 700, 1024, 3000}) {
    p = Plan(1, 32, context, 8, 132);
    EXPECT_EQ(p.partition_size % internal::kDecodeTileTokens, 0) << context;
    EXPECT_GE(int64_t{p.num_splits} * p.partition_size, context) << context;
    EXPECT_LT(int64_t{p.num_splits - 1} * p.partition_size, context) << context;
  }
}

TEST(DecodeSplitPlanTest, ChainsItemsPerCtaPastOneWave) {
  // Llama-3-8B shape on 132 SMs (264 CTA slots at kDecodeChainCtasPerSm = 2). Batch 64: 512
  // (sequence, KV head) items, two per CTA (256 CTAs); batch 132: 1056 items, four per CTA.
  static_assert(internal::kDecodeChainCtasPerSm == 2);
  static_assert(internal::kDecodeMaxChain == 4);
  EXPECT_EQ(Plan(64, 32, 1024, 8, 132).chain, 2);
  EXPECT_EQ(Plan(128, 32, 1024, 8, 132).chain, 4);
  EXPECT_EQ(Plan(132, 32, 1024, 8, 132).chain, 4);
  // More than kDecodeMaxChain items per CTA (batch 133, 256): one per CTA.
  EXPECT_EQ(Plan(133, 32, 1024, 8, 132).chain, 1);
  EXPECT_EQ(Plan(256, 32, 1024, 8, 132).chain, 1);
  EXPECT_EQ(Plan(4096, 32, 64, 32, 8).chain, 1);
  // Only up to kDecodeChainMaxContext tokens: longer items amortize their pipeline fill.
  static_assert(internal::kDecodeChainMaxContext == 1024);
  EXPECT_EQ(Plan(64, 32, 1025, 8, 132).chain, 1);
  EXPECT_EQ(Plan(64, 32, 8192, 8, 132).chain, 1);
  // Items that fit one wave, plans with splits, and plans without an SM count: one per CTA.
  // (64 query heads on 4 KV heads: 66 sequences are 264 items, 67 are 268.)
  EXPECT_EQ(Plan(66, 64, 1024, 4, 132).chain, 1);
  EXPECT_EQ(Plan(67, 64, 1024, 4, 132).chain, 2);
  EXPECT_EQ(Plan(8, 32, 1024, 8, 132).chain, 1);
  EXPECT_GT(Plan(8, 32, 1024, 8, 132).num_splits, 1);
  EXPECT_EQ(Plan(64, 32, 1024, 8, 0).chain, 1);
  EXPECT_EQ(Plan(64, 32, 1024).chain, 1);
}

TEST(DecodeSplitPlanTest, WorkspaceBoundCoversEveryPlanAndNeverShrinks) {
  for (const int heads : {8, 32, 64}) {
    for (const int head_dim : {32, 64, 128}) {
      size_t previous_row = 0;
      for (int seqs = 1; seqs <= 300; seqs += 7) {
        size_t previous = 0;
        for (int context = 1; context <= 40000; context = context * 3 / 2 + 1) {
          const size_t bound = DecodeAttentionWorkspaceBytes(seqs, heads, head_dim, context,
                                                             DecodeAttentionTuning{});
          for (const int sms : {0, 132, 1000}) {
            const internal::DecodeSplitPlan plan =
                Plan(seqs, heads, context, std::max(1, heads / 8), sms);
            EXPECT_GE(bound, internal::DecodeWorkspaceBytesForPlan(plan, seqs, heads, head_dim))
                << "seqs=" << seqs << " heads=" << heads << " context=" << context
                << " sms=" << sms;
          }
          EXPECT_GE(bound, previous) << "grows with context";
          previous = bound;
        }
        EXPECT_GE(previous, previous_row) << "grows with seqs";
        previous_row = previous;
      }
    }
  }
}

// The tuning fields move the plan: the work-item target, the split floor, the chain cap; and the
// workspace bound follows the target.
TEST(DecodeSplitPlanTest, TuningMovesTheTargetFloorAndChain) {
  DecodeAttentionTuning t;
  // Batch 8 at 8K: 2048 / 256 items = 8 splits by default; a target of 4096 doubles them.
  EXPECT_EQ(Plan(8, 32, 8192).num_splits, 8);
  t.split_target = 4096;
  EXPECT_EQ(Plan(8, 32, 8192, 0, 0, t).num_splits, 16);
  t.split_target = kDecodeSplitTargetMin;
  EXPECT_EQ(Plan(8, 32, 8192, 0, 0, t).num_splits, 1);
  // A floor of one tile: batch 1 at 1K takes 16 splits of 64 tokens without an SM count.
  t = DecodeAttentionTuning{};
  t.min_split_tokens = internal::kDecodeTileTokens;
  internal::DecodeSplitPlan p = Plan(1, 32, 1024, 0, 0, t);
  EXPECT_EQ(p.num_splits, 16);
  EXPECT_EQ(p.partition_size, internal::kDecodeTileTokens);
  t.min_split_tokens = 1024;
  EXPECT_EQ(Plan(1, 32, 8192, 0, 0, t).num_splits, 8);
  // The chain cap: batch 128 chains 4 items by default, none at 2, 1 or 0.
  t = DecodeAttentionTuning{};
  EXPECT_EQ(Plan(128, 32, 1024, 8, 132, t).chain, 4);
  EXPECT_EQ(Plan(64, 32, 1024, 8, 132, t).chain, 2);
  for (const int cap : {0, 1, 2}) {
    t.max_chain = cap;
    EXPECT_EQ(Plan(128, 32, 1024, 8, 132, t).chain, 1) << cap;
    EXPECT_EQ(Plan(64, 32, 1024, 8, 132, t).chain, cap == 2 ? 2 : 1) << cap;
  }
  // The workspace bound of a larger target covers its plans.
  t = DecodeAttentionTuning{};
  t.split_target = kDecodeSplitTargetMax;
  for (const int seqs : {1, 8, 64}) {
    for (const int context : {100, 1024, 8192, 32768}) {
      const size_t bound = DecodeAttentionWorkspaceBytes(seqs, 32, 128, context, t);
      for (const int sms : {0, 132}) {
        const internal::DecodeSplitPlan plan = Plan(seqs, 32, context, 8, sms, t);
        EXPECT_GE(bound, internal::DecodeWorkspaceBytesForPlan(plan, seqs, 32, 128))
            << seqs << " " << context;
      }
    }
  }
  EXPECT_GT(DecodeAttentionWorkspaceBytes(8, 32, 128, 8192, t),
            DecodeAttentionWorkspaceBytes(8, 32, 128, 8192, DecodeAttentionTuning{}));
}

}  // namespace
}  // namespace tandem::cuda

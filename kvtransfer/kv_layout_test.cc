#include "kvtransfer/kv_layout.h"

#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

using ::testing::HasSubstr;

// Blocks innermost: [layer][kv][block][block_size][heads][head_dim].
KvLayout BlockMajorLayout(int layers, int blocks, int block_size, int heads, int head_dim,
                          int elem_bytes) {
  KvLayout l;
  l.num_layers = layers;
  l.num_blocks = blocks;
  l.block_size = block_size;
  l.num_kv_heads = heads;
  l.head_dim = head_dim;
  l.elem_bytes = elem_bytes;
  l.block_bytes = static_cast<uint64_t>(block_size) * heads * head_dim * elem_bytes;
  l.block_stride = l.block_bytes;
  l.kv_stride = l.block_stride * blocks;
  l.layer_stride = l.kv_stride * 2;
  return l;
}

// Blocks outermost: [block][layer][kv][...], so consecutive blocks are never adjacent.
KvLayout LayerMajorLayout(int layers, int blocks, int block_size, int heads, int head_dim,
                          int elem_bytes) {
  KvLayout l = BlockMajorLayout(layers, blocks, block_size, heads, head_dim, elem_bytes);
  l.kv_stride = l.block_bytes;
  l.layer_stride = 2 * l.block_bytes;
  l.block_stride = l.layer_stride * layers;
  return l;
}

uint64_t RegionBytes(const KvLayout& l) {
  return KvBlockOffset(l, l.num_layers - 1, 1, l.num_blocks - 1) + l.block_bytes;
}

TEST(KvLayoutTest, MergesAdjacentBlocksPerLayerAndKv) {
  const KvLayout l = BlockMajorLayout(2, 16, 4, 2, 8, 2);
  const std::vector<int32_t> src = {3, 4, 5, 9};
  const std::vector<int32_t> dst = {7, 8, 9, 10};
  auto ops = PlanBlockCopies(l, l, src, dst, 16, 0);
  ASSERT_TRUE(ops.ok()) << ops.status();
  // Per (layer, kv): blocks 3,4,5 -> 7,8,9 merge; 9 -> 10 does not follow 5 in the source.
  ASSERT_EQ(ops->size(), 2u * 2u * 2u);
  EXPECT_EQ((*ops)[0].local_offset, KvBlockOffset(l, 0, 0, 3));
  EXPECT_EQ((*ops)[0].remote_offset, KvBlockOffset(l, 0, 0, 7));
  EXPECT_EQ((*ops)[0].length, 3 * l.block_bytes);
  EXPECT_EQ((*ops)[1].local_offset, KvBlockOffset(l, 0, 0, 9));
  EXPECT_EQ((*ops)[1].remote_offset, KvBlockOffset(l, 0, 0, 10));
  EXPECT_EQ((*ops)[1].length, l.block_bytes);
}

TEST(KvLayoutTest, WholeCacheInOrderIsOneOp) {
  const KvLayout l = BlockMajorLayout(3, 4, 2, 1, 4, 4);
  const std::vector<int32_t> ids = {0, 1, 2, 3};
  auto ops = PlanBlockCopies(l, l, ids, ids, 8, 0);
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 1u);
  EXPECT_EQ((*ops)[0].local_offset, 0u);
  EXPECT_EQ((*ops)[0].length, RegionBytes(l));
}

TEST(KvLayoutTest, NoMergeWhenOnlyOneSideIsAdjacent) {
  const KvLayout l = BlockMajorLayout(1, 8, 2, 1, 4, 4);
  const std::vector<int32_t> src = {1, 2};
  const std::vector<int32_t> dst = {5, 3};
  auto ops = PlanBlockCopies(l, l, src, dst, 4, 0);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->size(), 4u);  // 2 blocks x K,V
}

TEST(KvLayoutTest, SkipsOnlyWhollyCachedBlocks) {
  const KvLayout l = LayerMajorLayout(1, 8, 4, 1, 2, 1);
  const std::vector<int32_t> ids = {0, 2, 4, 6};
  // 14 tokens = 4 blocks; 9 cached tokens: blocks 0,1 wholly cached, block 2 partially -> written.
  auto ops = PlanBlockCopies(l, l, ids, ids, 14, 9);
  ASSERT_TRUE(ops.ok()) << ops.status();
  std::vector<uint64_t> starts;
  for (const CopyOp& op : *ops) starts.push_back(op.remote_offset);
  EXPECT_THAT(starts, ::testing::UnorderedElementsAre(
                          KvBlockOffset(l, 0, 0, 4), KvBlockOffset(l, 0, 1, 4),
                          KvBlockOffset(l, 0, 0, 6), KvBlockOffset(l, 0, 1, 6)));
  // Exactly at a block boundary: 8 cached tokens skip blocks 0 and 1 only.
  ops = PlanBlockCopies(l, l, ids, ids, 14, 8);
  ASSERT_TRUE(ops.ok());
  EXPECT_EQ(ops->size(), 4u);
  // Everything cached: nothing to write.
  ops = PlanBlockCopies(l, l, ids, ids, 16, 16);
  ASSERT_TRUE(ops.ok());
  EXPECT_TRUE(ops->empty());
  // One token short of the boundary: block 3 (tokens 12..15) still written, K and V (adjacent in
  // this layout) as one op.
  ops = PlanBlockCopies(l, l, ids, ids, 16, 15);
  ASSERT_TRUE(ops.ok());
  ASSERT_EQ(ops->size(), 1u);
  EXPECT_EQ((*ops)[0].remote_offset, KvBlockOffset(l, 0, 0, 6));
  EXPECT_EQ((*ops)[0].length, 2 * l.block_bytes);
}

// Applies the plan to real buffers and checks every token's K/V against a direct per-token copy
// computed from the layout formula (independent of the planner's block iteration and merging).
TEST(KvLayoutTest, PlanMovesExactlyTheUncachedTokensBetweenDifferentLayouts) {
  const int layers = 3, block_size = 4, heads = 2, head_dim = 3, elem = 2;
  const KvLayout src = BlockMajorLayout(layers, 10, block_size, heads, head_dim, elem);
  const KvLayout dst = LayerMajorLayout(layers, 7, block_size, heads, head_dim, elem);
  std::mt19937 rng(7);
  std::vector<uint8_t> src_mem(RegionBytes(src)), dst_mem(RegionBytes(dst), 0xEE);
  for (auto& b : src_mem) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> expected = dst_mem;
  const std::vector<int32_t> src_ids = {9, 2, 3, 4, 0};
  const std::vector<int32_t> dst_ids = {6, 0, 1, 3, 2};
  const int num_tokens = 18, skip = 5;
  const size_t token_bytes = static_cast<size_t>(heads) * head_dim * elem;
  for (int layer = 0; layer < layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int t = (skip / block_size) * block_size; t < num_tokens; ++t) {
        const int i = t / block_size, slot = t % block_size;
        std::memcpy(&expected[KvBlockOffset(dst, layer, kv, dst_ids[i]) + slot * token_bytes],
                    &src_mem[KvBlockOffset(src, layer, kv, src_ids[i]) + slot * token_bytes],
                    token_bytes);
      }
    }
  }
  // Block 4 (tokens 16..19) is only half used by the prompt but moves whole: mirror that.
  for (int layer = 0; layer < layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int slot = num_tokens % block_size; slot < block_size; ++slot) {
        std::memcpy(&expected[KvBlockOffset(dst, layer, kv, dst_ids[4]) + slot * token_bytes],
                    &src_mem[KvBlockOffset(src, layer, kv, src_ids[4]) + slot * token_bytes],
                    token_bytes);
      }
    }
  }
  auto ops = PlanBlockCopies(src, dst, src_ids, dst_ids, num_tokens, skip);
  ASSERT_TRUE(ops.ok()) << ops.status();
  for (const CopyOp& op : *ops) {
    ASSERT_LE(op.local_offset + op.length, src_mem.size());
    ASSERT_LE(op.remote_offset + op.length, dst_mem.size());
    std::memcpy(&dst_mem[op.remote_offset], &src_mem[op.local_offset], op.length);
  }
  EXPECT_EQ(dst_mem, expected);
}

TEST(KvLayoutTest, RejectsIncompatibleLayouts) {
  const KvLayout a = BlockMajorLayout(2, 8, 4, 2, 8, 2);
  const std::vector<int32_t> ids = {0};
  for (int field = 0; field < 5; ++field) {
    KvLayout b;
    switch (field) {
      case 0:
        b = BlockMajorLayout(3, 8, 4, 2, 8, 2);
        break;
      case 1:
        b = BlockMajorLayout(2, 8, 8, 2, 8, 2);
        break;
      case 2:
        b = BlockMajorLayout(2, 8, 4, 1, 8, 2);
        break;
      case 3:
        b = BlockMajorLayout(2, 8, 4, 2, 4, 2);
        break;
      default:
        b = BlockMajorLayout(2, 8, 4, 2, 8, 4);
        break;
    }
    auto ops = PlanBlockCopies(a, b, ids, ids, 4, 0);
    ASSERT_FALSE(ops.ok()) << "field " << field;
    EXPECT_EQ(ops.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ops.status().message(), HasSubstr("layouts differ"));
  }
  KvLayout bad = a;
  bad.block_bytes += 1;
  EXPECT_EQ(PlanBlockCopies(a, bad, ids, ids, 4, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = a;
  bad.head_dim = 0;
  EXPECT_EQ(PlanBlockCopies(bad, a, ids, ids, 4, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Found by fuzz/kv_layout_fuzz.cc: offsets and block_bytes were computed modulo 2^64, so a peer's
// layout could pass validation with blocks past the end of the address space (offsets that wrap
// onto other memory) or with a dimension product that wraps to the stated block_bytes.
TEST(KvLayoutTest, RejectsLayoutsWhoseOffsetsOrBlockBytesWrap) {
  const KvLayout ok = BlockMajorLayout(2, 4, 16, 4, 8, 4);
  ASSERT_TRUE(ValidateKvLayout(ok).ok());
  KvLayout wraps = ok;
  wraps.layer_stride = uint64_t{1} << 63;
  wraps.kv_stride = uint64_t{1} << 62;
  wraps.block_stride = UINT64_MAX / 3;
  EXPECT_THAT(ValidateKvLayout(wraps).message(), HasSubstr("past 2^64"));
  const std::vector<int32_t> ids = {3};
  EXPECT_FALSE(PlanBlockCopies(wraps, wraps, ids, ids, 16, 0).ok());
  // The largest layout that still fits: its last byte is at 2^64 - 1.
  KvLayout top = BlockMajorLayout(1, 2, 1, 1, 1, 1);
  top.kv_stride = 0;
  top.block_stride = UINT64_MAX - 1;
  EXPECT_TRUE(ValidateKvLayout(top).ok());
  top.block_stride = UINT64_MAX;
  EXPECT_FALSE(ValidateKvLayout(top).ok());

  KvLayout product = BlockMajorLayout(1, 1, 1, 1, 1, 1);
  product.block_size = 1 << 30;
  product.num_kv_heads = 1 << 30;
  product.head_dim = 16;
  product.elem_bytes = 1;
  product.block_bytes = 0;  // 2^30 * 2^30 * 16 * 1 == 0 modulo 2^64
  EXPECT_THAT(ValidateKvLayout(product).message(), HasSubstr("block_bytes"));
}

TEST(KvLayoutTest, RejectsOutOfRangeIdsAndCounts) {
  const KvLayout l = BlockMajorLayout(1, 4, 4, 1, 4, 2);
  const std::vector<int32_t> ok = {0, 1};
  const std::vector<int32_t> high = {0, 4};
  const std::vector<int32_t> negative = {-1, 1};
  const std::vector<int32_t> short_list = {0};
  EXPECT_THAT(PlanBlockCopies(l, l, high, ok, 8, 0).status().message(), HasSubstr("out of range"));
  EXPECT_THAT(PlanBlockCopies(l, l, ok, negative, 8, 0).status().message(),
              HasSubstr("out of range"));
  EXPECT_EQ(PlanBlockCopies(l, l, short_list, ok, 8, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanBlockCopies(l, l, ok, ok, 8, 9).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanBlockCopies(l, l, ok, ok, -1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Unused trailing ids are not checked; a 4-token prompt needs only the first block.
  EXPECT_TRUE(PlanBlockCopies(l, l, high, ok, 4, 0).ok());
}

}  // namespace
}  // namespace tandem::kvtransfer

namespace tandem::kvtransfer {
namespace {

// Layer-wise planning (streaming): each layer's ops stay inside that layer on both sides, and
// the layers together move exactly the bytes the whole-prompt plan moves.
TEST(KvLayoutLayerTest, LayersPartitionTheWholePlan) {
  const KvLayout l = BlockMajorLayout(3, 8, 4, 2, 8, 2);  // the runners' layout: layers outermost
  const std::vector<int32_t> src = {0, 1, 2, 3, 4}, dst = {7, 0, 1, 2, 3};  // adjacent runs
  auto whole = PlanBlockCopies(l, l, src, dst, 18, 5);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<std::pair<uint64_t, uint64_t>> want, got;  // (remote byte, local byte) pairs
  for (const CopyOp& op : *whole) {
    for (uint64_t b = 0; b < op.length; ++b)
      want.emplace_back(op.remote_offset + b, op.local_offset + b);
  }
  for (int layer = 0; layer < l.num_layers; ++layer) {
    auto ops = PlanLayerBlockCopies(l, l, src, dst, 18, 5, layer, layer + 1);
    ASSERT_TRUE(ops.ok()) << ops.status();
    for (const CopyOp& op : *ops) {
      EXPECT_EQ(op.local_offset / l.layer_stride, static_cast<uint64_t>(layer));
      EXPECT_EQ((op.local_offset + op.length - 1) / l.layer_stride, static_cast<uint64_t>(layer));
      EXPECT_EQ((op.remote_offset + op.length - 1) / l.layer_stride, static_cast<uint64_t>(layer));
      for (uint64_t b = 0; b < op.length; ++b)
        got.emplace_back(op.remote_offset + b, op.local_offset + b);
    }
  }
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  EXPECT_FALSE(PlanLayerBlockCopies(l, l, src, dst, 18, 5, 2, 2).ok());
  EXPECT_FALSE(PlanLayerBlockCopies(l, l, src, dst, 18, 5, 0, 4).ok());
  EXPECT_FALSE(PlanLayerBlockCopies(l, l, src, dst, 18, 5, -1, 1).ok());
}

}  // namespace
}  // namespace tandem::kvtransfer

// PlanMirrorCopies: the strided copies that move a set of KV blocks between a device cache and its
// host mirror. Checked by applying the plan to two host buffers and comparing byte by byte with a
// block-by-block reference copy (KvCacheLayout's formula), for the CUDA runner's layout and for
// layouts with other slab orders.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "runtime/model/cuda/kv_host_mirror.h"

namespace tandem {
namespace {

// [num_layers, 2, num_blocks, block] (the CUDA runner's order).
KvCacheLayout RunnerLayout(int layers, int blocks, size_t block_bytes) {
  KvCacheLayout l;
  l.num_layers = layers;
  l.num_blocks = blocks;
  l.block_size = 1;
  l.num_kv_heads = 1;
  l.head_dim = static_cast<int>(block_bytes);
  l.elem_bytes = 1;
  l.block_bytes = block_bytes;
  l.block_stride = block_bytes;
  l.kv_stride = block_bytes * blocks;
  l.layer_stride = 2 * l.kv_stride;
  l.bytes = l.layer_stride * layers;
  return l;
}

// Applies `copies` from `src` to `dst` (host memory standing in for cudaMemcpy2D).
void Apply(const std::vector<MirrorCopy>& copies, const std::vector<uint8_t>& src,
           std::vector<uint8_t>* dst) {
  for (const MirrorCopy& c : copies) {
    for (size_t r = 0; r < c.rows; ++r) {
      const size_t at = c.offset + r * c.pitch;
      ASSERT_LE(at + c.width, dst->size());
      std::memcpy(dst->data() + at, src.data() + at, c.width);
    }
  }
}

// Copies exactly `blocks` with the layout formula, then compares with the plan's result.
void ExpectPlanCopiesExactly(const KvCacheLayout& l, const std::vector<int32_t>& blocks) {
  std::vector<uint8_t> src(l.bytes);
  std::iota(src.begin(), src.end(), uint8_t{1});
  std::vector<uint8_t> want(l.bytes, 0), got(l.bytes, 0);
  for (int32_t b : blocks) {
    for (int layer = 0; layer < l.num_layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        std::memcpy(want.data() + l.Offset(layer, kv, b), src.data() + l.Offset(layer, kv, b),
                    l.block_bytes);
      }
    }
  }
  auto plan = PlanMirrorCopies(l, blocks);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Apply(*plan, src, &got);
  EXPECT_TRUE(want == got) << "the plan copied other bytes than the blocks";
}

TEST(KvHostMirrorPlanTest, OneCopyPerRunOfConsecutiveBlocks) {
  const KvCacheLayout l = RunnerLayout(3, 16, 8);
  // 7 8 9 | 2 | 4 5 (given out of order, with a duplicate)
  auto plan = PlanMirrorCopies(l, std::vector<int32_t>{7, 8, 9, 2, 4, 5, 8});
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_EQ((*plan)[0].offset, 2 * 8u);
  EXPECT_EQ((*plan)[0].width, 8u);
  EXPECT_EQ((*plan)[1].offset, 4 * 8u);
  EXPECT_EQ((*plan)[1].width, 16u);
  EXPECT_EQ((*plan)[2].offset, 7 * 8u);
  EXPECT_EQ((*plan)[2].width, 24u);
  for (const MirrorCopy& c : *plan) {
    EXPECT_EQ(c.pitch, l.kv_stride);
    EXPECT_EQ(c.rows, 6u);  // 3 layers x (K, V)
  }
  ExpectPlanCopiesExactly(l, {7, 8, 9, 2, 4, 5, 8});
}

TEST(KvHostMirrorPlanTest, CopiesExactlyTheBlocksForEveryLayoutOrder) {
  ExpectPlanCopiesExactly(RunnerLayout(2, 10, 12), {0});
  ExpectPlanCopiesExactly(RunnerLayout(2, 10, 12), {9, 0, 1, 2, 3, 4, 5, 6, 7, 8});
  ExpectPlanCopiesExactly(RunnerLayout(1, 5, 4), {3, 1});

  // Layers padded apart (layer_stride > 2 * kv_stride): one copy per (run, layer).
  KvCacheLayout padded = RunnerLayout(3, 8, 4);
  padded.layer_stride += 20;
  padded.bytes = padded.layer_stride * 3;
  auto plan = PlanMirrorCopies(padded, std::vector<int32_t>{1, 2, 6});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->size(), 6u);
  ExpectPlanCopiesExactly(padded, {1, 2, 6});

  // K and V of a block side by side ([layers, blocks, 2, block]): runs wider than kv_stride.
  KvCacheLayout interleaved = RunnerLayout(2, 6, 4);
  interleaved.kv_stride = 4;
  interleaved.block_stride = 8;
  interleaved.layer_stride = 48;
  interleaved.bytes = 96;
  ExpectPlanCopiesExactly(interleaved, {0, 1, 2, 5});
}

TEST(KvHostMirrorPlanTest, RejectsBlockIdsOutOfRangeAndAcceptsNone) {
  const KvCacheLayout l = RunnerLayout(2, 4, 8);
  for (int32_t bad : {-1, 4, 1000}) {
    auto plan = PlanMirrorCopies(l, std::vector<int32_t>{0, bad});
    ASSERT_FALSE(plan.ok()) << bad;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(plan.status().message(), ::testing::HasSubstr("block id"));
  }
  auto none = PlanMirrorCopies(l, std::vector<int32_t>{});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(KvHostMirrorPlanTest, StagingBeforeTheMirrorExistsIsAnError) {
  KvHostMirror mirror;  // nothing allocated, no CUDA call
  const std::vector<int32_t> blocks = {0};
  const absl::Status s = mirror.Stage(blocks, KvStage::kToMirror, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

}  // namespace
}  // namespace tandem

#include "kvtransfer/kv_convert.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_layout.h"
#include "runtime/base/float16.h"

namespace tandem::kvtransfer {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 2;
constexpr int kHeadDim = 4;
constexpr int kModelHeads = 4;

// [layer][kv][block][slot][head][dim] (block_major) or [block][layer][kv][...] (otherwise).
KvLayout MakeLayout(int blocks, int block_size, KvDtype dtype, int head_begin, int heads,
                    bool block_major) {
  KvLayout l;
  l.num_layers = kLayers;
  l.num_blocks = blocks;
  l.block_size = block_size;
  l.num_kv_heads = heads;
  l.head_dim = kHeadDim;
  l.dtype = dtype;
  l.elem_bytes = KvDtypeBytes(dtype);
  l.head_begin = head_begin;
  l.total_kv_heads = kModelHeads;
  l.block_bytes = static_cast<uint64_t>(block_size) * heads * kHeadDim * l.elem_bytes;
  if (block_major) {
    l.block_stride = l.block_bytes;
    l.kv_stride = l.block_stride * blocks;
    l.layer_stride = l.kv_stride * 2;
  } else {
    l.kv_stride = l.block_bytes;
    l.layer_stride = 2 * l.block_bytes;
    l.block_stride = l.layer_stride * kLayers;
  }
  return l;
}

uint64_t RegionBytes(const KvLayout& l) {
  uint64_t end = 0;
  for (int layer = 0; layer < l.num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      end = std::max(end, KvBlockOffset(l, layer, kv, l.num_blocks - 1) + l.block_bytes);
    }
  }
  return end;
}

// Source values: random floats plus the cases rounding must get right (ties, NaN, infinities,
// the largest finite values, subnormals), stored in the layout's dtype.
std::vector<char> FillSource(const KvLayout& l, std::mt19937& rng) {
  std::vector<char> bytes(RegionBytes(l));
  const float specials[] = {1.0f + 0x1p-8f,      // bf16 tie, rounds down to even
                            1.0f + 3 * 0x1p-8f,  // tie, rounds up to even
                            std::numeric_limits<float>::quiet_NaN(),   //
                            -std::numeric_limits<float>::infinity(),   //
                            std::numeric_limits<float>::max(),         // rounds to inf
                            std::numeric_limits<float>::denorm_min(),  //
                            -0.0f};
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const size_t count = bytes.size() / l.elem_bytes;
  for (size_t i = 0; i < count; ++i) {
    const float f = i % 11 == 0 ? specials[(i / 11) % 7] : normal(rng);
    if (l.dtype == KvDtype::kF32) {
      std::memcpy(bytes.data() + 4 * i, &f, 4);
    } else {
      const uint16_t h = FloatToBf16(f);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

// The definition, element by element: what the planner and ConvertOnHost must reproduce.
void ReferenceConvert(const KvLayout& src, const KvLayout& dst, const std::vector<int32_t>& sb,
                      const std::vector<int32_t>& db, int num_tokens, int skip_tokens,
                      int layer_begin, int layer_end, const std::vector<char>& in,
                      std::vector<char>* out) {
  const int h_begin = std::max(src.head_begin, dst.head_begin);
  const int h_end = std::min(src.head_begin + src.num_kv_heads, dst.head_begin + dst.num_kv_heads);
  for (int t = (skip_tokens / dst.block_size) * dst.block_size; t < num_tokens; ++t) {
    for (int layer = layer_begin; layer < layer_end; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = h_begin; h < h_end; ++h) {
          for (int d = 0; d < kHeadDim; ++d) {
            const uint64_t si = KvBlockOffset(src, layer, kv, sb[t / src.block_size]) +
                                ((static_cast<uint64_t>(t % src.block_size) * src.num_kv_heads +
                                  (h - src.head_begin)) *
                                     kHeadDim +
                                 d) *
                                    src.elem_bytes;
            const uint64_t di = KvBlockOffset(dst, layer, kv, db[t / dst.block_size]) +
                                ((static_cast<uint64_t>(t % dst.block_size) * dst.num_kv_heads +
                                  (h - dst.head_begin)) *
                                     kHeadDim +
                                 d) *
                                    dst.elem_bytes;
            float f;
            if (src.dtype == KvDtype::kF32) {
              std::memcpy(&f, in.data() + si, 4);
            } else {
              uint16_t h16;
              std::memcpy(&h16, in.data() + si, 2);
              f = Bf16ToFloat(h16);
            }
            if (dst.dtype == KvDtype::kF32) {
              if (src.dtype == KvDtype::kF32) {
                std::memcpy(out->data() + di, in.data() + si, 4);  // bit for bit, NaNs too
              } else {
                std::memcpy(out->data() + di, &f, 4);
              }
            } else if (src.dtype == KvDtype::kBf16) {
              std::memcpy(out->data() + di, in.data() + si, 2);
            } else {
              const uint16_t h16 = FloatToBf16(f);
              std::memcpy(out->data() + di, &h16, 2);
            }
          }
        }
      }
    }
  }
}

struct HeadRanges {
  int src_begin, src_count, dst_begin, dst_count;
};

// Every pair of block sizes in {8, 16, 32, 64}, both dtypes on each side, full and partial head
// ranges, both region orders, with and without a cached prefix and over a layer sub-range: the
// planned conversion equals the element-wise definition bit for bit, and leaves every other byte
// of the destination as it was.
TEST(KvConvertTest, ExhaustiveMatchesTheElementwiseDefinition) {
  const int sizes[] = {8, 16, 32, 64};
  const KvDtype dtypes[] = {KvDtype::kF32, KvDtype::kBf16};
  const HeadRanges heads[] = {
      {0, 4, 0, 4},  // both hold every head
      {0, 4, 1, 2},  // the destination is a shard
      {2, 2, 0, 4},  // the source is a shard
      {0, 3, 1, 3},  // overlapping shards
  };
  std::mt19937 rng(7);
  int cases = 0;
  for (int bs : sizes) {
    for (int bd : sizes) {
      for (KvDtype ts : dtypes) {
        for (KvDtype td : dtypes) {
          for (const HeadRanges& hr : heads) {
            for (int variant = 0; variant < 3; ++variant) {
              const int num_tokens = 93 + 40 * variant;  // never a multiple of a block
              const int skip = variant == 1 ? 37 : (variant == 2 ? 64 : 0);
              const int lb = variant == 2 ? 1 : 0;
              const int le = kLayers;
              const int src_needed = (num_tokens + bs - 1) / bs;
              const int dst_needed = (num_tokens + bd - 1) / bd;
              const KvLayout src =
                  MakeLayout(src_needed + 3, bs, ts, hr.src_begin, hr.src_count, variant != 1);
              const KvLayout dst =
                  MakeLayout(dst_needed + 5, bd, td, hr.dst_begin, hr.dst_count, variant == 0);
              std::vector<int32_t> sb(src.num_blocks), db(dst.num_blocks);
              std::iota(sb.begin(), sb.end(), 0);
              std::iota(db.begin(), db.end(), 0);
              if (variant != 0) {  // scattered ids; variant 0 keeps runs that merge
                std::shuffle(sb.begin(), sb.end(), rng);
                std::shuffle(db.begin(), db.end(), rng);
              }
              sb.resize(src_needed);
              db.resize(dst_needed);
              const std::vector<char> in = FillSource(src, rng);
              std::vector<char> canary(RegionBytes(dst));
              for (char& c : canary) c = static_cast<char>(rng());
              std::vector<char> want = canary, got = canary;
              ReferenceConvert(src, dst, sb, db, num_tokens, skip, lb, le, in, &want);

              const std::string what =
                  absl::StrCat("bs=", bs, " bd=", bd, " ", KvDtypeName(ts), "->", KvDtypeName(td),
                               " heads [", hr.src_begin, "+", hr.src_count, "]->[", hr.dst_begin,
                               "+", hr.dst_count, "] variant ", variant);
              auto plan = PlanKvConversion(src, dst, sb, db, num_tokens, skip, lb, le);
              ASSERT_TRUE(plan.ok()) << what << ": " << plan.status();
              ASSERT_TRUE(ConvertOnHost(*plan, in.data(), in.size(), got.data(), got.size()).ok())
                  << what;
              ASSERT_TRUE(want == got) << what;

              // Through a staging buffer and byte copies: the same destination bytes.
              const StagedConversion staged = StageConversion(*plan);
              EXPECT_EQ(staged.staging_bytes, ConversionBytes(*plan)) << what;
              std::vector<char> staging(staged.staging_bytes);
              ASSERT_TRUE(
                  ConvertOnHost(staged.pack, in.data(), in.size(), staging.data(), staging.size())
                      .ok())
                  << what;
              std::vector<char> via = canary;
              for (const CopyOp& op : staged.ops) {
                ASSERT_LE(op.local_offset + op.length, staging.size()) << what;
                ASSERT_LE(op.remote_offset + op.length, via.size()) << what;
                std::memcpy(via.data() + op.remote_offset, staging.data() + op.local_offset,
                            op.length);
              }
              ASSERT_TRUE(want == via) << what;
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 4 * 2 * 2 * 4 * 3);
}

TEST(KvConvertTest, SameFormatContiguousBlocksCollapseToOnePiecePerLayerAndKv) {
  const KvLayout l = MakeLayout(16, 16, KvDtype::kBf16, 0, 4, true);
  const std::vector<int32_t> ids = {3, 4, 5, 6};
  auto plan = PlanKvConversion(l, l, ids, ids, 64, 0, 0, kLayers);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->pieces.size(), 2u * kLayers);
  EXPECT_EQ(plan->pieces[0].rows, 1u);
  EXPECT_EQ(plan->pieces[0].row_elems * 2, 4 * l.block_bytes);
  EXPECT_EQ(StageConversion(*plan).ops.size(), 2u * kLayers);
}

TEST(KvConvertTest, RoundsToNearestEvenAndKeepsNaN) {
  KvLayout src = MakeLayout(1, 8, KvDtype::kF32, 0, 4, true);
  KvLayout dst = MakeLayout(1, 8, KvDtype::kBf16, 0, 4, true);
  std::vector<char> in(RegionBytes(src), 0);
  const float values[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f,
                          std::numeric_limits<float>::quiet_NaN(), 3.4e38f};
  std::memcpy(in.data(), values, sizeof(values));
  std::vector<char> out(RegionBytes(dst), 0);
  const std::vector<int32_t> ids = {0};
  auto plan = PlanKvConversion(src, dst, ids, ids, 1, 0, 0, 1);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(ConvertOnHost(*plan, in.data(), in.size(), out.data(), out.size()).ok());
  uint16_t h[5];
  std::memcpy(h, out.data(), sizeof(h));
  EXPECT_EQ(h[0], 0x3f80);  // tie: down to the even mantissa
  EXPECT_EQ(h[1], 0x3f82);  // tie: up to the even mantissa
  EXPECT_EQ(h[2], 0x3f81);  // above the tie: up
  EXPECT_TRUE(std::isnan(Bf16ToFloat(h[3])));
  EXPECT_EQ(h[4], 0x7f80);  // above bf16's largest finite value: infinity
}

TEST(KvConvertTest, RefusesPairsItCannotConvert) {
  const KvLayout a = MakeLayout(8, 16, KvDtype::kBf16, 0, 4, true);
  KvLayout b = a;
  b.num_layers = 3;
  EXPECT_THAT(CheckConvertible(a, b).message(), HasSubstr("num_layers"));
  b = MakeLayout(8, 16, KvDtype::kF32, 0, 4, true);
  b.head_dim = 8;
  b.block_bytes *= 2;
  EXPECT_THAT(CheckConvertible(a, b).message(), HasSubstr("head_dim"));
  b = MakeLayout(8, 16, KvDtype::kF32, 0, 4, true);
  b.total_kv_heads = 8;
  EXPECT_THAT(CheckConvertible(a, b).message(), HasSubstr("KV heads"));
  const KvLayout low = MakeLayout(8, 16, KvDtype::kF32, 0, 2, true);
  const KvLayout high = MakeLayout(8, 16, KvDtype::kF32, 2, 2, true);
  EXPECT_THAT(CheckConvertible(low, high).message(), HasSubstr("none in common"));
  KvLayout raw = a;
  raw.dtype = KvDtype::kRaw;
  EXPECT_THAT(CheckConvertible(raw, MakeLayout(8, 16, KvDtype::kF32, 0, 4, true)).message(),
              HasSubstr("element types"));
  EXPECT_TRUE(CheckConvertible(raw, raw).ok());
  KvLayout mismatched = a;
  mismatched.elem_bytes = 4;
  mismatched.block_bytes *= 2;
  EXPECT_THAT(ValidateKvLayout(mismatched).message(), HasSubstr("does not fit dtype"));
  KvLayout outside = MakeLayout(8, 16, KvDtype::kF32, 3, 2, true);
  EXPECT_THAT(ValidateKvLayout(outside).message(), HasSubstr("outside the model"));
}

TEST(KvConvertTest, RejectsBadIdsCountsAndLayers) {
  const KvLayout s = MakeLayout(4, 8, KvDtype::kF32, 0, 4, true);
  const KvLayout d = MakeLayout(4, 16, KvDtype::kBf16, 0, 4, true);
  const std::vector<int32_t> two = {0, 1};
  const std::vector<int32_t> one = {0};
  const std::vector<int32_t> high = {0, 4};
  EXPECT_THAT(PlanKvConversion(s, d, one, one, 16, 0, 0, 1).status().message(),
              HasSubstr("source blocks"));
  EXPECT_THAT(PlanKvConversion(s, d, high, one, 16, 0, 0, 1).status().message(),
              HasSubstr("out of range"));
  EXPECT_FALSE(PlanKvConversion(s, d, two, one, 16, 17, 0, 1).ok());
  EXPECT_FALSE(PlanKvConversion(s, d, two, one, 16, 0, 1, 1).ok());
  EXPECT_FALSE(PlanKvConversion(s, d, two, one, 16, 0, 0, 3).ok());
}

TEST(KvConvertTest, ConvertOnHostRefusesPiecesOutsideTheBuffers) {
  const KvLayout s = MakeLayout(4, 8, KvDtype::kF32, 0, 4, true);
  const KvLayout d = MakeLayout(4, 8, KvDtype::kBf16, 0, 4, true);
  const std::vector<int32_t> ids = {3};
  auto plan = PlanKvConversion(s, d, ids, ids, 8, 0, 0, kLayers);
  ASSERT_TRUE(plan.ok());
  std::vector<char> in(RegionBytes(s)), out(RegionBytes(d), 1);
  const std::vector<char> before = out;
  EXPECT_THAT(ConvertOnHost(*plan, in.data(), in.size(), out.data(), out.size() - 1).message(),
              HasSubstr("outside"));
  EXPECT_THAT(ConvertOnHost(*plan, in.data(), in.size() - 1, out.data(), out.size()).message(),
              HasSubstr("outside"));
  EXPECT_TRUE(out == before);  // nothing written
  ConversionPlan huge = *plan;
  huge.pieces[0].rows = uint64_t{1} << 62;
  huge.pieces[0].src_pitch = 1 << 20;
  EXPECT_FALSE(ConvertOnHost(huge, in.data(), in.size(), out.data(), out.size()).ok());
}

}  // namespace
}  // namespace tandem::kvtransfer

// KvChecksum: the same KV stored under different block sizes, block ids, strides and held head
// ranges checksums the same; every changed bit inside the range changes it, nothing outside does.
#include "kvtransfer/kv_checksum.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvtransfer/kv_layout.h"

namespace tandem::kvtransfer {
namespace {

// A prompt's KV, token-major: [layer][kv][token][head][head_dim] elements of elem_bytes, for
// every model head.
struct ReferenceKv {
  int layers = 0, tokens = 0, heads = 0, head_dim = 0, elem_bytes = 0;
  std::vector<uint8_t> bytes;

  size_t HeadBytes() const { return static_cast<size_t>(head_dim) * elem_bytes; }
  const uint8_t* Head(int layer, int kv, int token, int head) const {
    const size_t index = ((static_cast<size_t>(layer) * 2 + kv) * tokens + token) * heads + head;
    return bytes.data() + index * HeadBytes();
  }
};

ReferenceKv RandomKv(int layers, int tokens, int heads, int head_dim, uint32_t seed) {
  ReferenceKv kv{.layers = layers,
                 .tokens = tokens,
                 .heads = heads,
                 .head_dim = head_dim,
                 .elem_bytes = 2,
                 .bytes = {}};
  kv.bytes.resize(static_cast<size_t>(layers) * 2 * tokens * heads * kv.HeadBytes());
  std::mt19937 rng(seed);
  for (uint8_t& b : kv.bytes) b = static_cast<uint8_t>(rng());
  return kv;
}

// A bf16 layout holding heads [head_begin, head_begin + num_heads) of `total_heads`, with
// `num_blocks` blocks. Layer-major (the usual pool: [layer][kv][block]) or block-major
// ([block][layer][kv]), each with some padding so no stride is the packed one.
KvLayout MakeLayout(const ReferenceKv& ref, int block_size, int num_blocks, int head_begin,
                    int num_heads, bool block_major) {
  KvLayout l;
  l.num_layers = ref.layers;
  l.num_blocks = num_blocks;
  l.block_size = block_size;
  l.num_kv_heads = num_heads;
  l.head_dim = ref.head_dim;
  l.elem_bytes = ref.elem_bytes;
  l.dtype = KvDtype::kBf16;
  l.head_begin = head_begin;
  l.total_kv_heads = ref.heads;
  l.block_bytes = static_cast<uint64_t>(block_size) * num_heads * ref.HeadBytes();
  if (block_major) {
    l.kv_stride = l.block_bytes + 16;
    l.layer_stride = 2 * l.kv_stride + 8;
    l.block_stride = l.layer_stride * ref.layers + 24;
  } else {
    l.block_stride = l.block_bytes;
    l.kv_stride = l.block_stride * num_blocks + 40;
    l.layer_stride = 2 * l.kv_stride + 64;
  }
  return l;
}

size_t MemoryBytes(const KvLayout& l) {
  return KvBlockOffset(l, l.num_layers - 1, 1, l.num_blocks - 1) + l.block_bytes;
}

// KV stored in one layout: random bytes everywhere, then every token of `ref` scattered into
// shuffled blocks (the heads the layout holds).
struct StoredKv {
  KvLayout layout;
  std::vector<uint8_t> memory;
  std::vector<int32_t> blocks;
};

StoredKv Store(const ReferenceKv& ref, const KvLayout& layout, uint32_t seed) {
  StoredKv s{.layout = layout, .memory = std::vector<uint8_t>(MemoryBytes(layout)), .blocks = {}};
  std::mt19937 rng(seed);
  for (uint8_t& b : s.memory) b = static_cast<uint8_t>(rng());
  std::vector<int32_t> ids(layout.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int needed = (ref.tokens + layout.block_size - 1) / layout.block_size;
  EXPECT_LE(needed, layout.num_blocks);
  s.blocks.assign(ids.begin(), ids.begin() + needed);
  const size_t head_bytes = ref.HeadBytes();
  for (int layer = 0; layer < ref.layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int t = 0; t < ref.tokens; ++t) {
        for (int h = 0; h < layout.num_kv_heads; ++h) {
          const uint64_t at =
              KvBlockOffset(layout, layer, kv, s.blocks[t / layout.block_size]) +
              (static_cast<uint64_t>(t % layout.block_size) * layout.num_kv_heads + h) * head_bytes;
          std::memcpy(s.memory.data() + at, ref.Head(layer, kv, t, layout.head_begin + h),
                      head_bytes);
        }
      }
    }
  }
  return s;
}

struct Range {
  int token_begin, token_end, head_begin, head_end, layer_begin, layer_end;
};

uint64_t Checksum(const StoredKv& s, const Range& r) {
  absl::StatusOr<uint64_t> sum =
      KvChecksum(s.layout, s.memory.data(), s.memory.size(), s.blocks, r.token_begin, r.token_end,
                 r.head_begin, r.head_end, r.layer_begin, r.layer_end);
  EXPECT_TRUE(sum.ok()) << sum.status();
  return sum.ok() ? *sum : 0;
}

// head_dim 64 (128-byte heads) and head_dim 3 (6-byte heads: words straddle heads and runs).
class KvChecksumTest : public ::testing::TestWithParam<int> {};

TEST_P(KvChecksumTest, SameKvUnderAnyBlockSizeAndBlockIdsGivesTheSameChecksum) {
  const ReferenceKv ref = RandomKv(3, 100, 4, GetParam(), 1);
  std::vector<StoredKv> stored;
  uint32_t seed = 10;
  for (int block_size : {8, 16, 32, 64}) {
    for (bool block_major : {false, true}) {
      const int blocks = (ref.tokens + block_size - 1) / block_size + 3;
      stored.push_back(
          Store(ref, MakeLayout(ref, block_size, blocks, 0, ref.heads, block_major), ++seed));
    }
  }
  const std::vector<Range> ranges = {
      {0, 100, 0, 4, 0, 3},  // everything (whole rows)
      {37, 90, 1, 3, 1, 3},  // a window of tokens, heads and layers
      {37, 90, 0, 4, 0, 3},  // whole rows cut off the 32-byte stripes
      {0, 1, 3, 4, 2, 3},    // one head of one token
      {64, 64, 0, 4, 0, 3},  // no tokens
  };
  std::vector<uint64_t> sums;
  for (const Range& r : ranges) {
    const uint64_t sum = Checksum(stored[0], r);
    for (const StoredKv& s : stored) {
      EXPECT_EQ(Checksum(s, r), sum) << "block_size " << s.layout.block_size << " range ["
                                     << r.token_begin << ", " << r.token_end << ")";
    }
    sums.push_back(sum);
  }
  // Different ranges disagree, even where one covers nothing.
  std::sort(sums.begin(), sums.end());
  EXPECT_EQ(std::adjacent_find(sums.begin(), sums.end()), sums.end());
  EXPECT_NE(Checksum(stored[0], {0, 99, 0, 4, 0, 3}), Checksum(stored[0], ranges[0]));
}

TEST_P(KvChecksumTest, EveryFlippedBitInsideTheRangeChangesItAndNoneOutside) {
  const ReferenceKv ref = RandomKv(3, 29, 4, GetParam() == 3 ? 3 : 4, 2);
  StoredKv s = Store(ref, MakeLayout(ref, 8, 6, 0, ref.heads, false), 3);
  for (const Range& r : {Range{3, 29, 1, 3, 1, 3}, Range{5, 21, 0, 4, 0, 2}}) {
    // Which bytes the range covers.
    std::vector<bool> inside(s.memory.size(), false);
    const size_t head_bytes = ref.HeadBytes();
    for (int layer = r.layer_begin; layer < r.layer_end; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int t = r.token_begin; t < r.token_end; ++t) {
          for (int h = r.head_begin; h < r.head_end; ++h) {
            const uint64_t at =
                KvBlockOffset(s.layout, layer, kv, s.blocks[t / 8]) +
                (static_cast<uint64_t>(t % 8) * s.layout.num_kv_heads + h) * head_bytes;
            std::fill_n(inside.begin() + at, head_bytes, true);
          }
        }
      }
    }
    const uint64_t sum = Checksum(s, r);
    int changed = 0, covered = 0;
    for (size_t i = 0; i < s.memory.size(); ++i) {
      covered += inside[i];
      for (int bit = 0; bit < 8; ++bit) {
        s.memory[i] ^= static_cast<uint8_t>(1u << bit);
        const bool differs = Checksum(s, r) != sum;
        s.memory[i] ^= static_cast<uint8_t>(1u << bit);
        ASSERT_EQ(differs, inside[i]) << "byte " << i << " bit " << bit;
        changed += differs;
      }
    }
    EXPECT_EQ(changed, 8 * covered);
    EXPECT_EQ(covered, (r.layer_end - r.layer_begin) * 2 * (r.token_end - r.token_begin) *
                           (r.head_end - r.head_begin) * static_cast<int>(head_bytes));
    EXPECT_EQ(Checksum(s, r), sum);
  }
}

TEST_P(KvChecksumTest, HeadSubRangesAgreeAcrossShardsHoldingDifferentHeads) {
  const ReferenceKv ref = RandomKv(2, 40, 8, GetParam(), 4);
  // Tensor-parallel shards: all heads, the upper half, a middle half, a single head.
  const StoredKv all = Store(ref, MakeLayout(ref, 16, 5, 0, 8, false), 5);
  const StoredKv upper = Store(ref, MakeLayout(ref, 32, 4, 4, 4, true), 6);
  const StoredKv middle = Store(ref, MakeLayout(ref, 8, 7, 2, 4, false), 7);
  const StoredKv single = Store(ref, MakeLayout(ref, 64, 2, 5, 1, false), 8);
  const Range head5{0, 40, 5, 6, 0, 2};
  const uint64_t sum5 = Checksum(all, head5);
  EXPECT_EQ(Checksum(upper, head5), sum5);
  EXPECT_EQ(Checksum(middle, head5), sum5);
  EXPECT_EQ(Checksum(single, head5), sum5);
  const Range heads45{3, 33, 4, 6, 1, 2};
  EXPECT_EQ(Checksum(upper, heads45), Checksum(all, heads45));
  EXPECT_EQ(Checksum(middle, heads45), Checksum(all, heads45));
  EXPECT_NE(Checksum(all, heads45), Checksum(all, {3, 33, 5, 6, 1, 2}));
  // A head a shard does not hold is an error, not a checksum of something else.
  EXPECT_EQ(KvChecksum(single.layout, single.memory.data(), single.memory.size(), single.blocks, 0,
                       40, 4, 6, 0, 2)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, KvChecksumTest, ::testing::Values(64, 3),
                         [](const auto& info) { return "head_dim" + std::to_string(info.param); });

TEST(KvChecksumOrderTest, TokensInAnotherOrderChecksumDifferently) {
  const ReferenceKv ref = RandomKv(2, 32, 2, 8, 9);
  StoredKv s = Store(ref, MakeLayout(ref, 8, 4, 0, 2, false), 10);
  const Range r{0, 32, 0, 2, 0, 2};
  const uint64_t sum = Checksum(s, r);
  std::swap(s.blocks[1], s.blocks[2]);
  EXPECT_NE(Checksum(s, r), sum);
  std::swap(s.blocks[1], s.blocks[2]);
  EXPECT_EQ(Checksum(s, r), sum);
  // K and V of one block swapped.
  uint8_t* k = s.memory.data() + KvBlockOffset(s.layout, 1, 0, s.blocks[3]);
  uint8_t* v = s.memory.data() + KvBlockOffset(s.layout, 1, 1, s.blocks[3]);
  std::swap_ranges(k, k + s.layout.block_bytes, v);
  EXPECT_NE(Checksum(s, r), sum);
}

TEST(KvChecksumErrorsTest, RejectsBadInput) {
  const ReferenceKv ref = RandomKv(2, 20, 4, 4, 11);
  const StoredKv s = Store(ref, MakeLayout(ref, 8, 4, 2, 2, false), 12);  // heads [2, 4)
  const auto code = [&](const KvLayout& layout, const void* memory, size_t bytes,
                        std::vector<int32_t> blocks, Range r) {
    return KvChecksum(layout, memory, bytes, blocks, r.token_begin, r.token_end, r.head_begin,
                      r.head_end, r.layer_begin, r.layer_end)
        .status()
        .code();
  };
  const auto bad = [&](Range r) {
    return code(s.layout, s.memory.data(), s.memory.size(), s.blocks, r);
  };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(bad({0, 20, 2, 4, 0, 2}), absl::StatusCode::kOk);
  // Heads outside the held [2, 4), or none.
  EXPECT_EQ(bad({0, 20, 1, 4, 0, 2}), kInvalid);
  EXPECT_EQ(bad({0, 20, 2, 5, 0, 2}), kInvalid);
  EXPECT_EQ(bad({0, 20, 3, 3, 0, 2}), kInvalid);
  // Layers out of range, or none.
  EXPECT_EQ(bad({0, 20, 2, 4, -1, 2}), kInvalid);
  EXPECT_EQ(bad({0, 20, 2, 4, 0, 3}), kInvalid);
  EXPECT_EQ(bad({0, 20, 2, 4, 1, 1}), kInvalid);
  // Tokens that are no range, or that the blocks do not cover (3 blocks of 8 hold 24).
  EXPECT_EQ(bad({-1, 20, 2, 4, 0, 2}), kInvalid);
  EXPECT_EQ(bad({10, 9, 2, 4, 0, 2}), kInvalid);
  EXPECT_EQ(bad({0, 25, 2, 4, 0, 2}), kInvalid);
  // Block ids out of range (also one before token_begin: the ids are positional).
  std::vector<int32_t> blocks = s.blocks;
  blocks[2] = 4;
  EXPECT_EQ(code(s.layout, s.memory.data(), s.memory.size(), blocks, {0, 20, 2, 4, 0, 2}),
            kInvalid);
  blocks = s.blocks;
  blocks[0] = -1;
  EXPECT_EQ(code(s.layout, s.memory.data(), s.memory.size(), blocks, {16, 20, 2, 4, 0, 2}),
            kInvalid);
  // Memory one byte short of the furthest block read, or none.
  const int32_t last = *std::max_element(s.blocks.begin(), s.blocks.end());
  const size_t end = KvBlockOffset(s.layout, 1, 1, last) + s.layout.block_bytes;
  EXPECT_EQ(code(s.layout, s.memory.data(), end, s.blocks, {0, 20, 2, 4, 0, 2}),
            absl::StatusCode::kOk);
  EXPECT_EQ(code(s.layout, s.memory.data(), end - 1, s.blocks, {0, 20, 2, 4, 0, 2}), kInvalid);
  EXPECT_EQ(code(s.layout, nullptr, s.memory.size(), s.blocks, {0, 20, 2, 4, 0, 2}), kInvalid);
  // Strides whose offsets would wrap around.
  KvLayout huge = s.layout;
  huge.layer_stride = UINT64_MAX / 2 + 1;
  EXPECT_EQ(code(huge, s.memory.data(), s.memory.size(), s.blocks, {0, 20, 2, 4, 0, 2}), kInvalid);
  // An invalid layout.
  KvLayout invalid = s.layout;
  invalid.block_bytes += 1;
  EXPECT_EQ(code(invalid, s.memory.data(), s.memory.size(), s.blocks, {0, 20, 2, 4, 0, 2}),
            kInvalid);
}

// Not a pass/fail test of speed (CI machines vary): prints the rate over 64 MiB.
TEST(KvChecksumThroughputTest, HashesHundredsOfMiBQuickly) {
  const ReferenceKv ref = RandomKv(32, 512, 8, 128, 13);  // 64 MiB of bf16 KV
  const StoredKv s = Store(ref, MakeLayout(ref, 16, 36, 0, 8, false), 14);
  for (const Range& r : {Range{0, 512, 0, 8, 0, 32}, Range{0, 512, 2, 6, 0, 32}}) {
    const double mib = (r.layer_end - r.layer_begin) * 2.0 * (r.token_end - r.token_begin) *
                       (r.head_end - r.head_begin) * static_cast<double>(ref.HeadBytes()) /
                       (1 << 20);
    uint64_t sum = 0;
    const auto start = std::chrono::steady_clock::now();
    constexpr int kRepeats = 4;
    for (int i = 0; i < kRepeats; ++i) sum ^= Checksum(s, r);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "KvChecksum over " << mib << " MiB (heads " << r.head_begin << "-" << r.head_end
              << "): " << mib * kRepeats / 1024 / seconds << " GiB/s" << std::endl;
    EXPECT_NE(sum, 1u);  // keeps the loop
  }
}

}  // namespace
}  // namespace tandem::kvtransfer

// Host emulation of the data paths of the wgmma prefill attention kernel
// (prefill_attention_sm90.cu) through its index maps (prefill_attention_sm90_layout.h): the
// cp.async copies of Q, K and V into the swizzled tiles, the shared-memory descriptors the kernel
// builds (decoded from their bits), the tensor cores' reads as the canonical 128-byte-swizzled
// K-major and MN-major layouts define them (Swizzle<3,4,3> on the byte address), the m64nN
// accumulator fragments, and the re-packing of S into the register A fragments of P V. Checks
// S = Q K^T and O = P V element by element. Runs without a GPU; attention_cuda_test then checks the
// kernel itself on an H100/H200 (its default there).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "runtime/base/float16.h"
#include "runtime/kernels/cuda/prefill_attention_sm90_layout.h"

namespace tandem::cuda::sm90_attention {
namespace {

constexpr uint32_t kBase = 0x2400;  // an atom-aligned (1024) shared address, as the kernel's
constexpr uint16_t kUnwritten = 0xffff;

struct Smem {
  std::vector<uint16_t> bf16 = std::vector<uint16_t>(64 * 1024, kUnwritten);
  uint16_t At(uint32_t addr) const { return bf16.at(addr / 2); }
};

struct Descriptor {
  uint32_t start, lbo, sbo;
  int swizzle;
};

Descriptor Decode(uint64_t d) {
  return {static_cast<uint32_t>(d & 0x3FFF) << 4, static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4,
          static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4, static_cast<int>(d >> 62)};
}

// Swizzle<3,4,3>: byte address bits 4-6 XOR bits 7-9.
uint32_t Swizzle128(uint32_t addr) { return addr ^ (((addr >> 7) & 7) << 4); }

// Element (mn, k), k < 16, of a K-major operand with 128-byte swizzling.
float ReadKMajor(const Smem& smem, const Descriptor& d, int mn, int k) {
  EXPECT_EQ(d.swizzle, 1);
  const uint32_t addr = d.start + (mn / 8) * d.sbo + (mn % 8) * 128 + 2 * k;
  return Bf16ToFloat(smem.At(Swizzle128(addr)));
}

// Element (k, n), k < 16, of an MN-major operand with 128-byte swizzling: 64-element MN groups
// LBO apart, 8-row K groups SBO apart.
float ReadMnMajor(const Smem& smem, const Descriptor& d, int k, int n) {
  EXPECT_EQ(d.swizzle, 1);
  const uint32_t addr = d.start + (n / 64) * d.lbo + (k / 8) * d.sbo + (k % 8) * 128 + 2 * (n % 64);
  return Bf16ToFloat(smem.At(Swizzle128(addr)));
}

std::vector<uint16_t> Random(int n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = FloatToBf16(u(rng));
  return v;
}

// The 64-key and 128-key kernels (kv_rows keys per K/V tile, S = m64n{kv_rows}).
class QkPvTest : public ::testing::TestWithParam<int> {};

TEST_P(QkPvTest, QkAndPvThroughTheKernelsMapsAndDescriptors) {
  const int kv_rows = GetParam();
  const int n_regs = kv_rows / 2;  // S accumulators per thread
  std::mt19937 rng(5);
  // [64 rows][128 dims] of Q, [kv_rows][128 dims] of K and V.
  const std::vector<uint16_t> q = Random(64 * kHeadDim, rng), k = Random(kv_rows * kHeadDim, rng),
                              v = Random(kv_rows * kHeadDim, rng);
  const int kv_bytes = TileBytes(kv_rows);
  const uint32_t q_base = kBase, k_base = kBase + kTileBytes, v_base = k_base + kv_bytes;
  ASSERT_EQ(q_base % 1024, 0u);
  Smem smem;
  // The kernel's copies (16-byte chunks), each destination written once.
  std::vector<int> hits((kTileBytes + 2 * kv_bytes) / 16, 0);
  for (int tid = 0; tid < kThreads; ++tid) {
    for (int i = 0; i < 8; ++i) {
      const int qr = QLoadRow(tid), qc = QLoadChunk(tid, i);
      for (int e = 0; e < 8; ++e) {
        smem.bf16[(q_base + TileOffset(qr, qc)) / 2 + e] = q[qr * kHeadDim + qc * 8 + e];
      }
      ++hits[TileOffset(qr, qc) / 16];
    }
    for (int i = 0; i < kv_rows / 8; ++i) {
      const int kr = KvLoadRow(tid, i), kc = KvLoadChunk(tid, i);
      if (kv_rows == 64) {  // the 64-key maps the wgmma probe uses
        ASSERT_EQ(kr, LoadRow(tid));
        ASSERT_EQ(kc, LoadChunk(tid, i));
      }
      const int at = TileOffset(kr, kc, kv_rows);
      // The kernel's copy loop: per-thread registers plus immediates.
      ASSERT_EQ(at, KvRowBase(tid) + KvSwizzle(tid, i % 4) + (i / 4 % 2) * AtomBytes(kv_rows) +
                        (i / 8) * 8 * kGroupBytes)
          << "tid " << tid << " i " << i;
      ASSERT_EQ(kc * 8, 8 * (tid % 2) + 16 * (i % 4) + 64 * (i / 4 % 2));
      for (int e = 0; e < 8; ++e) {
        smem.bf16[(k_base + at) / 2 + e] = k[kr * kHeadDim + kc * 8 + e];
        smem.bf16[(v_base + at) / 2 + e] = v[kr * kHeadDim + kc * 8 + e];
      }
      ++hits[(kTileBytes + at) / 16];
      ++hits[(kTileBytes + kv_bytes + at) / 16];
    }
  }
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "chunk " << i;

  // S = Q K^T: 8 wgmma.m64n{kv_rows}k16 (SS), accumulators per (warp, lane, register).
  std::vector<float> s_acc(4 * 32 * n_regs, 0.0f);
  auto s = [&](int w, int lane, int r) -> float& { return s_acc[(w * 32 + lane) * n_regs + r]; };
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    const Descriptor da = Decode(MakeDescriptor(q_base + QkStepOffset(kk), kKMajorLbo, kSbo));
    const Descriptor db =
        Decode(MakeDescriptor(k_base + QkStepOffset(kk, kv_rows), kKMajorLbo, kSbo));
    for (int w = 0; w < 4; ++w) {
      for (int lane = 0; lane < 32; ++lane) {
        for (int r = 0; r < n_regs; ++r) {
          const int m = AccRow(w, lane, r), n = AccCol(lane, r);
          float acc = 0.0f;
          for (int kx = 0; kx < 16; ++kx)
            acc += ReadKMajor(smem, da, m, kx) * ReadKMajor(smem, db, n, kx);
          s(w, lane, r) += acc;
        }
      }
    }
  }
  int bad = 0;
  for (int w = 0; w < 4; ++w) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int r = 0; r < n_regs; ++r) {
        const int m = AccRow(w, lane, r), n = AccCol(lane, r);
        double ref = 0;
        for (int d = 0; d < kHeadDim; ++d) {
          ref += double{Bf16ToFloat(q[m * kHeadDim + d])} * Bf16ToFloat(k[n * kHeadDim + d]);
        }
        if (!(std::fabs(s(w, lane, r) - ref) < 1e-3) && bad++ < 5) {
          ADD_FAILURE() << "S[" << m << "][" << n << "] = " << s(w, lane, r) << ", want " << ref;
        }
      }
    }
  }
  ASSERT_EQ(bad, 0);

  // P (bf16 of S / 16) re-packed into register A fragments, O = P V: kv_rows / 16
  // wgmma.m64n128k16 (RS,
  // V MN-major). The A fragment of k-step kc (mma.m16n8k16 layout): a0 = P[g][2t..], a1 =
  // P[g+8][2t..], a2 = P[g][2t+8..], a3 = P[g+8][2t+8..] within the warp's rows and the step's
  // 16 keys.
  std::vector<float> p(64 * kv_rows, NAN);
  float o[4][32][64] = {};
  for (int kc = 0; kc < kv_rows / 16; ++kc) {
    const Descriptor db = Decode(MakeDescriptor(v_base + PvStepOffset(kc), VLbo(kv_rows), kSbo));
    for (int w = 0; w < 4; ++w) {
      float a[16][16];  // this warp's A (rows 16 w .., keys 16 kc ..)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int qi = 0; qi < 4; ++qi) {
          const int at = PIndex(kc, qi);
          for (int half = 0; half < 2; ++half) {
            const float pv = Bf16ToFloat(FloatToBf16(s(w, lane, at + half) / 16));
            a[rows[qi]][cols[qi] + half] = pv;
            // The element this register came from, as the accumulator map places it.
            const int m = AccRow(w, lane, at + half), n = AccCol(lane, at + half);
            ASSERT_EQ(m, 16 * w + rows[qi]) << "P row, kc " << kc << " reg " << qi;
            ASSERT_EQ(n, 16 * kc + cols[qi] + half) << "P key, kc " << kc << " reg " << qi;
            p[m * kv_rows + n] = pv;
          }
        }
      }
      for (int lane = 0; lane < 32; ++lane) {
        for (int r = 0; r < 64; ++r) {
          const int m = AccRow(w, lane, r) - 16 * w, n = AccCol(lane, r);
          float acc = 0.0f;
          for (int kx = 0; kx < 16; ++kx) acc += a[m][kx] * ReadMnMajor(smem, db, kx, n);
          o[w][lane][r] += acc;
        }
      }
    }
  }
  for (int w = 0; w < 4; ++w) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int r = 0; r < 64; ++r) {
        const int m = AccRow(w, lane, r), n = AccCol(lane, r);
        double ref = 0;
        for (int key = 0; key < kv_rows; ++key) {
          ref += double{p[m * kv_rows + key]} * Bf16ToFloat(v[key * kHeadDim + n]);
        }
        if (!(std::fabs(o[w][lane][r] - ref) < 1e-3) && bad++ < 5) {
          ADD_FAILURE() << "O[" << m << "][" << n << "] = " << o[w][lane][r] << ", want " << ref;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(KvTileRows, QkPvTest, ::testing::Values(64, 128));

// The kernel's causal bookkeeping (tile range, masked tiles, per-row limits) sees exactly the keys
// k <= position of every valid row, for sequences with and without a cached prefix, at tile edges.
class MaskTest : public ::testing::TestWithParam<int> {};

TEST_P(MaskTest, MasksGiveExactlyTheCausalKeys) {
  const int block_n = GetParam();
  int checked = 0;
  for (const int start : {0, 1, 63, 64, 100, 1000}) {
    for (const int num_new : {1, 5, 16, 63, 64, 65, 127, 200}) {
      for (int q0 = 0; q0 < num_new; q0 += kBlockM) {
        const int kv_end = KvEnd(start, q0, num_new);
        const int tiles = NumTiles(kv_end, block_n);
        for (int warp = 0; warp < 4; ++warp) {
          const int warp_pos0 = WarpPos0(start, q0, warp);
          for (int lane = 0; lane < 32; ++lane) {
            for (int h = 0; h < 2; ++h) {
              const int row = AccRow(warp, lane, 2 * h);
              if (q0 + row >= num_new) continue;  // not written
              const int pos = start + q0 + row;
              ASSERT_LE(pos, tiles * block_n - 1) << "a visible key is past the last tile";
              const int limit = RowLimit(warp_pos0, lane, h, kv_end);
              for (int tile = 0; tile < tiles; ++tile) {
                const int key0 = tile * block_n;
                for (int r = 2 * h; r < block_n / 2; r += (r % 2 == 0 ? 1 : 3)) {
                  const int key = key0 + AccCol(lane, r);
                  const bool seen = TileNeedsMask(key0, warp_pos0, block_n) ? key < limit : true;
                  ASSERT_EQ(seen, key <= pos) << "start " << start << " num_new " << num_new
                                              << " q0 " << q0 << " row " << row << " key " << key;
                  ++checked;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

INSTANTIATE_TEST_SUITE_P(KeysPerTile, MaskTest, ::testing::Values(64, 128));

TEST(PrefillAttentionSm90LayoutTest, DescriptorFields) {
  const uint64_t d = MakeDescriptor(0x12400, kVLbo, kSbo);
  const Descriptor x = Decode(d);
  EXPECT_EQ(x.start, 0x12400u);
  EXPECT_EQ(x.lbo, static_cast<uint32_t>(kAtomBytes));
  EXPECT_EQ(x.sbo, 1024u);
  EXPECT_EQ(x.swizzle, 1);
  EXPECT_EQ((d >> 49) & 7, 0u) << "base offset must be 0 (atoms 1024-aligned)";
  EXPECT_EQ(Decode(MakeDescriptor(kBase, kKMajorLbo, kSbo)).lbo, 16u);
  EXPECT_EQ(Decode(MakeDescriptor(kBase, VLbo(128), kSbo)).lbo, 16384u);
}

}  // namespace
}  // namespace tandem::cuda::sm90_attention

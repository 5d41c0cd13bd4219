// Host emulation of the skinny GEMM kernel (skinny_gemm.cu) with its own index maps
// (skinny_gemm_layout.h): cp.async copies into the swizzled stage tiles, ldmatrix.x4 and
// mma.m16n8k16 emulated by their PTX definitions (the fragment layouts in mma_utils.cuh), the
// two-warp k reduction, split-K partials summed in split order, and the bias / gated SiLU
// epilogues, against a float64 reference. Runs without a GPU: a wrong row, chunk, lane or
// accumulator map fails here; skinny_gemm_cuda_test then checks the real kernel on a GPU.
// Also checks the maps' properties the kernel relies on for speed and safety: every byte of a
// stage is copied exactly once, and the 8 row addresses of every ldmatrix phase and every
// 8-thread cp.async group fall in distinct 16-byte bank groups; and that the wgmma kernel
// (skinny_gemm_sm90.cu) sees the same tiles through its descriptors and accumulator map.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/float16.h"
#include "runtime/kernels/cuda/prefill_attention_sm90_layout.h"
#include "runtime/kernels/cuda/skinny_gemm.h"
#include "runtime/kernels/cuda/skinny_gemm_layout.h"

namespace tandem::cuda {
namespace {

namespace sl = skinny_layout;

constexpr int kWarps = sl::kThreads / 32;
constexpr uint16_t kUnwritten = 0xffff;  // bf16 NaN: a byte no copy wrote poisons the result

// One emulated 32-bit register: two bf16 (the lower column in the low half).
struct Reg {
  uint16_t lo = kUnwritten, hi = kUnwritten;
};

// ldmatrix.x4 (non-transposed) from a tile: lanes 8q .. 8q + 7 give the byte addresses of the 8
// rows of matrix q; lane L receives, of matrix q, row L / 4 at columns 2 (L % 4) and + 1.
void LdMatrixX4(const std::vector<uint16_t>& tile, const int (&addr)[32], Reg (&out)[32][4]) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int q = 0; q < 4; ++q) {
      const int row_addr = addr[8 * q + lane / 4];
      ASSERT_EQ(row_addr % 16, 0) << "ldmatrix row address must be 16-byte aligned";
      const int e = row_addr / 2 + 2 * (lane % 4);
      ASSERT_LT(e + 1, static_cast<int>(tile.size()));
      out[lane][q] = {tile[e], tile[e + 1]};
    }
  }
}

// mma.sync.m16n8k16.row.col f32 += bf16 * bf16: rebuilds A (16 x 16) and B (16 x 8) from the 32
// lanes' fragments (mma_utils.cuh: a0 = A[g][2t..], a1 = A[g+8][2t..], a2 = A[g][2t+8..],
// a3 = A[g+8][2t+8..]; b0 = B[2t..][g], b1 = B[2t+8..][g]) and adds A B into the accumulators
// (c0, c1 = C[g][2t..], c2, c3 = C[g+8][2t..]).
void Mma(float (&acc)[32][4], const Reg (&a)[32][4], const Reg (&b)[32][4], int b0, int b1) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int q = 0; q < 4; ++q) {
      A[rows[q]][cols[q]] = Bf16ToFloat(a[lane][q].lo);
      A[rows[q]][cols[q] + 1] = Bf16ToFloat(a[lane][q].hi);
    }
    B[2 * t][g] = Bf16ToFloat(b[lane][b0].lo);
    B[2 * t + 1][g] = Bf16ToFloat(b[lane][b0].hi);
    B[2 * t + 8][g] = Bf16ToFloat(b[lane][b1].lo);
    B[2 * t + 9][g] = Bf16ToFloat(b[lane][b1].hi);
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int r = g + (e >= 2 ? 8 : 0), c = 2 * t + (e & 1);
      float sum = 0.0f;
      for (int kk = 0; kk < 16; ++kk) sum += A[r][kk] * B[kk][c];
      acc[lane][e] += sum;
    }
  }
}

struct Problem {
  int m, n, k;
  bool gated = false;
  bool bias = false;
  bool out_f32 = false;
  int num_sms = 132;
  int ctas_per_sm = kSkinnyGemmCtasPerSm;
};

// The kernel's data flow on the host; returns out [m, n] (bf16-rounded unless out_f32).
std::vector<float> Emulate(const Problem& pr, const std::vector<uint16_t>& x,
                           const std::vector<uint16_t>& w, const std::vector<uint16_t>& bias) {
  const SkinnyGemmPlan plan =
      PlanSkinnyGemm(pr.m, pr.n, pr.k, pr.gated, pr.num_sms, pr.ctas_per_sm);
  const int m16 = (pr.m + 15) / 16, mp = 16 * m16;
  const int num_steps = plan.k_per_split / sl::kBk;
  const int per_tile = sl::FeaturesPerTile(pr.gated);
  std::vector<float> out(static_cast<size_t>(pr.m) * pr.n, NAN);
  std::vector<float> partials(static_cast<size_t>(plan.splits) * plan.tiles * sl::kRows * mp);
  for (int tile = 0; tile < plan.tiles; ++tile) {
    for (int split = 0; split < plan.splits; ++split) {
      const int k0 = split * plan.k_per_split;
      // acc[warp][i][j][lane][e]
      std::vector<float> acc_store(static_cast<size_t>(kWarps) * 2 * 2 * m16 * 32 * 4, 0.0f);
      auto acc = [&](int warp, int i, int j) {
        return reinterpret_cast<float(*)[4]>(
            &acc_store[(((static_cast<size_t>(warp) * 2 + i) * 2 * m16 + j) * 32) * 4]);
      };
      for (int step = 0; step < num_steps; ++step) {
        std::vector<uint16_t> ws(sl::kRows * sl::kRowBytes / 2, kUnwritten);
        std::vector<uint16_t> xs(static_cast<size_t>(mp) * sl::kRowBytes / 2, kUnwritten);
        for (int tid = 0; tid < sl::kThreads; ++tid) {
          const int chunk = sl::LoadChunk(tid);
          const int kcol = k0 + step * sl::kBk + chunk * 8;
          for (int i = 0; i < sl::kWLoadsPerThread; ++i) {
            const int r = sl::LoadRow(tid, i);
            const int row = sl::WeightRow(tile, r, pr.n, pr.gated);
            for (int e = 0; e < 8; ++e) {
              ws[sl::Swizzle(r, chunk) / 2 + e] =
                  row >= 0 ? w[static_cast<size_t>(row) * pr.k + kcol + e] : 0;
            }
          }
          for (int i = 0; i < m16; ++i) {
            const int r = sl::LoadRow(tid, i);
            for (int e = 0; e < 8; ++e) {
              xs[sl::Swizzle(r, chunk) / 2 + e] =
                  r < pr.m ? x[static_cast<size_t>(r) * pr.k + kcol + e] : 0;
            }
          }
        }
        for (int warp = 0; warp < kWarps; ++warp) {
          const int wn = sl::WarpN(warp), wk = sl::WarpK(warp);
          for (int kk = 0; kk < sl::kKSlicesPerWarp; ++kk) {
            const int ks = sl::KSlice(wk, kk);
            Reg a[2][32][4];
            for (int i = 0; i < 2; ++i) {
              int addr[32];
              for (int lane = 0; lane < 32; ++lane) {
                addr[lane] = sl::Swizzle(sl::ARow(wn, i, lane), sl::AChunk(ks, lane));
              }
              LdMatrixX4(ws, addr, a[i]);
            }
            for (int j2 = 0; j2 < m16; ++j2) {
              int addr[32];
              for (int lane = 0; lane < 32; ++lane) {
                addr[lane] = sl::Swizzle(sl::BRow(j2, lane), sl::BChunk(ks, lane));
              }
              Reg b[32][4];
              LdMatrixX4(xs, addr, b);
              for (int i = 0; i < 2; ++i) {
                Mma(*reinterpret_cast<float(*)[32][4]>(acc(warp, i, 2 * j2)), a[i], b, 0, 1);
                Mma(*reinterpret_cast<float(*)[32][4]>(acc(warp, i, 2 * j2 + 1)), a[i], b, 2, 3);
              }
            }
          }
        }
      }
      // red = (warps wk = 0) + (warps wk = 1), as the kernel's two passes.
      std::vector<float> red(static_cast<size_t>(sl::kRows) * mp, NAN);
      for (const int pass_wk : {1, 0}) {
        for (int warp = 0; warp < kWarps; ++warp) {
          if (sl::WarpK(warp) != pass_wk) continue;
          const int wn = sl::WarpN(warp);
          for (int i = 0; i < 2; ++i) {
            for (int j = 0; j < 2 * m16; ++j) {
              for (int lane = 0; lane < 32; ++lane) {
                for (int e = 0; e < 4; ++e) {
                  float& slot = red[static_cast<size_t>(sl::AccRow(wn, i, lane, e)) * mp +
                                    sl::AccCol(j, lane, e)];
                  const float v = acc(warp, i, j)[lane][e];
                  slot = pass_wk == 1 ? v : v + slot;
                }
              }
            }
          }
        }
      }
      std::copy(red.begin(), red.end(),
                partials.begin() + (static_cast<size_t>(split) * plan.tiles + tile) * red.size());
    }
    // The last CTA's sum over splits, in split order (or the one split's tile).
    std::vector<float> red(static_cast<size_t>(sl::kRows) * mp, 0.0f);
    for (int s = 0; s < plan.splits; ++s) {
      for (size_t idx = 0; idx < red.size(); ++idx) {
        red[idx] += partials[(static_cast<size_t>(s) * plan.tiles + tile) * red.size() + idx];
      }
    }
    auto store = [&](int row, int feature, float y) {
      out[static_cast<size_t>(row) * pr.n + feature] = pr.out_f32 ? y : Bf16ToFloat(FloatToBf16(y));
    };
    for (int row = 0; row < pr.m; ++row) {
      for (int r = 0; r < per_tile; ++r) {
        const int feature = tile * per_tile + r;
        if (feature >= pr.n) continue;
        if (pr.gated) {
          const float g = red[static_cast<size_t>(r) * mp + row];
          const float u = red[static_cast<size_t>(per_tile + r) * mp + row];
          store(row, feature, g / (1.0f + std::exp(-g)) * u);
        } else {
          float y = red[static_cast<size_t>(r) * mp + row];
          if (pr.bias) y += Bf16ToFloat(bias[feature]);
          store(row, feature, y);
        }
      }
    }
  }
  return out;
}

std::vector<uint16_t> RandomBf16(size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = FloatToBf16(u(rng));
  return v;
}

TEST(SkinnyGemmEmulationTest, MatchesFloat64Reference) {
  const std::vector<Problem> problems = {
      {1, 64, 64},                                  // one tile, one stage
      {5, 100, 128, false, true},                   // bias; n past the last full tile
      {16, 64, 256},                                // m exactly one m16 tile
      {17, 130, 1024},                              // padding to 32 rows; split-K
      {33, 96, 2048, false, false, true},           // float32 out; split-K
      {64, 192, 1024},                              // the full 64 rows; split-K
      {7, 50, 192, true},                           // gated, a partial gate/up tile
      {40, 72, 1024, true},                         // gated with split-K
      {64, 64, 4096, false, false, false, 132, 4},  // 16 splits at a higher CTA aim
  };
  std::mt19937 rng(11);
  bool saw_split = false, saw_gated_split = false;
  for (const Problem& pr : problems) {
    const SkinnyGemmPlan plan =
        PlanSkinnyGemm(pr.m, pr.n, pr.k, pr.gated, pr.num_sms, pr.ctas_per_sm);
    const std::string what = absl::StrCat(
        "m=", pr.m, " n=", pr.n, " k=", pr.k, pr.gated ? " gated" : "", pr.bias ? " bias" : "",
        pr.out_f32 ? " f32" : "", " (", plan.tiles, " tiles x ", plan.splits, " splits)");
    SCOPED_TRACE(what);
    saw_split |= plan.splits > 1;
    saw_gated_split |= pr.gated && plan.splits > 1;
    const int w_rows = pr.gated ? 2 * pr.n : pr.n;
    const std::vector<uint16_t> w =
        RandomBf16(static_cast<size_t>(w_rows) * pr.k, 1.0f / std::sqrt(float(pr.k)), rng);
    const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(pr.m) * pr.k, 1.0f, rng);
    const std::vector<uint16_t> bias = RandomBf16(pr.n, 1.0f, rng);
    const std::vector<float> got = Emulate(pr, x, w, bias);
    if (HasFatalFailure()) return;
    int bad = 0;
    std::string first;
    for (int i = 0; i < pr.m; ++i) {
      for (int j = 0; j < pr.n; ++j) {
        auto dot = [&](int row, double* mag) {
          double s = 0;
          *mag = 0;
          for (int kk = 0; kk < pr.k; ++kk) {
            const double p = double{Bf16ToFloat(x[static_cast<size_t>(i) * pr.k + kk])} *
                             Bf16ToFloat(w[static_cast<size_t>(row) * pr.k + kk]);
            s += p;
            *mag += std::fabs(p);
          }
          return s;
        };
        double ref, mag, tol;
        if (pr.gated) {
          double gm, um;
          const double g = dot(j, &gm), u = dot(pr.n + j, &um);
          const double silu = g / (1.0 + std::exp(-g));
          ref = silu * u;
          tol = 1e-5 * (std::fabs(u) * gm + std::fabs(silu) * um);
        } else {
          ref = dot(j, &mag) + (pr.bias ? Bf16ToFloat(bias[j]) : 0.0);
          tol = 1e-5 * (mag + 1.0);
        }
        tol += (pr.out_f32 ? 0.0 : std::fabs(ref) / 256) + 1e-6;
        const double g = got[static_cast<size_t>(i) * pr.n + j];
        if (!(std::fabs(g - ref) <= tol) && bad++ < 5) {
          first += absl::StrCat(" [", i, ",", j, "] got ", g, " ref ", ref, ";");
        }
      }
    }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " outputs off;" << first;
  }
  EXPECT_TRUE(saw_split);
  EXPECT_TRUE(saw_gated_split);
}

// Rope tiles: every row of the QKV weight appears in exactly one tile, and tile rows r and 32 + r
// are a rotation pair (i, i + head_dim / 2) of one head, for the head dims the runner supports.
TEST(SkinnyGemmLayoutTest, RopeTilesCoverEveryRowAsRotationPairs) {
  for (const int head_dim : {32, 64, 128}) {
    for (const auto& [heads, kv_heads] : {std::pair{32, 8}, std::pair{4, 2}, std::pair{7, 1}}) {
      const int n = (heads + 2 * kv_heads) * head_dim, pairs = n / 2, half = head_dim / 2;
      const SkinnyGemmPlan plan = PlanSkinnyGemmRope(8, n, 4096, 132);
      std::vector<int> hits(n, 0);
      for (int tile = 0; tile < plan.tiles; ++tile) {
        for (int r = 0; r < sl::kRows / 2; ++r) {
          const int a = sl::RopeWeightRow(tile, r, pairs, head_dim);
          const int b = sl::RopeWeightRow(tile, r + sl::kRows / 2, pairs, head_dim);
          ASSERT_EQ(a < 0, b < 0);
          if (a < 0) continue;
          EXPECT_EQ(b, a + half) << "head_dim " << head_dim << " tile " << tile << " r " << r;
          EXPECT_EQ(a / head_dim, b / head_dim) << "pair split across heads";
          EXPECT_LT(a % head_dim, half);
          ++hits[a];
          ++hits[b];
        }
      }
      EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), static_cast<long>(n))
          << "head_dim " << head_dim << " heads " << heads << "+" << kv_heads;
    }
  }
}

// Every byte of a stage's weight and activation tiles is the target of exactly one cp.async.
TEST(SkinnyGemmLayoutTest, CopiesCoverEveryStageByteOnce) {
  for (int m16 = 1; m16 <= 4; ++m16) {
    std::vector<int> w_hits(sl::kRows * sl::kRowBytes / 16, 0), x_hits(16 * m16 * 8, 0);
    for (int tid = 0; tid < sl::kThreads; ++tid) {
      for (int i = 0; i < sl::kWLoadsPerThread; ++i) {
        ++w_hits[sl::Swizzle(sl::LoadRow(tid, i), sl::LoadChunk(tid)) / 16];
      }
      for (int i = 0; i < m16; ++i)
        ++x_hits[sl::Swizzle(sl::LoadRow(tid, i), sl::LoadChunk(tid)) / 16];
    }
    EXPECT_EQ(std::count(w_hits.begin(), w_hits.end(), 1), static_cast<long>(w_hits.size()));
    EXPECT_EQ(std::count(x_hits.begin(), x_hits.end(), 1), static_cast<long>(x_hits.size()))
        << "m16=" << m16;
  }
}

// Shared memory serves a 16-byte access per bank group of 128 bytes: the 8 rows one ldmatrix
// phase reads, and the 8 chunks 8 consecutive threads copy, must hit 8 distinct groups.
TEST(SkinnyGemmLayoutTest, LdMatrixPhasesAndCopiesAreConflictFree) {
  auto distinct_groups = [](const std::vector<int>& addrs) {
    std::set<int> groups;
    for (int a : addrs) groups.insert((a % 128) / 16);
    return groups.size() == addrs.size();
  };
  for (int ks = 0; ks < 4; ++ks) {
    for (int q = 0; q < 4; ++q) {
      for (int wn = 0; wn < 2; ++wn) {
        for (int i = 0; i < 2; ++i) {
          std::vector<int> a;
          for (int l = 8 * q; l < 8 * q + 8; ++l) {
            a.push_back(sl::Swizzle(sl::ARow(wn, i, l), sl::AChunk(ks, l)));
          }
          EXPECT_TRUE(distinct_groups(a)) << "A ks=" << ks << " q=" << q;
        }
      }
      for (int j2 = 0; j2 < 4; ++j2) {
        std::vector<int> b;
        for (int l = 8 * q; l < 8 * q + 8; ++l) {
          b.push_back(sl::Swizzle(sl::BRow(j2, l), sl::BChunk(ks, l)));
        }
        EXPECT_TRUE(distinct_groups(b)) << "B ks=" << ks << " q=" << q;
      }
    }
  }
  for (int t0 = 0; t0 < sl::kThreads; t0 += 8) {
    for (int i = 0; i < sl::kWLoadsPerThread; ++i) {
      std::vector<int> c;
      for (int tid = t0; tid < t0 + 8; ++tid) {
        c.push_back(sl::Swizzle(sl::LoadRow(tid, i), sl::LoadChunk(tid)));
      }
      EXPECT_TRUE(distinct_groups(c)) << "copy threads " << t0 << "+";
    }
  }
}

// The wgmma kernel (skinny_gemm_sm90.cu) reads the same tiles through wgmma descriptors, so the
// skinny layout must be the canonical 128-byte-swizzled K-major layout those describe (the
// one-atom, 64-dim case of sm90_attention::TileOffset, whose descriptors the prefill emulation test
// checks), and the m64nN accumulator map it writes into the reduction tile
// (sm90_attention::AccRow / AccCol) must cover every (weight row, activation row) exactly once.
TEST(SkinnyGemmLayoutTest, WgmmaKernelSeesTheSameTiles) {
  namespace sa = ::tandem::cuda::sm90_attention;
  for (const int rows : {16, 32, 48, 64}) {
    for (int row = 0; row < rows; ++row) {
      for (int chunk = 0; chunk < sl::kChunks; ++chunk) {
        EXPECT_EQ(sl::Swizzle(row, chunk), sa::TileOffset(row, chunk, rows))
            << "rows " << rows << " row " << row << " chunk " << chunk;
      }
    }
  }
  for (const int n : {16, 32, 48, 64}) {
    std::vector<int> hits(static_cast<size_t>(sl::kRows) * n, 0);
    for (int warp = 0; warp < 4; ++warp) {
      for (int lane = 0; lane < 32; ++lane) {
        for (int r = 0; r < n / 2; ++r) {
          const int row = sa::AccRow(warp, lane, r), col = sa::AccCol(lane, r);
          ASSERT_TRUE(row >= 0 && row < sl::kRows && col >= 0 && col < n) << row << "," << col;
          ++hits[static_cast<size_t>(row) * n + col];
        }
      }
    }
    EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), static_cast<long>(hits.size())) << n;
  }
}

}  // namespace
}  // namespace tandem::cuda

// The cluster GEMM's plans (cluster_gemm.h), host only: which (tile, split) pairs are valid, and
// which one the default planner picks for the Llama-3 decode projections on the capacity an H200
// reports (132 single CTAs, 66 pairs, 30 clusters of 4, 15 of 8: its GPCs' SM counts are not all
// multiples of 4).

#include <gtest/gtest.h>

#include "runtime/kernels/cuda/cluster_gemm.h"

namespace tandem::cuda {
namespace {

ClusterGemmCapacity H200() {
  ClusterGemmCapacity c;
  c.clusters[0] = 132;
  c.clusters[1] = 66;
  c.clusters[2] = 30;
  c.clusters[3] = 15;
  return c;
}

TEST(ClusterGemmPlanTest, ValidPlans) {
  const ClusterGemmPlan p = MakeClusterGemmPlan(4096, 14336, 128, 4);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.tile_rows, 128);
  EXPECT_EQ(p.tiles, 32);
  EXPECT_EQ(p.splits, 4);
  EXPECT_EQ(p.k_per_split, 3584);
  EXPECT_EQ(MakeClusterGemmPlan(200, 1024, 128, 1).tiles, 2);  // a partial last tile
  EXPECT_FALSE(MakeClusterGemmPlan(4096, 4096, 96, 1).ok());   // not a multiple of 64
  EXPECT_FALSE(MakeClusterGemmPlan(4096, 4096, 320, 1).ok());  // wider than 4 sub-tiles
  EXPECT_FALSE(MakeClusterGemmPlan(4096, 4096, 128, 3).ok());  // not a cluster size
  EXPECT_FALSE(MakeClusterGemmPlan(4096, 4096, 128, 16).ok());
  EXPECT_FALSE(MakeClusterGemmPlan(4096, 192, 128, 2).ok());  // k steps not divisible
  EXPECT_FALSE(MakeClusterGemmPlan(4096, 128, 128, 2).ok());  // 1 stage per split
  EXPECT_FALSE(MakeClusterGemmPlan(4096, 4096, 64, 16).ok());
  EXPECT_FALSE(MakeClusterGemmPlan(0, 4096, 128, 1).ok());
  EXPECT_FALSE(MakeClusterGemmPlan(4096, 4000, 128, 1).ok());  // k % 64
}

TEST(ClusterGemmPlanTest, DefaultPlansFillOneWave) {
  const ClusterGemmCapacity cap = H200();
  for (const auto& [n, k] : {std::pair{4096, 4096}, {4096, 14336}, {8192, 8192}}) {
    const ClusterGemmPlan p = PlanClusterGemm(n, k, cap);
    ASSERT_TRUE(p.ok()) << n << "x" << k;
    EXPECT_LE(p.tiles, cap.For(p.splits)) << n << "x" << k;
    // At least 90% of the SMs stream.
    EXPECT_GE(p.tiles * p.splits, 119) << n << "x" << k << ": " << p.tiles << " x " << p.splits;
  }
  // The QKV projection (6144 rows; cuBLASLt's own kernel runs 96 CTAs) and Llama-3.2-1B's
  // 2048-row projections have none on this capacity.
  EXPECT_FALSE(PlanClusterGemm(6144, 4096, cap).ok());
  EXPECT_FALSE(PlanClusterGemm(2048, 2048, cap).ok());
  EXPECT_FALSE(PlanClusterGemm(2048, 8192, cap).ok());
  // No plan fills one wave (the gate/up projection: 28672 rows = 112 tiles of 256, 85% of the
  // SMs, or more tiles than SMs).
  EXPECT_FALSE(PlanClusterGemm(28672, 4096, cap).ok());
  // The Llama-3-8B O and down projections: 64-row tiles, two splits (what the runner takes).
  for (const auto& [n, k] : {std::pair{4096, 4096}, {4096, 14336}}) {
    const ClusterGemmPlan p = PlanClusterGemm(n, k, cap, 0.9, 64);
    EXPECT_EQ(p.tile_rows, 64) << n << "x" << k;
    EXPECT_EQ(p.splits, 2) << n << "x" << k;
  }
  // Llama-3.2-1B's gate/up projection (16384 rows) fills the SMs only with 128- or 256-row
  // tiles, which the runner's 64-row bound leaves out.
  EXPECT_EQ(PlanClusterGemm(16384, 2048, cap).tile_rows, 256);
  EXPECT_EQ(PlanClusterGemm(16384, 2048, cap, 0.9, 128).tile_rows, 128);
  EXPECT_FALSE(PlanClusterGemm(16384, 2048, cap, 0.9, 64).ok());
  // No capacity (no GPU): no plan.
  EXPECT_FALSE(PlanClusterGemm(4096, 4096, ClusterGemmCapacity{}).ok());
}

}  // namespace
}  // namespace tandem::cuda

// The cluster GEMM's plans (cluster_gemm.h), host only: which (tile, split) pairs are valid, and
// which one the default planner picks for the Llama-3 decode projections on an H200-like capacity
// (132 SMs: 132 single CTAs, 66 pairs, 32 clusters of 4, 16 of 8) and on a smaller one.

#include <gtest/gtest.h>

#include "runtime/kernels/cuda/cluster_gemm.h"

namespace tandem::cuda {
namespace {

ClusterGemmCapacity H200() {
  ClusterGemmCapacity c;
  c.clusters[0] = 132;
  c.clusters[1] = 66;
  c.clusters[2] = 32;
  c.clusters[3] = 16;
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
  for (const auto& [n, k] : {std::pair{6144, 4096},
                             {4096, 4096},
                             {4096, 14336},
                             {2048, 2048},
                             {3072, 2048},
                             {2048, 8192}}) {
    const ClusterGemmPlan p = PlanClusterGemm(n, k, cap);
    ASSERT_TRUE(p.ok()) << n << "x" << k;
    EXPECT_LE(p.tiles, cap.For(p.splits)) << n << "x" << k;
    // At least 90% of the SMs stream.
    EXPECT_GE(p.tiles * p.splits, 119) << n << "x" << k << ": " << p.tiles << " x " << p.splits;
  }
  // No plan fills one wave (the gate/up projection: 28672 rows = 112 tiles of 256, 85% of the
  // SMs, or more tiles than SMs).
  EXPECT_FALSE(PlanClusterGemm(28672, 4096, cap).ok());
  // No capacity (no GPU): no plan.
  EXPECT_FALSE(PlanClusterGemm(4096, 4096, ClusterGemmCapacity{}).ok());
}

}  // namespace
}  // namespace tandem::cuda

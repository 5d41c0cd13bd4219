// Host-side checks of the skinny GEMM launcher (skinny_gemm.h): the split-K plan for the decode
// shapes of Llama-3-8B on an H200 (132 SMs) and argument validation, which rejects bad input
// before touching the GPU (no GPU needed).

#include <gtest/gtest.h>

#include <cstdint>

#include "runtime/kernels/cuda/skinny_gemm.h"

namespace tandem::cuda {
namespace {

constexpr int kH200Sms = 132;

TEST(SkinnyGemmPlanTest, SplitsKOnlyWhenTheOutputHasFewTiles) {
  // O projection: 64 tiles of 64 rows; 4 equal splits of 1024 give 256 CTAs.
  SkinnyGemmPlan o = PlanSkinnyGemm(64, 4096, 4096, false, kH200Sms);
  EXPECT_EQ(o.tiles, 64);
  EXPECT_EQ(o.splits, 4);
  EXPECT_EQ(o.k_per_split, 1024);
  EXPECT_EQ(o.partial_bytes, size_t{4} * 64 * 64 * 64 * sizeof(float));
  EXPECT_EQ(o.counter_bytes, size_t{64} * sizeof(uint32_t));
  // QKV: 96 tiles want 3 splits; 64 k-steps split only into 2.
  SkinnyGemmPlan qkv = PlanSkinnyGemm(64, 6144, 4096, false, kH200Sms);
  EXPECT_EQ(qkv.tiles, 96);
  EXPECT_EQ(qkv.splits, 2);
  // Down projection: 224 k-steps, 4 splits of 56.
  SkinnyGemmPlan down = PlanSkinnyGemm(64, 4096, 14336, false, kH200Sms);
  EXPECT_EQ(down.splits, 4);
  EXPECT_EQ(down.k_per_split, 3584);
  // Gate/up gated: 32 output features (64 weight rows) per tile, 448 tiles: no split, no scratch.
  SkinnyGemmPlan gate_up = PlanSkinnyGemm(64, 14336, 4096, true, kH200Sms);
  EXPECT_EQ(gate_up.tiles, 448);
  EXPECT_EQ(gate_up.splits, 1);
  EXPECT_EQ(gate_up.partial_bytes, 0u);
  EXPECT_EQ(gate_up.counter_bytes, 0u);
  // LM head.
  EXPECT_EQ(PlanSkinnyGemm(64, 128256, 4096, false, kH200Sms).splits, 1);
  // Partials are padded to 16 activation rows.
  EXPECT_EQ(PlanSkinnyGemm(5, 4096, 4096, false, kH200Sms).partial_bytes,
            size_t{4} * 64 * 64 * 16 * sizeof(float));
  // Too few k-steps to split (fewer than four per split), or one stage only.
  EXPECT_EQ(PlanSkinnyGemm(8, 96, 256, false, kH200Sms).splits, 1);
  EXPECT_EQ(PlanSkinnyGemm(8, 96, 64, false, kH200Sms).splits, 1);
  // At most 16 splits.
  EXPECT_EQ(PlanSkinnyGemm(8, 64, 65536, false, kH200Sms).splits, 16);
  // The aim is a knob: one CTA per SM splits the O projection in 2, four in 8 (64 k-steps).
  EXPECT_EQ(PlanSkinnyGemm(64, 4096, 4096, false, kH200Sms, 1).splits, 2);
  EXPECT_EQ(PlanSkinnyGemm(64, 4096, 4096, false, kH200Sms, 4).splits, 8);
}

TEST(SkinnyGemmPlanTest, SupportsOnlyTheKernelsShapes) {
  alignas(16) static const uint16_t buf[16] = {};
  EXPECT_TRUE(SkinnyGemmSupports(1, 10, 64, buf, buf));
  EXPECT_TRUE(SkinnyGemmSupports(64, 10, 128, buf, buf));
  EXPECT_FALSE(SkinnyGemmSupports(0, 10, 64, buf, buf));
  EXPECT_FALSE(SkinnyGemmSupports(65, 10, 64, buf, buf));
  EXPECT_FALSE(SkinnyGemmSupports(8, 10, 96, buf, buf));  // k not a multiple of 64
  EXPECT_FALSE(SkinnyGemmSupports(8, 0, 64, buf, buf));
  EXPECT_FALSE(SkinnyGemmSupports(8, 10, 64, buf + 1, buf));  // x misaligned
}

TEST(SkinnyGemmLaunchTest, RejectsBadArgumentsBeforeTouchingTheGpu) {
  alignas(16) static uint16_t buf[64] = {};
  SkinnyGemmArgs ok;
  ok.x = buf;
  ok.w = buf;
  ok.out = buf;
  ok.m = 1;
  ok.n = 4;
  ok.k = 64;
  ok.num_sms = kH200Sms;
  auto bad = [&](auto mutate) {
    SkinnyGemmArgs a = ok;
    mutate(a);
    return LaunchSkinnyGemm(a, nullptr).code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(bad([](SkinnyGemmArgs& a) { a.m = -1; }), kInvalid);
  EXPECT_EQ(bad([](SkinnyGemmArgs& a) { a.m = 65; }), kInvalid);
  EXPECT_EQ(bad([](SkinnyGemmArgs& a) { a.n = 0; }), kInvalid);
  EXPECT_EQ(bad([](SkinnyGemmArgs& a) { a.k = 100; }), kInvalid);
  EXPECT_EQ(bad([](SkinnyGemmArgs& a) { a.num_sms = 0; }), kInvalid);
  EXPECT_EQ(bad([](SkinnyGemmArgs& a) { a.ctas_per_sm = 0; }), kInvalid);
  EXPECT_EQ(bad([](SkinnyGemmArgs& a) { a.out = nullptr; }), kInvalid);
  EXPECT_EQ(bad([&](SkinnyGemmArgs& a) { a.x = buf + 1; }), kInvalid);
  EXPECT_EQ(bad([&](SkinnyGemmArgs& a) {
              a.gated_silu = true;
              a.bias = buf;
            }),
            kInvalid);
  // A split-K shape without scratch.
  EXPECT_EQ(bad([](SkinnyGemmArgs& a) {
              a.m = 64;
              a.n = 4096;
              a.k = 4096;
            }),
            kInvalid);
  // m == 0 queues nothing and succeeds.
  EXPECT_TRUE(LaunchSkinnyGemm(
                  [&] {
                    SkinnyGemmArgs a = ok;
                    a.m = 0;
                    return a;
                  }(),
                  nullptr)
                  .ok());
}

}  // namespace
}  // namespace tandem::cuda

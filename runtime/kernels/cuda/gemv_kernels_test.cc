// Host-side checks of the GEMV launcher: shape and pointer validation (before any CUDA call, so no
// GPU is needed) and the GemvSupports predicate the runner dispatches on.

#include "runtime/kernels/cuda/gemv_kernels.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace tandem::cuda {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// Fake device pointers: never dereferenced, since every call here fails validation or queues
// nothing.
alignas(16) uint16_t g_x[64];
alignas(16) uint16_t g_w[64];
alignas(16) uint16_t g_out[64];

GemvArgs Valid() {
  GemvArgs a;
  a.x = g_x;
  a.w = g_w;
  a.out = g_out;
  a.m = 1;
  a.n = 4;
  a.k = 16;
  return a;
}

TEST(GemvKernelsTest, RejectsBadShapes) {
  for (const auto& mutate : {+[](GemvArgs& a) { a.m = -1; }, +[](GemvArgs& a) { a.m = 9; },
                             +[](GemvArgs& a) { a.n = 0; }, +[](GemvArgs& a) { a.k = 0; },
                             +[](GemvArgs& a) { a.k = 12; }, +[](GemvArgs& a) { a.k = -8; }}) {
    GemvArgs a = Valid();
    mutate(a);
    const absl::Status s = LaunchGemv(a, nullptr);
    EXPECT_EQ(s.code(), kInvalid) << "m=" << a.m << " n=" << a.n << " k=" << a.k << ": " << s;
  }
}

TEST(GemvKernelsTest, RejectsBiasInGatedMode) {
  GemvArgs a = Valid();
  a.gated_silu = true;
  a.bias = g_w;
  EXPECT_EQ(LaunchGemv(a, nullptr).code(), kInvalid);
}

TEST(GemvKernelsTest, RejectsNullAndMisalignedPointers) {
  for (const auto& mutate :
       {+[](GemvArgs& a) { a.x = nullptr; }, +[](GemvArgs& a) { a.w = nullptr; },
        +[](GemvArgs& a) { a.out = nullptr; }, +[](GemvArgs& a) { a.x = g_x + 1; },
        +[](GemvArgs& a) { a.w = g_w + 4; }}) {
    GemvArgs a = Valid();
    mutate(a);
    EXPECT_EQ(LaunchGemv(a, nullptr).code(), kInvalid);
  }
}

TEST(GemvKernelsTest, ZeroRowsQueueNothing) {
  GemvArgs a = Valid();
  a.m = 0;
  EXPECT_TRUE(LaunchGemv(a, nullptr).ok());
}

TEST(GemvKernelsTest, SupportsDecodeShapesOnly) {
  for (int m = 1; m <= kGemvMaxRows; ++m) EXPECT_TRUE(GemvSupports(m, 4096, g_x, g_w)) << m;
  EXPECT_FALSE(GemvSupports(0, 4096, g_x, g_w));
  EXPECT_FALSE(GemvSupports(kGemvMaxRows + 1, 4096, g_x, g_w));
  EXPECT_FALSE(GemvSupports(1, 4100, g_x, g_w));
  EXPECT_FALSE(GemvSupports(1, 0, g_x, g_w));
  EXPECT_FALSE(GemvSupports(1, 4096, g_x + 1, g_w));
  EXPECT_FALSE(GemvSupports(1, 4096, g_x, g_w + 2));
}

}  // namespace
}  // namespace tandem::cuda

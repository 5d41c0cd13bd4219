#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/cluster_gemm.h"
#include "runtime/kernels/cuda/cluster_gemm_internal.h"

namespace tandem::cuda {
namespace {

static_assert(kClusterGemmMaxRows == internal::kClusterGemmMaxRowsDevice);
static_assert(kClusterGemmKStep == internal::kClusterGemmKStepDevice);
static_assert(kClusterGemmTraceWords == internal::kClusterGemmTraceWords);

constexpr int kSplitSizes[4] = {1, 2, 4, 8};
constexpr int kMinStepsPerSplit = 2;

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int ClusterGemmCapacity::For(int splits) const {
  for (int i = 0; i < 4; ++i) {
    if (kSplitSizes[i] == splits) return clusters[i];
  }
  return 0;
}

ClusterGemmPlan MakeClusterGemmPlan(int n, int k, int tile_rows, int splits) {
  ClusterGemmPlan plan;
  const int sub = internal::kClusterGemmSubRows;
  if (n <= 0 || k <= 0 || k % kClusterGemmKStep != 0 || tile_rows % sub != 0 || tile_rows < sub ||
      tile_rows > sub * internal::kClusterGemmMaxSubs) {
    return plan;
  }
  bool split_ok = false;
  for (const int s : kSplitSizes) split_ok |= s == splits;
  const int steps = k / kClusterGemmKStep;
  if (!split_ok || steps % splits != 0 || steps / splits < kMinStepsPerSplit ||
      (tile_rows / splits) % 8 != 0) {
    return plan;
  }
  plan.tile_rows = tile_rows;
  plan.tiles = (n + tile_rows - 1) / tile_rows;
  plan.splits = splits;
  plan.k_per_split = k / splits;
  return plan;
}

ClusterGemmPlan PlanClusterGemm(int n, int k, const ClusterGemmCapacity& capacity, double min_fill,
                                int max_tile_rows) {
  ClusterGemmPlan best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (const int splits : kSplitSizes) {
    for (int subs = 1; subs <= internal::kClusterGemmMaxSubs &&
                       subs * internal::kClusterGemmSubRows <= max_tile_rows;
         ++subs) {
      const ClusterGemmPlan plan =
          MakeClusterGemmPlan(n, k, subs * internal::kClusterGemmSubRows, splits);
      // One wave that keeps at least min_fill of the SMs streaming.
      if (!plan.ok() || plan.tiles > capacity.For(splits) ||
          plan.tiles * splits < min_fill * capacity.For(1)) {
        continue;
      }
      const double w_bytes = 2.0 * plan.tile_rows * plan.k_per_split;
      const double x_bytes = 2.0 * kClusterGemmMaxRows * plan.k_per_split;
      const double peer_bytes = 4.0 * kClusterGemmMaxRows * plan.tile_rows * (splits - 1) / splits;
      const double cost = w_bytes + 0.5 * x_bytes + 0.5 * peer_bytes;
      if (cost < best_cost) {  // ties keep fewer splits, then narrower tiles
        best_cost = cost;
        best = plan;
      }
    }
  }
  return best;
}

bool ClusterGemmRunsHere() { return internal::ClusterGemmDeviceRuns(); }

ClusterGemmCapacity ClusterGemmCapacityHere() {
  ClusterGemmCapacity c;
  if (!ClusterGemmRunsHere()) return c;
  for (int i = 0; i < 4; ++i) {
    c.clusters[i] = internal::ClusterGemmMaxActiveClusters(kSplitSizes[i]);
  }
  return c;
}

bool ClusterGemmSupports(int m, int n, int k, const void* x, const void* w, const void* out,
                         const void* bias) {
  return m >= 1 && m <= kClusterGemmMaxRows && n > 0 && n % 8 == 0 && k > 0 &&
         k % kClusterGemmKStep == 0 && Aligned16(x) && Aligned16(w) && Aligned16(out) &&
         (bias == nullptr || Aligned16(bias));
}

absl::Status LaunchClusterGemm(const ClusterGemmArgs& a, const ClusterGemmPlan& plan,
                               void* stream) {
  if (a.m == 0 && a.n > 0 && a.k > 0) return absl::OkStatus();
  if (!ClusterGemmSupports(a.m, a.n, a.k, a.x, a.w, a.out, a.bias) || a.stages < 0 ||
      a.stages == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClusterGemm: m=", a.m, " n=", a.n, " k=", a.k,
                     " (or its pointers) not supported: m in [1, ", kClusterGemmMaxRows,
                     "], n a positive multiple of 8, k of ", kClusterGemmKStep,
                     ", 16-byte aligned buffers, stages 0 or >= 2; stages=", a.stages, ")"));
  }
  const ClusterGemmPlan check = MakeClusterGemmPlan(a.n, a.k, plan.tile_rows, plan.splits);
  if (!plan.ok() || !check.ok() || check.tiles != plan.tiles ||
      check.k_per_split != plan.k_per_split) {
    return absl::InvalidArgumentError(absl::StrCat("ClusterGemm: the plan (", plan.tile_rows,
                                                   "-row tiles x ", plan.splits,
                                                   " splits) is not one for n=", a.n, " k=", a.k));
  }
  if (!ClusterGemmRunsHere()) {
    return absl::FailedPreconditionError(
        "ClusterGemm runs only on compute capability 9.0 (sm_90a code)");
  }
  internal::ClusterGemmRaw raw;
  raw.x = a.x;
  raw.w = a.w;
  raw.bias = a.bias;
  raw.out = a.out;
  raw.out_f32 = a.out_f32;
  raw.m = a.m;
  raw.n = a.n;
  raw.k = a.k;
  raw.subs = plan.tile_rows / internal::kClusterGemmSubRows;
  raw.tiles = plan.tiles;
  raw.splits = plan.splits;
  raw.k_steps = plan.k_per_split / kClusterGemmKStep;
  raw.x_rows = (a.m + 7) / 8 * 8;
  raw.stages = a.stages;
  raw.trace = reinterpret_cast<unsigned long long*>(a.trace);
  RETURN_IF_CUDA_ERROR(internal::LaunchClusterGemmRaw(raw, static_cast<cudaStream_t>(stream)),
                       absl::StrCat("ClusterGemm launch (m=", a.m, " n=", a.n, " k=", a.k, ", ",
                                    plan.tile_rows, "-row tiles x ", plan.splits, " splits)"));
  return absl::OkStatus();
}

}  // namespace tandem::cuda

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/skinny_gemm.h"
#include "runtime/kernels/cuda/skinny_gemm_internal.h"

namespace tandem::cuda {
namespace {

static_assert(kSkinnyGemmMaxRows == internal::kSkinnyMaxRowsDevice);
static_assert(kSkinnyGemmKStep == internal::kSkinnyKStepDevice);

constexpr int kTileRows = internal::kSkinnyTileRows;
// Splits stay at most kMaxSplits and each keeps at least kMinStepsPerSplit pipeline stages of
// work.
constexpr int kMaxSplits = 16;
constexpr int kMinStepsPerSplit = 4;

bool Aligned(const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

}  // namespace

SkinnyGemmPlan PlanSkinnyGemm(int m, int n, int k, bool gated_silu, int num_sms, int ctas_per_sm) {
  SkinnyGemmPlan plan;
  const int per_tile = gated_silu ? kTileRows / 2 : kTileRows;
  plan.tiles = (n + per_tile - 1) / per_tile;
  const int steps = k / kSkinnyGemmKStep;
  const int target = std::max(ctas_per_sm, 1) * std::max(num_sms, 1);
  const int want = std::max(1, (target + plan.tiles - 1) / plan.tiles);
  plan.splits = 1;
  for (int d = 2; d <= std::min(want, kMaxSplits); ++d) {
    if (steps % d == 0 && steps / d >= kMinStepsPerSplit) plan.splits = d;
  }
  plan.k_per_split = k / plan.splits;
  if (plan.splits > 1) {
    const size_t padded_rows = static_cast<size_t>((m + 15) / 16) * 16;
    plan.partial_bytes =
        static_cast<size_t>(plan.splits) * plan.tiles * kTileRows * padded_rows * sizeof(float);
    plan.counter_bytes = static_cast<size_t>(plan.tiles) * sizeof(uint32_t);
  }
  return plan;
}

SkinnyGemmPlan PlanSkinnyGemmRope(int m, int n, int k, int num_sms, int ctas_per_sm) {
  // Tiles of 32 rotation pairs, planned as the gated mode's tiles of 32 output features.
  return PlanSkinnyGemm(m, n / 2, k, /*gated_silu=*/true, num_sms, ctas_per_sm);
}

bool SkinnyGemmSupports(int m, int n, int k, const void* x, const void* w) {
  return m >= 1 && m <= kSkinnyGemmMaxRows && n > 0 && k > 0 && k % kSkinnyGemmKStep == 0 &&
         Aligned(x, 16) && Aligned(w, 16);
}

absl::Status LaunchSkinnyGemm(const SkinnyGemmArgs& a, void* stream) {
  return internal::LaunchSkinnyGemmWithKernel(a, SkinnyGemmUsesWgmma(), stream);
}

absl::Status internal::LaunchSkinnyGemmWithKernel(const SkinnyGemmArgs& a, bool use_wgmma,
                                                  void* stream) {
  if (a.m < 0 || a.m > kSkinnyGemmMaxRows || a.n <= 0 || a.k <= 0 || a.k % kSkinnyGemmKStep != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SkinnyGemm shape m=", a.m, " n=", a.n, " k=", a.k, " is not valid (m in [0, ",
        kSkinnyGemmMaxRows, "], n > 0, k a positive multiple of ", kSkinnyGemmKStep, ")"));
  }
  if (a.num_sms <= 0 || a.ctas_per_sm <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SkinnyGemm num_sms and ctas_per_sm must be positive, got ", a.num_sms,
                     " and ", a.ctas_per_sm));
  }
  if (a.x == nullptr || a.w == nullptr || a.out == nullptr) {
    return absl::InvalidArgumentError("SkinnyGemm x, w and out must not be null");
  }
  if (!Aligned(a.x, 16) || !Aligned(a.w, 16)) {
    return absl::InvalidArgumentError("SkinnyGemm x and w must be 16-byte aligned");
  }
  if (a.gated_silu && a.bias != nullptr) {
    return absl::InvalidArgumentError("SkinnyGemm gated_silu takes no bias");
  }
  if (a.rope != nullptr) {
    const SkinnyRope& r = *a.rope;
    if (a.gated_silu || a.out_f32) {
      return absl::InvalidArgumentError("SkinnyGemm rope mode writes bf16 and is not gated");
    }
    if (r.num_heads <= 0 || r.num_kv_heads <= 0 || r.head_dim <= 0 || r.head_dim % 2 != 0 ||
        a.n != (r.num_heads + 2 * r.num_kv_heads) * r.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat("SkinnyGemm rope: n=", a.n, " is not (",
                                                     r.num_heads, " + 2 x ", r.num_kv_heads,
                                                     ") heads x head_dim ", r.head_dim, " (even)"));
    }
    if (r.positions == nullptr || r.inv_freq == nullptr || r.slot_mapping == nullptr ||
        r.k_layer == nullptr || r.v_layer == nullptr) {
      return absl::InvalidArgumentError(
          "SkinnyGemm rope positions, inv_freq, slot_mapping and the cache must not be null");
    }
  }
  if (use_wgmma && !SkinnyGemmUsesWgmma()) {
    return absl::FailedPreconditionError(
        "SkinnyGemm: the wgmma kernel runs on compute capability 9.0 only");
  }
  if (a.m == 0) return absl::OkStatus();
  const SkinnyGemmPlan plan =
      a.rope != nullptr ? PlanSkinnyGemmRope(a.m, a.n, a.k, a.num_sms, a.ctas_per_sm)
                        : PlanSkinnyGemm(a.m, a.n, a.k, a.gated_silu, a.num_sms, a.ctas_per_sm);
  if (plan.splits > 1) {
    if (a.partials == nullptr || a.counters == nullptr || a.partials_bytes < plan.partial_bytes ||
        a.counters_bytes < plan.counter_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SkinnyGemm m=", a.m, " n=", a.n, " k=", a.k, " splits K ", plan.splits,
          " ways and needs ", plan.partial_bytes, " bytes of partials and ", plan.counter_bytes,
          " of counters; got ", a.partials_bytes, " and ", a.counters_bytes));
    }
    if (!Aligned(a.partials, 16) || !Aligned(a.counters, 4)) {
      return absl::InvalidArgumentError(
          "SkinnyGemm partials must be 16-byte and counters 4-byte aligned");
    }
  }
  internal::SkinnyGemmRaw raw = {};
  raw.x = a.x;
  raw.w = a.w;
  raw.bias = a.bias;
  raw.out = a.out;
  raw.out_f32 = a.out_f32;
  raw.gated_silu = a.gated_silu;
  raw.m = a.m;
  raw.n = a.n;
  raw.k = a.k;
  raw.tiles = plan.tiles;
  raw.splits = plan.splits;
  raw.k_per_split = plan.k_per_split;
  raw.partials = plan.splits > 1 ? static_cast<float*>(a.partials) : nullptr;
  raw.counters = plan.splits > 1 ? static_cast<unsigned*>(a.counters) : nullptr;
  if (a.rope != nullptr) {
    raw.n = a.n / 2;  // rotation pairs
    raw.rope_head_dim = a.rope->head_dim;
    raw.rope_num_heads = a.rope->num_heads;
    raw.rope_num_kv_heads = a.rope->num_kv_heads;
    raw.rope_positions = a.rope->positions;
    raw.rope_inv_freq = a.rope->inv_freq;
    raw.rope_slots = a.rope->slot_mapping;
    raw.rope_k_layer = a.rope->k_layer;
    raw.rope_v_layer = a.rope->v_layer;
  }
  return CudaStatus(
      internal::LaunchSkinnyGemmRaw(raw, use_wgmma, static_cast<cudaStream_t>(stream)),
      "SkinnyGemm kernel launch");
}

bool SkinnyGemmUsesWgmma() { return internal::SkinnyGemmWgmmaRunsHere(); }

}  // namespace tandem::cuda

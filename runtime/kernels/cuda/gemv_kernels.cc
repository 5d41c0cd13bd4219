#include "runtime/kernels/cuda/gemv_kernels.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/gemv_internal.h"

namespace tandem::cuda {
namespace {

static_assert(kGemvMaxRows == internal::kGemvMaxRowsDevice);

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

namespace internal {

GemvTuning GemvTuningFromEnv() {
  static const GemvTuning tuning = [] {
    GemvTuning t;
    if (const char* env = std::getenv("TANDEM_GEMV_UNROLL")) {
      const long v = std::strtol(env, nullptr, 10);
      if (v == 2 || v == 4 || v == 8) t.max_unroll = static_cast<int>(v);
    }
    if (const char* env = std::getenv("TANDEM_GEMV_MIN_CTAS")) {
      const long v = std::strtol(env, nullptr, 10);
      if (v == 0 || v == 5 || v == 6 || v == 8) t.min_ctas = static_cast<int>(v);
    }
    if (const char* env = std::getenv("TANDEM_GEMV_MIN_CTAS_LONG")) {
      const long v = std::strtol(env, nullptr, 10);
      if (v == 0 || v == 4) t.min_ctas_long = static_cast<int>(v);
    }
    return t;
  }();
  return tuning;
}

}  // namespace internal

bool GemvSupports(int m, int k, const void* x, const void* w) {
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % 8 == 0 && Aligned16(x) && Aligned16(w);
}

absl::Status LaunchGemv(const GemvArgs& a, void* stream) {
  if (a.m < 0 || a.m > kGemvMaxRows || a.n <= 0 || a.k <= 0 || a.k % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Gemv shape m=", a.m, " n=", a.n, " k=", a.k,
                                                   " is not valid (m in [0, ", kGemvMaxRows,
                                                   "], n > 0, k a positive multiple of 8)"));
  }
  if (a.x == nullptr || a.w == nullptr || a.out == nullptr) {
    return absl::InvalidArgumentError("Gemv x, w and out must not be null");
  }
  if (!Aligned16(a.x) || !Aligned16(a.w)) {
    return absl::InvalidArgumentError("Gemv x and w must be 16-byte aligned");
  }
  if (a.gated_silu && a.bias != nullptr) {
    return absl::InvalidArgumentError("Gemv gated_silu takes no bias");
  }
  if (absl::Status s = ValidateGemvNorm(a.norm_weight, a.norm_eps, "Gemv"); !s.ok()) return s;
  if (a.add_to_out && (a.gated_silu || a.out_f32)) {
    return absl::InvalidArgumentError("Gemv add_to_out needs a bf16 output and no gated_silu");
  }
  if (a.m == 0) return absl::OkStatus();
  internal::GemvFusion fusion;
  fusion.norm_weight = a.norm_weight;
  fusion.norm_eps = a.norm_eps;
  fusion.add_to_out = a.add_to_out;
  return CudaStatus(internal::LaunchGemvRaw(a.x, a.w, a.bias, a.out, a.out_f32, a.gated_silu, a.m,
                                            a.n, a.k, fusion, internal::GemvTuningFromEnv(),
                                            static_cast<cudaStream_t>(stream)),
                    "Gemv kernel launch");
}

absl::Status ValidateGemvNorm(const void* norm_weight, float norm_eps, const char* what) {
  if (norm_weight == nullptr) return absl::OkStatus();
  if (!Aligned16(norm_weight)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " norm_weight must be 16-byte aligned"));
  }
  if (!(norm_eps > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " norm_eps must be positive with norm_weight, got ", norm_eps));
  }
  return absl::OkStatus();
}

}  // namespace tandem::cuda

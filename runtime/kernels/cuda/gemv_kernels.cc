#include "runtime/kernels/cuda/gemv_kernels.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/gemv_internal.h"

namespace tandem::cuda {
namespace {

static_assert(kGemvMaxRows == internal::kGemvMaxRowsDevice);

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool GemvSupports(int m, int k, const void* x, const void* w) {
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % 8 == 0 && Aligned16(x) && Aligned16(w);
}

size_t GemvResidualScratchBytes(int n) {
  if (n <= 0) return 0;
  const size_t blocks =
      (static_cast<size_t>(n) + internal::kGemvRowsPerBlock - 1) / internal::kGemvRowsPerBlock;
  return blocks * sizeof(float) + sizeof(uint32_t);
}

absl::Status LaunchGemv(const GemvArgs& a, void* stream) {
  if (a.m < 0 || a.m > kGemvMaxRows || a.n <= 0 || a.k <= 0 || a.k % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Gemv shape m=", a.m, " n=", a.n, " k=", a.k,
                                                   " is not valid (m in [0, ", kGemvMaxRows,
                                                   "], n > 0, k a positive multiple of 8)"));
  }
  if (a.x == nullptr || a.w == nullptr || (a.out == nullptr && a.residual == nullptr)) {
    return absl::InvalidArgumentError("Gemv x, w and out (or residual) must not be null");
  }
  if (!Aligned16(a.x) || !Aligned16(a.w)) {
    return absl::InvalidArgumentError("Gemv x and w must be 16-byte aligned");
  }
  if (a.gated_silu && a.bias != nullptr) {
    return absl::InvalidArgumentError("Gemv gated_silu takes no bias");
  }
  if ((a.norm_weight == nullptr) != (a.inv_rms == nullptr)) {
    return absl::InvalidArgumentError("Gemv norm_weight and inv_rms go together");
  }
  if ((a.residual == nullptr) != (a.inv_rms_out == nullptr)) {
    return absl::InvalidArgumentError("Gemv residual and inv_rms_out go together");
  }
  const bool fused = a.norm_weight != nullptr || a.residual != nullptr;
  if (fused && a.m > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gemv RMSNorm fusions take one row, not m=", a.m));
  }
  if (a.residual != nullptr) {
    if (a.bias != nullptr || a.out_f32 || a.gated_silu) {
      return absl::InvalidArgumentError(
          "Gemv residual epilogue takes no bias, f32 output or gated_silu");
    }
    if (a.residual_scratch == nullptr || a.residual_scratch_bytes < GemvResidualScratchBytes(a.n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Gemv residual scratch of ", a.residual_scratch_bytes,
                       " bytes is less than the ", GemvResidualScratchBytes(a.n), " bytes needed"));
    }
    if (!(a.norm_eps >= 0.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("Gemv norm_eps ", a.norm_eps, " is not >= 0"));
    }
  }
  if (a.m == 0) return absl::OkStatus();
  internal::GemvNormFusion fusion;
  fusion.norm_weight = a.norm_weight;
  fusion.inv_rms = a.inv_rms;
  fusion.residual = a.residual;
  fusion.inv_rms_out = a.inv_rms_out;
  fusion.scratch = a.residual_scratch;
  fusion.eps = a.norm_eps;
  return CudaStatus(
      internal::LaunchGemvRaw(a.x, a.w, a.bias, a.out, a.out_f32, a.gated_silu, fusion, a.m, a.n,
                              a.k, static_cast<cudaStream_t>(stream)),
      "Gemv kernel launch");
}

}  // namespace tandem::cuda

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
  if (a.m == 0) return absl::OkStatus();
  return CudaStatus(internal::LaunchGemvRaw(a.x, a.w, a.bias, a.out, a.out_f32, a.gated_silu, a.m,
                                            a.n, a.k, static_cast<cudaStream_t>(stream)),
                    "Gemv kernel launch");
}

}  // namespace tandem::cuda

#include "runtime/kernels/cuda/norm_kernels.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/rmsnorm_internal.h"

namespace tandem::cuda {

absl::Status LaunchRmsNorm(const RmsNormArgs& args, void* stream) {
  if (args.rows < 0 || args.dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNorm shape [", args.rows, ", ", args.dim, "] is not valid"));
  }
  if (!(args.eps > 0.0f) || !std::isfinite(args.eps)) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNorm eps ", args.eps, " is not > 0"));
  }
  if (args.x == nullptr || args.weight == nullptr || args.out == nullptr) {
    return absl::InvalidArgumentError("RmsNorm x, weight and out must not be null");
  }
  if (args.rows == 0) return absl::OkStatus();
  return CudaStatus(
      internal::LaunchRmsNormRaw(args.x, args.residual, args.weight, args.out, args.rows, args.dim,
                                 args.eps, static_cast<cudaStream_t>(stream)),
      "RmsNorm kernel launch");
}

}  // namespace tandem::cuda

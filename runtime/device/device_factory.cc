#include "runtime/device/device_factory.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/device/cpu_device.h"

#if TANDEM_HAVE_CUDA
#include "runtime/device/cuda/cuda_device.h"
#endif

namespace tandem {
namespace {

constexpr bool kHaveCuda = TANDEM_HAVE_CUDA;

absl::StatusOr<std::unique_ptr<Device>> CreateCuda(int ordinal) {
#if TANDEM_HAVE_CUDA
  return CreateCudaDevice(ordinal);
#else
  return absl::FailedPreconditionError(
      absl::StrCat("device \"cuda:", ordinal,
                   "\" requested, but this build of Tandem has no CUDA backend (configure with "
                   "-DTANDEM_CUDA=ON and a CUDA toolkit)"));
#endif
}

}  // namespace

bool DeviceBackendCompiledIn(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return true;
    case DeviceKind::kCuda:
      return kHaveCuda;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(std::string_view name) {
  if (name == "cpu") return std::unique_ptr<Device>(std::make_unique<CpuDevice>());
  if (name == "cuda") return CreateCuda(0);
  constexpr std::string_view kCudaPrefix = "cuda:";
  if (name.substr(0, kCudaPrefix.size()) == kCudaPrefix) {
    const std::string_view digits = name.substr(kCudaPrefix.size());
    int ordinal = -1;
    const bool all_digits =
        !digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos;
    if (!all_digits ||
        !absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()), &ordinal)) {
      return absl::InvalidArgumentError(absl::StrCat("bad device ordinal in \"", std::string(name),
                                                     "\": expected cuda:N with N >= 0"));
    }
    return CreateCuda(ordinal);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device \"", std::string(name), "\": expected cpu, cuda or cuda:N"));
}

}  // namespace tandem

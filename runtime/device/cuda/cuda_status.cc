#include "runtime/device/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clears the (non-sticky) error so it is not reported twice
  const std::string message = absl::StrCat(std::string(what), ": ", cudaGetErrorName(error), ": ",
                                           cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
      return absl::UnavailableError(message);
    case cudaErrorInvalidDevice:
      return absl::NotFoundError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidMemcpyDirection:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace tandem

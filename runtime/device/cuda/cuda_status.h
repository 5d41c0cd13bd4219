#pragma once
// Converts CUDA runtime errors to absl::Status at the edge, keeping CUDA's own name and message.
// For CUDA backend code only (this header includes the CUDA runtime API). Thread-safe.
//
// Side effect: CudaStatus clears CUDA's per-thread "last error" when `error` is not cudaSuccess, so
// a later cudaGetLastError() after a kernel launch reports only that launch's error.

#include <cuda_runtime_api.h>

#include <string_view>

#include "absl/status/status.h"

namespace tandem {

// OK for cudaSuccess; otherwise a status whose code follows the error's kind (out of memory ->
// kResourceExhausted, no device or driver -> kUnavailable, bad device ordinal -> kNotFound, bad
// argument or handle -> kInvalidArgument, anything else -> kInternal) and whose message is
// "<what>: <cudaErrorName>: <CUDA's description>".
absl::Status CudaStatus(cudaError_t error, std::string_view what);

}  // namespace tandem

// Returns from the enclosing function (which returns absl::Status or StatusOr) on a CUDA error.
#define RETURN_IF_CUDA_ERROR(expr, what)                     \
  do {                                                       \
    const cudaError_t _tandem_cuda_error = (expr);           \
    if (_tandem_cuda_error != cudaSuccess) {                 \
      return ::tandem::CudaStatus(_tandem_cuda_error, what); \
    }                                                        \
  } while (0)

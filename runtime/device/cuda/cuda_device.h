#pragma once
// The CUDA Device backend (CUDA runtime API). This header names no CUDA type, so the device
// factory and tests include it without the CUDA toolkit's headers; the implementation and its
// cudart dependency stay private to target tandem_device_cuda.
//
// The device binds the calling thread to its GPU (cudaSetDevice) at every call, so one owner thread
// may hold devices of several GPUs. Streams are non-blocking (they never wait on the legacy default
// stream). Memory comes from a CachingAllocator over cudaMalloc: after warm-up, an engine step
// that frees and re-allocates the same sizes never calls cudaMalloc; on out-of-memory the cached
// blocks are returned with cudaFree and the allocation retried once. Contract (threading,
// ownership, failure): see device.h.

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"

namespace tandem {

// GPUs the CUDA runtime sees. kUnavailable (with CUDA's message) when the runtime cannot be used:
// no driver, driver too old for this runtime, no GPU.
absl::StatusOr<int> CudaDeviceCount();

// kUnavailable when no GPU is usable, kNotFound when `ordinal` is not below CudaDeviceCount(),
// kInvalidArgument for a negative ordinal.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal);

}  // namespace tandem

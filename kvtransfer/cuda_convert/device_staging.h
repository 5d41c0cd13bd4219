#pragma once
// KvStaging on a GPU (kvtransfer/handoff/kv_staging.h): cudaMalloc'd staging on the source's
// device, filled by the conversion kernel (convert_on_device.h) on the staging's own stream. No
// CUDA types in this header.

#include <memory>

#include "absl/status/statusor.h"
#include "kvtransfer/handoff/kv_staging.h"

namespace tandem::kvtransfer::cuda_convert {

// Internal when the device or its stream cannot be set up.
absl::StatusOr<std::unique_ptr<KvStaging>> CreateCudaStaging(int cuda_device);

}  // namespace tandem::kvtransfer::cuda_convert

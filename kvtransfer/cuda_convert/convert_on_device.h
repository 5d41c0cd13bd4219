#pragma once
// Converts a kv_convert.h plan between two device buffers with the GPU kernel
// (convert_kernel.h): the same bytes ConvertOnHost writes. Checks every piece against both
// buffers first (InvalidArgument, nothing launched), uploads the pieces, launches on `stream` and
// waits for it (the upload buffer is freed after). Internal on a CUDA error.
//
// Thread-safety: like any CUDA call on `stream`; the caller owns the buffers meanwhile.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kvtransfer/kv_convert.h"

namespace tandem::kvtransfer::cuda_convert {

absl::Status ConvertOnDevice(const ConversionPlan& plan, const void* src, uint64_t src_length,
                             void* dst, uint64_t dst_length, cudaStream_t stream);

}  // namespace tandem::kvtransfer::cuda_convert

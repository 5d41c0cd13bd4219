#pragma once
// Private to the sm_90a kernels (tandem_kernels_sm90): the driver's TMA descriptor encoder,
// cuTensorMapEncodeTiled, fetched through the runtime (cudaGetDriverEntryPointByVersion) so that
// nothing links libcuda directly. Null when the driver does not offer it (callers then take a path
// without TMA or fail the launch). Looked up once per process; thread-safe.

#include <cuda.h>
#include <cudaTypedefs.h>

namespace tandem::cuda::internal {

PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder();

}  // namespace tandem::cuda::internal

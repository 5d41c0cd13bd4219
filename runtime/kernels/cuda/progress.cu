// The layer-progress store of layer-wise KV streaming (model_kernels.h: LaunchStoreProgress).
#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem::cuda::internal {
namespace {

__global__ void StoreProgressKernel(volatile unsigned long long* counter,
                                    unsigned long long value) {
  // Everything before this kernel in the stream is complete (a plain launch waits for it); the
  // fence makes the store visible to the host after those writes.
  __threadfence_system();
  *counter = value;
}

}  // namespace

cudaError_t LaunchStoreProgressRaw(uint64_t* counter, uint64_t value, cudaStream_t stream) {
  StoreProgressKernel<<<1, 1, 0, stream>>>(reinterpret_cast<unsigned long long*>(counter),
                                           static_cast<unsigned long long>(value));
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal

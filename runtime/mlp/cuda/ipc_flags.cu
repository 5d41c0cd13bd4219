#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "runtime/mlp/cuda/ipc_flags.h"

namespace tandem::mlp {
namespace {

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SignalKernel(IpcFlag* flag, uint32_t seq, const uint32_t* status_source) {
  const uint32_t status = status_source != nullptr ? *(volatile const uint32_t*)status_source : 0;
  volatile IpcFlag* f = flag;
  f->status = status;
  __threadfence_system();  // the status lands before the sequence number that publishes it
  f->seq = seq;
  __threadfence_system();
}

__global__ void WaitKernel(const IpcFlag* flag, uint32_t seq, uint64_t timeout_ns,
                           uint32_t* failed) {
  volatile const IpcFlag* f = flag;
  const uint64_t start = GlobalTimer();
  while (static_cast<int32_t>(f->seq - seq) < 0) {
    if (GlobalTimer() - start > timeout_ns) {
      *(volatile uint32_t*)failed = seq;
      __threadfence_system();
      return;
    }
    __nanosleep(256);
  }
  __threadfence();
  if (f->status != 0) {
    *(volatile uint32_t*)failed = seq;
    __threadfence_system();
  }
}

absl::Status Launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::Status EnqueueIpcSignal(IpcFlag* flag, uint32_t seq, const uint32_t* status_source,
                              void* stream) {
  SignalKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flag, seq, status_source);
  return Launched("GPU data plane: signal");
}

absl::Status EnqueueIpcWait(const IpcFlag* flag, uint32_t seq, uint64_t timeout_ns,
                            uint32_t* failed, void* stream) {
  WaitKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flag, seq, timeout_ns, failed);
  return Launched("GPU data plane: bounded wait");
}

}  // namespace tandem::mlp

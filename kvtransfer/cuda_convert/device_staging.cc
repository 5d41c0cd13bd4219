#include "kvtransfer/cuda_convert/device_staging.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kvtransfer/cuda_convert/convert_on_device.h"

namespace tandem::kvtransfer::cuda_convert {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(
      absl::StrCat("KV conversion staging: ", what, ": ", cudaGetErrorString(e)));
}

class CudaStaging final : public KvStaging {
 public:
  CudaStaging(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaStaging() override {
    (void)cudaSetDevice(device_);
    (void)cudaStreamDestroy(stream_);
  }
  MemoryKind kind() const override { return MemoryKind::kCuda; }
  absl::StatusOr<void*> Allocate(uint64_t bytes) override {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return CudaError(e, "device");
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "no GPU memory for a ", bytes, "-byte KV conversion buffer: ", cudaGetErrorString(e)));
    }
    return p;
  }
  void Free(void* buffer) override {
    (void)cudaSetDevice(device_);
    (void)cudaFree(buffer);
  }
  absl::Status Convert(const ConversionPlan& pack, const void* src, uint64_t src_length,
                       void* buffer, uint64_t length) override {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return CudaError(e, "device");
    return ConvertOnDevice(pack, src, src_length, buffer, length, stream_);
  }

 private:
  const int device_;
  const cudaStream_t stream_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvStaging>> CreateCudaStaging(int cuda_device) {
  if (cudaError_t e = cudaSetDevice(cuda_device); e != cudaSuccess) return CudaError(e, "device");
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaError(e, "stream");
  }
  return std::make_unique<CudaStaging>(cuda_device, stream);
}

}  // namespace tandem::kvtransfer::cuda_convert

// Read-through kernel for GEMM autotuning (contract: l2_flush.h).
#include <cstdint>

#include "runtime/kernels/cuda/l2_flush.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    ReadThroughKernel(const uint4* data, size_t words, unsigned int* sink) {
  unsigned int acc = 0;
  const size_t stride = size_t{gridDim.x} * kThreads;
  for (size_t i = size_t{blockIdx.x} * kThreads + threadIdx.x; i < words; i += stride) {
    const uint4 v = data[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  // Warp-reduce, then one atomic per warp.
  for (int offset = 16; offset > 0; offset /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, offset);
  if ((threadIdx.x & 31) == 0) atomicXor(sink, acc);
}

}  // namespace

cudaError_t LaunchReadThrough(const void* data, size_t bytes, unsigned int* sink,
                              cudaStream_t stream) {
  if (data == nullptr || sink == nullptr || bytes == 0 || bytes % 16 != 0 ||
      reinterpret_cast<uintptr_t>(data) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const size_t words = bytes / 16;
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  const size_t blocks = (words + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < size_t{8} * sms ? blocks : size_t{8} * sms);
  ReadThroughKernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint4*>(data), words, sink);
  return cudaGetLastError();
}

}  // namespace tandem::cuda

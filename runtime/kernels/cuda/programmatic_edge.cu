// Kernels of the programmatic-edge probe (contract: programmatic_edge.h; launchers:
// programmatic_edge_internal.h). Not on any step path: the probe runs once per GEMM plan.
#include <cuda_bf16.h>

#include <algorithm>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/programmatic_edge_internal.h"

namespace tandem::cuda::internal {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t Hash(uint64_t i, uint32_t pattern) {
  uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{pattern} * 0xC2B2AE3D27D4EB4Full);
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<uint32_t>(h);
}

__global__ void __launch_bounds__(kThreads)
    Bf16PatternWriterKernel(uint16_t* data, size_t count, uint32_t pattern, int delay_us,
                            bool trigger_first) {
  if (trigger_first) PdlLaunchDependents();
  if (delay_us > 0) {
    if (threadIdx.x == 0) {
      const uint64_t until = GlobalTimerNs() + uint64_t{1000} * static_cast<uint64_t>(delay_us);
      while (GlobalTimerNs() < until) {
      }
    }
    __syncthreads();
  }
  const size_t stride = size_t{gridDim.x} * kThreads;
  for (size_t i = size_t{blockIdx.x} * kThreads + threadIdx.x; i < count; i += stride) {
    const float v = static_cast<float>(static_cast<int>(Hash(i, pattern) % 5u) - 2);
    data[i] = __bfloat16_as_ushort(__float2bfloat16(v));
  }
}

__global__ void __launch_bounds__(kThreads)
    WordCopyKernel(const uint32_t* in, uint32_t* out, size_t count, bool wait) {
  if (wait) PdlWait();
  const size_t stride = size_t{gridDim.x} * kThreads;
  for (size_t i = size_t{blockIdx.x} * kThreads + threadIdx.x; i < count; i += stride) {
    out[i] = in[i];
  }
}

__global__ void __launch_bounds__(kThreads)
    CountWordMismatchesKernel(const uint32_t* a, const uint32_t* b, size_t count,
                              unsigned int* mismatches) {
  unsigned int local = 0;
  const size_t stride = size_t{gridDim.x} * kThreads;
  for (size_t i = size_t{blockIdx.x} * kThreads + threadIdx.x; i < count; i += stride) {
    local += a[i] != b[i] ? 1u : 0u;
  }
  if (local != 0) atomicAdd(mismatches, local);
}

unsigned Blocks(size_t count) {
  return static_cast<unsigned>(std::clamp<size_t>((count + kThreads - 1) / kThreads, 1, 1024));
}

}  // namespace

cudaError_t LaunchBf16PatternWriter(uint16_t* data, size_t count, uint32_t pattern, int delay_us,
                                    bool trigger_first, cudaStream_t stream) {
  // Few CTAs: the writer must leave room on the SMs for the grid it lets start early.
  const unsigned blocks = std::min(Blocks(count), 16u);
  Bf16PatternWriterKernel<<<blocks, kThreads, 0, stream>>>(data, count, pattern, delay_us,
                                                           trigger_first);
  return cudaGetLastError();
}

cudaError_t LaunchWordCopy(const uint32_t* in, uint32_t* out, size_t count, bool wait,
                           cudaStream_t stream) {
  WordCopyKernel<<<Blocks(count), kThreads, 0, stream>>>(in, out, count, wait);
  return cudaGetLastError();
}

cudaError_t LaunchCountWordMismatches(const uint32_t* a, const uint32_t* b, size_t count,
                                      unsigned int* mismatches, cudaStream_t stream) {
  CountWordMismatchesKernel<<<Blocks(count), kThreads, 0, stream>>>(a, b, count, mismatches);
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal

#pragma once
// Reads a device buffer through the L2 cache, for GEMM autotuning: reading a buffer larger than L2
// leaves L2 holding clean lines of it (a decode step's state before a projection: the weights not
// cached, nothing dirty to write back), and reading the activations then leaves them cached as the
// kernel that wrote them would. A memset flush instead leaves L2 full of dirty lines whose
// write-back then competes with the timed GEMM.
//
// LaunchReadThrough queues a kernel that loads every 16-byte word of data[0, bytes) (bytes a
// multiple of 16, data 16-byte aligned) and folds them into *sink (atomicXor, so the loads are
// kept). Returns cudaGetLastError() after the launch, cudaErrorInvalidValue for bad arguments.

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tandem::cuda {

cudaError_t LaunchReadThrough(const void* data, size_t bytes, unsigned int* sink,
                              cudaStream_t stream);

}  // namespace tandem::cuda

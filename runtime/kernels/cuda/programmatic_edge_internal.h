#pragma once
// Private to tandem_kernels_cuda: the raw launchers of programmatic_edge.cu, which
// programmatic_edge.cc wraps (contract: programmatic_edge.h). Each returns cudaGetLastError() after
// its launch.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tandem::cuda::internal {

// data[i] = BF16 small integer in [-2, 2] hashed from (i, pattern), i < count. With
// trigger_first, every CTA first lets the next grid start (griddepcontrol.launch_dependents), then
// waits `delay_us` microseconds (%globaltimer) before it writes. A plain launch (not programmatic).
cudaError_t LaunchBf16PatternWriter(uint16_t* data, size_t count, uint32_t pattern, int delay_us,
                                    bool trigger_first, cudaStream_t stream);

// out[i] = in[i] for i < count 32-bit words, after griddepcontrol.wait when `wait` (the probe's
// test subjects: a consumer that waits for its predecessor and one that does not).
cudaError_t LaunchWordCopy(const uint32_t* in, uint32_t* out, size_t count, bool wait,
                           cudaStream_t stream);

// *mismatches += the number of 32-bit words where a and b differ (count words).
cudaError_t LaunchCountWordMismatches(const uint32_t* a, const uint32_t* b, size_t count,
                                      unsigned int* mismatches, cudaStream_t stream);

}  // namespace tandem::cuda::internal

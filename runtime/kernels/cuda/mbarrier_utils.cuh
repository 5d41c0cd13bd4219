#pragma once
// mbarriers in shared memory and the bulk (TMA) copy that completes on one: compute capability
// 9.0 instructions (not architecture-specific), so kernels built for sm_90 and sm_90a share them.
// Below sm_90 the helpers are empty and their callers must not be launched.

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda::internal {

// mbarriers in shared memory (addresses from SharedAddress): init with an arrival count (then
// FenceMbarrierInit and a CTA barrier before any other thread uses them), arrive (release), and
// wait for the phase of a parity to complete (acquire). A phase that never completes (a bug)
// traps after ~2^30 polls, failing the launch instead of hanging the GPU.
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void FenceMbarrierInit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Arrives and adds `bytes` to the transaction count the phase waits for (the TMA copies it covers
// complete them).
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  for (uint32_t tries = 0; done == 0; ++tries) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (tries == (1u << 30)) __trap();
  }
#endif
}
// A bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory
// to this CTA's shared memory at `dst`, completing its bytes on mbarrier `bar` (whose phase must
// expect them: MbarArriveExpectTx), with an L2 cache policy (kernel_utils.cuh).
__device__ __forceinline__ void BulkCopyG2S(uint32_t dst, const void* src, uint32_t bytes,
                                            uint32_t bar, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
#endif
}

}  // namespace tandem::cuda::internal

#pragma once
// Private device helpers for the sm_90a (Hopper) kernels of tandem_kernels_sm90: wgmma issue,
// fence, commit and wait, the async-proxy fence for shared memory written by cp.async, mbarriers
// (init, arrive, arrive with an expected transaction count, wait), TMA tensor loads and the tensor
// map prefetch, named barriers, setmaxnreg, and an address-based cp.async. The sm_90a instructions
// are compiled only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); anywhere else those helpers are empty,
// and their callers must not be launched.

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda::internal {

__device__ __forceinline__ void WgmmaFence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void WgmmaCommit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void WgmmaWaitAll() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

// Generic-proxy writes to shared memory (cp.async, plain stores) become visible to the async
// proxy the wgmma operands are read through.
__device__ __forceinline__ void FenceProxyAsyncShared() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Keeps the compiler from moving accumulator reads or writes across the wgmma issue/wait pairs.
template <int N>
__device__ __forceinline__ void FenceRegisters(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (m64n64, f32) = (scale_d ? d : 0) + A B, A and B from shared memory (K-major both).
__device__ __forceinline__ void WgmmaSs64x64(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                             int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

// Operand lists of an m64n128 f32 accumulator d[64] in wgmma inline assembly: the register
// list "{%0, ..., %63}", and the 64 constraints with F = TANDEM_WGMMA_RW ("+f", read and written)
// or TANDEM_WGMMA_WO ("=f", written only).
#define TANDEM_WGMMA_D64                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define TANDEM_WGMMA_RW(x) "+f"(x)
#define TANDEM_WGMMA_WO(x) "=f"(x)
#define TANDEM_WGMMA_ACC64(F)                                                                   \
  F(d[0]), F(d[1]), F(d[2]), F(d[3]), F(d[4]), F(d[5]), F(d[6]), F(d[7]), F(d[8]), F(d[9]),     \
      F(d[10]), F(d[11]), F(d[12]), F(d[13]), F(d[14]), F(d[15]), F(d[16]), F(d[17]), F(d[18]), \
      F(d[19]), F(d[20]), F(d[21]), F(d[22]), F(d[23]), F(d[24]), F(d[25]), F(d[26]), F(d[27]), \
      F(d[28]), F(d[29]), F(d[30]), F(d[31]), F(d[32]), F(d[33]), F(d[34]), F(d[35]), F(d[36]), \
      F(d[37]), F(d[38]), F(d[39]), F(d[40]), F(d[41]), F(d[42]), F(d[43]), F(d[44]), F(d[45]), \
      F(d[46]), F(d[47]), F(d[48]), F(d[49]), F(d[50]), F(d[51]), F(d[52]), F(d[53]), F(d[54]), \
      F(d[55]), F(d[56]), F(d[57]), F(d[58]), F(d[59]), F(d[60]), F(d[61]), F(d[62]), F(d[63])

// d (m64n128, f32) = (kAccumulate ? d : 0) + A B, A and B from shared memory (K-major both). The
// first k-step of a product passes kAccumulate = false: d is then only written (no zeroing moves).
#define TANDEM_WGMMA_SS_M64N128                                             \
  "{\n"                                                                     \
  ".reg .pred p;\n"                                                         \
  "setp.ne.b32 p, %66, 0;\n"                                                \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TANDEM_WGMMA_D64 \
  ", %64, %65, p, 1, 1, 0, 0;\n"                                            \
  "}\n"
template <bool kAccumulate>
__device__ __forceinline__ void WgmmaSs64x128(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kAccumulate) {
    asm volatile(TANDEM_WGMMA_SS_M64N128
                 : TANDEM_WGMMA_ACC64(TANDEM_WGMMA_RW)
                 : "l"(desc_a), "l"(desc_b), "r"(1));
  } else {
    asm volatile(TANDEM_WGMMA_SS_M64N128
                 : TANDEM_WGMMA_ACC64(TANDEM_WGMMA_WO)
                 : "l"(desc_a), "l"(desc_b), "r"(0));
  }
#endif
}

// d (m64n128, f32) += A B, A (bf16) from registers, B from shared memory (MN-major, transposed).
__device__ __forceinline__ void WgmmaRs64x128(float (&d)[64], const uint32_t (&a)[4],
                                              uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TANDEM_WGMMA_D64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
      "}\n"
      : TANDEM_WGMMA_ACC64(TANDEM_WGMMA_RW)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#endif
}

// mbarriers in shared memory (addresses from SharedAddress): init with an arrival count (then
// FenceMbarrierInit and a CTA barrier before any other thread uses them), arrive (release), and
// wait for the phase of a parity to complete (acquire). A phase that never completes (a bug)
// traps after ~2^30 polls, failing the launch instead of hanging the GPU.
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void FenceMbarrierInit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Arrives and adds `bytes` to the transaction count the phase waits for (the TMA copies it covers
// complete them).
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
// One box of the 3-D tensor map `map` (a __grid_constant__ CUtensorMap) at coordinates (c0, c1,
// c2) into shared memory at `dst`, completing its bytes on mbarrier `bar`.
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const void* map, int c0, int c1, int c2,
                                          uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#endif
}
// One box of the 2-D tensor map `map` (a __grid_constant__ CUtensorMap) at coordinates (c0, c1)
// into shared memory at `dst`, completing its bytes on mbarrier `bar`.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const void* map, int c0, int c1,
                                          uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
}
// Brings a __grid_constant__ tensor map into the TMA unit's descriptor cache ahead of its first
// use.
__device__ __forceinline__ void PrefetchTensorMap(const void* map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
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
// Named barrier `id` (1-15; 0 is __syncthreads) over `threads` threads (a multiple of 32).
__device__ __forceinline__ void NamedBarrierSync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives on named barrier `id` without waiting (the producer side of a bar.sync).
__device__ __forceinline__ void NamedBarrierArrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Sets this warpgroup's per-thread register maximum (every warp of the warpgroup executes it):
// kInc raises it to kRegs (blocks until the CTA's pool has them), else lowers it to kRegs.
template <bool kInc, int kRegs>
__device__ __forceinline__ void SetMaxRegisters() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kInc) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
  }
#endif
}

// Thread block clusters: this CTA's rank in its cluster; a barrier over every thread of every CTA
// of the cluster (release / acquire: shared-memory writes before it are visible to the cluster's
// reads after it; a launch without a cluster is a cluster of one); the shared::cluster address of
// the same shared-memory location `addr` in the cluster's CTA `rank`, and an 8-byte store there.
__device__ __forceinline__ uint32_t ClusterCtaRank() {
  uint32_t rank = 0;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
#endif
  return rank;
}
__device__ __forceinline__ void ClusterSync() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
#endif
}
// An 8-byte store of (a, b) at a shared::cluster address (MapSharedToRank).
__device__ __forceinline__ void StoreSharedCluster8(uint32_t cluster_addr, float a, float b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(cluster_addr), "f"(a), "f"(b)
               : "memory");
#endif
}
__device__ __forceinline__ uint32_t MapSharedToRank(uint32_t addr, uint32_t rank) {
  uint32_t out = addr;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
#endif
  return out;
}

__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

}  // namespace tandem::cuda::internal

// The wgmma probe of wgmma_probe.h: the attention kernel's copies, descriptors and fragment maps on
// one 64 x 64 x 128 problem, nothing else.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/mma_utils.cuh"
#include "runtime/kernels/cuda/prefill_attention_sm90_layout.h"
#include "runtime/kernels/cuda/wgmma_probe.h"
#include "runtime/kernels/cuda/wgmma_utils.cuh"

namespace tandem::cuda::internal {
namespace {

namespace sa = ::tandem::cuda::sm90_attention;

constexpr size_t kProbeSmem = 1024 + 3 * sa::kTileBytes;

__global__ void __launch_bounds__(sa::kThreads)
    WgmmaProbeKernel(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                     const __nv_bfloat16* p, float* s_out, float* o_out) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (SharedAddress(smem_raw) + 1023u) & ~1023u;
  const uint32_t q_base = base, k_base = base + sa::kTileBytes, v_base = base + 2 * sa::kTileBytes;
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int qr = sa::QLoadRow(tid), qc = sa::QLoadChunk(tid, i);
    const int kr = sa::LoadRow(tid), kc = sa::LoadChunk(tid, i);
    CpAsync16(q_base + sa::TileOffset(qr, qc), q + qr * sa::kHeadDim + qc * 8, true);
    CpAsync16(k_base + sa::TileOffset(kr, kc), k + kr * sa::kHeadDim + kc * 8, true);
    CpAsync16(v_base + sa::TileOffset(kr, kc), v + kr * sa::kHeadDim + kc * 8, true);
  }
  CpAsyncCommitGroup();
  CpAsyncWaitGroup<0>();
  FenceProxyAsyncShared();
  __syncthreads();

  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.0f;
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < sa::kHeadDim / 16; ++kk) {
    WgmmaSs64x64(s, sa::MakeDescriptor(q_base + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo),
                 sa::MakeDescriptor(k_base + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo),
                 kk > 0 ? 1 : 0);
  }
  WgmmaCommit();
  WgmmaWaitAll();
  FenceRegisters(s);
#pragma unroll
  for (int r = 0; r < 32; ++r) {
    s_out[sa::AccRow(warp, lane, r) * sa::kBlockN + sa::AccCol(lane, r)] = s[r];
  }

  // P into the registers the kernel's probabilities occupy (accumulator r = element (AccRow,
  // AccCol)), packed as the kernel packs them.
  float pr[32];
#pragma unroll
  for (int r = 0; r < 32; ++r) {
    pr[r] = __bfloat162float(p[sa::AccRow(warp, lane, r) * sa::kBlockN + sa::AccCol(lane, r)]);
  }
  uint32_t pa[4][4];
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
#pragma unroll
    for (int qi = 0; qi < 4; ++qi) {
      const int at = sa::PIndex(kc, qi);
      pa[kc][qi] = PackBf16x2(pr[at], pr[at + 1]);
    }
  }
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  WgmmaFence();
#pragma unroll
  for (int kc = 0; kc < sa::kBlockN / 16; ++kc) {
    WgmmaRs64x128(o, pa[kc],
                  sa::MakeDescriptor(v_base + sa::PvStepOffset(kc), sa::kVLbo, sa::kSbo));
  }
  WgmmaCommit();
  WgmmaWaitAll();
  FenceRegisters(o);
#pragma unroll
  for (int r = 0; r < 64; ++r) {
    o_out[sa::AccRow(warp, lane, r) * sa::kHeadDim + sa::AccCol(lane, r)] = o[r];
  }
}

}  // namespace

cudaError_t LaunchWgmmaProbeRaw(const void* q, const void* k, const void* v, const void* p,
                                float* s_out, float* o_out, cudaStream_t stream) {
  static std::atomic<uint64_t> configured{0};
  if (const cudaError_t e = OptInDynamicSharedMemory(WgmmaProbeKernel, kProbeSmem, configured);
      e != cudaSuccess) {
    return e;
  }
  WgmmaProbeKernel<<<1, sa::kThreads, kProbeSmem, stream>>>(
      static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k),
      static_cast<const __nv_bfloat16*>(v), static_cast<const __nv_bfloat16*>(p), s_out, o_out);
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal

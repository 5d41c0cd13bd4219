// Skinny bf16 GEMM on Hopper tensor cores (wgmma; sm_90a only): the main loop of the skinny GEMM
// (contract: skinny_gemm.h) for compute capability 9.0, with the tiles, the plan, the split-K sum
// and the epilogues of the mma.sync kernel (skinny_gemm_tile.cuh).
//   - CTA: one warpgroup (4 warps), one output tile of 64 weight rows over one K range of the
//     plan's split. out^T = w . x^T as one wgmma.m64nNk16 per k16 step: the tile's 64 weight rows
//     are the 64-row A operand and the activation rows (m padded to N = 16, 32, 48 or 64) the B
//     operand, both read from shared memory through descriptors (K-major; the skinny layout is the
//     canonical 128-byte-swizzled one, so stage bases are 1024-byte aligned). The accumulator is
//     N / 2 floats per thread, against 64 for the mma.sync kernel's 64 rows.
//   - Pipeline: kStages stages of 64 k (weights 8 KB + activations N x 128 bytes), loads issued
//     kStages - 2 steps ahead of the step being multiplied, the wgmma of one step left in flight
//     while the next is issued; the weights of the first stages are queued BEFORE PdlWait() (they
//     do not depend on the previous kernel), the activations after it. Sized so that two CTAs fit
//     an SM: 4-6 stages in flight per CTA.
//   - Why: at 8-64 rows the mma.sync kernel spends as long on its MMAs and ldmatrix traffic as on
//     the weight stream; a wgmma takes 64 weight rows by up to 64 activation rows from shared
//     memory in one asynchronous instruction, so the SM's time goes to keeping loads in flight.
//     On the H200 (Llama-3-8B decode step) it beats cuBLASLt by 10.7% / 7.4% / 3.4% at 8 / 16 /
//     32 rows and loses by 6% at 64 (bench/RESULTS.md, seventh session), hence the runner's
//     2-32-row default (cublas_gemm.h).

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/mma_utils.cuh"
#include "runtime/kernels/cuda/prefill_attention_sm90_layout.h"
#include "runtime/kernels/cuda/skinny_gemm_internal.h"
#include "runtime/kernels/cuda/skinny_gemm_tile.cuh"
#include "runtime/kernels/cuda/wgmma_utils.cuh"

namespace tandem::cuda::internal {
namespace {

using namespace skinny_tile;  // NOLINT: the shared tile pieces (skinny_gemm_tile.cuh)
// The wgmma descriptor and accumulator maps (the same instructions as the prefill kernel's).
namespace sa = ::tandem::cuda::sm90_attention;

template <int kN>
__host__ __device__ constexpr int StageBytes() {
  return kWStageBytes + kN * kRowBytes;
}
// Stages: as many as fit two CTAs per SM (227 KB of shared memory, less 2 KB per CTA for the
// alignment slack and the static shared memory), at most 8: 8 for N <= 32, 7 for 48, 6 for 64.
// (One CTA per SM with up to 14 stages, and three with 4-7, measured slower on the H200:
// bench/RESULTS.md, seventh session.)
template <int kN>
__host__ __device__ constexpr int Stages() {
  return (227 * 1024 / 2 - 2048) / StageBytes<kN>() < 8 ? (227 * 1024 / 2 - 2048) / StageBytes<kN>()
                                                        : 8;
}
template <int kN>
constexpr size_t SmemBytes() {
  return size_t{1024} + Stages<kN>() * StageBytes<kN>();
}

// d (m64nN, f32) += A B for N = 16, 32, 48 or 64, A and B from shared memory (K-major both).
template <int kN>
__device__ __forceinline__ void WgmmaSsAcc(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kN == 16) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, 1, 1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "l"(desc_a), "l"(desc_b));
  } else if constexpr (kN == 32) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, 1, 1, "
        "1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b));
  } else if constexpr (kN == 48) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23}, %24, %25, 1, 1, 1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
        : "l"(desc_a), "l"(desc_b));
  } else {
    static_assert(kN == 64, "N = 16, 32, 48 or 64");
    WgmmaSs64x64(d, desc_a, desc_b, 1);
  }
#endif
}

template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

template <int kN, int kMode>
__global__ void __launch_bounds__(kThreads) SkinnyGemmSm90Kernel(const SkinnyGemmRaw p) {
  constexpr int kStages = Stages<kN>();
  constexpr int kAhead = kStages - 2;  // steps whose loads are in flight past the current one
  constexpr int kStageBytes = StageBytes<kN>();
  constexpr int kLd = kN + 1;  // float stride of the reduction tile
  constexpr int kAcc = kN / 2;
  static_assert(kRows * kLd * 4 <= kStages * kStageBytes, "reduction tile must fit the pipeline");
  static_assert(kStageBytes % 1024 == 0 && kWStageBytes % 1024 == 0, "1024-byte aligned operands");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  PdlLaunchDependents();
  // Operand tiles must start on 1024-byte boundaries (descriptor base offset 0).
  const uint32_t raw_addr = SharedAddress(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  const uint32_t base = SharedAddress(smem);

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int tile = blockIdx.x;
  const int split = blockIdx.y;
  const SkinnyLoader<kN / 16, kMode> loader(p, tile, split, tid);
  const int num_steps = loader.num_steps;
  auto stage_ptr = [&](int step) { return smem + (step % kStages) * kStageBytes; };

  // Prologue: kAhead groups; the last one also carries the activations of every prologue stage,
  // which may only be read after the previous kernel has finished.
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    loader.LoadW(stage_ptr(s), s);
    if (s < kAhead - 1) CpAsyncCommitGroup();
  }
  PdlWait();
#pragma unroll
  for (int s = 0; s < kAhead; ++s) loader.LoadX(stage_ptr(s), s);
  CpAsyncCommitGroup();
  CpAsyncWaitGroup<0>();
  FenceProxyAsyncShared();
  __syncthreads();

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

  for (int step = 0; step < num_steps; ++step) {
    if (step > 0) {
      // Groups committed so far: kAhead + step, group j holding step j's stage; at most kAhead - 1
      // pending means this step's stage has landed. After the barrier every thread's copies are
      // visible to the async proxy, and every warp's wgmma of step - 2 has retired (each waited
      // for all but its newest group), so that stage can be refilled.
      CpAsyncWaitGroup<kAhead - 1>();
      FenceProxyAsyncShared();
      __syncthreads();
    }
    loader.LoadW(stage_ptr(step + kAhead), step + kAhead);
    loader.LoadX(stage_ptr(step + kAhead), step + kAhead);
    CpAsyncCommitGroup();  // possibly empty: keeps the group count in step

    const uint32_t w_tile = base + (step % kStages) * kStageBytes;
    const uint32_t x_tile = w_tile + kWStageBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      WgmmaSsAcc<kN>(acc,
                     sa::MakeDescriptor(w_tile + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo),
                     sa::MakeDescriptor(x_tile + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo));
    }
    WgmmaCommit();
    WgmmaWait<1>();
    FenceRegisters(acc);
  }
  WgmmaWaitAll();
  FenceRegisters(acc);
  CpAsyncWaitGroup<0>();
  __syncthreads();  // every warp is done with the pipeline: its memory becomes the reduction tile

  // red[r][c]: output tile, weight row r (0..63) by activation row c (0..kN-1).
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int r = 0; r < kAcc; ++r) {
    red[sa::AccRow(warp, lane, r) * kLd + sa::AccCol(lane, r)] = acc[r];
  }
  __syncthreads();
  FinishSkinnyTile<kN, kMode>(p, red, kLd, tile, split, tid);
}

template <int kN, int kMode>
cudaError_t LaunchTyped(const SkinnyGemmRaw& p, cudaStream_t stream) {
  static std::atomic<uint64_t> configured{0};
  return LaunchSkinnyKernel(SkinnyGemmSm90Kernel<kN, kMode>, SmemBytes<kN>(), configured, p,
                            stream);
}

}  // namespace

cudaError_t LaunchSkinnyGemmSm90Raw(const SkinnyGemmRaw& p, cudaStream_t stream) {
  if (p.m < 1 || p.m > kSkinnyMaxRowsDevice) return cudaErrorInvalidValue;
  return DispatchSkinnyMode(p, [&](auto mode) {
    return DispatchSkinnyRows(p.m, [&](auto m16) {
      return LaunchTyped<16 * decltype(m16)::value, decltype(mode)::value>(p, stream);
    });
  });
}

}  // namespace tandem::cuda::internal

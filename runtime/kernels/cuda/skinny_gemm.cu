// Skinny bf16 GEMM on tensor cores (contract: skinny_gemm.h). out^T = w . x^T with mma.sync
// m16n8k16: the weight rows are the MMA's 16-row A operand and the activation rows its 8-column B
// operand, so a CTA streams a 64-row slab of the weights once for all (up to 64) activation rows.
//   - CTA: 4 warps, one output tile of 64 weight rows (gated: gate rows j0..j0+31 and up rows
//     n+j0..n+j0+31, so the SiLU-and-multiply epilogue has both halves in one CTA) over one K
//     range of the plan's split. Warp (wn, wk): weight rows 32 wn .. 32 wn + 31 (two A tiles) and
//     the k16 slices wk and wk + 2 of each 64-wide stage; the two wk halves are summed through
//     shared memory at the end. Each weight byte is read from shared memory once, each activation
//     byte twice.
//   - Pipeline: kStages stages of 64 k (weights 8 KB + activations up to 8 KB) with cp.async; the
//     first kStages - 1 weight stages are issued BEFORE PdlWait() (weights do not depend on the
//     previous kernel), the activations after it.
//   - Shared tiles are [rows][8 x 16-byte chunks] with the chunk index XORed by row % 8, so the
//     8 row addresses of every ldmatrix phase and every cp.async row fall in distinct banks.
//   - Split-K: partial tiles go to global scratch; the last CTA of a tile (atomic counter) sums
//     them in split order, writes the output and resets the counter.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/mma_utils.cuh"
#include "runtime/kernels/cuda/skinny_gemm_internal.h"
#include "runtime/kernels/cuda/skinny_gemm_layout.h"
#include "runtime/kernels/cuda/skinny_gemm_tile.cuh"

namespace tandem::cuda::internal {
namespace {

// Every index below comes from skinny_gemm_layout.h (as skinny_tile::sl), which the host
// emulation test shares.
using namespace skinny_tile;  // NOLINT: the shared tile pieces (skinny_gemm_tile.cuh)

constexpr int kStages = 4;
constexpr int kPrefetch = kStages - 1;

template <int kM16>
__host__ __device__ constexpr int StageBytes() {
  return kWStageBytes + 16 * kM16 * kRowBytes;
}

template <int kM16>
__host__ __device__ constexpr int SmemBytes() {
  return kStages * StageBytes<kM16>();
}

template <int kM16, int kMode>
__global__ void __launch_bounds__(kThreads) SkinnyGemmKernel(const SkinnyGemmRaw p) {
  constexpr int kMp = 16 * kM16;  // activation rows, padded (MMA columns)
  constexpr int kStageBytes = StageBytes<kM16>();
  constexpr int kLd = kMp + 1;  // float stride of the reduction tile (odd: no conflicts)
  static_assert(kRows * kLd * 4 <= SmemBytes<kM16>(), "reduction tile must fit the pipeline");
  extern __shared__ __align__(128) unsigned char smem[];
  PdlLaunchDependents();

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int tile = blockIdx.x;
  const int split = blockIdx.y;
  const SkinnyLoader<kM16, kMode> loader(p, tile, split, tid);
  const int num_steps = loader.num_steps;
  auto load_w = [&](int step) { loader.LoadW(smem + (step % kStages) * kStageBytes, step); };
  auto load_x = [&](int step) { loader.LoadX(smem + (step % kStages) * kStageBytes, step); };

  // Prologue: kPrefetch groups; the last one also carries the activations of every prologue
  // stage, which may only be read after the previous kernel has finished.
#pragma unroll
  for (int s = 0; s < kPrefetch; ++s) {
    load_w(s);
    if (s < kPrefetch - 1) CpAsyncCommitGroup();
  }
  PdlWait();
#pragma unroll
  for (int s = 0; s < kPrefetch; ++s) load_x(s);
  CpAsyncCommitGroup();
  CpAsyncWaitGroup<0>();
  __syncthreads();

  const int wn = sl::WarpN(warp);
  const int wk = sl::WarpK(warp);
  float acc[2][2 * kM16][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 2 * kM16; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    }
  }

  for (int step = 0; step < num_steps; ++step) {
    if (step > 0) {
      // Groups committed so far: kPrefetch + step; at most kPrefetch - 1 pending means group
      // `step` (this step's stage) has landed. The barrier also retires every warp's reads of
      // the stage the loads below overwrite (step - 1's).
      CpAsyncWaitGroup<kPrefetch - 1>();
      __syncthreads();
    }
    load_w(step + kPrefetch);
    load_x(step + kPrefetch);
    CpAsyncCommitGroup();  // possibly empty: keeps the group count in step

    const unsigned stage = SharedAddress(smem + (step % kStages) * kStageBytes);
#pragma unroll
    for (int kk = 0; kk < sl::kKSlicesPerWarp; ++kk) {
      const int ks = sl::KSlice(wk, kk);  // k16 slice of the stage: chunks 2 ks and 2 ks + 1
      uint32_t a[2][4];                   // A fragments of the warp's two m16 tiles of weight rows
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        LdMatrixX4(a[i], stage + sl::Swizzle(sl::ARow(wn, i, lane), sl::AChunk(ks, lane)));
      }
#pragma unroll
      for (int j2 = 0; j2 < kM16; ++j2) {
        uint32_t b[4];  // b0, b1 of n8 tile 2 j2, then of n8 tile 2 j2 + 1
        LdMatrixX4(b, stage + kWStageBytes + sl::Swizzle(sl::BRow(j2, lane), sl::BChunk(ks, lane)));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          MmaBf16(acc[i][2 * j2], a[i], b[0], b[1]);
          MmaBf16(acc[i][2 * j2 + 1], a[i], b[2], b[3]);
        }
      }
    }
  }
  CpAsyncWaitGroup<0>();
  __syncthreads();  // every warp is done with the pipeline: its memory becomes the reduction tile

  // red[r][c]: output tile, weight row r (0..63) by activation row c (0..kMp-1).
  float* red = reinterpret_cast<float*>(smem);
  auto for_each_acc = [&](auto&& f) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2 * kM16; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          f(red[sl::AccRow(wn, i, lane, e) * kLd + sl::AccCol(j, lane, e)], acc[i][j][e]);
        }
      }
    }
  };
  if (wk == 1) for_each_acc([](float& slot, float v) { slot = v; });
  __syncthreads();
  if (wk == 0) for_each_acc([](float& slot, float v) { slot = v + slot; });
  __syncthreads();

  FinishSkinnyTile<16 * kM16, kMode>(p, red, kLd, tile, split, tid);
}

template <int kM16, int kMode>
cudaError_t LaunchTyped(const SkinnyGemmRaw& p, cudaStream_t stream) {
  static std::atomic<uint64_t> configured{0};
  return LaunchSkinnyKernel(SkinnyGemmKernel<kM16, kMode>, SmemBytes<kM16>(), configured, p,
                            stream);
}

}  // namespace

bool SkinnyGemmWgmmaRunsHere() { return CurrentDeviceIsSm90(); }

cudaError_t LaunchSkinnyGemmRaw(const SkinnyGemmRaw& p, bool use_wgmma, cudaStream_t stream) {
  if (use_wgmma) return LaunchSkinnyGemmSm90Raw(p, stream);
  return DispatchSkinnyMode(p, [&](auto mode) {
    return DispatchSkinnyRows(p.m, [&](auto m16) {
      return LaunchTyped<decltype(m16)::value, decltype(mode)::value>(p, stream);
    });
  });
}

}  // namespace tandem::cuda::internal

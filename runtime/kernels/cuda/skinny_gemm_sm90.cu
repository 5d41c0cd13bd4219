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
#include <cstdlib>
#include <cstring>

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

// d (m64n256, f32) += A B, A (64 rows) and B (256 rows) from shared memory (K-major both).
__device__ __forceinline__ void WgmmaSs64x256Acc(float (&d)[128], uint64_t desc_a,
                                                 uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "
      "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "
      "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
      "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "
      "%123, %124, %125, %126, %127}, "
      "%128, %129, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b));
#endif
}

// --- Wide variant (TANDEM_SKINNY_WIDE=1, for 33-64 rows; opt-in while measured) ----------------
// One CTA takes four consecutive 64-row output tiles (256 weight rows) by all m <= 64 activation
// rows, with the operands' roles swapped: wgmma m64n256k16, the activation rows as A (64, padded
// with zeros) and the 256 weight rows as B, both from the same 128-byte-swizzled shared tiles (the
// four weight tiles back to back are one 256-row tile). A stage is 32 KB of weights and 8 KB of
// activations (a fifth of its bytes, against half in the 64-row kernel at 64 rows); one CTA per
// SM, kWideStages stages. The plan is the 64-row tiles' plan aimed at four of them per SM
// (TANDEM_SKINNY_CTAS_PER_SM=4: one wide CTA per SM); each of the four tiles is then finished as
// in the other kernels (split-K partials and sum, epilogues).
constexpr int kWideTiles = 4;
constexpr int kWideWBytes = kWideTiles * kWStageBytes;
constexpr int kWideStageBytes = kWideWBytes + 64 * kRowBytes;
constexpr int kWideStages = 5;
constexpr size_t kWideSmemBytes = 1024 + size_t{kWideStages} * kWideStageBytes;

// kMp: the activation rows the plan's partials hold (m rounded up to 16: 48 or 64).
template <int kMode, int kMp>
__global__ void __launch_bounds__(kThreads) SkinnyGemmSm90WideKernel(const SkinnyGemmRaw p) {
  constexpr int kAhead = kWideStages - 2;
  constexpr int kLd = 64 + 1;
  constexpr int kAcc = 128;
  static_assert(kWideTiles * kRows * kLd * 4 <= kWideStages * kWideStageBytes, "reduction tiles");
  static_assert(kWideStageBytes % 1024 == 0, "1024-byte aligned operands");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  PdlLaunchDependents();
  const uint32_t raw_addr = SharedAddress(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  const uint32_t base = SharedAddress(smem);

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int tile0 = blockIdx.x * kWideTiles;
  const int split = blockIdx.y;
  const SkinnyLoader<4, kMode> xload(p, tile0, split, tid);  // for its activation copies
  const int num_steps = xload.num_steps;
  const int chunk = sl::LoadChunk(tid);
  // This thread's weight rows of the four tiles (-1 past the matrix).
  int w_row[kWideTiles][sl::kWLoadsPerThread];
#pragma unroll
  for (int j = 0; j < kWideTiles; ++j) {
#pragma unroll
    for (int i = 0; i < sl::kWLoadsPerThread; ++i) {
      w_row[j][i] = kMode == kRopeMode
                        ? sl::RopeWeightRow(tile0 + j, sl::LoadRow(tid, i), p.n, p.rope_head_dim)
                        : sl::WeightRow(tile0 + j, sl::LoadRow(tid, i), p.n, kMode == kGatedMode);
    }
  }
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(p.w);
  const size_t w_col0 = static_cast<size_t>(split) * p.k_per_split + chunk * 8;
  auto stage_ptr = [&](int step) { return smem + (step % kWideStages) * kWideStageBytes; };
  auto load_w = [&](int step) {
    if (step >= num_steps) return;
    unsigned char* st = stage_ptr(step);
#pragma unroll
    for (int j = 0; j < kWideTiles; ++j) {
#pragma unroll
      for (int i = 0; i < sl::kWLoadsPerThread; ++i) {
        const int row = w_row[j][i];
        CpAsyncCg16(st + j * kWStageBytes + sl::Swizzle(sl::LoadRow(tid, i), chunk),
                    w + static_cast<size_t>(row < 0 ? 0 : row) * p.k + w_col0 + step * kBk,
                    row >= 0);
      }
    }
  };
  // LoadX writes at its argument + kWStageBytes: the activations follow the four weight tiles.
  auto load_x = [&](int step) {
    xload.LoadX(stage_ptr(step) + (kWideTiles - 1) * kWStageBytes, step);
  };

#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    load_w(s);
    if (s < kAhead - 1) CpAsyncCommitGroup();
  }
  PdlWait();
#pragma unroll
  for (int s = 0; s < kAhead; ++s) load_x(s);
  CpAsyncCommitGroup();
  CpAsyncWaitGroup<0>();
  FenceProxyAsyncShared();
  __syncthreads();

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  for (int step = 0; step < num_steps; ++step) {
    if (step > 0) {
      CpAsyncWaitGroup<kAhead - 1>();
      FenceProxyAsyncShared();
      __syncthreads();
    }
    load_w(step + kAhead);
    load_x(step + kAhead);
    CpAsyncCommitGroup();
    const uint32_t w_tile = base + (step % kWideStages) * kWideStageBytes;
    const uint32_t x_tile = w_tile + kWideWBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      WgmmaSs64x256Acc(acc,
                       sa::MakeDescriptor(x_tile + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo),
                       sa::MakeDescriptor(w_tile + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo));
    }
    WgmmaCommit();
    WgmmaWait<1>();
    FenceRegisters(acc);
  }
  WgmmaWaitAll();
  FenceRegisters(acc);
  CpAsyncWaitGroup<0>();
  __syncthreads();

  // Tile j's reduction tile at red + j * kRows * kLd: weight row r (0..63) by activation row c.
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int col = sa::AccCol(lane, i);  // weight row of the CTA's 256
    red[(col / kRows * kRows + col % kRows) * kLd + sa::AccRow(warp, lane, i)] = acc[i];
  }
  __syncthreads();
  for (int j = 0; j < kWideTiles; ++j) {
    if (tile0 + j >= p.tiles) break;  // uniform over the CTA
    FinishSkinnyTile<kMp, kMode>(p, red + j * kRows * kLd, kLd, tile0 + j, split, tid, CtaBarrier(),
                                 p.tiles);
  }
}

template <int kMode, int kMp>
cudaError_t LaunchWideTyped(const SkinnyGemmRaw& p, cudaStream_t stream) {
  static std::atomic<uint64_t> configured{0};
  const auto kernel = SkinnyGemmSm90WideKernel<kMode, kMp>;
  if (const cudaError_t e = OptInDynamicSharedMemory(kernel, kWideSmemBytes, configured);
      e != cudaSuccess) {
    return e;
  }
  const dim3 grid(static_cast<unsigned>((p.tiles + kWideTiles - 1) / kWideTiles),
                  static_cast<unsigned>(p.splits));
  const cudaError_t e = LaunchKernel(kernel, grid, dim3(kThreads), kWideSmemBytes, stream, p);
  return e != cudaSuccess ? e : cudaGetLastError();
}

// Whether a launch takes the wide kernel: TANDEM_SKINNY_WIDE=1 (read once) and more than 32 rows.
bool UseWide(const SkinnyGemmRaw& p) {
  static const bool requested = [] {
    const char* env = std::getenv("TANDEM_SKINNY_WIDE");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  return requested && p.m > 32;
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
    if (UseWide(p)) {
      return p.m > 48 ? LaunchWideTyped<decltype(mode)::value, 64>(p, stream)
                      : LaunchWideTyped<decltype(mode)::value, 48>(p, stream);
    }
    return DispatchSkinnyRows(p.m, [&](auto m16) {
      return LaunchTyped<16 * decltype(m16)::value, decltype(mode)::value>(p, stream);
    });
  });
}

}  // namespace tandem::cuda::internal

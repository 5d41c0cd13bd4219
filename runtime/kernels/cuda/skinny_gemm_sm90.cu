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

#include <cuda.h>  // CUtensorMap
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
#include "runtime/kernels/cuda/tensor_map.h"
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

// --- TMA-fed wide variant (TANDEM_SKINNY_TMA_WIDE=1: plain mode, 33-64 rows; opt-in while
// measured). One CTA takes four consecutive 64-row output tiles (256 weight rows) by all m <= 64
// activation rows with the operands' roles swapped: wgmma m64n256k16, the activation rows as A
// (zero-filled to 64 by the tensor map's bounds) and the 256 weight rows as B. A producer warp
// loads each 64-k stage as one TMA box of 256 weight rows (32 KB) and one of 64 activation rows
// (8 KB) onto the stage's full mbarrier, kTwStages stages ahead (the first stages' weights before
// PdlWait); the consumer warpgroup multiplies and releases a stage on its empty mbarrier (one
// arrival per warp) once the wgmma that read it retired: no CTA barrier and no per-thread copies
// in the loop (the eighth session's wide kernel issued 20 cp.async per thread per stage behind a
// CTA barrier and lost by 55%). The four tiles are then finished as in the other kernels; the plan
// is the 64-row tiles' plan aimed at four per SM (TANDEM_SKINNY_CTAS_PER_SM=4).
constexpr int kTwTiles = 4;
constexpr int kTwWBytes = kTwTiles * kWStageBytes;
constexpr int kTwStageBytes = kTwWBytes + 64 * kRowBytes;
constexpr int kTwStages = 5;
constexpr size_t kTwSmemBytes = 1024 + size_t{kTwStages} * kTwStageBytes;
constexpr int kTwThreads = kThreads + kWarpSize;  // the consumer warpgroup, then the producer warp
static_assert(kTwStageBytes % 1024 == 0, "1024-byte aligned operands");
static_assert(kTwTiles * kRows * (64 + 1) * 4 <= kTwStages * kTwStageBytes, "reduction tiles");

// The consumer warpgroup's barrier (named barrier 1; the producer warp has left by then).
struct ConsumerBarrier {
  __device__ __forceinline__ void operator()() const { NamedBarrierSync(1, kThreads); }
};

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

// One 2-D box of `map` (a __grid_constant__ CUtensorMap) at (c0 = column, c1 = row) into shared
// memory at `dst`, completing its bytes on mbarrier `bar`.
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

// kMp: the activation rows the plan's partials hold (m rounded up to 16: 48 or 64).
template <int kMp>
__global__ void __launch_bounds__(kTwThreads, 1)
    SkinnyGemmSm90TmaWideKernel(const SkinnyGemmRaw p, const __grid_constant__ CUtensorMap w_map,
                                const __grid_constant__ CUtensorMap x_map) {
  constexpr int kLd = 64 + 1;
  constexpr int kAcc = 128;
  __shared__ __align__(8) uint64_t bars[2 * kTwStages];  // full[kTwStages], then empty
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  PdlLaunchDependents();
  const uint32_t raw_addr = SharedAddress(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  const uint32_t base = SharedAddress(smem);
  const uint32_t full0 = SharedAddress(bars);
  const uint32_t empty0 = full0 + 8 * kTwStages;
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int tile0 = blockIdx.x * kTwTiles;
  const int k0 = blockIdx.y * p.k_per_split;
  const int num_steps = p.k_per_split / kBk;
  if (tid == 0) {
    for (int s = 0; s < kTwStages; ++s) {
      MbarInit(full0 + 8 * s, 1);                      // the producer's arrive.expect_tx
      MbarInit(empty0 + 8 * s, kThreads / kWarpSize);  // one arrival per consumer warp
    }
    FenceMbarrierInit();
  }
  __syncthreads();

  if (warp == kThreads / kWarpSize) {  // the producer warp
    if (lane == 0) {
      PrefetchTensorMap(&w_map);
      PrefetchTensorMap(&x_map);
      const auto load = [&](int step, bool weights, bool activations) {
        const int s = step % kTwStages;
        const uint32_t stage = base + s * kTwStageBytes;
        const uint32_t full = full0 + 8 * s;
        if (weights) {
          MbarArriveExpectTx(full, kTwStageBytes);
          TmaLoad2d(stage, &w_map, k0 + step * kBk, tile0 * kRows, full);
        }
        if (activations) TmaLoad2d(stage + kTwWBytes, &x_map, k0 + step * kBk, 0, full);
      };
      const int ahead = num_steps < kTwStages ? num_steps : kTwStages;
      for (int step = 0; step < ahead; ++step) load(step, true, false);
      PdlWait();  // the activations are the previous kernel's output
      for (int step = 0; step < ahead; ++step) load(step, false, true);
      for (int step = kTwStages; step < num_steps; ++step) {
        MbarWait(empty0 + 8 * (step % kTwStages), ((step / kTwStages) - 1) & 1);
        load(step, true, true);
      }
    }
    return;
  }

  PdlWait();  // before this CTA writes anything an earlier kernel may still read
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  for (int step = 0; step < num_steps; ++step) {
    const int s = step % kTwStages;
    MbarWait(full0 + 8 * s, (step / kTwStages) & 1);
    const uint32_t w_tile = base + s * kTwStageBytes;
    const uint32_t x_tile = w_tile + kTwWBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      WgmmaSs64x256Acc(acc,
                       sa::MakeDescriptor(x_tile + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo),
                       sa::MakeDescriptor(w_tile + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo));
    }
    WgmmaCommit();
    WgmmaWait<1>();  // step - 1's products retired: its stage can be refilled
    FenceRegisters(acc);
    if (step > 0) {
      __syncwarp();
      if (lane == 0) MbarArrive(empty0 + 8 * ((step - 1) % kTwStages));
    }
  }
  WgmmaWaitAll();
  FenceRegisters(acc);
  ConsumerBarrier()();  // every stage landed and was read: its memory becomes the reduction tiles

  // red[c * kLd + r]: weight row c (0..255) of the CTA by activation row r; tile j's at
  // red + j * kRows * kLd.
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    red[sa::AccCol(lane, i) * kLd + sa::AccRow(warp, lane, i)] = acc[i];
  }
  ConsumerBarrier()();
  for (int j = 0; j < kTwTiles; ++j) {
    if (tile0 + j >= p.tiles) break;  // uniform over the CTA
    FinishSkinnyTile<kMp, kPlain>(p, red + j * kRows * kLd, kLd, tile0 + j, blockIdx.y, tid,
                                  ConsumerBarrier(), p.tiles);
  }
}

template <int kMp>
cudaError_t LaunchTmaWideTyped(const SkinnyGemmRaw& p, cudaStream_t stream) {
  CUtensorMap w_map, x_map;
  if (!EncodeRowMajorBf16(&w_map, p.w, static_cast<uint64_t>(p.n), static_cast<uint64_t>(p.k),
                          kTwTiles * kRows) ||
      !EncodeRowMajorBf16(&x_map, p.x, static_cast<uint64_t>(p.m), static_cast<uint64_t>(p.k),
                          64)) {
    return cudaErrorNotSupported;
  }
  static std::atomic<uint64_t> configured{0};
  const auto kernel = SkinnyGemmSm90TmaWideKernel<kMp>;
  if (const cudaError_t e = OptInDynamicSharedMemory(kernel, kTwSmemBytes, configured);
      e != cudaSuccess) {
    return e;
  }
  const dim3 grid(static_cast<unsigned>((p.tiles + kTwTiles - 1) / kTwTiles),
                  static_cast<unsigned>(p.splits));
  const cudaError_t e =
      LaunchKernel(kernel, grid, dim3(kTwThreads), kTwSmemBytes, stream, p, w_map, x_map);
  return e != cudaSuccess ? e : cudaGetLastError();
}

// Whether a launch takes the TMA wide kernel: TANDEM_SKINNY_TMA_WIDE=1 (read once), plain mode,
// more than 32 rows.
bool UseTmaWide(const SkinnyGemmRaw& p) {
  static const bool requested = [] {
    const char* env = std::getenv("TANDEM_SKINNY_TMA_WIDE");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  return requested && p.m > 32 && !p.gated_silu && p.rope_head_dim == 0;
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
  if (UseTmaWide(p)) {
    const cudaError_t e =
        p.m > 48 ? LaunchTmaWideTyped<64>(p, stream) : LaunchTmaWideTyped<48>(p, stream);
    if (e != cudaErrorNotSupported) return e;  // else (no tensor map) the 64-row kernel below
  }
  return DispatchSkinnyMode(p, [&](auto mode) {
    return DispatchSkinnyRows(p.m, [&](auto m16) {
      return LaunchTyped<16 * decltype(m16)::value, decltype(mode)::value>(p, stream);
    });
  });
}

}  // namespace tandem::cuda::internal

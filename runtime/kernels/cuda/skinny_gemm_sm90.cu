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
//     an SM: 4 stages of weights in flight per CTA.
//   - Why: at 8-64 rows the mma.sync kernel spends as long on its MMAs and ldmatrix traffic as on
//     the weight stream; a wgmma takes 64 weight rows by up to 64 activation rows from shared
//     memory in one asynchronous instruction, so the SM's time goes to keeping loads in flight.

#include <cuda.h>
#include <cudaTypedefs.h>
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

// Activation rows padded to the wgmma N of the launch.
__host__ __device__ constexpr int PaddedRows(int m) { return (m + 15) / 16 * 16; }

template <int kN>
__host__ __device__ constexpr int StageBytes() {
  return kWStageBytes + kN * kRowBytes;
}
// Stages of the cp.async kernel: as many as fit two CTAs per SM (~113 KB each) with the 1 KB
// alignment slack.
template <int kN>
__host__ __device__ constexpr int Stages() {
  return kN <= 32 ? 8 : 6;
}
template <int kN>
constexpr size_t SmemBytes() {
  return size_t{1024} + Stages<kN>() * StageBytes<kN>();
}

// The TMA kernel's rings: kTmaXStages activation tiles (cp.async, two steps ahead) and as many
// 8 KB weight stages (TMA, kTmaWStages - 2 steps ahead) as fit two CTAs per SM, at most 12.
constexpr int kTmaXStages = 4;
template <int kN>
__host__ __device__ constexpr int TmaWStages() {
  return (110 * 1024 - kTmaXStages * kN * kRowBytes) / kWStageBytes < 12
             ? (110 * 1024 - kTmaXStages * kN * kRowBytes) / kWStageBytes
             : 12;
}
template <int kN>
constexpr size_t TmaSmemBytes() {
  return size_t{1024} + TmaWStages<kN>() * kWStageBytes + kTmaXStages * kN * kRowBytes;
}
constexpr int kTmaBoxRows = 32;  // a weight stage is two 32-row boxes (gated and rope tiles)
constexpr uint32_t kTmaStageTx = kWStageBytes;

// mbarrier and TMA instructions (sm_90a).
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
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
// Waits for the phase of `bar` with this parity to complete. A bounded wait: a phase that never
// completes (a bug) traps, failing the launch, instead of hanging the GPU.
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
// One 2D box of `map` at coordinates (c0 = k, c1 = row) into shared memory at `dst`, completing
// its bytes on `bar`.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
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

// The TMA kernel: the same CTA, tiles and wgmma as SkinnyGemmSm90Kernel, but the weight stages
// come by TMA (thread 0 issues two 32-row boxes of the 128-byte-swizzled tensor map per stage,
// completing on that stage's mbarrier), so they are out of the cp.async groups: the weights run
// kTmaWStages - 2 steps ahead while the activations (cp.async, L2-resident) run two. Rows of the
// tile's two boxes: plain rows 64 t and 64 t + 32; gated the gate rows 32 t and the up rows
// n + 32 t; rope the pair rows of RopeWeightRow (contiguous when head_dim / 2 is a multiple of
// 32, which the launcher requires). Rows past the matrix read as zeros (the map's bounds).
template <int kN, int kMode>
__global__ void __launch_bounds__(kThreads)
    SkinnyGemmSm90TmaKernel(const SkinnyGemmRaw p, const __grid_constant__ CUtensorMap w_map) {
  constexpr int kWStages = TmaWStages<kN>();
  constexpr int kWAhead = kWStages - 2;
  constexpr int kXAhead = kTmaXStages - 2;
  constexpr int kXBytes = kN * kRowBytes;
  constexpr int kLd = kN + 1;
  constexpr int kAcc = kN / 2;
  static_assert(kWAhead >= 2, "pipeline depth");
  static_assert(kRows * kLd * 4 <= kWStages * kWStageBytes, "reduction tile must fit the ring");
  static_assert(kXBytes % 1024 == 0, "1024-byte aligned operands");
  __shared__ __align__(8) uint64_t full[kWStages];
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  PdlLaunchDependents();
  const uint32_t raw_addr = SharedAddress(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  unsigned char* x_ring = smem + kWStages * kWStageBytes;
  const uint32_t w_base = SharedAddress(smem);
  const uint32_t x_base = w_base + kWStages * kWStageBytes;
  const uint32_t bar_base = SharedAddress(full);

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int tile = blockIdx.x;
  const int split = blockIdx.y;
  const SkinnyLoader<kN / 16, kMode> loader(p, tile, split, tid);
  const int num_steps = loader.num_steps;
  const int k0 = loader.k0;
  int row0, row1;
  if constexpr (kMode == kRopeMode) {
    const int half = p.rope_head_dim / 2;
    const int pair0 = tile * (kRows / 2);
    row0 = (pair0 / half) * p.rope_head_dim + pair0 % half;
    row1 = row0 + half;
  } else if constexpr (kMode == kGatedMode) {
    row0 = tile * (kRows / 2);
    row1 = p.n + row0;
  } else {
    row0 = tile * kRows;
    row1 = row0 + kTmaBoxRows;
  }

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kWStages; ++s) MbarInit(bar_base + 8 * s, 1);
    FenceMbarrierInit();
  }
  __syncthreads();
  auto issue_w = [&](int step) {
    if (tid != 0 || step >= num_steps) return;
    const uint32_t bar = bar_base + 8 * (step % kWStages);
    const uint32_t dst = w_base + (step % kWStages) * kWStageBytes;
    MbarArriveExpectTx(bar, kTmaStageTx);
    TmaLoad2d(dst, &w_map, k0 + step * kBk, row0, bar);
    TmaLoad2d(dst + kTmaBoxRows * kRowBytes, &w_map, k0 + step * kBk, row1, bar);
  };
  auto x_tile = [&](int step) { return x_ring + (step % kTmaXStages) * kXBytes; };

  // Prologue: the first kWAhead weight stages before PdlWait() (weights do not depend on the
  // previous kernel), then the first kXAhead activation tiles, one cp.async group each.
  for (int s = 0; s < kWAhead; ++s) issue_w(s);
  PdlWait();
#pragma unroll
  for (int s = 0; s < kXAhead; ++s) {
    loader.LoadXTile(x_tile(s), s);
    CpAsyncCommitGroup();
  }

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

  for (int step = 0; step < num_steps; ++step) {
    // Activation groups committed so far: kXAhead + step, group j holding step j's tile; the
    // weight stage completes on its mbarrier (phase step / kWStages). After the barrier every
    // thread's activation copies are visible to the async proxy, and every warp's wgmma of step - 2
    // has retired, so its weight stage and activation tile can be refilled.
    CpAsyncWaitGroup<kXAhead - 1>();
    MbarWait(bar_base + 8 * (step % kWStages), (step / kWStages) & 1);
    FenceProxyAsyncShared();
    __syncthreads();
    issue_w(step + kWAhead);
    loader.LoadXTile(x_tile(step + kXAhead), step + kXAhead);
    CpAsyncCommitGroup();  // possibly empty: keeps the group count in step

    const uint32_t w_tile = w_base + (step % kWStages) * kWStageBytes;
    const uint32_t xt = x_base + (step % kTmaXStages) * kXBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      WgmmaSsAcc<kN>(acc,
                     sa::MakeDescriptor(w_tile + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo),
                     sa::MakeDescriptor(xt + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo));
    }
    WgmmaCommit();
    WgmmaWait<1>();
    FenceRegisters(acc);
  }
  WgmmaWaitAll();
  FenceRegisters(acc);
  CpAsyncWaitGroup<0>();
  __syncthreads();  // every warp is done with the rings: their memory becomes the reduction tile

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
  constexpr size_t kSmem = SmemBytes<kN>();
  static std::atomic<uint64_t> configured{0};
  if (const cudaError_t e =
          OptInDynamicSharedMemory(SkinnyGemmSm90Kernel<kN, kMode>, kSmem, configured);
      e != cudaSuccess) {
    return e;
  }
  const dim3 grid(static_cast<unsigned>(p.tiles), static_cast<unsigned>(p.splits));
  const cudaError_t e =
      LaunchKernel(SkinnyGemmSm90Kernel<kN, kMode>, grid, dim3(kThreads), kSmem, stream, p);
  return e != cudaSuccess ? e : cudaGetLastError();
}

// cuTensorMapEncodeTiled from the driver (through the runtime: no libcuda link), or null.
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

template <int kN, int kMode>
cudaError_t LaunchTmaTyped(const SkinnyGemmRaw& p, cudaStream_t stream) {
  // The weight matrix as a [rows, k] bf16 tensor, boxes of 64 k x 32 rows, 128-byte swizzle.
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const uint64_t rows = kMode == kGatedMode  ? 2 * static_cast<uint64_t>(p.n)
                        : kMode == kRopeMode ? 2 * static_cast<uint64_t>(p.n)
                                             : static_cast<uint64_t>(p.n);
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(p.k), rows};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p.k) * 2};
  const cuuint32_t box[2] = {kBk, kTmaBoxRows};
  const cuuint32_t element_strides[2] = {1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p.w), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    return cudaErrorInvalidValue;
  }
  constexpr size_t kSmem = TmaSmemBytes<kN>();
  static std::atomic<uint64_t> configured{0};
  if (const cudaError_t e =
          OptInDynamicSharedMemory(SkinnyGemmSm90TmaKernel<kN, kMode>, kSmem, configured);
      e != cudaSuccess) {
    return e;
  }
  const dim3 grid(static_cast<unsigned>(p.tiles), static_cast<unsigned>(p.splits));
  const cudaError_t e =
      LaunchKernel(SkinnyGemmSm90TmaKernel<kN, kMode>, grid, dim3(kThreads), kSmem, stream, p, map);
  return e != cudaSuccess ? e : cudaGetLastError();
}

// Whether launches take the TMA kernel: TANDEM_SKINNY_TMA=0 (read once) not set, and for rope
// launches head_dim / 2 a multiple of 32 (a tile's rows are then two contiguous boxes).
bool UseTma(const SkinnyGemmRaw& p) {
  static const bool requested = [] {
    const char* env = std::getenv("TANDEM_SKINNY_TMA");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return requested && (p.rope_head_dim == 0 || (p.rope_head_dim / 2) % kTmaBoxRows == 0);
}

template <int kMode>
cudaError_t LaunchForRows(const SkinnyGemmRaw& p, cudaStream_t stream) {
  const bool tma = UseTma(p);
  switch (PaddedRows(p.m)) {
    case 16:
      return tma ? LaunchTmaTyped<16, kMode>(p, stream) : LaunchTyped<16, kMode>(p, stream);
    case 32:
      return tma ? LaunchTmaTyped<32, kMode>(p, stream) : LaunchTyped<32, kMode>(p, stream);
    case 48:
      return tma ? LaunchTmaTyped<48, kMode>(p, stream) : LaunchTyped<48, kMode>(p, stream);
    default:
      return tma ? LaunchTmaTyped<64, kMode>(p, stream) : LaunchTyped<64, kMode>(p, stream);
  }
}

}  // namespace

cudaError_t LaunchSkinnyGemmSm90Raw(const SkinnyGemmRaw& p, cudaStream_t stream) {
  if (p.m < 1 || p.m > kSkinnyMaxRowsDevice) return cudaErrorInvalidValue;
  if (p.rope_head_dim > 0) return LaunchForRows<kRopeMode>(p, stream);
  return p.gated_silu ? LaunchForRows<kGatedMode>(p, stream) : LaunchForRows<kPlain>(p, stream);
}

}  // namespace tandem::cuda::internal

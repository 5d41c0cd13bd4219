// Cluster GEMM for decode batches of up to 64 rows on Hopper (sm_90a; contract: cluster_gemm.h).
//
//   out[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]), m <= 64, bf16 in, float32 accumulate.
//
// Grid (tiles, splits): CTA (t, s) multiplies the m activation rows (loaded as m rounded up to 8,
// the extra rows the TMA's zero fill; the MMA's rows past those are never-stored garbage) by
// weight rows [t R, t R + R), R = 64 subs, over the k range of split s. The splits of one tile
// form a thread block cluster and sum their float32 partial tiles through distributed shared
// memory: once every CTA of the cluster is past its main loop (a cluster barrier), each pushes
// the partials of the weight rows another CTA stores into that CTA's ring, and after a second
// barrier each sums its slice in rank order (no scratch, no second kernel, bit-identical run to
// run).
//
// Why this shape (bench/RESULTS.md, twelfth session): at 64 rows a projection is a weight stream,
// and what a 13-35 us GEMM loses against the copy bandwidth is its fill and drain, not its steady
// state. So:
//   - one CTA per SM, one wave: the plan picks R and the split count so that tiles x splits fill
//     the SMs once (cluster_gemm_kernels.cc), and every CTA streams R x k / splits weights;
//   - a producer warp (one lane) loads each 64-k stage by TMA (the R-row weight box and the
//     activation box, 128-byte swizzled: the layout the wgmma descriptors read) onto a full
//     mbarrier; the consumer warpgroup runs R / 64 wgmma m64n64k16 per k16 (activations as A,
//     weights as B: D is [batch row, weight row]) and frees the stage on an empty mbarrier. By
//     default as many stages as shared memory holds (5-12) are in flight; both sides keep the
//     ring position in counters (a division per step measured 40% slower);
//   - programmatic dependent launch: the weight boxes of every first stage are queued BEFORE the
//     wait on the previous kernel (weights do not depend on it), the activation boxes after it, so
//     a CTA that lands on an SM while the previous kernel drains starts streaming at once.
//     cuBLASLt's kernels do not do this (they do not wait on a programmatic edge: eleventh
//     session), which is the reason this kernel exists.

#include <cuda.h>  // CUtensorMap (its encoder comes through the runtime)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "runtime/kernels/cuda/cluster_gemm_internal.h"
#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/mma_utils.cuh"
#include "runtime/kernels/cuda/prefill_attention_sm90_layout.h"
#include "runtime/kernels/cuda/tensor_map.h"
#include "runtime/kernels/cuda/wgmma_utils.cuh"

namespace tandem::cuda::internal {
namespace {

namespace sa = ::tandem::cuda::sm90_attention;

constexpr int kConsumerThreads = 128;                   // one warpgroup
constexpr int kThreads = kConsumerThreads + kWarpSize;  // + the producer warp
constexpr int kProducerWarp = kConsumerThreads / kWarpSize;
constexpr int kBk = kClusterGemmKStepDevice;              // k per stage: one 128-byte swizzle atom
constexpr int kBoxBytes = kClusterGemmSubRows * kBk * 2;  // 64 rows x 64 k bf16 (8 KB)
constexpr int kSmemLimit = 227 * 1024 - 1024;             // per CTA, less the static shared memory
constexpr int kMaxStages = 12;

template <int kSubs>
__host__ __device__ constexpr int StageBytes() {  // activations, then the weight sub-tiles
  return kBoxBytes * (1 + kSubs);
}
// As many stages as fit beside the 1 KB alignment slack, at most kMaxStages: 12 / 9 / 7 / 5 for
// 1 / 2 / 3 / 4 sub-tiles. (A receive region of its own for split-K partials, 24-72 KB, measured
// 3% slower in the decode step than sharing the ring: it leaves no shared memory for the
// neighbouring kernels' CTAs, bench/RESULTS.md.)
template <int kSubs>
__host__ __device__ constexpr int Stages() {
  return (kSmemLimit - 1024) / StageBytes<kSubs>() < kMaxStages
             ? (kSmemLimit - 1024) / StageBytes<kSubs>()
             : kMaxStages;
}
// Dynamic shared memory of a launch with `stages` stages (Stages() at most).
template <int kSubs>
constexpr size_t SmemBytes(int stages = Stages<kSubs>()) {
  return size_t{1024} + size_t(stages) * StageBytes<kSubs>();
}
// Floats of split-K partials one CTA receives (into its ring, once every CTA of the cluster is
// past its main loop): per source rank, 64 rows of W + 4 (W = R / splits), up to 8 ranks.
template <int kSubs>
__host__ __device__ constexpr int ReceiveFloats() {
  return kClusterGemmSubRows * (kClusterGemmSubRows * kSubs + 4 * kClusterGemmMaxSplits);
}
// Float stride of the one-split partial tile [64 batch rows][R weight rows] in the ring's memory.
template <int kSubs>
__host__ __device__ constexpr int PartialStride() {
  return kClusterGemmSubRows * kSubs + 4;
}

__device__ __forceinline__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// Word `i` of this CTA's trace record (see ClusterGemmRaw::trace), when tracing.
__device__ __forceinline__ void Trace(const ClusterGemmRaw& p, int i, unsigned long long v) {
  if (p.trace != nullptr) {
    p.trace[(blockIdx.y * gridDim.x + blockIdx.x) * kClusterGemmTraceWords + i] = v;
  }
}

template <int kPending>
__device__ __forceinline__ void WgmmaWaitGroup() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

template <int kSubs, bool kSplit>
__global__ void __launch_bounds__(kThreads, 1)
    ClusterGemmKernel(const ClusterGemmRaw p, const __grid_constant__ CUtensorMap w_map,
                      const __grid_constant__ CUtensorMap x_map) {
  constexpr int kMaxRing = Stages<kSubs>();
  const int stages = p.stages;  // in [2, kMaxRing] (the launcher checks)
  constexpr int kStageBytes = StageBytes<kSubs>();
  constexpr int kTileRows = kClusterGemmSubRows * kSubs;
  constexpr int kLd = PartialStride<kSubs>();
  static_assert(kClusterGemmSubRows * kLd * 4 <= 2 * kStageBytes,
                "the one-split partial tile must fit two stages of the pipeline's memory");
  static_assert(ReceiveFloats<kSubs>() * 4 <= 2 * kStageBytes,
                "two stages of the ring hold every source's split-K slice");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_bars[kMaxRing];
  __shared__ __align__(8) uint64_t empty_bars[kMaxRing];
  PdlLaunchDependents();
  if (threadIdx.x == 0) Trace(p, 0, GlobalTimer());
  // 128-byte swizzled boxes start on 1024-byte boundaries (descriptor base offset 0).
  const uint32_t raw_addr = SharedAddress(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  const uint32_t base = SharedAddress(smem);
  const uint32_t full0 = SharedAddress(&full_bars[0]);
  const uint32_t empty0 = SharedAddress(&empty_bars[0]);

  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int n0 = blockIdx.x * kTileRows;
  const int k_step0 = blockIdx.y * p.k_steps;

  if (tid == 0) {
    for (int s = 0; s < stages; ++s) {
      MbarInit(full0 + 8 * s, 1);
      MbarInit(empty0 + 8 * s, kConsumerThreads / kWarpSize);
    }
    FenceMbarrierInit();
  }
  __syncthreads();

  float acc[kSubs][32];
  if (warp == kProducerWarp) {
    if (lane == 0) {
      PrefetchTensorMap(&w_map);
      PrefetchTensorMap(&x_map);
      // The activation box holds x_rows rows (m rounded up to 8; rows past m are the TMA's zero
      // fill): the stage's rows past it are never written, and only ever reach output rows past
      // m, which are not stored.
      const uint32_t stage_tx = kStageBytes - (kClusterGemmMaxRowsDevice - p.x_rows) * kBk * 2;
      const int first = p.k_steps < stages ? p.k_steps : stages;
      for (int s = 0; s < first; ++s) {
        MbarArriveExpectTx(full0 + 8 * s, stage_tx);
        TmaLoad2d(base + s * kStageBytes + kBoxBytes, &w_map, (k_step0 + s) * kBk, n0,
                  full0 + 8 * s);
      }
      PdlWait();  // the activations are the previous kernel's output
      Trace(p, 1, GlobalTimer());
      for (int s = 0; s < first; ++s) {
        TmaLoad2d(base + s * kStageBytes, &x_map, (k_step0 + s) * kBk, 0, full0 + 8 * s);
      }
      // The ring position as counters (a division per step by the runtime depth measured 40%
      // slower: the one issuing thread's dependent chain delays every load).
      int slot = 0;
      uint32_t phase = 0;
      for (int step = stages; step < p.k_steps; ++step) {
        MbarWait(empty0 + 8 * slot, phase);
        const uint32_t stage = base + slot * kStageBytes;
        MbarArriveExpectTx(full0 + 8 * slot, stage_tx);
        TmaLoad2d(stage + kBoxBytes, &w_map, (k_step0 + step) * kBk, n0, full0 + 8 * slot);
        TmaLoad2d(stage, &x_map, (k_step0 + step) * kBk, 0, full0 + 8 * slot);
        if (++slot == stages) {
          slot = 0;
          phase ^= 1;
        }
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kSubs; ++j) {
#pragma unroll
      for (int r = 0; r < 32; ++r) acc[j][r] = 0.0f;
    }
    int slot = 0, prev_slot = stages - 1;
    uint32_t phase = 0;
    for (int step = 0; step < p.k_steps; ++step) {
      MbarWait(full0 + 8 * slot, phase);
      if (step == 0 && tid == 0) Trace(p, 2, GlobalTimer());
      const uint32_t x_tile = base + slot * kStageBytes;
      const uint32_t w_tile = x_tile + kBoxBytes;
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kBk / 16; ++kk) {
        const uint64_t desc_x =
            sa::MakeDescriptor(x_tile + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo);
#pragma unroll
        for (int j = 0; j < kSubs; ++j) {
          WgmmaSs64x64(acc[j], desc_x,
                       sa::MakeDescriptor(w_tile + j * kBoxBytes + sa::QkStepOffset(kk),
                                          sa::kKMajorLbo, sa::kSbo),
                       1);
        }
      }
      WgmmaCommit();
      WgmmaWaitGroup<1>();  // the previous step's products have read their stage
#pragma unroll
      for (int j = 0; j < kSubs; ++j) FenceRegisters(acc[j]);
      if (step > 0 && lane == 0) MbarArrive(empty0 + 8 * prev_slot);
      prev_slot = slot;
      if (++slot == stages) {
        slot = 0;
        phase ^= 1;
      }
    }
    WgmmaWaitAll();
#pragma unroll
    for (int j = 0; j < kSubs; ++j) FenceRegisters(acc[j]);
    if (tid == 0) Trace(p, 3, GlobalTimer());
    PdlWait();  // before writing anything (an earlier kernel may still read `out`)
  }

  const int splits = kSplit ? p.splits : 1;
  const int width = kTileRows / splits;  // weight rows of the tile this CTA sums and stores
  const int chunks = width / 8;
  const int rank = kSplit ? static_cast<int>(ClusterCtaRank()) : 0;
  const int recv_ld = width + 4;  // floats per row of one source rank's slice
  // Divisions by the runtime width as multiplications (exact: quotients of integers below 2^12,
  // never within float error of the next integer once offset by half).
  const float inv_width = 1.0f / static_cast<float>(width);
  const float inv_chunks = 1.0f / static_cast<float>(chunks);
  // Partial tile entry (source q, batch row, weight row c of this CTA's slice) in the ring: per
  // source rank 64 rows of width + 4 floats (split-K), or the one [64][kLd] tile.
  auto partial_offset = [&](int q, int row, int c) {
    return kSplit ? (q * kClusterGemmSubRows + row) * recv_ld + c : row * kLd + c;
  };
  float* part = reinterpret_cast<float*>(smem);  // the ring, once every product has retired
  __syncwarp();  // the producer warp's lane 0 rejoins it (the cluster barrier is warp-aligned)
  if constexpr (kSplit) {
    // Once every CTA of the cluster is past its main loop (the first barrier: their rings are
    // free), each pushes its partials to the CTA that sums those weight rows (its own slice stays
    // here); the second barrier makes the stores visible, and the sums read local memory only.
    // (Pulling them with remote loads instead measured a 2.6 us epilogue, call 6.)
    ClusterSync();
    if (warp != kProducerWarp) {
      const uint32_t part_addr = SharedAddress(part);
#pragma unroll
      for (int j = 0; j < kSubs; ++j) {
#pragma unroll
        for (int r = 0; r < 32; r += 2) {
          const int row = sa::AccRow(warp, lane, r);
          const int col = kClusterGemmSubRows * j + sa::AccCol(lane, r);
          const int owner = static_cast<int>((static_cast<float>(col) + 0.5f) * inv_width);
          const int at = partial_offset(rank, row, col - owner * width);
          if (owner == rank) {
            *reinterpret_cast<float2*>(&part[at]) = make_float2(acc[j][r], acc[j][r + 1]);
          } else {
            StoreSharedCluster8(MapSharedToRank(part_addr + 4 * at, static_cast<uint32_t>(owner)),
                                acc[j][r], acc[j][r + 1]);
          }
        }
      }
    }
    ClusterSync();
  } else {
    if (warp != kProducerWarp) {
      // Every consumer warp's products have retired: the ring becomes the partial tile.
      NamedBarrierSync(1, kConsumerThreads);
#pragma unroll
      for (int j = 0; j < kSubs; ++j) {
#pragma unroll
        for (int r = 0; r < 32; r += 2) {
          const int row = sa::AccRow(warp, lane, r);
          const int col = kClusterGemmSubRows * j + sa::AccCol(lane, r);
          *reinterpret_cast<float2*>(&part[partial_offset(0, row, col)]) =
              make_float2(acc[j][r], acc[j][r + 1]);
        }
      }
    }
    __syncthreads();
  }
  if (tid == 0) Trace(p, 4, GlobalTimer());

  // Sum this CTA's slice over the sources in rank order (deterministic), add the bias, store.
  if (warp != kProducerWarp) {
    for (int item = tid; item < p.m * chunks; item += kConsumerThreads) {
      const int row = static_cast<int>((static_cast<float>(item) + 0.5f) * inv_chunks);
      const int c = (item - row * chunks) * 8;
      const int n = n0 + rank * width + c;
      if (n >= p.n) continue;  // n % 8 == 0: a chunk is wholly in or out
      float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int q = 0; q < splits; ++q) {
        const float* src = &part[partial_offset(q, row, c)];
        const float4 a = *reinterpret_cast<const float4*>(src);
        const float4 b = *reinterpret_cast<const float4*>(src + 4);
        v[0] += a.x;
        v[1] += a.y;
        v[2] += a.z;
        v[3] += a.w;
        v[4] += b.x;
        v[5] += b.y;
        v[6] += b.z;
        v[7] += b.w;
      }
      if (p.bias != nullptr) {
        float bf[8];
        Bf16x8ToFloat(LoadBf16x8(static_cast<const __nv_bfloat16*>(p.bias) + n), bf);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] += bf[e];
      }
      const size_t o = static_cast<size_t>(row) * p.n + n;
      if (p.out_f32) {
        float* out = static_cast<float*>(p.out) + o;
        *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4*>(out + 4) = make_float4(v[4], v[5], v[6], v[7]);
      } else {
        StoreBf16x8(static_cast<__nv_bfloat16*>(p.out) + o, FloatToBf16x8(v));
      }
    }
  }
  if (tid == 0) {
    Trace(p, 5, GlobalTimer());
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(smid));
    Trace(p, 6, smid);
    Trace(p, 7, static_cast<unsigned long long>(p.k_steps));
  }
}

// A row-major bf16 [rows, k] matrix as a tensor map of 64-k x box_rows-row boxes, 128-byte
// swizzle; rows past `rows` read as zeros. False when the encoder is missing or refuses.
bool EncodeRowsMap(CUtensorMap* map, const void* data, int rows, int k, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};
  const cuuint32_t box[2] = {kBk, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides,
                box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int kSubs, bool kSplit>
cudaLaunchConfig_t Config(dim3 grid, int splits, int stages, bool pdl, cudaStream_t stream,
                          cudaLaunchAttribute (&attrs)[2]) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = SmemBytes<kSubs>(stages);
  config.stream = stream;
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = 1;
  attrs[0].val.clusterDim.y = static_cast<unsigned>(splits);
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  config.attrs = attrs;
  config.numAttrs = 2;
  return config;
}

template <int kSubs, bool kSplit>
cudaError_t LaunchTyped(ClusterGemmRaw p, cudaStream_t stream) {
  constexpr int kMaxRing = Stages<kSubs>();
  if (p.stages == 0 || p.stages > kMaxRing) p.stages = kMaxRing;
  if (p.stages < 2) return cudaErrorInvalidValue;
  static std::atomic<uint64_t> configured{0};
  const auto kernel = ClusterGemmKernel<kSubs, kSplit>;
  if (const cudaError_t e = OptInDynamicSharedMemory(kernel, SmemBytes<kSubs>(), configured);
      e != cudaSuccess) {
    return e;
  }
  CUtensorMap w_map, x_map;
  if (!EncodeRowsMap(&w_map, p.w, p.n, p.k, kClusterGemmSubRows * kSubs) ||
      !EncodeRowsMap(&x_map, p.x, p.m, p.k, p.x_rows)) {
    return cudaErrorInvalidValue;
  }
  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t config =
      Config<kSubs, kSplit>(dim3(static_cast<unsigned>(p.tiles), static_cast<unsigned>(p.splits)),
                            p.splits, p.stages, /*pdl=*/true, stream, attrs);
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, p, w_map, x_map);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace

cudaError_t LaunchClusterGemmRaw(const ClusterGemmRaw& p, cudaStream_t stream) {
  if (p.m < 1 || p.m > kClusterGemmMaxRowsDevice || p.x_rows < p.m || p.x_rows % 8 != 0 ||
      p.x_rows > kClusterGemmMaxRowsDevice || p.k_steps < 1 || p.splits < 1 ||
      p.splits > kClusterGemmMaxSplits || p.tiles < 1 || p.n % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  const bool split = p.splits > 1;
  switch (p.subs) {
    case 1:
      return split ? LaunchTyped<1, true>(p, stream) : LaunchTyped<1, false>(p, stream);
    case 2:
      return split ? LaunchTyped<2, true>(p, stream) : LaunchTyped<2, false>(p, stream);
    case 3:
      return split ? LaunchTyped<3, true>(p, stream) : LaunchTyped<3, false>(p, stream);
    case 4:
      return split ? LaunchTyped<4, true>(p, stream) : LaunchTyped<4, false>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

bool ClusterGemmDeviceRuns() { return CurrentDeviceIsSm90(); }

int ClusterGemmMaxActiveClusters(int splits) {
  if (!CurrentDeviceIsSm90()) return 0;
  if (splits != 1 && splits != 2 && splits != 4 && splits != 8) return 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= 64) return 0;
  static std::atomic<int> cache[64][4] = {};  // +1 (0: not yet known)
  const int slot = splits == 1 ? 0 : splits == 2 ? 1 : splits == 4 ? 2 : 3;
  if (const int known = cache[device][slot].load(std::memory_order_acquire); known > 0) {
    return known - 1;
  }
  // The largest form's shared memory; every form runs one CTA per SM.
  static std::atomic<uint64_t> configured{0};
  const auto kernel = ClusterGemmKernel<kClusterGemmMaxSubs, true>;
  int clusters = 0;
  if (OptInDynamicSharedMemory(kernel, SmemBytes<kClusterGemmMaxSubs>(), configured) ==
      cudaSuccess) {
    cudaLaunchAttribute attrs[2];
    const cudaLaunchConfig_t config = Config<kClusterGemmMaxSubs, true>(
        dim3(static_cast<unsigned>(splits), static_cast<unsigned>(splits)), splits,
        Stages<kClusterGemmMaxSubs>(), false, nullptr, attrs);
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) clusters = 0;
  }
  cudaGetLastError();
  cache[device][slot].store(clusters + 1, std::memory_order_release);
  return clusters;
}

}  // namespace tandem::cuda::internal

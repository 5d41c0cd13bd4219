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

namespace tandem::cuda::internal {
namespace {

// Every index below comes from skinny_gemm_layout.h, which the host emulation test shares.
namespace sl = ::tandem::cuda::skinny_layout;

constexpr int kThreads = sl::kThreads;
constexpr int kRows = sl::kRows;  // 64 weight rows per CTA
constexpr int kBk = sl::kBk;      // 64 k per stage
constexpr int kStages = 4;
constexpr int kPrefetch = kStages - 1;
constexpr int kRowBytes = sl::kRowBytes;
constexpr int kWStageBytes = kRows * kRowBytes;

static_assert(kRows == kSkinnyTileRows && kBk == kSkinnyKStepDevice, "one tile geometry");

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + __expf(-g)); }

template <int kM16>
__host__ __device__ constexpr int StageBytes() {
  return kWStageBytes + 16 * kM16 * kRowBytes;
}

template <int kM16>
__host__ __device__ constexpr int SmemBytes() {
  return kStages * StageBytes<kM16>();
}

// Output modes: plain, gated (SiLU-and-multiply), rope (the QKV projection with RoPE and the KV
// append in the epilogue).
constexpr int kPlain = 0;
constexpr int kGatedMode = 1;
constexpr int kRopeMode = 2;

template <int kM16, int kMode>
__global__ void __launch_bounds__(kThreads) SkinnyGemmKernel(const SkinnyGemmRaw p) {
  constexpr bool kGated = kMode == kGatedMode;
  constexpr bool kRope = kMode == kRopeMode;
  constexpr int kMp = 16 * kM16;  // activation rows, padded (MMA columns)
  constexpr int kStageBytes = StageBytes<kM16>();
  constexpr int kLd = kMp + 1;  // float stride of the reduction tile (odd: no conflicts)
  static_assert(kRows * kLd * 4 <= SmemBytes<kM16>(), "reduction tile must fit the pipeline");
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ bool s_last;
  PdlLaunchDependents();

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int tile = blockIdx.x;
  const int split = blockIdx.y;
  const int k0 = split * p.k_per_split;
  const int num_steps = p.k_per_split / kBk;
  const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(p.w);
  const __nv_bfloat16* x = static_cast<const __nv_bfloat16*>(p.x);

  // This thread's cp.async slots: chunk LoadChunk(tid) of tile rows LoadRow(tid, i).
  const int chunk = sl::LoadChunk(tid);
  const __nv_bfloat16* w_src[sl::kWLoadsPerThread];
  bool w_valid[sl::kWLoadsPerThread];
#pragma unroll
  for (int i = 0; i < sl::kWLoadsPerThread; ++i) {
    const int row = kRope ? sl::RopeWeightRow(tile, sl::LoadRow(tid, i), p.n, p.rope_head_dim)
                          : sl::WeightRow(tile, sl::LoadRow(tid, i), p.n, kGated);
    w_valid[i] = row >= 0;
    w_src[i] = w + static_cast<size_t>(w_valid[i] ? row : 0) * p.k + k0 + chunk * 8;
  }
  auto load_w = [&](int step) {
    if (step >= num_steps) return;
    unsigned char* base = smem + (step % kStages) * kStageBytes;
#pragma unroll
    for (int i = 0; i < sl::kWLoadsPerThread; ++i) {
      CpAsyncCg16(base + sl::Swizzle(sl::LoadRow(tid, i), chunk), w_src[i] + step * kBk,
                  w_valid[i]);
    }
  };
  auto load_x = [&](int step) {
    if (step >= num_steps) return;
    unsigned char* base = smem + (step % kStages) * kStageBytes + kWStageBytes;
#pragma unroll
    for (int i = 0; i < kM16; ++i) {
      const int r = sl::LoadRow(tid, i);
      const bool valid = r < p.m;
      CpAsyncCg16(base + sl::Swizzle(r, chunk),
                  x + static_cast<size_t>(valid ? r : 0) * p.k + k0 + step * kBk + chunk * 8,
                  valid);
    }
  };

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

  if (p.splits > 1) {
    constexpr int kTileFloats = kRows * kMp;
    float* mine = p.partials + (static_cast<size_t>(split) * gridDim.x + tile) * kTileFloats;
    for (int idx = tid; idx < kTileFloats; idx += kThreads) {
      mine[idx] = red[(idx / kMp) * kLd + idx % kMp];
    }
    __threadfence();  // this CTA's partial is visible device-wide before it is counted
    __syncthreads();
    if (tid == 0) {
      const unsigned arrived = atomicAdd(p.counters + tile, 1u);
      s_last = arrived == static_cast<unsigned>(p.splits - 1);
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int idx = tid; idx < kTileFloats; idx += kThreads) {
      float sum = 0.0f;
      for (int s = 0; s < p.splits; ++s) {
        sum += __ldcg(p.partials + (static_cast<size_t>(s) * gridDim.x + tile) * kTileFloats + idx);
      }
      red[(idx / kMp) * kLd + idx % kMp] = sum;
    }
    if (tid == 0) p.counters[tile] = 0;  // ready for the next launch (which waits for this grid)
    __syncthreads();
  }

  // Epilogue: consecutive threads take consecutive output features of one activation row.
  if constexpr (kRope) {
    // Pair r of this tile, token `row`: both projections rounded to bf16 as the plain mode writes
    // them, then the exact rotation arithmetic of the RoPE + KV append kernel (bit-identical to
    // the plain GEMM followed by it).
    constexpr int kHalfTile = sl::FeaturesPerTile(true);
    const __nv_bfloat16* bias = static_cast<const __nv_bfloat16*>(p.bias);
    const int half = p.rope_head_dim / 2;
    const int rotated = p.rope_num_heads + p.rope_num_kv_heads;
    const int out_n = 2 * p.n;
    for (int idx = tid; idx < p.m * kHalfTile; idx += kThreads) {
      const int row = idx / kHalfTile;
      const int r = idx % kHalfTile;
      const int pair = tile * kHalfTile + r;
      if (pair >= p.n) continue;
      const int head = pair / half;
      const int i = pair % half;
      const int f0 = head * p.rope_head_dim + i;
      float y0 = red[r * kLd + row];
      float y1 = red[(kHalfTile + r) * kLd + row];
      if (bias != nullptr) {
        y0 += __bfloat162float(bias[f0]);
        y1 += __bfloat162float(bias[f0 + half]);
      }
      __nv_bfloat16 z0 = __float2bfloat16_rn(y0);
      __nv_bfloat16 z1 = __float2bfloat16_rn(y1);
      if (head < rotated) {
        RopeRotateBf16(z0, z1, static_cast<float>(p.rope_positions[row]), p.rope_inv_freq[i]);
      }
      __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + static_cast<size_t>(row) * out_n;
      out[f0] = z0;
      out[f0 + half] = z1;
      const int slot = p.rope_slots[row];
      if (slot >= 0 && head >= p.rope_num_heads) {
        const bool is_k = head < rotated;
        __nv_bfloat16* dst =
            static_cast<__nv_bfloat16*>(is_k ? p.rope_k_layer : p.rope_v_layer) +
            static_cast<size_t>(slot) * p.rope_num_kv_heads * p.rope_head_dim +
            static_cast<size_t>(head - (is_k ? p.rope_num_heads : rotated)) * p.rope_head_dim + i;
        dst[0] = z0;
        dst[half] = z1;
      }
    }
  } else if constexpr (kGated) {
    constexpr int kHalf = sl::FeaturesPerTile(true);
    for (int idx = tid; idx < p.m * kHalf; idx += kThreads) {
      const int row = idx / kHalf;
      const int r = idx % kHalf;
      const int j = tile * kHalf + r;
      if (j >= p.n) continue;
      const float y = Silu(red[r * kLd + row]) * red[(kHalf + r) * kLd + row];
      const size_t at = static_cast<size_t>(row) * p.n + j;
      if (p.out_f32) {
        static_cast<float*>(p.out)[at] = y;
      } else {
        static_cast<__nv_bfloat16*>(p.out)[at] = __float2bfloat16_rn(y);
      }
    }
  } else {
    const __nv_bfloat16* bias = static_cast<const __nv_bfloat16*>(p.bias);
    for (int idx = tid; idx < p.m * kRows; idx += kThreads) {
      const int row = idx / kRows;
      const int r = idx % kRows;
      const int feature = tile * kRows + r;
      if (feature >= p.n) continue;
      float y = red[r * kLd + row];
      if (bias != nullptr) y += __bfloat162float(bias[feature]);
      const size_t at = static_cast<size_t>(row) * p.n + feature;
      if (p.out_f32) {
        static_cast<float*>(p.out)[at] = y;
      } else {
        static_cast<__nv_bfloat16*>(p.out)[at] = __float2bfloat16_rn(y);
      }
    }
  }
}

template <int kM16, int kMode>
cudaError_t LaunchTyped(const SkinnyGemmRaw& p, cudaStream_t stream) {
  constexpr size_t kSmem = SmemBytes<kM16>();
  static std::atomic<uint64_t> configured{0};
  if (const cudaError_t e =
          OptInDynamicSharedMemory(SkinnyGemmKernel<kM16, kMode>, kSmem, configured);
      e != cudaSuccess) {
    return e;
  }
  const dim3 grid(static_cast<unsigned>(p.tiles), static_cast<unsigned>(p.splits));
  const cudaError_t e =
      LaunchKernel(SkinnyGemmKernel<kM16, kMode>, grid, dim3(kThreads), kSmem, stream, p);
  return e != cudaSuccess ? e : cudaGetLastError();
}

template <int kMode>
cudaError_t LaunchForRows(const SkinnyGemmRaw& p, cudaStream_t stream) {
  switch ((p.m + 15) / 16) {
    case 1:
      return LaunchTyped<1, kMode>(p, stream);
    case 2:
      return LaunchTyped<2, kMode>(p, stream);
    case 3:
      return LaunchTyped<3, kMode>(p, stream);
    case 4:
      return LaunchTyped<4, kMode>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchSkinnyGemmRaw(const SkinnyGemmRaw& p, cudaStream_t stream) {
  if (p.rope_head_dim > 0) return LaunchForRows<kRopeMode>(p, stream);
  return p.gated_silu ? LaunchForRows<kGatedMode>(p, stream) : LaunchForRows<kPlain>(p, stream);
}

}  // namespace tandem::cuda::internal

#pragma once
// Device pieces shared by the two skinny GEMM kernels (contract: skinny_gemm.h): the mma.sync
// kernel of skinny_gemm.cu and the wgmma kernel of skinny_gemm_sm90.cu. Both stream the same
// tiles (64 weight rows by a 64-wide k stage, and the activation rows, in the 128-byte-swizzled
// layout of skinny_gemm_layout.h, which is also the canonical K-major layout of wgmma operands),
// and both finish a tile the same way from a float32 tile in shared memory: split-K partials and
// the last-arriving CTA's sum, then the plain, gated or rope epilogue. Included only by .cu files.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/skinny_gemm_internal.h"
#include "runtime/kernels/cuda/skinny_gemm_layout.h"

namespace tandem::cuda::internal::skinny_tile {

namespace sl = ::tandem::cuda::skinny_layout;

constexpr int kThreads = sl::kThreads;
constexpr int kRows = sl::kRows;  // 64 weight rows per CTA
constexpr int kBk = sl::kBk;      // 64 k per stage
constexpr int kRowBytes = sl::kRowBytes;
constexpr int kWStageBytes = kRows * kRowBytes;
static_assert(kRows == kSkinnyTileRows && kBk == kSkinnyKStepDevice, "one tile geometry");

// Output modes: plain, gated (SiLU-and-multiply), rope (the QKV projection with RoPE and the KV
// append in the epilogue).
constexpr int kPlain = 0;
constexpr int kGatedMode = 1;
constexpr int kRopeMode = 2;

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + __expf(-g)); }

// The cp.async copies of one thread: chunk LoadChunk(tid) of weight tile rows LoadRow(tid, i) and
// of activation rows LoadRow(tid, i), i < kM16, for the k range of split `split` of tile `tile`.
// A stage's weights land at `stage`, its activations at stage + kWStageBytes.
template <int kM16, int kMode>
struct SkinnyLoader {
  const __nv_bfloat16* w_src[sl::kWLoadsPerThread];
  bool w_valid[sl::kWLoadsPerThread];
  const __nv_bfloat16* x;
  int tid, chunk, m, k, k0, num_steps;

  __device__ __forceinline__ SkinnyLoader(const SkinnyGemmRaw& p, int tile, int split, int tid_)
      : x(static_cast<const __nv_bfloat16*>(p.x)),
        tid(tid_),
        chunk(sl::LoadChunk(tid_)),
        m(p.m),
        k(p.k),
        k0(split * p.k_per_split),
        num_steps(p.k_per_split / kBk) {
    const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(p.w);
#pragma unroll
    for (int i = 0; i < sl::kWLoadsPerThread; ++i) {
      const int row = kMode == kRopeMode
                          ? sl::RopeWeightRow(tile, sl::LoadRow(tid, i), p.n, p.rope_head_dim)
                          : sl::WeightRow(tile, sl::LoadRow(tid, i), p.n, kMode == kGatedMode);
      w_valid[i] = row >= 0;
      w_src[i] = w + static_cast<size_t>(w_valid[i] ? row : 0) * p.k + k0 + chunk * 8;
    }
  }
  // Queues the weight copies of k-step `step` (none past the split) into `stage`.
  __device__ __forceinline__ void LoadW(unsigned char* stage, int step) const {
    if (step >= num_steps) return;
#pragma unroll
    for (int i = 0; i < sl::kWLoadsPerThread; ++i) {
      CpAsyncCg16(stage + sl::Swizzle(sl::LoadRow(tid, i), chunk), w_src[i] + step * kBk,
                  w_valid[i]);
    }
  }
  // Queues the activation copies of k-step `step` (rows past m zero-filled) into `stage`.
  __device__ __forceinline__ void LoadX(unsigned char* stage, int step) const {
    if (step >= num_steps) return;
#pragma unroll
    for (int i = 0; i < kM16; ++i) {
      const int r = sl::LoadRow(tid, i);
      const bool valid = r < m;
      CpAsyncCg16(stage + kWStageBytes + sl::Swizzle(r, chunk),
                  x + static_cast<size_t>(valid ? r : 0) * k + k0 + step * kBk + chunk * 8, valid);
    }
  }
};

// out[at] = y, in float32 or rounded once to bf16.
__device__ __forceinline__ void StoreOut(const SkinnyGemmRaw& p, size_t at, float y) {
  if (p.out_f32) {
    static_cast<float*>(p.out)[at] = y;
  } else {
    static_cast<__nv_bfloat16*>(p.out)[at] = __float2bfloat16_rn(y);
  }
}

// Launches `kernel` (one CTA of kThreads per output tile and split) with `smem` bytes of dynamic
// shared memory, raising the kernel's limit on the first launch on each device (`configured`).
template <typename Kernel>
cudaError_t LaunchSkinnyKernel(Kernel kernel, size_t smem, std::atomic<uint64_t>& configured,
                               const SkinnyGemmRaw& p, cudaStream_t stream) {
  if (const cudaError_t e = OptInDynamicSharedMemory(kernel, smem, configured); e != cudaSuccess) {
    return e;
  }
  const dim3 grid(static_cast<unsigned>(p.tiles), static_cast<unsigned>(p.splits));
  const cudaError_t e = LaunchKernel(kernel, grid, dim3(kThreads), smem, stream, p);
  return e != cudaSuccess ? e : cudaGetLastError();
}

// Calls launch(std::integral_constant<int, kMode>()) for the output mode of `p` (rope, gated or
// plain).
template <typename Launch>
cudaError_t DispatchSkinnyMode(const SkinnyGemmRaw& p, Launch launch) {
  if (p.rope_head_dim > 0) return launch(std::integral_constant<int, kRopeMode>());
  return p.gated_silu ? launch(std::integral_constant<int, kGatedMode>())
                      : launch(std::integral_constant<int, kPlain>());
}
// Calls launch(std::integral_constant<int, kM16>()) for the 16-row blocks (1-4) m takes.
template <typename Launch>
cudaError_t DispatchSkinnyRows(int m, Launch launch) {
  switch ((m + 15) / 16) {
    case 1:
      return launch(std::integral_constant<int, 1>());
    case 2:
      return launch(std::integral_constant<int, 2>());
    case 3:
      return launch(std::integral_constant<int, 3>());
    case 4:
      return launch(std::integral_constant<int, 4>());
    default:
      return cudaErrorInvalidValue;
  }
}

// Finishes output tile `tile` from red[r * ld + c] (weight row r of the tile, activation row c <
// kMp; every thread of the CTA calls it after a barrier that follows the last write of red): with
// several splits, writes this split's partial and returns unless this CTA arrived last, which then
// sums the splits in split order into red; then the epilogue of kMode writes the output.
template <int kMp, int kMode>
__device__ __forceinline__ void FinishSkinnyTile(const SkinnyGemmRaw& p, float* red, int kLd,
                                                 int tile, int split, int tid) {
  constexpr bool kGated = kMode == kGatedMode;
  constexpr bool kRope = kMode == kRopeMode;
  __shared__ bool s_last;
  if (p.splits > 1) {
    // Partials as float4s: thread tid takes vectors v * kThreads + tid (4 consecutive activation
    // rows of one weight row; kMp is a multiple of 16).
    constexpr int kTileFloats = kRows * kMp;
    constexpr int kVecs = kTileFloats / 4 / kThreads;
    static_assert(kVecs * 4 * kThreads == kTileFloats, "whole float4s per thread");
    auto red_at = [&](int v) { return red + (4 * v / kMp) * kLd + 4 * v % kMp; };
    const float4* partials = reinterpret_cast<const float4*>(p.partials);
    auto partial = [&](int s) {
      return (static_cast<size_t>(s) * gridDim.x + tile) * (kTileFloats / 4);
    };
    float4* mine = reinterpret_cast<float4*>(p.partials) + partial(split);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const float* src = red_at(i * kThreads + tid);
      mine[i * kThreads + tid] = make_float4(src[0], src[1], src[2], src[3]);
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
    // The sum in split order, with the loads of a batch of kBatch vectors times up to 4 splits
    // in flight at once (the loop is latency-bound: one L2 round trip per batch of splits).
    constexpr int kBatch = kVecs % 4 == 0 ? 4 : 2;
    static_assert(kVecs % kBatch == 0, "whole batches");
#pragma unroll
    for (int i0 = 0; i0 < kVecs; i0 += kBatch) {
      float4 sum[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) sum[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int s0 = 0; s0 < p.splits; s0 += 4) {
        float4 got[4][kBatch];
#pragma unroll
        for (int ds = 0; ds < 4; ++ds) {
#pragma unroll
          for (int j = 0; j < kBatch; ++j) {
            got[ds][j] = s0 + ds < p.splits
                             ? __ldcg(partials + partial(s0 + ds) + (i0 + j) * kThreads + tid)
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
        }
#pragma unroll
        for (int ds = 0; ds < 4; ++ds) {
          if (s0 + ds >= p.splits) break;
#pragma unroll
          for (int j = 0; j < kBatch; ++j) {
            sum[j].x += got[ds][j].x;
            sum[j].y += got[ds][j].y;
            sum[j].z += got[ds][j].z;
            sum[j].w += got[ds][j].w;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        float* dst = red_at((i0 + j) * kThreads + tid);
        dst[0] = sum[j].x;
        dst[1] = sum[j].y;
        dst[2] = sum[j].z;
        dst[3] = sum[j].w;
      }
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
#pragma unroll 4  // the iterations' metadata loads overlap
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
#pragma unroll 4
    for (int idx = tid; idx < p.m * kHalf; idx += kThreads) {
      const int row = idx / kHalf;
      const int r = idx % kHalf;
      const int j = tile * kHalf + r;
      if (j >= p.n) continue;
      StoreOut(p, static_cast<size_t>(row) * p.n + j,
               Silu(red[r * kLd + row]) * red[(kHalf + r) * kLd + row]);
    }
  } else {
    const __nv_bfloat16* bias = static_cast<const __nv_bfloat16*>(p.bias);
#pragma unroll 4
    for (int idx = tid; idx < p.m * kRows; idx += kThreads) {
      const int row = idx / kRows;
      const int r = idx % kRows;
      const int feature = tile * kRows + r;
      if (feature >= p.n) continue;
      float y = red[r * kLd + row];
      if (bias != nullptr) y += __bfloat162float(bias[feature]);
      StoreOut(p, static_cast<size_t>(row) * p.n + feature, y);
    }
  }
}

}  // namespace tandem::cuda::internal::skinny_tile

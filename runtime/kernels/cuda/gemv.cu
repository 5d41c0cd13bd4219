// Small-M bf16 GEMV (contract: gemv_kernels.h). Memory-bound on the weight matrix: each warp owns
// kRowsPerWarp output features and streams their weight rows with 16-byte loads, kUnroll loads
// per row in flight per lane (evict-first: the weights are read once per step). The M activation
// rows (a few KB, shared by every warp) are read through the read-only cache, one 16-byte pack
// per weight pack. Each lane accumulates M x kRowsPerWarp partial dot products in float32; a
// butterfly warp reduction finishes them and lane (m * kRowsPerWarp + r) writes out[m, row + r].

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/gemv_internal.h"
#include "runtime/kernels/cuda/kernel_utils.cuh"

namespace tandem::cuda::internal {
namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 2;
constexpr int kUnroll = 4;

template <int M>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    GemvKernel(const uint4* __restrict__ x, const uint4* __restrict__ w,
               const __nv_bfloat16* __restrict__ bias, void* __restrict__ out, bool out_f32, int n,
               int chunks) {
  const int lane = threadIdx.x % kWarpSize;
  const int row0 = (blockIdx.x * kWarps + threadIdx.x / kWarpSize) * kRowsPerWarp;
  if (row0 >= n) return;
  // Rows past n (odd n) re-read the last row; their results are not written.
  const uint4* w_rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = row0 + r < n ? row0 + r : n - 1;
    w_rows[r] = w + static_cast<size_t>(row) * chunks;
  }
  float acc[M][kRowsPerWarp];
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) acc[m][r] = 0.0f;
  }

  for (int base = lane; base < chunks; base += kWarpSize * kUnroll) {
    uint4 wv[kUnroll][kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + u * kWarpSize;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        wv[u][r] = c < chunks ? __ldcs(w_rows[r] + c) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + u * kWarpSize;
      if (c < chunks) {
        float wf[kRowsPerWarp][8];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          Bf16x8 p;
          memcpy(&p, &wv[u][r], sizeof(p));
          Bf16x8ToFloat(p, wf[r]);
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xr = __ldg(x + static_cast<size_t>(m) * chunks + c);
          Bf16x8 p;
          memcpy(&p, &xr, sizeof(p));
          float xf[8];
          Bf16x8ToFloat(p, xf);
#pragma unroll
          for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[m][r] = fmaf(xf[j], wf[r][j], acc[m][r]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float sum = WarpSum(acc[m][r]);
      const int row = row0 + r;
      if (lane == m * kRowsPerWarp + r && row < n) {
        const float y = bias != nullptr ? sum + __bfloat162float(bias[row]) : sum;
        const size_t at = static_cast<size_t>(m) * n + row;
        if (out_f32) {
          static_cast<float*>(out)[at] = y;
        } else {
          static_cast<__nv_bfloat16*>(out)[at] = __float2bfloat16_rn(y);
        }
      }
    }
  }
}

static_assert(kGemvMaxRowsDevice * kRowsPerWarp <= kWarpSize, "one writing lane per output");

template <int M>
void Launch(const void* x, const void* w, const void* bias, void* out, bool out_f32, int n, int k,
            cudaStream_t stream) {
  constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
  const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  GemvKernel<M><<<blocks, kWarps * kWarpSize, 0, stream>>>(
      static_cast<const uint4*>(x), static_cast<const uint4*>(w),
      static_cast<const __nv_bfloat16*>(bias), out, out_f32, n, k / 8);
}

}  // namespace

cudaError_t LaunchGemvRaw(const void* x, const void* w, const void* bias, void* out, bool out_f32,
                          int m, int n, int k, cudaStream_t stream) {
  switch (m) {
    case 1:
      Launch<1>(x, w, bias, out, out_f32, n, k, stream);
      break;
    case 2:
      Launch<2>(x, w, bias, out, out_f32, n, k, stream);
      break;
    case 3:
      Launch<3>(x, w, bias, out, out_f32, n, k, stream);
      break;
    case 4:
      Launch<4>(x, w, bias, out, out_f32, n, k, stream);
      break;
    case 5:
      Launch<5>(x, w, bias, out, out_f32, n, k, stream);
      break;
    case 6:
      Launch<6>(x, w, bias, out, out_f32, n, k, stream);
      break;
    case 7:
      Launch<7>(x, w, bias, out, out_f32, n, k, stream);
      break;
    case 8:
      Launch<8>(x, w, bias, out, out_f32, n, k, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal

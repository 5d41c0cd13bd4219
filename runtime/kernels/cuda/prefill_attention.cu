// Paged causal prefill attention on tensor cores (contract: model_kernels.h,
// LaunchPrefillAttention). FlashAttention-2 structure with mma.sync.m16n8k16 (bf16 in, f32 out).
//
// Grid: (query tile of kBlockM new tokens, query head, sequence); the heaviest tiles (last rows,
// most keys) are numbered first. A CTA of 4 warps owns kBlockM = 64 query rows, 16 per warp, and
// walks the sequence's keys [0, last position of its rows] in tiles of kBlockN = 64, gathered
// from the paged cache with cp.async into padded shared memory (K and V in separate buffers, so
// loading the next K overlaps P V and loading the next V overlaps the next Q K^T). Per warp:
//   S = Q K^T on tensor cores (Q fragments stay in registers for the whole kernel; K fragments
//   are 32-bit shared loads, conflict-free thanks to the 16-byte row padding);
//   causal mask, online softmax on the S accumulators in registers (base-2 exponentials);
//   O += P V, P re-packed from the S accumulators to bf16 A fragments without shared memory,
//   V fragments with ldmatrix.trans.
// Accumulation and softmax statistics are float32; P is rounded to bf16 for the second product,
// as FlashAttention does.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem::cuda::internal {
namespace {

constexpr int kThreads = 128;
constexpr int kBlockM = 64;  // query rows per CTA (16 per warp)
constexpr int kBlockN = 64;  // keys per tile
constexpr int kPad = 8;      // bf16 elements of padding per shared row (16 bytes)
constexpr float kLog2e = 1.4426950408889634f;

struct PrefillParams {
  const __nv_bfloat16* q;
  int q_row_stride;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  int block_size;
  int num_kv_heads;
  const int32_t* block_tables;
  int max_blocks_per_seq;
  const int32_t* seq_start_rows;
  const int32_t* start_pos;
  int num_heads;
  int group;
  float scale_log2;
  __nv_bfloat16* out;
};

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

__device__ __forceinline__ uint32_t PackBf16(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  __nv_bfloat162 v;
  v.x = lo;
  v.y = hi;
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// d += a * b for one m16n8k16 tile (row-major A, column-major B, f32 accumulators).
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 bf16 matrices from shared memory, transposed: lanes 8i..8i+7 give the row addresses
// of matrix i; r[i] receives this lane's fragment of matrix i.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem_row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Gathers keys [key0, key0 + kBlockN) of one KV head into dst (rows past kv_end are zeros).
template <int kHeadDim>
__device__ __forceinline__ void LoadKvTile(__nv_bfloat16 (*dst)[kHeadDim + kPad],
                                           const __nv_bfloat16* layer, const int32_t* table,
                                           int block_size, size_t slot_stride, int kv_head,
                                           int key0, int kv_end) {
  constexpr int kChunks = kHeadDim / 8;
  static_assert(kBlockN * kChunks % kThreads == 0, "tile loads");
#pragma unroll
  for (int it = 0; it < kBlockN * kChunks / kThreads; ++it) {
    const int idx = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const int j = key0 + r;
    const bool valid = j < kv_end;
    const __nv_bfloat16* src = layer;
    if (valid) {
      const long long block = table[j / block_size];
      src = layer + (block * block_size + j % block_size) * slot_stride +
            static_cast<size_t>(kv_head) * kHeadDim + c * 8;
    }
    CpAsync16(&dst[r][c * 8], src, valid);
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) PrefillAttentionKernel(const PrefillParams p) {
  constexpr int kKSteps = kHeadDim / 16;  // k-steps of Q K^T
  constexpr int kSTiles = kBlockN / 8;    // n-tiles of S
  constexpr int kOTiles = kHeadDim / 8;   // n-tiles of O
  __shared__ __align__(16) __nv_bfloat16 s_k[kBlockN][kHeadDim + kPad];
  __shared__ __align__(16) __nv_bfloat16 s_v[kBlockN][kHeadDim + kPad];

  const int seq = blockIdx.z;
  const int head = blockIdx.y;
  const int kv_head = head / p.group;
  const int row_begin = p.seq_start_rows[seq];
  const int num_new = p.seq_start_rows[seq + 1] - row_begin;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;
  if (q0 >= num_new) return;
  const int start = p.start_pos[seq];
  const int last_row = min(q0 + kBlockM, num_new);
  const int kv_end = start + last_row;  // keys this CTA needs: [0, kv_end)

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int g = lane / 4;             // mma group: row g and g + 8 of the warp's 16
  const int t = lane % 4;             // thread in group: columns 2t, 2t + 1 (+ 8)
  const int i0 = q0 + warp * 16 + g;  // new-token index of this thread's first row
  const int i1 = i0 + 8;
  const int pos0 = start + i0;
  const int pos1 = start + i1;

  const size_t slot_stride = static_cast<size_t>(p.num_kv_heads) * kHeadDim;
  const int32_t* table = p.block_tables + static_cast<size_t>(seq) * p.max_blocks_per_seq;

  // Start the first K and V tiles before reading Q.
  LoadKvTile<kHeadDim>(s_k, p.k, table, p.block_size, slot_stride, kv_head, 0, kv_end);
  CpAsyncCommit();
  LoadKvTile<kHeadDim>(s_v, p.v, table, p.block_size, slot_stride, kv_head, 0, kv_end);
  CpAsyncCommit();

  // Q fragments (A operand, row-major 16 x kHeadDim); rows past the sequence are zeros.
  uint32_t q_frag[kKSteps][4];
  {
    const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
    const __nv_bfloat16* q_row0 =
        p.q + static_cast<size_t>(row_begin + i0) * p.q_row_stride + head * kHeadDim;
    const __nv_bfloat16* q_row1 = q_row0 + static_cast<size_t>(8) * p.q_row_stride;
    const bool valid0 = i0 < num_new;
    const bool valid1 = i1 < num_new;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const int c = kk * 16 + 2 * t;
      q_frag[kk][0] = PackBf16(valid0 ? q_row0[c] : zero, valid0 ? q_row0[c + 1] : zero);
      q_frag[kk][1] = PackBf16(valid1 ? q_row1[c] : zero, valid1 ? q_row1[c + 1] : zero);
      q_frag[kk][2] = PackBf16(valid0 ? q_row0[c + 8] : zero, valid0 ? q_row0[c + 9] : zero);
      q_frag[kk][3] = PackBf16(valid1 ? q_row1[c + 8] : zero, valid1 ? q_row1[c + 9] : zero);
    }
  }

  float o[kOTiles][4];
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
  }
  float m0 = -INFINITY, m1 = -INFINITY;  // running max (log2 domain) of rows g and g + 8
  float l0 = 0.0f, l1 = 0.0f;            // this thread's part of the running sums

  const int num_tiles = (kv_end + kBlockN - 1) / kBlockN;
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int key0 = tile * kBlockN;
    CpAsyncWait<1>();  // K of this tile (V may still be in flight)
    __syncthreads();

    // S = Q K^T.
    float s[kSTiles][4];
#pragma unroll
    for (int n = 0; n < kSTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        const __nv_bfloat16* krow = &s_k[n * 8 + g][kk * 16 + 2 * t];
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + 8);
        Mma(s[n], q_frag[kk], b0, b1);
      }
    }

    // Scale, mask (causal and past the needed keys), online softmax.
    float tile_max0 = -INFINITY, tile_max1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < kSTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = key0 + n * 8 + 2 * t + e;
        const bool out0 = j > pos0 || j >= kv_end;
        const bool out1 = j > pos1 || j >= kv_end;
        s[n][e] = out0 ? -INFINITY : s[n][e] * p.scale_log2;
        s[n][e + 2] = out1 ? -INFINITY : s[n][e + 2] * p.scale_log2;
        tile_max0 = fmaxf(tile_max0, s[n][e]);
        tile_max1 = fmaxf(tile_max1, s[n][e + 2]);
      }
    }
#pragma unroll
    for (int offset = 1; offset < 4; offset *= 2) {
      tile_max0 = fmaxf(tile_max0, __shfl_xor_sync(0xffffffffu, tile_max0, offset));
      tile_max1 = fmaxf(tile_max1, __shfl_xor_sync(0xffffffffu, tile_max1, offset));
    }
    const float new_m0 = fmaxf(m0, tile_max0);
    const float new_m1 = fmaxf(m1, tile_max1);
    // A row with nothing visible yet keeps exponent base 0 (its scores are all -inf anyway).
    const float base0 = new_m0 == -INFINITY ? 0.0f : new_m0;
    const float base1 = new_m1 == -INFINITY ? 0.0f : new_m1;
    const float alpha0 = exp2f(m0 - base0);
    const float alpha1 = exp2f(m1 - base1);
    m0 = new_m0;
    m1 = new_m1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int n = 0; n < kSTiles; ++n) {
      s[n][0] = exp2f(s[n][0] - base0);
      s[n][1] = exp2f(s[n][1] - base0);
      s[n][2] = exp2f(s[n][2] - base1);
      s[n][3] = exp2f(s[n][3] - base1);
      sum0 += s[n][0] + s[n][1];
      sum1 += s[n][2] + s[n][3];
    }
    l0 = l0 * alpha0 + sum0;
    l1 = l1 * alpha1 + sum1;
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
      o[n][0] *= alpha0;
      o[n][1] *= alpha0;
      o[n][2] *= alpha1;
      o[n][3] *= alpha1;
    }

    // Every warp is done with s_k: start the next K tile, then wait for this V tile.
    __syncthreads();
    if (tile + 1 < num_tiles) {
      LoadKvTile<kHeadDim>(s_k, p.k, table, p.block_size, slot_stride, kv_head, key0 + kBlockN,
                           kv_end);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();

    // O += P V: keys in chunks of 16 (two S n-tiles make one A fragment).
#pragma unroll
    for (int kc = 0; kc < kBlockN / 16; ++kc) {
      uint32_t a[4];
      a[0] = PackBf16(s[2 * kc][0], s[2 * kc][1]);
      a[1] = PackBf16(s[2 * kc][2], s[2 * kc][3]);
      a[2] = PackBf16(s[2 * kc + 1][0], s[2 * kc + 1][1]);
      a[3] = PackBf16(s[2 * kc + 1][2], s[2 * kc + 1][3]);
      // ldmatrix x4: matrices (keys +0..7, dims +0..7), (keys +8..15, dims +0..7),
      // (keys +0..7, dims +8..15), (keys +8..15, dims +8..15).
      const int mat = lane / 8;
      const int key = kc * 16 + (mat % 2) * 8 + lane % 8;
#pragma unroll
      for (int n = 0; n < kOTiles; n += 2) {
        uint32_t b[4];
        LdMatrixX4Trans(b, &s_v[key][n * 8 + (mat / 2) * 8]);
        Mma(o[n], a, b[0], b[1]);
        Mma(o[n + 1], a, b[2], b[3]);
      }
    }

    // Every warp is done with s_v: start the next V tile.
    __syncthreads();
    if (tile + 1 < num_tiles) {
      LoadKvTile<kHeadDim>(s_v, p.v, table, p.block_size, slot_stride, kv_head, key0 + kBlockN,
                           kv_end);
      CpAsyncCommit();
    }
  }

  // Full row sums over the quad, normalize, store.
#pragma unroll
  for (int offset = 1; offset < 4; offset *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, offset);
    l1 += __shfl_xor_sync(0xffffffffu, l1, offset);
  }
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f;
  const float inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  const size_t out_stride = static_cast<size_t>(p.num_heads) * kHeadDim;
  __nv_bfloat16* out0 = p.out + static_cast<size_t>(row_begin + i0) * out_stride + head * kHeadDim;
  __nv_bfloat16* out1 = out0 + 8 * out_stride;
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) {
    const int c = n * 8 + 2 * t;
    if (i0 < num_new) {
      out0[c] = __float2bfloat16_rn(o[n][0] * inv0);
      out0[c + 1] = __float2bfloat16_rn(o[n][1] * inv0);
    }
    if (i1 < num_new) {
      out1[c] = __float2bfloat16_rn(o[n][2] * inv1);
      out1[c + 1] = __float2bfloat16_rn(o[n][3] * inv1);
    }
  }
}

}  // namespace

cudaError_t LaunchPrefillAttentionRaw(const void* q, int q_row_stride, const PagedLayerView& kv,
                                      const int32_t* seq_start_rows, const int32_t* start_pos,
                                      int num_seqs, int max_new_tokens, int num_heads, float scale,
                                      void* out, cudaStream_t stream) {
  PrefillParams p;
  p.q = static_cast<const __nv_bfloat16*>(q);
  p.q_row_stride = q_row_stride;
  p.k = static_cast<const __nv_bfloat16*>(kv.k);
  p.v = static_cast<const __nv_bfloat16*>(kv.v);
  p.block_size = kv.block_size;
  p.num_kv_heads = kv.num_kv_heads;
  p.block_tables = kv.block_tables;
  p.max_blocks_per_seq = kv.max_blocks_per_seq;
  p.seq_start_rows = seq_start_rows;
  p.start_pos = start_pos;
  p.num_heads = num_heads;
  p.group = num_heads / kv.num_kv_heads;
  p.scale_log2 = scale * kLog2e;
  p.out = static_cast<__nv_bfloat16*>(out);
  const dim3 grid(CeilDiv(max_new_tokens, kBlockM), static_cast<unsigned>(num_heads),
                  static_cast<unsigned>(num_seqs));
  switch (kv.head_dim) {
    case 32:
      PrefillAttentionKernel<32><<<grid, kThreads, 0, stream>>>(p);
      break;
    case 64:
      PrefillAttentionKernel<64><<<grid, kThreads, 0, stream>>>(p);
      break;
    case 128:
      PrefillAttentionKernel<128><<<grid, kThreads, 0, stream>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal

// Embedding gather, RoPE and paged KV append, separate or fused (contracts: model_kernels.h). All
// are pure data movement with a little arithmetic: 16-byte accesses where the shapes and pointers
// allow, a scalar path otherwise.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem::cuda::internal {
namespace {

constexpr int kCopyThreads = 256;
constexpr int kRopeThreads = kCopyThreads;
// Rotated heads per RoPE block: 8 heads of 128 dims = 512 pairs, two per thread.
constexpr int kRopeHeadsPerBlock = 8;

// One block per row; T is the element or pack type copied.
template <typename T>
__global__ void __launch_bounds__(kCopyThreads)
    EmbeddingKernel(const int32_t* __restrict__ ids, const T* __restrict__ table, int row_units,
                    T* __restrict__ out) {
  PdlLaunchDependents();
  PdlWait();
  const size_t src = static_cast<size_t>(ids[blockIdx.x]) * row_units;
  const size_t dst = static_cast<size_t>(blockIdx.x) * row_units;
  for (int i = threadIdx.x; i < row_units; i += blockDim.x) out[dst + i] = table[src + i];
}

// Grid (token, group of kRopeHeadsPerBlock rotated heads [, one more group for V]). The block
// computes the token's cos/sin once per rotation pair i into shared memory ([half] cos then [half]
// sin), then rotates every (head, pair) of its group, one pair per thread, consecutive threads on
// consecutive i (coalesced). With a cache (k_layer non-null) it is RoPE and KV append in one
// launch: rotated k heads are also stored at the token's slot, and the extra group copies the v
// heads there (a negative slot skips both stores).
struct RopeParams {
  __nv_bfloat16* qkv;
  const int32_t* positions;
  const float* inv_freq;
  int num_heads;  // query heads; rotated heads are [0, num_heads + num_kv_heads)
  int num_kv_heads;
  int row_stride;
  int head_dim;
  int rope_groups;
  const int32_t* slot_mapping;  // null without a cache
  __nv_bfloat16* k_layer;       // [slots, num_kv_heads * head_dim], or null
  __nv_bfloat16* v_layer;
};

__global__ void __launch_bounds__(kRopeThreads) RopeKernel(const RopeParams p) {
  PdlLaunchDependents();
  PdlWait();
  extern __shared__ float rope_cs[];
  const int half = p.head_dim / 2;
  const int token = blockIdx.x;
  __nv_bfloat16* row = p.qkv + static_cast<size_t>(token) * p.row_stride;
  const size_t kv_units = static_cast<size_t>(p.num_kv_heads) * p.head_dim;
  const int slot = p.k_layer != nullptr ? p.slot_mapping[token] : -1;
  if (static_cast<int>(blockIdx.y) == p.rope_groups) {  // the V group (cache only)
    if (slot < 0) return;
    const __nv_bfloat16* v_src =
        row + static_cast<size_t>(p.num_heads + p.num_kv_heads) * p.head_dim;
    __nv_bfloat16* v_dst = p.v_layer + static_cast<size_t>(slot) * kv_units;
    for (size_t i = threadIdx.x; i < kv_units; i += blockDim.x) v_dst[i] = v_src[i];
    return;
  }
  float* cos_s = rope_cs;
  float* sin_s = rope_cs + half;
  const float pos = static_cast<float>(p.positions[token]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    RopeCosSin(pos, p.inv_freq[i], cos_s[i], sin_s[i]);
  }
  __syncthreads();
  const int head_begin = blockIdx.y * kRopeHeadsPerBlock;
  const int heads = min(kRopeHeadsPerBlock, p.num_heads + p.num_kv_heads - head_begin);
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int h = idx / half;
    const int i = idx - h * half;
    const float c = cos_s[i];
    const float s = sin_s[i];
    const int head = head_begin + h;
    __nv_bfloat16* lo = row + static_cast<size_t>(head) * p.head_dim + i;
    __nv_bfloat16* hi = lo + half;
    float r0, r1;
    RopeRotate(__bfloat162float(*lo), __bfloat162float(*hi), c, s, r0, r1);
    const __nv_bfloat16 y0 = __float2bfloat16_rn(r0);
    const __nv_bfloat16 y1 = __float2bfloat16_rn(r1);
    *lo = y0;
    *hi = y1;
    if (slot >= 0 && head >= p.num_heads) {
      __nv_bfloat16* k_dst = p.k_layer + static_cast<size_t>(slot) * kv_units +
                             static_cast<size_t>(head - p.num_heads) * p.head_dim + i;
      k_dst[0] = y0;
      k_dst[half] = y1;
    }
  }
}

// Vectorized RoPE (+ KV append): one block per token. The token's cos/sin go to shared memory once;
// then each work item (rotated head, 8-pair pack) loads the 16-byte packs at i and i + half,
// rotates the 8 pairs with the exact arithmetic of RopeKernel, stores them back (and, for k heads,
// into the cache slot); the v heads are copied pack by pack. Requires half % 8 == 0 and 16-byte
// aligned rows, cache and qkv (checked by the launcher).
__global__ void __launch_bounds__(kRopeThreads) RopeKvVecKernel(const RopeParams p) {
  PdlLaunchDependents();
  extern __shared__ float rope_cs[];
  const int half = p.head_dim / 2;
  const int token = blockIdx.x;
  float* cos_s = rope_cs;
  float* sin_s = rope_cs + half;
  // Positions, slots and inv_freq are step metadata and constants that no kernel of the step
  // writes (they are copied in before its first kernel), so the angles are computed while the
  // previous kernel (the QKV projection) finishes.
  const float pos = static_cast<float>(p.positions[token]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    RopeCosSin(pos, p.inv_freq[i], cos_s[i], sin_s[i]);
  }
  const int slot = p.k_layer != nullptr ? p.slot_mapping[token] : -1;
  PdlWait();
  __syncthreads();
  __nv_bfloat16* row = p.qkv + static_cast<size_t>(token) * p.row_stride;
  const int packs_per_half = half / 8;
  const int rotated = p.num_heads + p.num_kv_heads;
  const size_t kv_units = static_cast<size_t>(p.num_kv_heads) * p.head_dim;
  for (int item = threadIdx.x; item < rotated * packs_per_half; item += blockDim.x) {
    const int h = item / packs_per_half;
    const int i0 = (item - h * packs_per_half) * 8;
    __nv_bfloat16* lo = row + static_cast<size_t>(h) * p.head_dim + i0;
    __nv_bfloat16* hi = lo + half;
    float x0[8], x1[8], y0[8], y1[8];
    Bf16x8ToFloat(LoadBf16x8(lo), x0);
    Bf16x8ToFloat(LoadBf16x8(hi), x1);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      RopeRotate(x0[j], x1[j], cos_s[i0 + j], sin_s[i0 + j], y0[j], y1[j]);
    }
    const Bf16x8 out0 = FloatToBf16x8(y0);
    const Bf16x8 out1 = FloatToBf16x8(y1);
    StoreBf16x8(lo, out0);
    StoreBf16x8(hi, out1);
    if (slot >= 0 && h >= p.num_heads) {
      __nv_bfloat16* k_dst = p.k_layer + static_cast<size_t>(slot) * kv_units +
                             static_cast<size_t>(h - p.num_heads) * p.head_dim + i0;
      StoreBf16x8(k_dst, out0);
      StoreBf16x8(k_dst + half, out1);
    }
  }
  if (slot >= 0) {
    const __nv_bfloat16* v_src = row + static_cast<size_t>(rotated) * p.head_dim;
    __nv_bfloat16* v_dst = p.v_layer + static_cast<size_t>(slot) * kv_units;
    for (size_t i = threadIdx.x * size_t{8}; i < kv_units; i += blockDim.x * size_t{8}) {
      StoreBf16x8(v_dst + i, LoadBf16x8(v_src + i));
    }
  }
}

// One block per row: copies the row's k heads and v heads (kv_units each, in units of T) to the
// slot. k_offset: where the k heads start in the row; v heads follow them.
template <typename T>
__global__ void __launch_bounds__(kCopyThreads)
    KvAppendKernel(const T* __restrict__ qkv, const int32_t* __restrict__ slot_mapping,
                   int row_units, int k_offset, int kv_units, T* __restrict__ k_layer,
                   T* __restrict__ v_layer) {
  PdlLaunchDependents();
  PdlWait();
  const int slot = slot_mapping[blockIdx.x];
  if (slot < 0) return;
  const T* k_src = qkv + static_cast<size_t>(blockIdx.x) * row_units + k_offset;
  const T* v_src = k_src + kv_units;
  const size_t dst = static_cast<size_t>(slot) * kv_units;
  for (int i = threadIdx.x; i < kv_units; i += blockDim.x) {
    k_layer[dst + i] = k_src[i];
    v_layer[dst + i] = v_src[i];
  }
}

int ThreadsFor(int units) {
  const int warps = (units + kWarpSize - 1) / kWarpSize;
  return warps * kWarpSize < kCopyThreads ? warps * kWarpSize : kCopyThreads;
}

}  // namespace

cudaError_t LaunchEmbeddingRaw(const int32_t* ids, const void* table, int n, int hidden, void* out,
                               cudaStream_t stream) {
  if (hidden % 8 == 0 && IsAligned16(table) && IsAligned16(out)) {
    const int units = hidden / 8;
    LaunchKernel(EmbeddingKernel<uint4>, n, ThreadsFor(units), 0, stream, ids,
                 static_cast<const uint4*>(table), units, static_cast<uint4*>(out));
  } else {
    LaunchKernel(EmbeddingKernel<uint16_t>, n, ThreadsFor(hidden), 0, stream, ids,
                 static_cast<const uint16_t*>(table), hidden, static_cast<uint16_t*>(out));
  }
  return cudaGetLastError();
}

cudaError_t LaunchRopeKvRaw(void* qkv, const int32_t* positions, const float* inv_freq, int n,
                            int num_heads, int num_kv_heads, int head_dim,
                            const int32_t* slot_mapping, void* k_layer, void* v_layer,
                            cudaStream_t stream) {
  RopeParams p;
  p.qkv = static_cast<__nv_bfloat16*>(qkv);
  p.positions = positions;
  p.inv_freq = inv_freq;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.row_stride = (num_heads + 2 * num_kv_heads) * head_dim;
  p.head_dim = head_dim;
  const int rotated = num_heads + num_kv_heads;
  p.rope_groups = (rotated + kRopeHeadsPerBlock - 1) / kRopeHeadsPerBlock;
  p.slot_mapping = slot_mapping;
  p.k_layer = static_cast<__nv_bfloat16*>(k_layer);
  p.v_layer = static_cast<__nv_bfloat16*>(v_layer);
  const int half = head_dim / 2;
  const int pairs = (rotated < kRopeHeadsPerBlock ? rotated : kRopeHeadsPerBlock) * half;
  const int threads = ThreadsFor(pairs);  // at most kCopyThreads == kRopeThreads
  const size_t smem = 2 * static_cast<size_t>(half) * sizeof(float);
  const bool vectorized = half % 8 == 0 && IsAligned16(qkv) && p.row_stride % 8 == 0 &&
                          (k_layer == nullptr || (IsAligned16(k_layer) && IsAligned16(v_layer)));
  if (vectorized) {
    LaunchKernel(RopeKvVecKernel, dim3(n), kRopeThreads, smem, stream, p);
  } else {
    const int groups = p.rope_groups + (k_layer != nullptr ? 1 : 0);
    LaunchKernel(RopeKernel, dim3(n, groups), threads, smem, stream, p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchRopeRaw(void* qkv, const int32_t* positions, const float* inv_freq, int n,
                          int num_heads, int num_kv_heads, int head_dim, cudaStream_t stream) {
  return LaunchRopeKvRaw(qkv, positions, inv_freq, n, num_heads, num_kv_heads, head_dim, nullptr,
                         nullptr, nullptr, stream);
}

cudaError_t LaunchKvAppendRaw(const void* qkv, const int32_t* slot_mapping, int n, int num_heads,
                              int num_kv_heads, int head_dim, void* k_layer, void* v_layer,
                              cudaStream_t stream) {
  const int row = (num_heads + 2 * num_kv_heads) * head_dim;
  const int kv = num_kv_heads * head_dim;
  const int k_offset = num_heads * head_dim;
  if (head_dim % 8 == 0 && IsAligned16(qkv) && IsAligned16(k_layer) && IsAligned16(v_layer)) {
    LaunchKernel(KvAppendKernel<uint4>, n, ThreadsFor(kv / 8), 0, stream,
                 static_cast<const uint4*>(qkv), slot_mapping, row / 8, k_offset / 8, kv / 8,
                 static_cast<uint4*>(k_layer), static_cast<uint4*>(v_layer));
  } else {
    LaunchKernel(KvAppendKernel<uint16_t>, n, ThreadsFor(kv), 0, stream,
                 static_cast<const uint16_t*>(qkv), slot_mapping, row, k_offset, kv,
                 static_cast<uint16_t*>(k_layer), static_cast<uint16_t*>(v_layer));
  }
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal

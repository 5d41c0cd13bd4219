// Paged decode attention (contract: model_kernels.h, LaunchPagedDecodeAttention).
//
// Grid: (KV head x query-head chunk, sequence, context split). One CTA of 4 warps reads the K and
// V rows of one KV head over its chunk of the context exactly once, for all the query heads that
// share that KV head (up to kMaxGroup of them; larger groups take several chunks). The chunk is
// walked in tiles of kTile tokens:
//   0. the tile's token -> cache offsets (block table lookups) go to shared memory;
//   1. scores: a token's K row (head_dim bf16) is split over head_dim / 8 lanes, one 16-byte load
//      each, several loads in flight per thread; partial dots are reduced with shuffles;
//   2. online softmax per query head (running max and sum, base-2 exponentials);
//   3. the same lanes load the V rows and accumulate p * v in registers (float32).
// At the end the per-lane accumulators are reduced across token slots and warps. With one split
// the CTA writes the normalized bf16 output; with several (flash-decoding, when the batch alone
// cannot fill the GPU) it writes unnormalized partials and its (max, sum) to the workspace, and a
// merge kernel combines the splits.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem::cuda::internal {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kTile = kDecodeTileTokens;  // == kThreads (one offset per thread in phase 0)
constexpr float kLog2e = 1.4426950408889634f;

struct DecodeParams {
  const __nv_bfloat16* q;
  int q_row_stride;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  int block_size;
  int num_kv_heads;
  const int32_t* block_tables;
  int max_blocks_per_seq;
  const int32_t* context_lens;
  int num_heads;
  int group;         // num_heads / num_kv_heads
  int head_chunks;   // ceil(group / kMaxGroup)
  float scale_log2;  // scale * log2(e)
  int num_splits;
  int partition_size;
  __nv_bfloat16* out;
  float* partial_out;  // [num_seqs, num_heads, num_splits, head_dim]
  float* partial_ml;   // [num_seqs, num_heads, num_splits, 2]
};

template <int kHeadDim, int kMaxGroup>
__global__ void __launch_bounds__(kThreads) DecodeAttentionKernel(const DecodeParams p) {
  constexpr int kLanesPerToken = kHeadDim / 8;
  constexpr int kTokensPerWarp = kWarpSize / kLanesPerToken;
  constexpr int kTokensPerStep = kWarps * kTokensPerWarp;
  constexpr int kSteps = kTile / kTokensPerStep;
  constexpr int kBatch = kSteps < 8 ? kSteps : 8;
  static_assert(kTile == kThreads && kSteps % kBatch == 0, "tile shape");

  __shared__ float s_q[kMaxGroup][kHeadDim];
  __shared__ float s_scores[kMaxGroup][kTile];
  __shared__ long long s_offset[kTile];
  __shared__ float s_m[kMaxGroup], s_l[kMaxGroup], s_alpha[kMaxGroup];
  __shared__ float s_reduce[kWarps][kMaxGroup][kHeadDim];

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int kv_head = blockIdx.x / p.head_chunks;
  const int chunk = blockIdx.x % p.head_chunks;
  const int seq = blockIdx.y;
  const int split = blockIdx.z;
  const int head0 = kv_head * p.group + chunk * kMaxGroup;
  const int rest = p.group - chunk * kMaxGroup;
  const int num_q = rest < kMaxGroup ? rest : kMaxGroup;

  const int context = p.context_lens[seq];
  const int begin = split * p.partition_size;
  const int end = split == p.num_splits - 1 ? context : min(context, begin + p.partition_size);
  // An empty split writes nothing: the merge skips splits that start at or past the context.
  if (p.num_splits > 1 && begin >= context) return;

  for (int i = tid; i < num_q * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim;
    const int d = i % kHeadDim;
    s_q[g][d] = __bfloat162float(p.q[static_cast<size_t>(seq) * p.q_row_stride +
                                     static_cast<size_t>(head0 + g) * kHeadDim + d]);
  }
  if (tid < kMaxGroup) {
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.0f;
  }

  const int slot_in_warp = lane / kLanesPerToken;
  const int dim0 = (lane % kLanesPerToken) * 8;
  const size_t slot_stride = static_cast<size_t>(p.num_kv_heads) * kHeadDim;
  const int32_t* table = p.block_tables + static_cast<size_t>(seq) * p.max_blocks_per_seq;
  __syncthreads();
  // Each lane always touches the same 8 dims, so its slice of every query head lives in registers.
  float q_reg[kMaxGroup][8];
  float acc[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      q_reg[g][k] = g < num_q ? s_q[g][dim0 + k] : 0.0f;
      acc[g][k] = 0.0f;
    }
  }

  for (int tile = begin; tile < end; tile += kTile) {
    // 0. Cache offsets of the tile's tokens.
    {
      const int t = tile + tid;
      if (t < end) {
        const long long block = table[t / p.block_size];
        s_offset[tid] = (block * p.block_size + t % p.block_size) * slot_stride +
                        static_cast<long long>(kv_head) * kHeadDim;
      }
    }
    __syncthreads();

    // 1. Scores.
#pragma unroll
    for (int s0 = 0; s0 < kSteps; s0 += kBatch) {
      uint4 raw[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int lt = (s0 + b) * kTokensPerStep + warp * kTokensPerWarp + slot_in_warp;
        raw[b] = tile + lt < end ? __ldg(reinterpret_cast<const uint4*>(p.k + s_offset[lt] + dim0))
                                 : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int lt = (s0 + b) * kTokensPerStep + warp * kTokensPerWarp + slot_in_warp;
        Bf16x8 k8;
        memcpy(&k8, &raw[b], sizeof(k8));
        float kf[8];
        Bf16x8ToFloat(k8, kf);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g < num_q) {
            float dot = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; ++k) dot = fmaf(q_reg[g][k], kf[k], dot);
#pragma unroll
            for (int offset = kLanesPerToken / 2; offset > 0; offset /= 2) {
              dot += __shfl_xor_sync(0xffffffffu, dot, offset);
            }
            if (lane % kLanesPerToken == 0) {
              s_scores[g][lt] = tile + lt < end ? dot * p.scale_log2 : -INFINITY;
            }
          }
        }
      }
    }
    __syncthreads();

    // 2. Online softmax: warp w owns query heads w, w + kWarps, ...
    for (int g = warp; g < num_q; g += kWarps) {
      float tile_max = -INFINITY;
      for (int i = lane; i < kTile; i += kWarpSize) tile_max = fmaxf(tile_max, s_scores[g][i]);
      tile_max = WarpMax(tile_max);
      const float m_old = s_m[g];
      const float m_new = fmaxf(m_old, tile_max);
      float sum = 0.0f;
      for (int i = lane; i < kTile; i += kWarpSize) {
        const float e = exp2f(s_scores[g][i] - m_new);
        s_scores[g][i] = e;
        sum += e;
      }
      sum = WarpSum(sum);
      __syncwarp();
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);
        s_alpha[g] = alpha;
        s_m[g] = m_new;
        s_l[g] = s_l[g] * alpha + sum;
      }
    }
    __syncthreads();

    // 3. acc = acc * alpha + P V.
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < num_q) {
        const float alpha = s_alpha[g];
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[g][k] *= alpha;
      }
    }
#pragma unroll
    for (int s0 = 0; s0 < kSteps; s0 += kBatch) {
      uint4 raw[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int lt = (s0 + b) * kTokensPerStep + warp * kTokensPerWarp + slot_in_warp;
        raw[b] = tile + lt < end ? __ldg(reinterpret_cast<const uint4*>(p.v + s_offset[lt] + dim0))
                                 : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int lt = (s0 + b) * kTokensPerStep + warp * kTokensPerWarp + slot_in_warp;
        Bf16x8 v8;
        memcpy(&v8, &raw[b], sizeof(v8));
        float vf[8];
        Bf16x8ToFloat(v8, vf);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g < num_q) {
            const float pr = s_scores[g][lt];
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[g][k] = fmaf(pr, vf[k], acc[g][k]);
          }
        }
      }
    }
    __syncthreads();
  }

  // Reduce over the token slots of a warp (lanes that share dim0), then over warps.
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
#pragma unroll
      for (int offset = kLanesPerToken; offset < kWarpSize; offset *= 2) {
        acc[g][k] += __shfl_xor_sync(0xffffffffu, acc[g][k], offset);
      }
    }
  }
  if (slot_in_warp == 0) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < num_q) {
#pragma unroll
        for (int k = 0; k < 8; ++k) s_reduce[warp][g][dim0 + k] = acc[g][k];
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < num_q * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim;
    const int d = i % kHeadDim;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += s_reduce[w][g][d];
    const int head = head0 + g;
    if (p.num_splits == 1) {
      const float l = s_l[g];
      p.out[(static_cast<size_t>(seq) * p.num_heads + head) * kHeadDim + d] =
          __float2bfloat16_rn(l > 0.0f ? o / l : 0.0f);
    } else {
      const size_t part = (static_cast<size_t>(seq) * p.num_heads + head) * p.num_splits + split;
      p.partial_out[part * kHeadDim + d] = o;
      if (d == 0) {
        p.partial_ml[2 * part] = s_m[g];
        p.partial_ml[2 * part + 1] = s_l[g];
      }
    }
  }
}

// One block per (query head, sequence), one thread per dim: combines the non-empty splits.
template <int kHeadDim>
__global__ void __launch_bounds__(kHeadDim) DecodeMergeKernel(const DecodeParams p) {
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int d = threadIdx.x;
  const int context = p.context_lens[seq];
  const int by_length = (context + p.partition_size - 1) / p.partition_size;
  const int active = by_length < p.num_splits ? by_length : p.num_splits;
  const size_t part0 = (static_cast<size_t>(seq) * p.num_heads + head) * p.num_splits;
  float m = -INFINITY;
  for (int i = 0; i < active; ++i) m = fmaxf(m, p.partial_ml[2 * (part0 + i)]);
  float l = 0.0f, o = 0.0f;
  for (int i = 0; i < active; ++i) {
    const float w = exp2f(p.partial_ml[2 * (part0 + i)] - m);
    l = fmaf(p.partial_ml[2 * (part0 + i) + 1], w, l);
    o = fmaf(p.partial_out[(part0 + i) * kHeadDim + d], w, o);
  }
  p.out[(static_cast<size_t>(seq) * p.num_heads + head) * kHeadDim + d] =
      __float2bfloat16_rn(l > 0.0f ? o / l : 0.0f);
}

template <int kHeadDim>
void Dispatch(const DecodeParams& p, int num_seqs, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_kv_heads * p.head_chunks),
                  static_cast<unsigned>(num_seqs), static_cast<unsigned>(p.num_splits));
  if (p.group <= 4) {
    DecodeAttentionKernel<kHeadDim, 4><<<grid, kThreads, 0, stream>>>(p);
  } else {
    DecodeAttentionKernel<kHeadDim, 8><<<grid, kThreads, 0, stream>>>(p);
  }
  if (p.num_splits > 1) {
    DecodeMergeKernel<kHeadDim>
        <<<dim3(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_seqs)), kHeadDim, 0,
           stream>>>(p);
  }
}

}  // namespace

cudaError_t LaunchDecodeAttentionRaw(const void* q, int q_row_stride, const PagedLayerView& kv,
                                     const int32_t* context_lens, int num_seqs, int num_heads,
                                     float scale, void* out, void* workspace,
                                     const DecodeSplitPlan& plan, cudaStream_t stream) {
  DecodeParams p;
  p.q = static_cast<const __nv_bfloat16*>(q);
  p.q_row_stride = q_row_stride;
  p.k = static_cast<const __nv_bfloat16*>(kv.k);
  p.v = static_cast<const __nv_bfloat16*>(kv.v);
  p.block_size = kv.block_size;
  p.num_kv_heads = kv.num_kv_heads;
  p.block_tables = kv.block_tables;
  p.max_blocks_per_seq = kv.max_blocks_per_seq;
  p.context_lens = context_lens;
  p.num_heads = num_heads;
  p.group = num_heads / kv.num_kv_heads;
  p.scale_log2 = scale * kLog2e;
  p.num_splits = plan.num_splits;
  p.partition_size = plan.partition_size;
  p.out = static_cast<__nv_bfloat16*>(out);
  p.partial_out = static_cast<float*>(workspace);
  p.partial_ml = p.partial_out == nullptr
                     ? nullptr
                     : p.partial_out + static_cast<size_t>(num_seqs) * num_heads * plan.num_splits *
                                           kv.head_dim;
  const int max_group = p.group <= 4 ? 4 : 8;
  p.head_chunks = (p.group + max_group - 1) / max_group;
  switch (kv.head_dim) {
    case 32:
      Dispatch<32>(p, num_seqs, stream);
      break;
    case 64:
      Dispatch<64>(p, num_seqs, stream);
      break;
    case 128:
      Dispatch<128>(p, num_seqs, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal

// Paged decode attention (contract: model_kernels.h, LaunchPagedDecodeAttention).
//
// Grid: (KV head x query-head chunk, sequence, context split). One CTA of 4 warps reads the K and
// V rows of one KV head over its chunk of the context exactly once, for all the query heads that
// share that KV head (up to 16 of them, one tensor-core row each; larger groups take several
// chunks).
//
// A decode step streams every cached K/V byte once, so the kernel is built to keep HBM busy with
// as few instructions per byte as possible:
//   - each warp runs its own cp.async pipeline and never waits for the other warps inside the
//     loop: the chunk is cut into warp tiles of 16 tokens, warp w takes tiles w, w + 4, ..., and
//     keeps kStages - 1 tiles (K and V) in flight in shared memory while it computes the oldest;
//   - both products run on tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate) with the
//     group's query heads as the 16 rows of A (rows past the group are zeros): S = Q K^T with K
//     fragments from ldmatrix, then O += P V with P re-packed from the S accumulators to A
//     fragments (a bf16 high part and a bf16 low part, two MMAs, so P keeps ~16 bits) and V
//     fragments from ldmatrix.trans;
//   - when the group has at most 8 query heads (Llama-3: 4), rows 8-15 of A carry P's low part
//     instead of zeros, so one MMA per V fragment does the work of two (the two halves of O are
//     summed once at the end) and rows 8-15 need no softmax;
//   - online softmax on the S accumulators in registers (base-2 exponentials, f32 statistics),
//     rescaling O only when some row's maximum grew (warp-uniform test);
//   - block-table lookups once per token (one lane each), shared through shuffles, loaded one
//     warp tile ahead of their use so the table's round trip never stalls the pipeline; the
//     context length and the first lookups (step metadata, written before the step's first
//     kernel) are read before the PDL wait.
// The evict-first form (kEvictFirst) loads the cache rows with an evict-first L2 policy.
// At the end the warps' (max, sum, accumulator) triples are merged through shared memory. With one
// split the CTA writes the normalized bf16 output; with several (flash-decoding, when the batch
// alone cannot fill the GPU) it writes unnormalized partials and its (max, sum) to the workspace,
// and a merge kernel combines the splits.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/mma_utils.cuh"
#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem::cuda::internal {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kWarpTile = 16;  // tokens per warp tile (one k-step of P V)
constexpr int kStages = 3;     // warp tiles per warp in shared memory (kStages - 1 in flight)
constexpr int kMaxGroup = 16;  // query heads per CTA: the 16 rows of the MMA
constexpr int kPad = 8;        // bf16 elements of padding per shared row (conflict-free ldmatrix)
static_assert(kDecodeTileTokens == kWarps * kWarpTile, "a split partition is whole CTA tiles");
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

template <int kHeadDim>
__host__ __device__ constexpr int RowElems() {
  return kHeadDim + kPad;
}

template <int kHeadDim>
__host__ __device__ constexpr int StageElems() {  // one warp tile of K, then V
  return 2 * kWarpTile * RowElems<kHeadDim>();
}

template <int kHeadDim>
constexpr size_t DecodeSmemBytes() {
  const size_t pipeline = size_t{kWarps} * kStages * StageElems<kHeadDim>() * sizeof(__nv_bfloat16);
  const size_t merge = size_t{kWarps} * kMaxGroup * (kHeadDim + 2) * sizeof(float);
  return pipeline > merge ? pipeline : merge;
}

// The running softmax state of one warp over its warp tiles (rows g and g + 8 of the MMA; with
// kPackLo, rows 8-15 carry P's low parts and no query head) and the per-tile step that updates it.
template <int kHeadDim, bool kPackLo>
struct WarpAttention {
  static constexpr int kKSteps = kHeadDim / 16;  // k-steps of Q K^T
  static constexpr int kOTiles = kHeadDim / 8;   // n-tiles of O
  float o[kOTiles][4];
  float m0, m1;  // running max (log2 domain) of rows g and g + 8
  float l0, l1;  // this lane's part of the running sums

  __device__ __forceinline__ void Reset() {
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
    }
    m0 = -INFINITY;
    m1 = -INFINITY;
    l0 = 0.0f;
    l1 = 0.0f;
  }

  // One warp tile of tokens [t0, t0 + kWarpTile) (those at or past `end` masked), K at k_base and
  // V at v_base in shared memory, this lane's ldmatrix offsets k_lane_off / v_lane_off.
  __device__ __forceinline__ void Step(const uint32_t (&q_frag)[kKSteps][4], unsigned k_base,
                                       unsigned v_base, unsigned k_lane_off, unsigned v_lane_off,
                                       int t0, int end, float scale_log2, int t) {
    constexpr int kRow = RowElems<kHeadDim>();
    // S = Q K^T: n-tile j holds tokens 8j .. 8j + 7 of the warp tile.
    float s[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKSteps; kk += 2) {
        uint32_t b[4];  // (kk: dims +0..7, +8..15), (kk + 1: dims +0..7, +8..15)
        LdMatrixX4(b, k_base + k_lane_off +
                          static_cast<unsigned>((j * 8 * kRow + kk * 16) * sizeof(__nv_bfloat16)));
        MmaBf16(s[j], q_frag[kk], b[0], b[1]);
        MmaBf16(s[j], q_frag[kk + 1], b[2], b[3]);
      }
    }

    // Scale, mask tokens past the chunk, online softmax (token 0 of a tile is always valid).
    // With kPackLo rows 8-15 hold no query head: their statistics stay (-inf, 0).
    float max0 = -INFINITY, max1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool valid = t0 + j * 8 + 2 * t + e < end;
        s[j][e] = valid ? s[j][e] * scale_log2 : -INFINITY;
        max0 = fmaxf(max0, s[j][e]);
        if constexpr (!kPackLo) {
          s[j][e + 2] = valid ? s[j][e + 2] * scale_log2 : -INFINITY;
          max1 = fmaxf(max1, s[j][e + 2]);
        }
      }
    }
#pragma unroll
    for (int offset = 1; offset < 4; offset *= 2) {
      max0 = fmaxf(max0, __shfl_xor_sync(0xffffffffu, max0, offset));
      if constexpr (!kPackLo) max1 = fmaxf(max1, __shfl_xor_sync(0xffffffffu, max1, offset));
    }
    const float new_m0 = fmaxf(m0, max0);
    const float alpha0 = exp2f(m0 - new_m0);  // exactly 1 when the maximum did not grow
    bool grew = new_m0 > m0;
    m0 = new_m0;
    float alpha1 = alpha0;  // kPackLo: rows 8-15 accumulate rows 0-7's low parts
    if constexpr (!kPackLo) {
      const float new_m1 = fmaxf(m1, max1);
      alpha1 = exp2f(m1 - new_m1);
      grew = grew || new_m1 > m1;
      m1 = new_m1;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      s[j][0] = exp2f(s[j][0] - m0);
      s[j][1] = exp2f(s[j][1] - m0);
      if constexpr (!kPackLo) {
        s[j][2] = exp2f(s[j][2] - m1);
        s[j][3] = exp2f(s[j][3] - m1);
      }
    }
    l0 = l0 * alpha0 + (s[0][0] + s[0][1] + s[1][0] + s[1][1]);
    if constexpr (!kPackLo) l1 = l1 * alpha1 + (s[0][2] + s[0][3] + s[1][2] + s[1][3]);

    // O = O * alpha + P V, with P split into bf16 high and low parts: P keeps ~16 significant
    // bits, so the output matches a float32 P V closely. kPackLo: the low parts ride in rows
    // 8-15 of the same A fragment (one MMA per V fragment); otherwise two MMAs on the same V
    // fragments. The tensor cores have time to spare in this bandwidth-bound kernel.
    uint32_t a[4], a_lo[4];
    if constexpr (kPackLo) {
      SplitBf16x2(s[0][0], s[0][1], a[0], a[1]);
      SplitBf16x2(s[1][0], s[1][1], a[2], a[3]);
    } else {
      SplitBf16x2(s[0][0], s[0][1], a[0], a_lo[0]);
      SplitBf16x2(s[0][2], s[0][3], a[1], a_lo[1]);
      SplitBf16x2(s[1][0], s[1][1], a[2], a_lo[2]);
      SplitBf16x2(s[1][2], s[1][3], a[3], a_lo[3]);
    }
    // Rescale only when some row's maximum grew (alpha == 1 otherwise, so skipping is exact).
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        o[n][0] *= alpha0;
        o[n][1] *= alpha0;
        o[n][2] *= alpha1;
        o[n][3] *= alpha1;
      }
    }
#pragma unroll
    for (int n = 0; n < kOTiles; n += 2) {
      uint32_t b[4];  // (tokens 0..7, dims n), (8..15, n), (0..7, n + 1), (8..15, n + 1)
      LdMatrixX4Trans(b,
                      v_base + v_lane_off + static_cast<unsigned>(n * 8 * sizeof(__nv_bfloat16)));
      MmaBf16(o[n], a, b[0], b[1]);
      MmaBf16(o[n + 1], a, b[2], b[3]);
      if constexpr (!kPackLo) {
        MmaBf16(o[n], a_lo, b[0], b[1]);
        MmaBf16(o[n + 1], a_lo, b[2], b[3]);
      }
    }
  }

  // After the last step: folds the low parts (kPackLo) into rows 0-7 and sums l over the quad.
  __device__ __forceinline__ void Finish() {
    if constexpr (kPackLo) {
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        o[n][0] += o[n][2];
        o[n][1] += o[n][3];
      }
    }
#pragma unroll
    for (int offset = 1; offset < 4; offset *= 2) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, offset);
      l1 += __shfl_xor_sync(0xffffffffu, l1, offset);
    }
  }
};

// Q as the A operand: row r = query head head0 + r of sequence seq (zeros from row num_q on).
template <int kHeadDim>
__device__ __forceinline__ void LoadQ(const DecodeParams& p, int seq, int head0, int num_q, int g,
                                      int t, uint32_t (&q_frag)[kHeadDim / 16][4]) {
  const __nv_bfloat16* q_seq = p.q + static_cast<size_t>(seq) * p.q_row_stride;
  const bool valid0 = g < num_q;
  const bool valid1 = g + 8 < num_q;
  const uint32_t* row0 =
      reinterpret_cast<const uint32_t*>(q_seq + static_cast<size_t>(head0 + g) * kHeadDim);
  const uint32_t* row1 =
      reinterpret_cast<const uint32_t*>(q_seq + static_cast<size_t>(head0 + g + 8) * kHeadDim);
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    const int c = (kk * 16 + 2 * t) / 2;  // in bf16 pairs
    q_frag[kk][0] = valid0 ? row0[c] : 0u;
    q_frag[kk][1] = valid1 ? row1[c] : 0u;
    q_frag[kk][2] = valid0 ? row0[c + 4] : 0u;
    q_frag[kk][3] = valid1 ? row1[c + 4] : 0u;
  }
}

// Combines the kWarps warps' (max, sum, accumulator) triples of query row r, dim d from a merge
// area of `rows` rows per warp (s_acc: [kWarps][rows][kHeadDim], s_ml: [kWarps][rows][2]):
// returns the accumulators rescaled to the common max and summed, with the sum in l_all and the
// max in m_all (-inf, with 0 and 0, when no warp saw a key).
// Queues the K and V copies of one warp tile, tokens [t0, t0 + kWarpTile) of one KV head
// (head_offset elements into a cache slot), into k_dst and the V rows after it: lane j <
// kWarpTile holds the cache block of token t0 + j (`block`; garbage past the tile); rows at or past
// `end` are zero-filled. With kEvictFirst the reads carry the evict-first L2 `policy`.
template <int kHeadDim, bool kEvictFirst>
__device__ __forceinline__ void CopyWarpTile(const DecodeParams& p, __nv_bfloat16* k_dst, int block,
                                             int t0, int end, long long slot_stride,
                                             long long head_offset, uint64_t policy, int lane) {
  constexpr int kRow = RowElems<kHeadDim>();
  constexpr int kChunksPerRow = kHeadDim / 8;                     // 16-byte pieces of one K row
  constexpr int kCopies = kWarpTile * kChunksPerRow / kWarpSize;  // per lane, K (and V)
  static_assert(kCopies >= 1 && kWarpTile * kChunksPerRow % kWarpSize == 0, "tile shape");
  __nv_bfloat16* v_dst = k_dst + kWarpTile * kRow;
  const int my_slot = block * p.block_size + (t0 + lane) % p.block_size;
#pragma unroll
  for (int c = 0; c < kCopies; ++c) {
    const int piece = c * kWarpSize + lane;
    const int row = piece / kChunksPerRow;
    const int d = (piece % kChunksPerRow) * 8;
    const int slot = __shfl_sync(0xffffffffu, my_slot, row);
    const long long offset = static_cast<long long>(slot) * slot_stride + head_offset;
    const bool valid = t0 + row < end;
    if constexpr (kEvictFirst) {
      CpAsyncCg16(k_dst + row * kRow + d, p.k + offset + d, valid, policy);
      CpAsyncCg16(v_dst + row * kRow + d, p.v + offset + d, valid, policy);
    } else {
      CpAsyncCg16(k_dst + row * kRow + d, p.k + offset + d, valid);
      CpAsyncCg16(v_dst + row * kRow + d, p.v + offset + d, valid);
    }
  }
}

template <int kHeadDim>
__device__ __forceinline__ float MergeWarpTriples(const float* s_acc, const float* s_ml, int rows,
                                                  int r, int d, float& m_all, float& l_all) {
  m_all = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, s_ml[2 * (w * rows + r)]);
  float out = 0.0f;
  l_all = 0.0f;
  if (m_all != -INFINITY) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float scale = exp2f(s_ml[2 * (w * rows + r)] - m_all);
      out = fmaf(s_acc[(w * rows + r) * kHeadDim + d], scale, out);
      l_all = fmaf(s_ml[2 * (w * rows + r) + 1], scale, l_all);
    }
  }
  return out;
}

// kPackLo: the group fits in rows 0-7 (group <= 8), so rows 8-15 of P carry the low parts.
// kEvictFirst: the cache's cp.async carry an evict-first L2 policy (chosen per launch:
// DecodeEvictFirst in model_kernels.cc).
template <int kHeadDim, bool kPackLo, bool kEvictFirst>
__global__ void __launch_bounds__(kThreads) DecodeAttentionKernel(const DecodeParams p) {
  PdlLaunchDependents();
  constexpr int kRow = RowElems<kHeadDim>();
  constexpr int kKSteps = kHeadDim / 16;  // k-steps of Q K^T
  constexpr int kOTiles = kHeadDim / 8;   // n-tiles of O
  static_assert(kKSteps % 2 == 0 && kOTiles % 2 == 0, "head_dim multiple of 32");
  extern __shared__ __align__(16) unsigned char smem[];

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int g = lane / 4;  // MMA group: rows g and g + 8
  const int t = lane % 4;  // thread in group: columns 2t, 2t + 1
  const int kv_head = blockIdx.x / p.head_chunks;
  const int chunk = blockIdx.x % p.head_chunks;
  const int seq = blockIdx.y;
  const int split = blockIdx.z;
  const int head0 = kv_head * p.group + chunk * kMaxGroup;
  const int rest = p.group - chunk * kMaxGroup;
  const int num_q = rest < kMaxGroup ? rest : kMaxGroup;
  [[maybe_unused]] const uint64_t policy = kEvictFirst ? L2EvictFirstPolicy() : 0;

  // Step metadata (context lengths, block tables) is uploaded before the step's first kernel and
  // written by none, so it is read before PdlWait(); Q and the cache are read after it.
  const int context = p.context_lens[seq];
  const int begin = split * p.partition_size;
  const int end = split == p.num_splits - 1 ? context : min(context, begin + p.partition_size);
  // An empty split writes nothing: the merge skips splits that start at or past the context.
  if (p.num_splits > 1 && begin >= context) {
    PdlWait();
    return;
  }

  const long long slot_stride = static_cast<long long>(p.num_kv_heads) * kHeadDim;
  const long long head_offset = static_cast<long long>(kv_head) * kHeadDim;
  const int32_t* table = p.block_tables + static_cast<size_t>(seq) * p.max_blocks_per_seq;
  __nv_bfloat16* stages =
      reinterpret_cast<__nv_bfloat16*>(smem) + warp * kStages * StageElems<kHeadDim>();

  // Warp tiles of this warp: tokens [first_tile + i * tile_stride, + kWarpTile).
  const int first_tile = begin + warp * kWarpTile;
  const int tile_stride = kWarps * kWarpTile;
  const int num_tiles = first_tile < end ? (end - first_tile + tile_stride - 1) / tile_stride : 0;

  // Lane j < kWarpTile: the cache block of token j of warp tile i (0 past the tile or chunk). Only
  // the load; the slot arithmetic waits for issue(), one warp tile later.
  auto load_block = [&](int i) -> int {
    const int tok = first_tile + i * tile_stride + lane;
    return i < num_tiles && lane < kWarpTile && tok < end ? __ldg(table + tok / p.block_size) : 0;
  };
  // Queues the K and V copies of warp tile i, whose blocks load_block(i) returned, into its stage
  // (one commit group, maybe empty).
  auto issue = [&](int i, int block) {
    if (i < num_tiles) {
      CopyWarpTile<kHeadDim, kEvictFirst>(p, stages + (i % kStages) * StageElems<kHeadDim>(), block,
                                          first_tile + i * tile_stride, end, slot_stride,
                                          head_offset, policy, lane);
    }
    CpAsyncCommitGroup();
  };

  int first_blocks[kStages];
#pragma unroll
  for (int i = 0; i < kStages; ++i) first_blocks[i] = load_block(i);
  PdlWait();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i, first_blocks[i]);
  int next_block = first_blocks[kStages - 1];  // of warp tile i + kStages - 1 in iteration i

  uint32_t q_frag[kKSteps][4];
  LoadQ<kHeadDim>(p, seq, head0, num_q, g, t, q_frag);
  WarpAttention<kHeadDim, kPackLo> st;
  st.Reset();

  // ldmatrix row addresses of this lane within a stage (see mma_utils.cuh).
  const int mat = lane / 8;
  const unsigned k_lane_off =
      static_cast<unsigned>(((lane % 8) * kRow + mat * 8) * sizeof(__nv_bfloat16));
  const unsigned v_lane_off = static_cast<unsigned>(
      (((mat % 2) * 8 + lane % 8) * kRow + (mat / 2) * 8) * sizeof(__nv_bfloat16));

  for (int i = 0; i < num_tiles; ++i) {
    __syncwarp();  // every lane is done reading the stage the next issue overwrites
    const int block = next_block;
    next_block = load_block(i + kStages);  // consumed next iteration: its latency hides here
    issue(i + kStages - 1, block);
    CpAsyncWaitGroup<kStages - 1>();
    __syncwarp();
    const int t0 = first_tile + i * tile_stride;
    const __nv_bfloat16* k_tile = stages + (i % kStages) * StageElems<kHeadDim>();
    const unsigned k_base = SharedAddress(k_tile);
    const unsigned v_base = k_base + kWarpTile * kRow * sizeof(__nv_bfloat16);

    st.Step(q_frag, k_base, v_base, k_lane_off, v_lane_off, t0, end, p.scale_log2, t);
  }
  CpAsyncWaitGroup<0>();  // no copy may land in the buffer the merge below reuses
  // Row sums over the quad, then the warps' triples through shared memory.
  st.Finish();
  __syncthreads();                                // every warp is done with its pipeline stages
  float* s_acc = reinterpret_cast<float*>(smem);  // [kWarps][kMaxGroup][kHeadDim]
  float* s_ml = s_acc + kWarps * kMaxGroup * kHeadDim;  // [kWarps][kMaxGroup][2]
  float* acc0 = s_acc + (warp * kMaxGroup + g) * kHeadDim;
  float* acc1 = acc0 + 8 * kHeadDim;
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) {
    acc0[n * 8 + 2 * t] = st.o[n][0];
    acc0[n * 8 + 2 * t + 1] = st.o[n][1];
    acc1[n * 8 + 2 * t] = st.o[n][2];
    acc1[n * 8 + 2 * t + 1] = st.o[n][3];
  }
  if (t == 0) {
    s_ml[2 * (warp * kMaxGroup + g)] = st.m0;
    s_ml[2 * (warp * kMaxGroup + g) + 1] = st.l0;
    s_ml[2 * (warp * kMaxGroup + g + 8)] = st.m1;
    s_ml[2 * (warp * kMaxGroup + g + 8) + 1] = st.l1;
  }
  __syncthreads();
  for (int idx = tid; idx < num_q * kHeadDim; idx += kThreads) {
    const int r = idx / kHeadDim;
    const int d = idx % kHeadDim;
    float m_all, l_all;
    const float out = MergeWarpTriples<kHeadDim>(s_acc, s_ml, kMaxGroup, r, d, m_all, l_all);
    const int head = head0 + r;
    if (p.num_splits == 1) {
      p.out[(static_cast<size_t>(seq) * p.num_heads + head) * kHeadDim + d] =
          __float2bfloat16_rn(l_all > 0.0f ? out / l_all : 0.0f);
    } else {
      const size_t part = (static_cast<size_t>(seq) * p.num_heads + head) * p.num_splits + split;
      p.partial_out[part * kHeadDim + d] = out;
      if (d == 0) {
        p.partial_ml[2 * part] = m_all;
        p.partial_ml[2 * part + 1] = l_all;
      }
    }
  }
}

// Shared memory of the chained kernel: the warps' rings, then its merge area for `group` query
// heads ([kWarps][group][kHeadDim] partial outputs, then [kWarps][group] (max, sum) pairs).
template <int kHeadDim>
size_t ChainSmemBytes(int group) {
  return size_t{kWarps} * kStages * StageElems<kHeadDim>() * sizeof(__nv_bfloat16) +
         size_t{kWarps} * group * (kHeadDim + 2) * sizeof(float);
}

// Chained decode attention (one split per sequence, a group of at most 8 query heads per KV head:
// the kPackLo layout): CTA c takes the (sequence, KV head) items c * chain .. c * chain + chain - 1
// (item = sequence * num_kv_heads + KV head) in turn. Each warp's cp.async ring runs on from one
// item into the next (its tiles of item k, then of item k + 1, skipping items where it has none),
// so the next item's first tiles and query rows are in flight while the warps merge the last one
// through their own shared-memory area, which the ring does not use. Per warp tile the work is
// DecodeAttentionKernel's (WarpAttention); the merge and the output are its single-split ones.
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads)
    DecodeAttentionChainKernel(const DecodeParams p, int chain, int num_items) {
  PdlLaunchDependents();
  constexpr int kRow = RowElems<kHeadDim>();
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kOTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int item_context[kDecodeMaxChain];

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int g = lane / 4;
  const int t = lane % 4;
  const int item0 = blockIdx.x * chain;
  const int items = min(chain, num_items - item0);
  const int group = p.group;
  const uint64_t policy = L2EvictFirstPolicy();  // chains run at 2+ sequences: evict-first

  // Step metadata (context lengths, block tables) is read before PdlWait(); Q and the cache after.
  for (int k = tid; k < items; k += kThreads) {
    item_context[k] = p.context_lens[(item0 + k) / p.num_kv_heads];
  }
  __syncthreads();

  const long long slot_stride = static_cast<long long>(p.num_kv_heads) * kHeadDim;
  __nv_bfloat16* stages =
      reinterpret_cast<__nv_bfloat16*>(smem) + warp * kStages * StageElems<kHeadDim>();
  float* s_acc = reinterpret_cast<float*>(smem + size_t{kWarps} * kStages * StageElems<kHeadDim>() *
                                                     sizeof(__nv_bfloat16));
  float* s_ml = s_acc + kWarps * group * kHeadDim;
  const int first_tile = warp * kWarpTile;  // of every item: one split, begin = 0
  const int tile_stride = kWarps * kWarpTile;
  auto tiles_of = [&](int k) {
    const int end = item_context[k];
    return first_tile < end ? (end - first_tile + tile_stride - 1) / tile_stride : 0;
  };

  // A position in this warp's sequence of warp tiles: tile i of item k (k == items: past the end).
  struct Cursor {
    int k, i, n;  // n: this warp's tiles of item k
  };
  auto skip_empty = [&](Cursor& c) {
    while (c.k < items && (c.n = tiles_of(c.k)) == 0) ++c.k;
  };
  auto advance = [&](Cursor& c) {
    if (++c.i < c.n) return;
    c.i = 0;
    ++c.k;
    skip_empty(c);
  };
  // Lane j < kWarpTile: the cache block of token j of the cursor's tile (0 past the tile).
  auto load_block = [&](const Cursor& c) -> int {
    if (c.k >= items) return 0;
    const int end = item_context[c.k];
    const int tok = first_tile + c.i * tile_stride + lane;
    const int seq = (item0 + c.k) / p.num_kv_heads;
    return lane < kWarpTile && tok < end
               ? __ldg(p.block_tables + static_cast<size_t>(seq) * p.max_blocks_per_seq +
                       tok / p.block_size)
               : 0;
  };
  // Queues the K and V copies of the cursor's tile into ring stage `ring` (one commit group,
  // empty past the end).
  auto issue = [&](const Cursor& c, int block, int ring) {
    if (c.k < items) {
      const long long head_offset =
          static_cast<long long>((item0 + c.k) % p.num_kv_heads) * kHeadDim;
      CopyWarpTile<kHeadDim, true>(p, stages + (ring % kStages) * StageElems<kHeadDim>(), block,
                                   first_tile + c.i * tile_stride, item_context[c.k], slot_stride,
                                   head_offset, policy, lane);
    }
    CpAsyncCommitGroup();
  };
  auto load_q = [&](int k, uint32_t(&q)[kKSteps][4]) {
    const int item = item0 + k;
    LoadQ<kHeadDim>(p, item / p.num_kv_heads, (item % p.num_kv_heads) * group, group, g, t, q);
  };

  Cursor look{0, 0, 0};
  skip_empty(look);
  Cursor iss = look;
  int first_blocks[kStages];
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    first_blocks[s] = load_block(look);
    advance(look);
  }
  PdlWait();
  int issued = 0;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    issue(iss, first_blocks[s], issued++);
    advance(iss);
  }
  int next_block = first_blocks[kStages - 1];
  uint32_t q_next[kKSteps][4];
  load_q(0, q_next);

  const int mat = lane / 8;
  const unsigned k_lane_off =
      static_cast<unsigned>(((lane % 8) * kRow + mat * 8) * sizeof(__nv_bfloat16));
  const unsigned v_lane_off = static_cast<unsigned>(
      (((mat % 2) * 8 + lane % 8) * kRow + (mat / 2) * 8) * sizeof(__nv_bfloat16));

  int computed = 0;
  for (int k = 0; k < items; ++k) {
    uint32_t q_frag[kKSteps][4];
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int e = 0; e < 4; ++e) q_frag[kk][e] = q_next[kk][e];
    }
    if (k + 1 < items) load_q(k + 1, q_next);  // lands while this item streams
    const int end = item_context[k];
    const int num_tiles = tiles_of(k);
    WarpAttention<kHeadDim, true> st;
    st.Reset();
    for (int i = 0; i < num_tiles; ++i) {
      __syncwarp();  // every lane is done reading the stage the next issue overwrites
      const int block = next_block;
      next_block = load_block(look);
      advance(look);
      issue(iss, block, issued++);
      advance(iss);
      CpAsyncWaitGroup<kStages - 1>();
      __syncwarp();
      const unsigned k_base = SharedAddress(stages + (computed % kStages) * StageElems<kHeadDim>());
      const unsigned v_base = k_base + kWarpTile * kRow * sizeof(__nv_bfloat16);
      ++computed;
      st.Step(q_frag, k_base, v_base, k_lane_off, v_lane_off, first_tile + i * tile_stride, end,
              p.scale_log2, t);
    }
    st.Finish();

    // The warps' triples of item k through the merge area (rows 0-7 of the MMA hold the group).
    if (g < group) {
      float* acc = s_acc + (warp * group + g) * kHeadDim;
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        acc[n * 8 + 2 * t] = st.o[n][0];
        acc[n * 8 + 2 * t + 1] = st.o[n][1];
      }
      if (t == 0) {
        s_ml[2 * (warp * group + g)] = st.m0;
        s_ml[2 * (warp * group + g) + 1] = st.l0;
      }
    }
    __syncthreads();
    const int item = item0 + k;
    const int seq = item / p.num_kv_heads;
    const int head0 = (item % p.num_kv_heads) * group;
    for (int idx = tid; idx < group * kHeadDim; idx += kThreads) {
      const int r = idx / kHeadDim;
      const int d = idx % kHeadDim;
      float m_all, l_all;
      const float out = MergeWarpTriples<kHeadDim>(s_acc, s_ml, group, r, d, m_all, l_all);
      p.out[(static_cast<size_t>(seq) * p.num_heads + head0 + r) * kHeadDim + d] =
          __float2bfloat16_rn(l_all > 0.0f ? out / l_all : 0.0f);
    }
    __syncthreads();  // the merge area is free for the next item
  }
  CpAsyncWaitGroup<0>();
}

// One block per (query head, sequence), one thread per dim: combines the non-empty splits.
template <int kHeadDim>
__global__ void __launch_bounds__(kHeadDim) DecodeMergeKernel(const DecodeParams p) {
  PdlLaunchDependents();
  PdlWait();
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

template <int kHeadDim, bool kPackLo, bool kEvictFirst>
cudaError_t LaunchMain(const DecodeParams& p, const dim3 grid, cudaStream_t stream) {
  constexpr size_t kSmem = DecodeSmemBytes<kHeadDim>();
  static std::atomic<uint64_t> configured{0};
  if (const cudaError_t e = OptInDynamicSharedMemory(
          DecodeAttentionKernel<kHeadDim, kPackLo, kEvictFirst>, kSmem, configured);
      e != cudaSuccess) {
    return e;
  }
  LaunchKernel(DecodeAttentionKernel<kHeadDim, kPackLo, kEvictFirst>, grid, kThreads, kSmem, stream,
               p);
  return cudaSuccess;
}

template <int kHeadDim, bool kPackLo>
cudaError_t LaunchForm(const DecodeParams& p, bool evict_first, const dim3 grid,
                       cudaStream_t stream) {
  return evict_first ? LaunchMain<kHeadDim, kPackLo, true>(p, grid, stream)
                     : LaunchMain<kHeadDim, kPackLo, false>(p, grid, stream);
}

// Whether the chained kernel runs for this head_dim and group on the current device: the kPackLo
// layout, one CTA per KV head, and kDecodeChainCtasPerSm CTAs resident per SM (so the grid of
// PlanDecodeSplits' chain is one wave). Cached per (head_dim, group) and device.
template <int kHeadDim>
bool ChainFits(int group) {
  if (group > kMaxGroup / 2) return false;
  static std::atomic<uint64_t> known[kMaxGroup / 2 + 1], fits[kMaxGroup / 2 + 1];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= 64) return false;
  const uint64_t bit = uint64_t{1} << device;
  if ((known[group].load(std::memory_order_acquire) & bit) == 0) {
    // The limit covers every group the kernel takes, so raising it once serves them all.
    const size_t smem = ChainSmemBytes<kHeadDim>(group);
    int blocks = 0;
    bool ok = cudaFuncSetAttribute(
                  DecodeAttentionChainKernel<kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                  static_cast<int>(ChainSmemBytes<kHeadDim>(kMaxGroup / 2))) == cudaSuccess &&
              cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                  &blocks, DecodeAttentionChainKernel<kHeadDim>, kThreads, smem) == cudaSuccess &&
              blocks >= kDecodeChainCtasPerSm;
    cudaGetLastError();
    if (ok) fits[group].fetch_or(bit, std::memory_order_relaxed);
    known[group].fetch_or(bit, std::memory_order_release);
  }
  return (fits[group].load(std::memory_order_relaxed) & bit) != 0;
}

template <int kHeadDim>
cudaError_t Dispatch(const DecodeParams& p, int num_seqs, int chain, bool evict_first,
                     cudaStream_t stream) {
  if (chain < 1 || chain > kDecodeMaxChain) return cudaErrorInvalidValue;
  // Chaining only for head_dim 128 (H200: Llama-3.2-1B's head_dim 64 at batch 64, 1K measured
  // 3% slower chained; bench/RESULTS.md, tenth session): other head sizes take one item per CTA.
  if constexpr (kHeadDim == 128) {
    if (chain > 1 && p.num_splits == 1 && p.head_chunks == 1 && ChainFits<kHeadDim>(p.group)) {
      const int items = num_seqs * p.num_kv_heads;
      const int ctas = (items + chain - 1) / chain;
      LaunchKernel(DecodeAttentionChainKernel<kHeadDim>, ctas, kThreads,
                   ChainSmemBytes<kHeadDim>(p.group), stream, p, chain, items);
      return cudaGetLastError();
    }
  }
  const dim3 grid(static_cast<unsigned>(p.num_kv_heads * p.head_chunks),
                  static_cast<unsigned>(num_seqs), static_cast<unsigned>(p.num_splits));
  // Groups of at most 8 query heads pack P's low parts into MMA rows 8-15; larger groups take a
  // second MMA for them.
  const cudaError_t e = p.group <= kMaxGroup / 2
                            ? LaunchForm<kHeadDim, true>(p, evict_first, grid, stream)
                            : LaunchForm<kHeadDim, false>(p, evict_first, grid, stream);
  if (e != cudaSuccess) return e;
  if (p.num_splits > 1) {
    LaunchKernel(DecodeMergeKernel<kHeadDim>,
                 dim3(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_seqs)),
                 kHeadDim, 0, stream, p);
  }
  return cudaGetLastError();
}

}  // namespace

bool DecodeChainRuns(int head_dim, int group) { return head_dim == 128 && ChainFits<128>(group); }

cudaError_t LaunchDecodeAttentionRaw(const void* q, int q_row_stride, const PagedLayerView& kv,
                                     const int32_t* context_lens, int num_seqs, int num_heads,
                                     float scale, void* out, void* workspace,
                                     const DecodeSplitPlan& plan, bool evict_first,
                                     cudaStream_t stream) {
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
  p.head_chunks = (p.group + kMaxGroup - 1) / kMaxGroup;
  switch (kv.head_dim) {
    case 32:
      return Dispatch<32>(p, num_seqs, plan.chain, evict_first, stream);
    case 64:
      return Dispatch<64>(p, num_seqs, plan.chain, evict_first, stream);
    case 128:
      return Dispatch<128>(p, num_seqs, plan.chain, evict_first, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda::internal

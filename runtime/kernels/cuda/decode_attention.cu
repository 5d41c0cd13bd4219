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
// With RoPE and the KV append fused in (kFuse; DecodeAttentionArgs::rope_*, the runner's path
// when the QKV projection is cuBLASLt's, 33+ decode rows), q holds the unrotated qkv rows: the
// token's cos/sin go to shared memory before the PDL wait, every CTA rotates its query heads in
// the Q fragments (registers; the buffer keeps unrotated q), and the warp whose tiles hold the
// new token (the last of the context) loads that token's k and v heads into registers after the
// PDL wait without waiting for them; when its copy of that tile has landed (holding the slot's
// old bytes), it rotates k, writes k and v over the token's row of the stage and stores them to
// the token's slot. No fence or stall is added to any warp's stream. The arithmetic is
// LaunchRopeKvAppend's, so the cache bytes and the output are those of the two launches it
// replaces.
// At the end the warps' (max, sum, accumulator) triples are merged through shared memory. With one
// split the CTA writes the normalized bf16 output; with several (flash-decoding, when the batch
// alone cannot fill the GPU) it writes unnormalized partials and its (max, sum) to the workspace,
// and a merge kernel combines the splits.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/mma_utils.cuh"
#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem::cuda::internal {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kWarpTile = 16;  // tokens per warp tile (one k-step of P V)
constexpr int kStages = 3;     // warp tiles per warp in shared memory (kStages - 1 in flight)
constexpr int kMaxGroup = kDecodeMaxGroup;  // query heads per CTA: the 16 rows of the MMA
constexpr int kPad = 8;  // bf16 elements of padding per shared row (conflict-free ldmatrix)
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

// The fused RoPE + KV append, a second parameter of the fused kernel only (a larger parameter
// block alone changes the register allocation of the plain kernel, which measured ~1% slower):
// q rows are unrotated qkv rows; the new token of sequence s is at positions[s] and goes to cache
// slot slots[s] (negative: not appended) of k / v (the layer's).
struct DecodeRopeParams {
  const int32_t* positions;
  const float* inv_freq;
  const int32_t* slots;
  __nv_bfloat16* k;
  __nv_bfloat16* v;
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

// The new token's k and v heads (kv_head of sequence seq's qkv row) as one warp holds them: lane
// l has k dims l + 32 j (j < kPairs) of the first half and the same dims of the second half
// (rotation pairs), and v dims l + 32 j (j < kVDims). Loaded without waiting; Finish() rotates k
// with the cos/sin table and stores both at the token's slot (nothing when it is negative).
template <int kHeadDim>
struct NewToken {
  static constexpr int kHalf = kHeadDim / 2;
  static constexpr int kPairs = (kHalf + kWarpSize - 1) / kWarpSize;
  static constexpr int kVDims = (kHeadDim + kWarpSize - 1) / kWarpSize;
  __nv_bfloat16 k_lo[kPairs], k_hi[kPairs], v[kVDims];
  size_t dst;  // element offset of the token's kv_head at its slot; slot < 0: not appended
  int slot;

  __device__ __forceinline__ void Load(const DecodeParams& p, const DecodeRopeParams& r, int seq,
                                       int kv_head, int lane) {
    slot = r.slots[seq];
    dst = static_cast<size_t>(slot < 0 ? 0 : slot) * p.num_kv_heads * kHeadDim +
          static_cast<size_t>(kv_head) * kHeadDim;
    const __nv_bfloat16* row = p.q + static_cast<size_t>(seq) * p.q_row_stride;
    const __nv_bfloat16* k_src = row + static_cast<size_t>(p.num_heads + kv_head) * kHeadDim;
    const __nv_bfloat16* v_src =
        row + static_cast<size_t>(p.num_heads + p.num_kv_heads + kv_head) * kHeadDim;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int i = lane + j * kWarpSize;
      if (i < kHalf) {
        k_lo[j] = k_src[i];
        k_hi[j] = k_src[i + kHalf];
      }
    }
#pragma unroll
    for (int j = 0; j < kVDims; ++j) {
      const int i = lane + j * kWarpSize;
      if (i < kHeadDim) v[j] = v_src[i];
    }
  }
  // Rotates k (cos/sin of pair i at cs[0][i], cs[1][i]); writes k and v over row `row` of a
  // staged K / V tile (null: none) and to the cache.
  __device__ __forceinline__ void Finish(const DecodeRopeParams& r, const float (*cs)[kHalf],
                                         int lane, __nv_bfloat16* k_row, __nv_bfloat16* v_row) {
    if (slot < 0) return;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int i = lane + j * kWarpSize;
      if (i < kHalf) {
        float y0, y1;
        RopeRotate(__bfloat162float(k_lo[j]), __bfloat162float(k_hi[j]), cs[0][i], cs[1][i], y0,
                   y1);
        const __nv_bfloat16 r0 = __float2bfloat16_rn(y0), r1 = __float2bfloat16_rn(y1);
        r.k[dst + i] = r0;
        r.k[dst + i + kHalf] = r1;
        if (k_row != nullptr) {
          k_row[i] = r0;
          k_row[i + kHalf] = r1;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kVDims; ++j) {
      const int i = lane + j * kWarpSize;
      if (i < kHeadDim) {
        r.v[dst + i] = v[j];
        if (v_row != nullptr) v_row[i] = v[j];
      }
    }
  }
};

// The bf16 pair packed in `u` (element 0 in the low half) rotated with its partner pair `v` (the
// dims head_dim / 2 further) by (c0, s0) and (c1, s1), rounded to bf16 as LaunchRope does.
__device__ __forceinline__ void RotatePacked(uint32_t& u, uint32_t& v, float c0, float s0, float c1,
                                             float s1) {
  __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&u);
  __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&v);
  float a0, a1, b0, b1;
  RopeRotate(__low2float(lo), __low2float(hi), c0, s0, a0, b0);
  RopeRotate(__high2float(lo), __high2float(hi), c1, s1, a1, b1);
  lo = __halves2bfloat162(__float2bfloat16_rn(a0), __float2bfloat16_rn(a1));
  hi = __halves2bfloat162(__float2bfloat16_rn(b0), __float2bfloat16_rn(b1));
  u = *reinterpret_cast<const uint32_t*>(&lo);
  v = *reinterpret_cast<const uint32_t*>(&hi);
}

// kPackLo: the group fits in rows 0-7 (group <= 8), so rows 8-15 of P carry the low parts. kFuse:
// the RoPE and KV append of the new token are fused in (`r`; unused otherwise). The body of both
// kernels below.
template <int kHeadDim, bool kPackLo, bool kFuse>
__device__ __forceinline__ void DecodeAttention(const DecodeParams& p, const DecodeRopeParams& r) {
  PdlLaunchDependents();
  constexpr int kRow = RowElems<kHeadDim>();
  constexpr int kKSteps = kHeadDim / 16;                          // k-steps of Q K^T
  constexpr int kOTiles = kHeadDim / 8;                           // n-tiles of O
  constexpr int kChunksPerRow = kHeadDim / 8;                     // 16-byte pieces of one K row
  constexpr int kCopies = kWarpTile * kChunksPerRow / kWarpSize;  // per lane, K (and V)
  static_assert(kCopies >= 1 && kWarpTile * kChunksPerRow % kWarpSize == 0, "tile shape");
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

  // Step metadata (context lengths, block tables, positions, slots) is uploaded before the step's
  // first kernel and written by none, so it is read before PdlWait(); Q and the cache are read
  // after it.
  const int context = p.context_lens[seq];
  const int begin = split * p.partition_size;
  const int end = split == p.num_splits - 1 ? context : min(context, begin + p.partition_size);
  // Fused RoPE: the new token's cos/sin, for the rotations of q and k, computed (by the first
  // head_dim / 2 threads) once the prologue's copies are queued, from inputs loaded here.
  static_assert(kHeadDim / 2 <= kThreads, "one rotation pair per thread");
  __shared__ float rope_cs[kFuse ? 2 : 1][kFuse ? kHeadDim / 2 : 1];
  float rope_pos = 0.0f, rope_freq = 0.0f;
  auto fill_rope_cs = [&] {
    if (tid < kHeadDim / 2) RopeCosSin(rope_pos, rope_freq, rope_cs[0][tid], rope_cs[1][tid]);
    __syncthreads();
  };
  if constexpr (kFuse) {
    rope_pos = static_cast<float>(r.positions[seq]);
    if (tid < kHeadDim / 2) rope_freq = r.inv_freq[tid];
    if (context == 0) {  // a padding row reads nothing but appends as RoPE + append would
      fill_rope_cs();
      PdlWait();
      if (split == 0 && warp == 0) {
        NewToken<kHeadDim> token;
        token.Load(p, r, seq, kv_head, lane);
        token.Finish(r, rope_cs, lane, nullptr, nullptr);
      }
    }
  }
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
      const int t0 = first_tile + i * tile_stride;
      // Lane j < kWarpTile: cache slot of token t0 + j (garbage, never used, past the chunk).
      const int my_slot = block * p.block_size + (t0 + lane) % p.block_size;
      __nv_bfloat16* k_dst = stages + (i % kStages) * StageElems<kHeadDim>();
      __nv_bfloat16* v_dst = k_dst + kWarpTile * kRow;
#pragma unroll
      for (int c = 0; c < kCopies; ++c) {
        const int piece = c * kWarpSize + lane;
        const int row = piece / kChunksPerRow;
        const int d = (piece % kChunksPerRow) * 8;
        const int slot = __shfl_sync(0xffffffffu, my_slot, row);
        const long long offset = static_cast<long long>(slot) * slot_stride + head_offset;
        const bool valid = t0 + row < end;
        CpAsyncCg16(k_dst + row * kRow + d, p.k + offset + d, valid);
        CpAsyncCg16(v_dst + row * kRow + d, p.v + offset + d, valid);
      }
    }
    CpAsyncCommitGroup();
  };

  // Fused KV append: the warp whose tiles hold the new token (the last of the context) writes it
  // at its tile new_tile (-1: not this warp).
  const int last = context - 1;
  const int new_tile = kFuse && context > 0 && begin <= last && last < end &&
                               warp == (last - begin) / kWarpTile % kWarps
                           ? (last - begin) / tile_stride
                           : -1;

  int first_blocks[kStages];
#pragma unroll
  for (int i = 0; i < kStages; ++i) first_blocks[i] = load_block(i);
  PdlWait();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i, first_blocks[i]);
  NewToken<kHeadDim> token;
  if constexpr (kFuse) {
    if (new_tile >= 0) token.Load(p, r, seq, kv_head, lane);
    if (context != 0) fill_rope_cs();  // a padding row's was filled above
  }
  int next_block = first_blocks[kStages - 1];  // of warp tile i + kStages - 1 in iteration i

  // Q as the A operand: row r = query head head0 + r (zeros past the group).
  uint32_t q_frag[kKSteps][4];
  {
    const __nv_bfloat16* q_seq = p.q + static_cast<size_t>(seq) * p.q_row_stride;
    const bool valid0 = g < num_q;
    const bool valid1 = g + 8 < num_q;
    const uint32_t* row0 =
        reinterpret_cast<const uint32_t*>(q_seq + static_cast<size_t>(head0 + g) * kHeadDim);
    const uint32_t* row1 =
        reinterpret_cast<const uint32_t*>(q_seq + static_cast<size_t>(head0 + g + 8) * kHeadDim);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const int c = (kk * 16 + 2 * t) / 2;  // in bf16 pairs
      q_frag[kk][0] = valid0 ? row0[c] : 0u;
      q_frag[kk][1] = valid1 ? row1[c] : 0u;
      q_frag[kk][2] = valid0 ? row0[c + 4] : 0u;
      q_frag[kk][3] = valid1 ? row1[c + 4] : 0u;
    }
    if constexpr (kFuse) {
      // Dims kk * 16 + 2t (+1) in fragments 0-1 and +8 (+9) in 2-3 pair with the same dims of
      // k-step kk + kKSteps / 2 (head_dim / 2 further).
#pragma unroll
      for (int kk = 0; kk < kKSteps / 2; ++kk) {
#pragma unroll
        for (int f = 0; f < 4; f += 2) {
          const int d = kk * 16 + 2 * t + (f == 2 ? 8 : 0);
          const float c0 = rope_cs[0][d], s0 = rope_cs[1][d];
          const float c1 = rope_cs[0][d + 1], s1 = rope_cs[1][d + 1];
          RotatePacked(q_frag[kk][f], q_frag[kk + kKSteps / 2][f], c0, s0, c1, s1);
          RotatePacked(q_frag[kk][f + 1], q_frag[kk + kKSteps / 2][f + 1], c0, s0, c1, s1);
        }
      }
    }
  }

  float o[kOTiles][4];
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
  }
  float m0 = -INFINITY, m1 = -INFINITY;  // running max (log2 domain) of rows g and g + 8
  float l0 = 0.0f, l1 = 0.0f;            // this lane's part of the running sums

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
    if constexpr (kFuse) {
      if (i == new_tile) {  // the new token's row holds the slot's old bytes: replace them
        __nv_bfloat16* k_row = stages + (i % kStages) * StageElems<kHeadDim>() + (last - t0) * kRow;
        token.Finish(r, rope_cs, lane, k_row, k_row + kWarpTile * kRow);
        __syncwarp();
      }
    }
    const unsigned k_base = SharedAddress(k_tile);
    const unsigned v_base = k_base + kWarpTile * kRow * sizeof(__nv_bfloat16);

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
        s[j][e] = valid ? s[j][e] * p.scale_log2 : -INFINITY;
        max0 = fmaxf(max0, s[j][e]);
        if constexpr (!kPackLo) {
          s[j][e + 2] = valid ? s[j][e + 2] * p.scale_log2 : -INFINITY;
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
  CpAsyncWaitGroup<0>();    // no copy may land in the buffer the merge below reuses
  if constexpr (kPackLo) {  // fold the low parts (rows 8-15) into rows 0-7
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
      o[n][0] += o[n][2];
      o[n][1] += o[n][3];
    }
  }

  // Row sums over the quad, then the warps' triples through shared memory.
#pragma unroll
  for (int offset = 1; offset < 4; offset *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, offset);
    l1 += __shfl_xor_sync(0xffffffffu, l1, offset);
  }
  __syncthreads();                                // every warp is done with its pipeline stages
  float* s_acc = reinterpret_cast<float*>(smem);  // [kWarps][kMaxGroup][kHeadDim]
  float* s_ml = s_acc + kWarps * kMaxGroup * kHeadDim;  // [kWarps][kMaxGroup][2]
  float* acc0 = s_acc + (warp * kMaxGroup + g) * kHeadDim;
  float* acc1 = acc0 + 8 * kHeadDim;
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) {
    acc0[n * 8 + 2 * t] = o[n][0];
    acc0[n * 8 + 2 * t + 1] = o[n][1];
    acc1[n * 8 + 2 * t] = o[n][2];
    acc1[n * 8 + 2 * t + 1] = o[n][3];
  }
  if (t == 0) {
    s_ml[2 * (warp * kMaxGroup + g)] = m0;
    s_ml[2 * (warp * kMaxGroup + g) + 1] = l0;
    s_ml[2 * (warp * kMaxGroup + g + 8)] = m1;
    s_ml[2 * (warp * kMaxGroup + g + 8) + 1] = l1;
  }
  __syncthreads();
  for (int idx = tid; idx < num_q * kHeadDim; idx += kThreads) {
    const int r = idx / kHeadDim;
    const int d = idx % kHeadDim;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, s_ml[2 * (w * kMaxGroup + r)]);
    float out = 0.0f, l_all = 0.0f;
    if (m_all != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float scale = exp2f(s_ml[2 * (w * kMaxGroup + r)] - m_all);
        out = fmaf(s_acc[(w * kMaxGroup + r) * kHeadDim + d], scale, out);
        l_all = fmaf(s_ml[2 * (w * kMaxGroup + r) + 1], scale, l_all);
      }
    }
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

template <int kHeadDim, bool kPackLo>
__global__ void __launch_bounds__(kThreads) DecodeAttentionKernel(const DecodeParams p) {
  DecodeAttention<kHeadDim, kPackLo, false>(p, DecodeRopeParams{});
}

template <int kHeadDim, bool kPackLo>
__global__ void __launch_bounds__(kThreads)
    DecodeAttentionRopeKernel(const DecodeParams p, const DecodeRopeParams r) {
  DecodeAttention<kHeadDim, kPackLo, true>(p, r);
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

// Whether groups of at most 8 query heads take the packed-low-part kernel: on unless
// TANDEM_DECODE_PACK_LO=0 (read once; the A/B switch and its ctest variant).
bool PackLoEnabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("TANDEM_DECODE_PACK_LO");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return enabled;
}

// Launches `kernel` (one of the two above) with its shared memory opt-in.
template <int kHeadDim, typename Kernel, typename... Args>
cudaError_t LaunchWithSmem(Kernel kernel, std::atomic<uint64_t>& configured, const dim3 grid,
                           cudaStream_t stream, const Args&... args) {
  constexpr size_t kSmem = DecodeSmemBytes<kHeadDim>();
  if (const cudaError_t e = OptInDynamicSharedMemory(kernel, kSmem, configured); e != cudaSuccess) {
    return e;
  }
  LaunchKernel(kernel, grid, kThreads, kSmem, stream, args...);
  return cudaSuccess;
}

template <int kHeadDim, bool kPackLo>
cudaError_t LaunchMain(const DecodeParams& p, const DecodeRopeParams* rope, const dim3 grid,
                       cudaStream_t stream) {
  if (rope != nullptr) {
    static std::atomic<uint64_t> configured{0};
    return LaunchWithSmem<kHeadDim>(DecodeAttentionRopeKernel<kHeadDim, kPackLo>, configured, grid,
                                    stream, p, *rope);
  }
  static std::atomic<uint64_t> configured{0};
  return LaunchWithSmem<kHeadDim>(DecodeAttentionKernel<kHeadDim, kPackLo>, configured, grid,
                                  stream, p);
}

template <int kHeadDim>
cudaError_t Dispatch(const DecodeParams& p, const DecodeRopeParams* rope, int num_seqs,
                     cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_kv_heads * p.head_chunks),
                  static_cast<unsigned>(num_seqs), static_cast<unsigned>(p.num_splits));
  const cudaError_t e = p.group <= kMaxGroup / 2 && PackLoEnabled()
                            ? LaunchMain<kHeadDim, true>(p, rope, grid, stream)
                            : LaunchMain<kHeadDim, false>(p, rope, grid, stream);
  if (e != cudaSuccess) return e;
  if (p.num_splits > 1) {
    LaunchKernel(DecodeMergeKernel<kHeadDim>,
                 dim3(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_seqs)),
                 kHeadDim, 0, stream, p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchDecodeAttentionRaw(const void* q, int q_row_stride, const PagedLayerView& kv,
                                     const int32_t* context_lens, int num_seqs, int num_heads,
                                     float scale, void* out, void* workspace,
                                     const DecodeSplitPlan& plan, const DecodeRopeAppend* rope,
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
  DecodeRopeParams r{};
  if (rope != nullptr) {
    // One CTA per (sequence, KV head, split) must see every query head of the group.
    if (p.head_chunks != 1) return cudaErrorInvalidValue;
    r.positions = rope->positions;
    r.inv_freq = rope->inv_freq;
    r.slots = rope->slot_mapping;
    r.k = static_cast<__nv_bfloat16*>(const_cast<void*>(kv.k));
    r.v = static_cast<__nv_bfloat16*>(const_cast<void*>(kv.v));
  }
  const DecodeRopeParams* fused = rope != nullptr ? &r : nullptr;
  switch (kv.head_dim) {
    case 32:
      return Dispatch<32>(p, fused, num_seqs, stream);
    case 64:
      return Dispatch<64>(p, fused, num_seqs, stream);
    case 128:
      return Dispatch<128>(p, fused, num_seqs, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda::internal

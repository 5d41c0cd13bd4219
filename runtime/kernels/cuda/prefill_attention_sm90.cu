// Paged causal prefill attention on Hopper tensor cores (wgmma), head_dim 128: what
// LaunchPrefillAttentionRaw (prefill_attention.cu) runs on compute capability 9.0; other head
// dims and GPUs keep the mma.sync kernel. Same contract
// and numbers as that kernel: FlashAttention-2's online softmax with float32 statistics, P rounded
// to bf16 for the second product, rows past a sequence's new tokens not written.
//
// Grid: (query head pair, sequence, query tile of kBlockM = 64 new tokens), heaviest tiles first.
// A CTA is one warpgroup (4 warps, 16 query rows each) per query head, two heads of one KV head
// (one where the GQA group is odd). Per K/V tile of kBlockN keys (128 with paired heads, 64 with
// one head per CTA):
//   S = Q K^T: 8 wgmma.m64nNk16 with Q and K read by the tensor cores straight from shared memory
//     (no ldmatrix: the mma.sync kernel's limit was its shared-memory reads into registers); the
//     first k-step writes S without reading it (no zeroing moves);
//   the masks (only where a tile crosses the diagonal or the end of the keys), the online softmax
//     (row max and sum as four independent chains) and the lazy rescale of the mma.sync kernel,
//     on the S accumulators in registers;
//   O += P V: kBlockN / 16 wgmma.m64n128k16 with P from registers (the S accumulators re-packed
//     to bf16, the same fragment layout) and V from shared memory (MN-major, transposed by the
//     instruction).
// K/V tiles of the paged cache go through a ring of kStages stages in the 128-byte-swizzled
// operand layout (prefill_attention_sm90_layout.h), which the descriptors describe. Where it
// applies (kWs: paired heads, block_size % 16 == 0) a third, producer warpgroup loads them by TMA
// (boxes of 16-128 rows of one KV block from a per-layer tensor map) onto full / empty
// mbarriers, and the two consumer warpgroups only compute: the ninth session's ablation showed
// the cp.async gather by the consumers cost ~46 ms of the 235 ms 8K prefill; TMA took 5% off it.
// Otherwise the warpgroups gather with cp.async themselves and a fence.proxy.async after each
// tile lands makes the generic-proxy copies visible to the tensor cores' async proxy. Measured on
// the H200 and deleted (bench/RESULTS.md): overlapping the softmax of one tile with the products
// of the next inside a warpgroup (FlashAttention-3's intra-warpgroup pipelining), the two
// warpgroups half a tile apart or taking turns on named barriers (its ping-pong, 3-4% slower), a
// cp.async producer warpgroup, one head per CTA or 64-key tiles for even groups, 2 or 4-6 stages,
// a tile's copies all before or all after its QK^T.
//
// Compiled for sm_90a only (its own target): wgmma exists on no other architecture.

#include <cuda.h>  // CUtensorMap (its encoder comes through the runtime)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/mma_utils.cuh"
#include "runtime/kernels/cuda/model_kernels_internal.h"
#include "runtime/kernels/cuda/prefill_attention_common.cuh"
#include "runtime/kernels/cuda/prefill_attention_sm90_layout.h"
#include "runtime/kernels/cuda/tensor_map.h"
#include "runtime/kernels/cuda/wgmma_utils.cuh"

namespace tandem::cuda::internal {
namespace {

namespace sa = ::tandem::cuda::sm90_attention;

constexpr int kHeadDim = sa::kHeadDim;
constexpr int kBlockM = sa::kBlockM;
constexpr int kThreads = sa::kThreads;
constexpr int kMaxGridZ = 65535;
// kHeads query heads of one KV head per CTA, one warpgroup each, sharing every K/V tile: at 2 the
// K/V bytes the tiles pull from L2 halve (Nsight, Llama-3-8B shape at 8K: L2 74.7% busy with one
// head per CTA, 38% with two; the K/V of a sequence is re-read by each of its 64-row query
// tiles). K+V tile stages (32 KB each at 64 keys, 64 KB at 128): with one head (64-key tiles), 2
// keep a CTA at 82 KB of shared memory, so two CTAs (two warpgroups: one's softmax beside the
// other's products) share an SM; two heads are one CTA per SM either way (registers) and take 3
// (each tile load gets two tiles of time; 225 KB at 128 keys). Layout: kHeads Q tiles, kStages K
// tiles, kStages V tiles; +1024 to align the base to an atom.
template <int kStages, int kHeads, int kBlockN>
__host__ __device__ constexpr size_t SmemBytes() {
  return 1024 + size_t{sa::kTileBytes} * kHeads + size_t{sa::TileBytes(kBlockN)} * 2 * kStages;
}

// Issues S = Q K^T for a 128-key tile (m64n128, K = 128 dims in 8 steps; the first k-step only
// writes S: no zeroing moves) from the Q tile at q_base and the K tile at k_tile.
__device__ __forceinline__ void IssueQk128(float (&s)[64], uint32_t q_base, uint32_t k_tile) {
  WgmmaSs64x128<false>(
      s, sa::MakeDescriptor(q_base + sa::QkStepOffset(0), sa::kKMajorLbo, sa::kSbo),
      sa::MakeDescriptor(k_tile + sa::QkStepOffset(0, 128), sa::kKMajorLbo, sa::kSbo));
#pragma unroll
  for (int kk = 1; kk < kHeadDim / 16; ++kk) {
    WgmmaSs64x128<true>(
        s, sa::MakeDescriptor(q_base + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo),
        sa::MakeDescriptor(k_tile + sa::QkStepOffset(kk, 128), sa::kKMajorLbo, sa::kSbo));
  }
}

// Rows of one TMA box of the K/V cache: the most of 128, 64, 32, 16 that divides the block size
// (a box stays inside one block); the TMA producer needs block_size % 16 == 0.
__host__ __device__ __forceinline__ int TmaBoxRows(int block_size) {
  return block_size % 128 == 0 ? 128 : block_size % 64 == 0 ? 64 : block_size % 32 == 0 ? 32 : 16;
}

// One K/V tile's softmax step on the S accumulators of a warp (rows warp_pos0 + lane / 4, + 8;
// key0 the tile's first key): the causal / end-of-keys masks, the online softmax with the lazy
// rescale, P packed into the A fragments of P V, and O and the row sums rescaled.
template <int kBlockN>
__device__ __forceinline__ void SoftmaxTile(float (&s)[kBlockN / 2],
                                            uint32_t (&pa)[kBlockN / 16][4], float (&o)[64],
                                            float (&row_max)[2], float (&row_sum)[2],
                                            const int (&row_limit)[2], int key0, int warp_pos0,
                                            int lane, float scale_log2) {
  constexpr int kSRegs = kBlockN / 2;
  constexpr int kPSteps = kBlockN / 16;
  // Masks, only where the tile crosses the warp's diagonal (a tile crossing kv_end does too).
  if (sa::TileNeedsMask(key0, warp_pos0, kBlockN)) {
#pragma unroll
    for (int r = 0; r < kSRegs; ++r) {
      if (key0 + sa::AccCol(lane, r) >= row_limit[(r % 4) / 2]) s[r] = -INFINITY;
    }
  }

  // Online softmax with the lazy rescale of the mma.sync kernel (log2 domain). The row max and
  // sum run as kChains independent chains each (a warp has few neighbours on its scheduler to
  // hide a serial chain's latency behind; Nsight: 2 warps per scheduler, 0.5 eligible).
  constexpr int kChains = 4;
  float tile_max[2];
  bool raise = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mc[kChains];
#pragma unroll
    for (int c = 0; c < kChains; ++c) mc[c] = -INFINITY;
#pragma unroll
    for (int i = 0; i < kSRegs / 4; ++i) {
      mc[i % kChains] = fmaxf(mc[i % kChains], fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
    }
    float m = fmaxf(fmaxf(mc[0], mc[1]), fmaxf(mc[2], mc[3]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    tile_max[h] = m * scale_log2;
    raise |= tile_max[h] > row_max[h] + kRescaleSlack;
  }
  const bool rescale = __any_sync(0xffffffffu, raise);
  float alpha[2] = {1.0f, 1.0f};
  if (rescale) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float new_max = fmaxf(row_max[h], tile_max[h]);
      alpha[h] = FastExp2(row_max[h] - (new_max == -INFINITY ? 0.0f : new_max));
      row_max[h] = new_max;
      row_sum[h] *= alpha[h];
    }
  }
  float neg_base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) neg_base[h] = row_max[h] == -INFINITY ? 0.0f : -row_max[h];
  float sum[2][kChains] = {};
#pragma unroll
  for (int r = 0; r < kSRegs; ++r) {
    s[r] = FastExp2(fmaf(s[r], scale_log2, neg_base[(r % 4) / 2]));
    sum[(r % 4) / 2][(r / 4) % kChains] += s[r];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) row_sum[h] += (sum[h][0] + sum[h][1]) + (sum[h][2] + sum[h][3]);
#pragma unroll
  for (int kc = 0; kc < kPSteps; ++kc) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int at = sa::PIndex(kc, q);
      pa[kc][q] = PackBf16x2(s[at], s[at + 1]);
    }
  }
  if (rescale) {
#pragma unroll
    for (int r = 0; r < 64; ++r) o[r] *= alpha[(r % 4) / 2];
  }
}

// kBlockN keys per K/V tile: 64 (S = m64n64 per warpgroup) or 128 (m64n128: half the tiles, so
// half the per-tile barriers, waits, row-max shuffles and descriptor set-up per key).
//
// kWs (warp specialization, FlashAttention-3's loading): a third warpgroup, the producer, does
// every K/V load; it signals a stage's "full" mbarrier once its loads landed, and refills a stage
// after its "empty" mbarrier saw one arrival per consumer warp. The two consumer warpgroups issue
// no copy and meet no CTA barrier in the loop, so one's softmax runs beside the other's products
// without the per-tile lockstep. The producer's warp 0 loads every whole K/V tile by TMA (k_map /
// v_map: the layer's cache as [rows, KV heads, 128 dims], one box = TmaBoxRows rows of a block x
// 64 dims, 128-byte swizzled as the operands are; lane j issues box j), one arrive.expect_tx per
// tile on its full mbarrier; a last, partial tile is gathered by cp.async (zero-filled past the
// keys) by the whole producer warpgroup. Needs block_size % 16 == 0.
template <int kStages, int kHeads, int kBlockN, bool kWs = false>
__global__ void __launch_bounds__((kThreads * (kHeads + (kWs ? 1 : 0))),
                                  (kStages == 2 && kHeads == 1 && kBlockN == 64 ? 2 : 1))
    PrefillAttentionSm90Kernel(const PrefillParams p, const __grid_constant__ CUtensorMap k_map,
                               const __grid_constant__ CUtensorMap v_map) {
  static_assert(kBlockN == 64 || kBlockN == 128, "64- or 128-key tiles");
  constexpr int kKvTileBytes = sa::TileBytes(kBlockN);
  constexpr int kSRegs = kBlockN / 2;           // S accumulators per thread (m64nN)
  constexpr int kPSteps = kBlockN / 16;         // k-steps of P V
  constexpr int kRowsPerThread = kBlockN / 64;  // K/V rows this thread copies per tile
  static_assert(!kWs || (kHeads == 2 && kBlockN == 128), "warp specialization: paired, wide");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // full[kStages], then empty[kStages] (kWs only).
  __shared__ __align__(8) uint64_t bars[kWs ? 2 * kStages : 1];
  // Operand atoms must start on 1024-byte boundaries (descriptor base offset 0).
  const uint32_t base = (SharedAddress(smem_raw) + 1023u) & ~1023u;
  // Warpgroup wg owns query head blockIdx.x * kHeads + wg; wtid is its thread index in the
  // warpgroup, which every layout map of sa:: takes.
  const int wg = threadIdx.x / kThreads;
  const int wtid = threadIdx.x % kThreads;
  const uint32_t q_base = base + wg * sa::kTileBytes;
  const uint32_t k_base = base + kHeads * sa::kTileBytes;   // stage s: + s * kKvTileBytes
  const uint32_t v_base = k_base + kStages * kKvTileBytes;  // stage s: + s * kKvTileBytes

  // The producer warpgroup (wg == kHeads, kWs only) has no head of its own.
  const int kv_head = blockIdx.x * kHeads / p.group;
  const int head = blockIdx.x * kHeads + wg;
  PrefillTile cta;
  if (!LocatePrefillTile(p, kBlockM, cta)) return;
  const uint32_t full0 = SharedAddress(bars);
  const uint32_t empty0 = full0 + 8 * kStages;
  if constexpr (kWs) {
    if (threadIdx.x == 0) {
      for (int st = 0; st < kStages; ++st) {
        MbarInit(full0 + 8 * st, kWarpSize);                       // producer warp 0
        MbarInit(empty0 + 8 * st, kHeads * kThreads / kWarpSize);  // every consumer warp
      }
      FenceMbarrierInit();
    }
    __syncthreads();  // the kernel's only CTA barrier
  }
  const int seq = cta.seq, row_begin = cta.row_begin, num_new = cta.num_new, q0 = cta.q0;
  const int start = cta.start;
  const int kv_end = sa::KvEnd(start, q0, num_new);  // keys this CTA needs: [0, kv_end)
  const int num_tiles = sa::NumTiles(kv_end, kBlockN);

  const int tid = wtid;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  // This thread's rows (accumulator h = 0, 1): CTA rows 16 warp + lane / 4 (+ 8); the keys they
  // see are [0, row_limit[h]).
  const int warp_pos0 = sa::WarpPos0(start, q0, warp);
  int row_limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) row_limit[h] = sa::RowLimit(warp_pos0, lane, h, kv_end);

  // K/V loads: this thread copies chunks KvLoadChunk(tid, i) of key rows KvLoadRow(tid, i) of a
  // tile (kRowsPerThread rows), of K and V with one head per CTA, else of K (warpgroup 0) or V
  // (warpgroup 1). Slots are cache rows (-1: past kv_end, zero-filled).
  const int table_offset = seq * p.max_blocks_per_seq;
  const size_t head_offset = static_cast<size_t>(kv_head) * kHeadDim;
  struct Slots {
    int row[kRowsPerThread];
  };
  const auto slots_of_tile = [&](int tile) {
    Slots sl;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const int key = tile * kBlockN + sa::KvLoadRow(tid, 8 * j);
      if (key >= kv_end) {
        sl.row[j] = -1;
      } else if (p.block_shift >= 0) {  // power-of-two blocks: no integer division
        sl.row[j] = (p.block_tables[table_offset + (key >> p.block_shift)] << p.block_shift) +
                    (key & (p.block_size - 1));
      } else {
        sl.row[j] =
            p.block_tables[table_offset + key / p.block_size] * p.block_size + key % p.block_size;
      }
    }
    return sl;
  };
  // The copy loop in registers plus immediates (layout header: KvRowBase, KvSwizzle): chunk
  // 2 k + 8 a of this thread's rows lands at row_base + swizzle[k] + a * atom (+ 8 groups for the
  // second row), from element 8 (tid % 2) + 16 k + 64 a of the row.
  const uint32_t row_base = static_cast<uint32_t>(sa::KvRowBase(tid));
  uint32_t swizzle[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) swizzle[k] = static_cast<uint32_t>(sa::KvSwizzle(tid, k));
  // Paired heads: warpgroup 0 copies K, warpgroup 1 V (`mine`); one head: this thread copies both.
  const __nv_bfloat16* const k_src = p.k + head_offset + 8 * (tid % 2);
  const __nv_bfloat16* const v_src = p.v + head_offset + 8 * (tid % 2);
  const __nv_bfloat16* const mine_src = wg == 0 ? k_src : v_src;
  const uint32_t mine_base = (wg == 0 ? k_base : v_base) + row_base;
  // Copies rows j0 .. j1 - 1 of this thread's kRowsPerThread rows of a tile.
  const auto load_kv = [&](int stage, const Slots& sl, int j0, int j1) {
    const uint32_t k_dst = k_base + stage * kKvTileBytes + row_base;
    const uint32_t v_dst = v_base + stage * kKvTileBytes + row_base;
    const uint32_t mine_dst = mine_base + stage * kKvTileBytes;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      if (j < j0 || j >= j1) continue;
      const int slot = sl.row[j];
      const size_t row_offset =
          slot >= 0 ? static_cast<size_t>(slot) * p.num_kv_heads * kHeadDim : 0;
#pragma unroll
      for (int a = 0; a < 2; ++a) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t at = swizzle[k] + a * sa::AtomBytes(kBlockN) + j * 8 * sa::kGroupBytes;
          const int elem = 16 * k + 64 * a;
          if constexpr (kHeads == 1 || kWs) {
            CpAsync16(k_dst + at, k_src + row_offset + elem, slot >= 0);
            CpAsync16(v_dst + at, v_src + row_offset + elem, slot >= 0);
          } else {
            CpAsync16(mine_dst + at, mine_src + row_offset + elem, slot >= 0);
          }
        }
      }
    }
  };

  if constexpr (kWs) {
    if (wg == kHeads) {
      // Warp 0 loads the whole tiles: lane j < boxes owns box j of a tile (TmaBoxRows keys; its
      // block table lookup a tile ahead, its K and V boxes, both 64-dim halves); lane 0 first
      // adds the tile's bytes to its full mbarrier, then every lane arrives (32 arrivals a
      // phase). Warps 1-3 wait on named barrier 5 for a last, partial tile, which all four gather
      // by cp.async (zero-filled past the keys); named barrier 6 orders their landed copies
      // before warp 0's arrivals. Without a partial tile they leave at once.
      const int box_rows = TmaBoxRows(p.block_size);
      const int boxes = kBlockN / box_rows;
      const int pwarp = tid / kWarpSize;
      const int whole = kv_end / kBlockN;  // tiles [0, whole) are whole
      const bool has_tail = whole < num_tiles;
      if (pwarp == 0) {
        if (lane == 0) {
          PrefetchTensorMap(&k_map);
          PrefetchTensorMap(&v_map);
        }
        const auto lookup = [&](int t) {
          const int key = t * kBlockN + box_rows * lane;
          if (lane >= boxes || t >= whole) return 0;
          return p.block_shift >= 0
                     ? (p.block_tables[table_offset + (key >> p.block_shift)] << p.block_shift) +
                           (key & (p.block_size - 1))
                     : p.block_tables[table_offset + key / p.block_size] * p.block_size +
                           key % p.block_size;
        };
        int box_row = lookup(0);
        for (int t = 0; t < whole; ++t) {
          const int stage = t % kStages;
          const uint32_t full = full0 + 8 * stage;
          if (t >= kStages) MbarWait(empty0 + 8 * stage, ((t / kStages) - 1) & 1);
          if (lane == 0) MbarArriveExpectTx(full, 2 * kKvTileBytes);
          __syncwarp();
          if (lane < boxes) {
            const uint32_t at = stage * kKvTileBytes + lane * box_rows * 128;
#pragma unroll
            for (int a = 0; a < 2; ++a) {
              const uint32_t atom = at + a * sa::AtomBytes(kBlockN);
              TmaLoad3d(k_base + atom, &k_map, 64 * a, kv_head, box_row, full);
              TmaLoad3d(v_base + atom, &v_map, 64 * a, kv_head, box_row, full);
            }
          }
          if (lane != 0) MbarArrive(full);
          box_row = lookup(t + 1);
        }
      }
      if (!has_tail) return;
      const int t = num_tiles - 1;
      const int stage = t % kStages;
      if (pwarp == 0) {
        if (t >= kStages) MbarWait(empty0 + 8 * stage, ((t / kStages) - 1) & 1);
        NamedBarrierArrive(5, kThreads);
      } else {
        NamedBarrierSync(5, kThreads);
      }
      load_kv(stage, slots_of_tile(t), 0, kRowsPerThread);
      CpAsyncCommitGroup();
      CpAsyncWaitGroup<0>();
      FenceProxyAsyncShared();
      NamedBarrierSync(6, kThreads);
      if (pwarp == 0) MbarArrive(full0 + 8 * stage);
      return;
    }
  }
  // Q tile (rows past the sequence are zeros), then (without kWs) the first kStages - 1 K/V tiles.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = sa::QLoadRow(tid);
    const int chunk = sa::QLoadChunk(tid, i);
    const bool valid = q0 + r < num_new;
    const __nv_bfloat16* src =
        p.q + static_cast<size_t>(row_begin + q0 + (valid ? r : 0)) * p.q_row_stride +
        head * kHeadDim + chunk * 8;
    CpAsync16(q_base + sa::TileOffset(r, chunk), src, valid);
  }
  CpAsyncCommitGroup();
  Slots ahead{};
  if constexpr (kWs) {
    // This warpgroup's Q tile, visible to its tensor cores.
    CpAsyncWaitGroup<0>();
    FenceProxyAsyncShared();
    NamedBarrierSync(1 + wg, kThreads);
  } else {
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < num_tiles) load_kv(st, slots_of_tile(st), 0, kRowsPerThread);
      CpAsyncCommitGroup();
    }
    ahead = slots_of_tile(kStages - 1);
  }

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
  const float scale_log2 = p.scale_log2;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % kStages;
    if constexpr (kWs) MbarWait(full0 + 8 * stage, (tile / kStages) & 1);
    // Groups so far: Q, kStages - 1 prologue tiles, one per earlier iteration; at most
    // kStages - 2 pending means this tile (and Q) landed. Then make this thread's copies visible
    // to the async proxy, and wait for every thread's (and for every warp to be done with the
    // stage refilled below).
    if constexpr (!kWs) {
      CpAsyncWaitGroup<kStages - 2>();
      FenceProxyAsyncShared();
      __syncthreads();
    }
    // The next tile's copies, into the stage the barrier just freed (one commit group per
    // iteration): with two rows per thread (128-key tiles) the first row while QK^T runs on the
    // tensor cores and the second while P V does; with one, all while QK^T runs. (All before
    // QK^T, in one burst of every warp, stalled the warps on the LSU queue: Nsight at 8K,
    // lg_throttle, 1.6 cycles per instruction.)
    const Slots next = ahead;
    const bool has_next = tile + kStages - 1 < num_tiles;
    const int next_stage = (tile + kStages - 1) % kStages;
    if constexpr (!kWs) ahead = slots_of_tile(tile + kStages);
    const auto copy_rows = [&](int j0, int j1, bool commit) {
      if constexpr (!kWs) {
        if (has_next) load_kv(next_stage, next, j0, j1);
        if (commit) CpAsyncCommitGroup();
      }
    };
    constexpr bool kSplit = kRowsPerThread > 1;

    // S = Q K^T (raw scores), m64nN, K = 128 dims in 8 steps.
    const uint32_t k_tile = k_base + stage * kKvTileBytes;
    float s[kSRegs];
    WgmmaFence();
    if constexpr (kBlockN == 64) {
#pragma unroll
      for (int i = 0; i < kSRegs; ++i) s[i] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        WgmmaSs64x64(s, sa::MakeDescriptor(q_base + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo),
                     sa::MakeDescriptor(k_tile + sa::QkStepOffset(kk), sa::kKMajorLbo, sa::kSbo),
                     kk > 0 ? 1 : 0);
      }
    } else {
      IssueQk128(s, q_base, k_tile);
    }
    WgmmaCommit();
    copy_rows(0, kSplit ? 1 : kRowsPerThread, !kSplit);
    WgmmaWaitAll();
    FenceRegisters(s);

    uint32_t pa[kPSteps][4];
    SoftmaxTile<kBlockN>(s, pa, o, row_max, row_sum, row_limit, tile * kBlockN, warp_pos0, lane,
                         scale_log2);
    // O += P V, m64n128, K = kBlockN keys in kPSteps steps.
    const uint32_t v_tile = v_base + stage * kKvTileBytes;
    WgmmaFence();
#pragma unroll
    for (int kc = 0; kc < kPSteps; ++kc) {
      WgmmaRs64x128(o, pa[kc],
                    sa::MakeDescriptor(v_tile + sa::PvStepOffset(kc), sa::VLbo(kBlockN), sa::kSbo));
    }
    WgmmaCommit();
    if constexpr (kSplit) copy_rows(1, kRowsPerThread, true);
    WgmmaWaitAll();
    FenceRegisters(o);
    if constexpr (kWs) {
      // This warp's products are done with the stage's K and V.
      __syncwarp();
      if (lane == 0) MbarArrive(empty0 + 8 * stage);
    }
  }

  // Full row sums over the quad, normalize, store the valid rows.
  const size_t out_stride = static_cast<size_t>(p.num_heads) * kHeadDim;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int i = q0 + sa::AccRow(warp, lane, 2 * h);
    if (i >= num_new) continue;
    __nv_bfloat16* out_row =
        p.out + static_cast<size_t>(row_begin + i) * out_stride + head * kHeadDim + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      *reinterpret_cast<uint32_t*>(out_row + 8 * j) =
          PackBf16x2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    }
  }
}

// One layer's K or V cache, [num_slots rows, num_kv_heads, 128 dims] bf16, as a tensor map of
// 64-dim x 1-head x box_rows-row boxes, 128-byte swizzle. False when the encoder is missing or
// refuses.
bool EncodeCacheMap(CUtensorMap* map, const void* data, int num_kv_heads, int64_t num_slots,
                    int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr || num_slots <= 0 || num_slots > (int64_t{1} << 32)) return false;
  const cuuint64_t dims[3] = {kHeadDim, static_cast<cuuint64_t>(num_kv_heads),
                              static_cast<cuuint64_t>(num_slots)};
  const cuuint64_t strides[2] = {kHeadDim * 2,
                                 static_cast<cuuint64_t>(num_kv_heads) * kHeadDim * 2};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(data), dims, strides,
                box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int kStages, int kHeads, int kBlockN = 64, bool kWs = false>
cudaError_t LaunchShape(const PrefillParams& p, dim3 grid, cudaStream_t stream,
                        const CUtensorMap& k_map = {}, const CUtensorMap& v_map = {}) {
  constexpr size_t kSmem = SmemBytes<kStages, kHeads, kBlockN>();
  static_assert(kSmem <= 227 * 1024 - 64, "shared memory per CTA (with the mbarriers)");
  static std::atomic<uint64_t> configured{0};
  const auto kernel = PrefillAttentionSm90Kernel<kStages, kHeads, kBlockN, kWs>;
  if (const cudaError_t e = OptInDynamicSharedMemory(kernel, kSmem, configured); e != cudaSuccess) {
    return e;
  }
  grid.x /= kHeads;
  kernel<<<grid, kThreads*(kHeads + (kWs ? 1 : 0)), kSmem, stream>>>(p, k_map, v_map);
  return cudaGetLastError();
}

}  // namespace

// The shapes measured fastest on the H200 (bench/RESULTS.md, ninth session): where the GQA group
// is even, two query heads per CTA, 128-key tiles and 3 stages, warp-specialized with the TMA
// producer when block_size % 16 == 0 and the cache's tensor maps encode, the consumers gathering
// their own tiles otherwise; one head per CTA, 64-key tiles and 2 stages (two CTAs per SM) where
// the group is odd.
cudaError_t LaunchPrefillAttentionSm90(const PrefillParams& p, int num_seqs, int max_new_tokens,
                                       int64_t num_slots, cudaStream_t stream) {
  const int q_tiles = static_cast<int>(CeilDiv(max_new_tokens, kBlockM));
  if (q_tiles > kMaxGridZ || !p.q_vector || !p.out_vector) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_seqs),
                  static_cast<unsigned>(q_tiles));
  if (p.group % 2 != 0) return LaunchShape<2, 1>(p, grid, stream);
  if (p.block_size % 16 == 0) {
    CUtensorMap k_map, v_map;
    const int box_rows = TmaBoxRows(p.block_size);
    if (EncodeCacheMap(&k_map, p.k, p.num_kv_heads, num_slots, box_rows) &&
        EncodeCacheMap(&v_map, p.v, p.num_kv_heads, num_slots, box_rows)) {
      return LaunchShape<3, 2, 128, true>(p, grid, stream, k_map, v_map);
    }
  }
  return LaunchShape<3, 2, 128>(p, grid, stream);
}

}  // namespace tandem::cuda::internal

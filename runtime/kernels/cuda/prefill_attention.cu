// Paged causal prefill attention on tensor cores (contract: model_kernels.h,
// LaunchPrefillAttention). FlashAttention-2 structure with mma.sync.m16n8k16 (bf16 in, f32 out).
//
// Grid: (query head, sequence, query tile of kBlockM = 128 new tokens). Blocks start in linear
// order, head fastest, and the tile index is reversed, so every head's heaviest tiles (last rows,
// most keys) start first and the light ones fill the tail. Heads sharing a KV head are adjacent,
// so their K/V reads meet in L2.
//
// A CTA of 8 warps owns 128 query rows, 16 per warp (one m16 tile), so every K/V tile in shared
// memory serves 128 rows while each thread needs at most 128 registers: two CTAs per SM give 16
// warps (4 per scheduler) to hide the mma, ldmatrix and MUFU latencies. A CTA walks the keys
// [0, last position of its rows] in tiles of kBlockN = 64 through a ring of kStages K+V buffers
// (the V stages after the K stages) filled by cp.async, 4 threads per tile row: tile
// j + kStages - 1 is requested at the top of tile j's iteration, behind the one barrier per tile,
// so kStages - 1 tiles are in flight while tile j computes. The paged cache is gathered through
// slot indices (block * block_size + offset): each thread reads the block table for its row of tile
// j + kStages during tile j and keeps the slot in a register, so loads never wait on the table.
// Shared rows are padded by 16 bytes, which makes every ldmatrix (8 rows of one 16-byte column)
// and every cp.async row write conflict-free.
//
// Per warp and step of kSubN = 64 keys (one tile):
//   S = Q K^T: Q fragments stay in registers for head_dim <= 64 and are re-read with ldmatrix
//   from the CTA's Q tile for head_dim 128 (no room for them next to O and S);
//   K fragments by ldmatrix (non-transposed).
//   Mask only where needed: a warp masks a step only if it crosses the warp's causal diagonal
//   (which any step crossing the kv_end edge does), and skips a step that none of its rows can
//   see (equivalent to all -inf).
//   Online softmax on the S accumulators in registers: P = exp2(s * scale_log2 - base), one FFMA
//   and one MUFU per score (the scale folded into the exponent). The exponent base of a row is
//   its running maximum (log2 domain), but it is raised only when a step's maximum exceeds it by
//   more than kRescaleSlack for some row of the warp; then the warp rescales O and the sums.
//   Usually only a row's first step does, so O is rarely rescaled; P stays <= 2^kRescaleSlack.
//   O += P V: P re-packed from the S accumulators to bf16 A fragments without shared memory,
//   V fragments with ldmatrix.trans.
// Accumulation and softmax statistics are float32; P is rounded to bf16 for the second product,
// as FlashAttention does (the relative rounding does not depend on the base); the row sums use
// the float32 P. Rows past a sequence's new tokens read zero Q and are not written; a row that
// has seen nothing yet keeps exponent base 0.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/kernel_utils.cuh"
#include "runtime/kernels/cuda/mma_utils.cuh"
#include "runtime/kernels/cuda/model_kernels_internal.h"
#include "runtime/kernels/cuda/prefill_attention_common.cuh"

namespace tandem::cuda::internal {
namespace {

constexpr int kBlockM = 128;  // query rows per CTA
constexpr int kBlockN = 64;   // keys per tile
constexpr int kPad = 8;       // bf16 elements of padding per shared row (16 bytes)
constexpr int kMaxGridZ = 65535;

template <int kHeadDim>
struct Config {
  // 8 warps of one m16 tile each: at most 128 registers per thread, so two CTAs (16 warps, 4 per
  // scheduler) share an SM and hide each other's mma, ldmatrix and MUFU latencies.
  static constexpr int kWarps = 8;
  static constexpr int kMinBlocks = 2;  // CTAs per SM the register budget is sized for
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kMTiles = kBlockM / (16 * kWarps);  // m16 tiles per warp
  static constexpr int kWarpRows = 16 * kMTiles;           // query rows per warp
  static constexpr int kLoadThreads = kThreads / kBlockN;  // threads per K/V tile row
  static constexpr int kStride = kHeadDim + kPad;          // shared row stride, elements
  // Q fragments (kHeadDim / 4 registers per m-tile) stay in registers where they fit next to O.
  static constexpr bool kQInRegs = kHeadDim <= 64;
  // Two K+V stages for head_dim 128 keep two CTAs per SM (~102 KiB each); more for smaller dims.
  static constexpr int kStages = kHeadDim == 128 ? 2 : 3;
  // Keys per softmax step: the whole tile. For head_dim 128, S of 64 keys (32 registers) next to
  // O (64) fits the 128-register budget only with Q re-read from shared memory; 32-key steps
  // (kSubN = 32) would also fit, with twice the Q reads and row reductions per tile.
  static constexpr int kSubN = kBlockN;
  static constexpr int kQElems = kBlockM * kStride;
  static constexpr int kTileElems = kBlockN * kStride;
  static constexpr size_t kSmemBytes = sizeof(__nv_bfloat16) * (kQElems + 2 * kStages * kTileElems);
};

__device__ __forceinline__ void CpAsync16(unsigned smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
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

// Cache slot (block * block_size + offset) of key `key`, or -1 past kv_end.
__device__ __forceinline__ int KeySlot(const int32_t* table, int block_size, int key, int kv_end) {
  if (key >= kv_end) return -1;
  return table[key / block_size] * block_size + key % block_size;
}

// Requests this thread's part of one cached row (K and V): thread c of the kLoadThreads threads
// of a row copies the 16-byte chunks c, c + kLoadThreads, ..., so the threads of a row read whole
// sectors together. An invalid row (past kv_end) is filled with zeros, so the P V product never
// meets stale or NaN values.
template <int kHeadDim, int kLoadThreads>
__device__ __forceinline__ void LoadKvRow(unsigned dst_k, unsigned dst_v, const __nv_bfloat16* k,
                                          const __nv_bfloat16* v, bool valid) {
  static_assert(kHeadDim % (8 * kLoadThreads) == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < kHeadDim / (8 * kLoadThreads); ++i) {
    CpAsync16(dst_k + 16 * kLoadThreads * i, k + 8 * kLoadThreads * i, valid);
    CpAsync16(dst_v + 16 * kLoadThreads * i, v + 8 * kLoadThreads * i, valid);
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(Config<kHeadDim>::kThreads, Config<kHeadDim>::kMinBlocks)
    PrefillAttentionKernel(const PrefillParams p) {
  using Cfg = Config<kHeadDim>;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kMTiles = Cfg::kMTiles;
  constexpr int kWarpRows = Cfg::kWarpRows;
  constexpr int kLoadThreads = Cfg::kLoadThreads;
  constexpr int kStride = Cfg::kStride;
  constexpr int kStages = Cfg::kStages;
  constexpr int kKSteps = kHeadDim / 16;  // k-steps of Q K^T
  constexpr int kSubN = Cfg::kSubN;
  constexpr int kSTiles = kSubN / 8;     // n-tiles of S
  constexpr int kOTiles = kHeadDim / 8;  // n-tiles of O
  static_assert(kKSteps % 2 == 0 && kOTiles % 2 == 0, "fragment pairs");

  static_assert(kThreads % kBlockN == 0 && kBlockM % kBlockN == 0, "whole threads per tile row");
  static_assert(kBlockM == Cfg::kWarps * kWarpRows, "warps cover the CTA's rows");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* s_k = s_q + Cfg::kQElems;
  // Shared addresses below are in bytes; kRowBytes per row, kTileBytes per K or V stage.
  constexpr int kRowBytes = kStride * 2;
  constexpr int kTileBytes = Cfg::kTileElems * 2;

  const int head = blockIdx.x;
  const int kv_head = head / p.group;
  PrefillTile cta;
  if (!LocatePrefillTile(p, kBlockM, cta)) return;
  const int seq = cta.seq, row_begin = cta.row_begin, num_new = cta.num_new, q0 = cta.q0;
  const int start = cta.start;
  const int kv_end = start + min(q0 + kBlockM, num_new);  // keys this CTA needs: [0, kv_end)
  const int num_tiles = (kv_end + kBlockN - 1) / kBlockN;

  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int g = lane / 4;                       // mma group: rows g and g + 8 of an m16 tile
  const int t = lane % 4;                       // thread in group: columns 2t, 2t + 1 (+ 8)
  const int warp_row0 = q0 + warp * kWarpRows;  // new-token index of the warp's first row
  // Position of the warp's first row, and the keys its rows see: [0, warp_end) (empty for a warp
  // without rows). A warp with rows has warp_pos0 < kv_end.
  const int warp_pos0 = start + warp_row0;
  const int warp_end = warp_row0 < num_new ? min(warp_pos0 + kWarpRows, kv_end) : 0;
  // Per row of this thread (index 2 * mt + h: row mt * 16 + g + 8 h of the warp): the keys it
  // sees are [0, row_limit + 2 t), so column 2 t + e of a step at key0 is visible iff
  // e < row_limit - key0.
  int row_limit[2 * kMTiles];
#pragma unroll
  for (int r = 0; r < 2 * kMTiles; ++r) {
    row_limit[r] = min(warp_pos0 + (r / 2) * 16 + (r % 2) * 8 + g + 1, kv_end) - 2 * t;
  }

  // Loads: thread tid copies part tid % kLoadThreads of tile row tid / kLoadThreads (and of Q
  // rows tid / kLoadThreads + 64 j).
  const int load_row = tid / kLoadThreads;
  const int load_col = (tid % kLoadThreads) * 8;  // elements
  // Per-thread load state is kept small (O and S need nearly all registers for head_dim 128):
  // K and V share offsets, the V stage is at a fixed distance from the K stage, and the kernel
  // parameters are read at each use.
  const int head_offset = kv_head * kHeadDim + load_col;  // elements within a cache slot
  const int table_offset = seq * p.max_blocks_per_seq;
  const unsigned kv_load_dst = SharedAddress(s_k + load_row * kStride + load_col);
  constexpr unsigned kVFromK = kStages * kTileBytes;  // bytes from a K stage to its V stage
  // Requests tile `tile` (its row of this thread at cache slot `slot`, -1: past kv_end) into
  // stage `stage`.
  const auto load_kv = [&](int stage, int slot) {
    const size_t offset =
        (slot >= 0 ? static_cast<size_t>(slot) * p.num_kv_heads * kHeadDim : 0) + head_offset;
    const unsigned dst = kv_load_dst + stage * kTileBytes;
    LoadKvRow<kHeadDim, kLoadThreads>(dst, dst + kVFromK, p.k + offset, p.v + offset, slot >= 0);
  };
  const auto slot_of_tile = [&](int tile) {
    return KeySlot(p.block_tables + table_offset, p.block_size, tile * kBlockN + load_row, kv_end);
  };

  // Q tile (rows past the sequence are zeros), then the first kStages - 1 K/V tiles.
#pragma unroll
  for (int j = 0; j < kBlockM / kBlockN; ++j) {
    const int r = load_row + j * kBlockN;
    const bool valid = q0 + r < num_new;
    const __nv_bfloat16* src =
        p.q + static_cast<size_t>(row_begin + q0 + (valid ? r : 0)) * p.q_row_stride +
        head * kHeadDim + load_col;
    __nv_bfloat16* dst = s_q + r * kStride + load_col;
#pragma unroll
    for (int i = 0; i < kHeadDim / (8 * kLoadThreads); ++i) {
      const int col = 8 * kLoadThreads * i;
      if (p.q_vector) {
        CpAsync16(SharedAddress(dst + col), src + col, valid);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          dst[col + e] = valid ? src[col + e] : __float2bfloat16_rn(0.0f);
        }
      }
    }
  }
  CpAsyncCommit();
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < num_tiles) load_kv(st, slot_of_tile(st));
    CpAsyncCommit();
  }
  // Slot of this thread's row of the next tile to request (tile kStages - 1 in iteration 0).
  int ahead_slot = slot_of_tile(kStages - 1);

  // Q fragments (A operand) of m-tile mt, k-step kk: rows warp_row0 + mt * 16 + (lane % 16),
  // columns kk * 16 + (lane / 16) * 8 give a[0..3] in mma order.
  const unsigned q_frag_row =
      SharedAddress(s_q + (warp * kWarpRows + lane % 16) * kStride + (lane / 16) * 8);
  // K and V fragments, one ldmatrix per 16 x 16 block: matrices (keys +0..7, dims +0..7),
  // (keys +0..7, dims +8..15), (keys +8..15, dims +0..7), (keys +8..15, dims +8..15). For K (one
  // k-step, two n-tiles of keys) that is b0, b1 of the first n-tile, then of the second; for V
  // (ldmatrix.trans: one k-step of keys, two n-tiles of dims) b0, b0', b1, b1'. V uses the same
  // lane addresses at kVFromK bytes, so one register serves both.
  const unsigned kv_frag_row =
      SharedAddress(s_k + ((lane / 16) * 8 + lane % 8) * kStride + ((lane / 8) % 2) * 8);
  uint32_t q_frag[Cfg::kQInRegs ? kMTiles : 1][Cfg::kQInRegs ? kKSteps : 1][4];
  if constexpr (Cfg::kQInRegs) {
    CpAsyncWait<kStages - 1>();  // the Q group
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        LdMatrixX4(q_frag[mt][kk], q_frag_row + mt * 16 * kRowBytes + kk * 32);
      }
    }
  }

  float o[kMTiles][kOTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][n][e] = 0.0f;
    }
  }
  // Exponent base of each of this thread's four rows (log2 domain: raw score * scale_log2) and
  // this thread's part of the row's running sum; index 2 * mt + h is row mt * 16 + g + 8 h of
  // the warp. The base is the row's running maximum, raised lazily (see kRescaleSlack).
  float row_max[2 * kMTiles], row_sum[2 * kMTiles];
#pragma unroll
  for (int r = 0; r < 2 * kMTiles; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
  }
  const float scale_log2 = p.scale_log2;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % kStages;
    // This tile's K and V have landed (and Q, the first time); every warp is done with the
    // previous tile's stage, which the request below refills.
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    // Request tile + kStages - 1; start reading the table for the tile after it (its value is
    // first used in the next iteration).
    if (tile + kStages - 1 < num_tiles) load_kv((tile + kStages - 1) % kStages, ahead_slot);
    CpAsyncCommit();
    ahead_slot = slot_of_tile(tile + kStages);

#pragma unroll
    for (int sub = 0; sub < kBlockN / kSubN; ++sub) {
      // Skip a sub-tile that no row of this warp can see (equivalent to all -inf).
      const int key0 = tile * kBlockN + sub * kSubN;
      if (key0 >= warp_end) continue;
      const unsigned stage_bytes = stage * kTileBytes + sub * kSubN * kRowBytes;

      // S = Q K^T (raw scores).
      float s[kMTiles][kSTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int n = 0; n < kSTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][n][e] = 0.0f;
        }
      }
      const unsigned k_row = kv_frag_row + stage_bytes;
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t a_smem[Cfg::kQInRegs ? 1 : kMTiles][4];
        if constexpr (!Cfg::kQInRegs) {
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            LdMatrixX4(a_smem[mt], q_frag_row + mt * 16 * kRowBytes + kk * 32);
          }
        }
#pragma unroll
        for (int n = 0; n < kSTiles; n += 2) {
          uint32_t b[4];
          LdMatrixX4(b, k_row + n * 8 * kRowBytes + kk * 32);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            if constexpr (Cfg::kQInRegs) {
              MmaBf16(s[mt][n], q_frag[mt][kk], b[0], b[1]);
              MmaBf16(s[mt][n + 1], q_frag[mt][kk], b[2], b[3]);
            } else {
              MmaBf16(s[mt][n], a_smem[mt], b[0], b[1]);
              MmaBf16(s[mt][n + 1], a_smem[mt], b[2], b[3]);
            }
          }
        }
      }

      // Mask keys past a row's position or past kv_end, only in steps that cross the warp's
      // diagonal (kv_end >= warp_pos0 + 1, so a step crossing the kv_end edge crosses it too).
      if (key0 + kSubN - 1 > warp_pos0) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int limit = row_limit[2 * mt + h] - key0;  // visible: n * 8 + e < limit
#pragma unroll
            for (int n = 0; n < kSTiles; ++n) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                if (n * 8 + e >= limit) s[mt][n][2 * h + e] = -INFINITY;
              }
            }
          }
        }
      }

      // Row maxima of the tile in the log2 domain (scale_log2 > 0 commutes with the maximum, and
      // the product is rounded once either way).
      float tile_max[2 * kMTiles];
      bool raise = false;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float m = fmaxf(s[mt][0][2 * h], s[mt][0][2 * h + 1]);
#pragma unroll
          for (int n = 1; n < kSTiles; ++n) {
            m = fmaxf(m, fmaxf(s[mt][n][2 * h], s[mt][n][2 * h + 1]));
          }
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
          tile_max[2 * mt + h] = m * scale_log2;
          // A row with nothing visible so far (base -inf) that sees a key here always raises.
          raise |= tile_max[2 * mt + h] > row_max[2 * mt + h] + kRescaleSlack;
        }
      }
      // Raise the bases to the running maxima only when some row of the warp would otherwise
      // see exponentials above 2^kRescaleSlack; then O and the sums are rescaled by alpha (O after
      // the exponentials, when S no longer occupies registers).
      const bool rescale = __any_sync(0xffffffffu, raise);
      float alpha[2 * kMTiles];
      if (rescale) {
#pragma unroll
        for (int r = 0; r < 2 * kMTiles; ++r) {
          const float new_max = fmaxf(row_max[r], tile_max[r]);
          // A row with nothing visible yet keeps exponent base 0 (its scores are all -inf).
          alpha[r] = FastExp2(row_max[r] - (new_max == -INFINITY ? 0.0f : new_max));
          row_max[r] = new_max;
          row_sum[r] *= alpha[r];
        }
      }

      // P = exp2(s * scale_log2 - base), one FFMA and one MUFU per score; P packed to bf16 A
      // fragments for P V (keys 16 kc .. 16 kc + 15) without shared memory.
      uint32_t pa[kMTiles][kSubN / 16][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        float neg_base[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float base = row_max[2 * mt + h];
          neg_base[h] = base == -INFINITY ? 0.0f : -base;
        }
#pragma unroll
        for (int n = 0; n < kSTiles; ++n) {
          float e[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            e[i] = FastExp2(fmaf(s[mt][n][i], scale_log2, neg_base[i / 2]));
            sum[i / 2] += e[i];
          }
          // n-tile n is half n % 2 of the A fragment of keys 16 (n / 2) .. 16 (n / 2) + 15.
          pa[mt][n / 2][2 * (n % 2)] = PackBf16x2(e[0], e[1]);
          pa[mt][n / 2][2 * (n % 2) + 1] = PackBf16x2(e[2], e[3]);
        }
        row_sum[2 * mt] += sum[0];
        row_sum[2 * mt + 1] += sum[1];
      }

      if (rescale) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int n = 0; n < kOTiles; ++n) {
            o[mt][n][0] *= alpha[2 * mt];
            o[mt][n][1] *= alpha[2 * mt];
            o[mt][n][2] *= alpha[2 * mt + 1];
            o[mt][n][3] *= alpha[2 * mt + 1];
          }
        }
      }

      // O += P V.
      const unsigned v_row = kv_frag_row + kVFromK + stage_bytes;
#pragma unroll
      for (int kc = 0; kc < kSubN / 16; ++kc) {
#pragma unroll
        for (int n = 0; n < kOTiles; n += 2) {
          uint32_t b[4];
          LdMatrixX4Trans(b, v_row + kc * 16 * kRowBytes + n * 16);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            MmaBf16(o[mt][n], pa[mt][kc], b[0], b[2]);
            MmaBf16(o[mt][n + 1], pa[mt][kc], b[1], b[3]);
          }
        }
      }
    }
  }

  // Full row sums over the quad, normalize, store the valid rows.
  const size_t out_stride = static_cast<size_t>(p.num_heads) * kHeadDim;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 2 * mt + h;
      float l = row_sum[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int i = warp_row0 + mt * 16 + h * 8 + g;
      if (i >= num_new) continue;
      __nv_bfloat16* out_row =
          p.out + static_cast<size_t>(row_begin + i) * out_stride + head * kHeadDim + 2 * t;
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        const float x0 = o[mt][n][2 * h] * inv;
        const float x1 = o[mt][n][2 * h + 1] * inv;
        if (p.out_vector) {
          *reinterpret_cast<uint32_t*>(out_row + n * 8) = PackBf16x2(x0, x1);
        } else {
          out_row[n * 8] = __float2bfloat16_rn(x0);
          out_row[n * 8 + 1] = __float2bfloat16_rn(x1);
        }
      }
    }
  }
}

// Launches one instantiation, raising its dynamic shared-memory limit the first time on each
// device (a plain attribute call: no allocation or synchronization, so the launcher stays
// graph-capturable).
template <int kHeadDim>
cudaError_t LaunchForHeadDim(const PrefillParams& p, dim3 grid, cudaStream_t stream) {
  constexpr size_t kSmem = Config<kHeadDim>::kSmemBytes;
  static std::atomic<uint64_t> configured{0};
  if (const cudaError_t e =
          OptInDynamicSharedMemory(PrefillAttentionKernel<kHeadDim>, kSmem, configured);
      e != cudaSuccess) {
    return e;
  }
  PrefillAttentionKernel<kHeadDim><<<grid, Config<kHeadDim>::kThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchPrefillAttentionRaw(const void* q, int q_row_stride, const PagedLayerView& kv,
                                      const int32_t* seq_start_rows, const int32_t* start_pos,
                                      int num_seqs, int max_new_tokens, int num_heads, float scale,
                                      void* out, bool allow_wgmma, cudaStream_t stream) {
  const PrefillParams p =
      MakePrefillParams(q, q_row_stride, kv, seq_start_rows, start_pos, num_heads, scale, out);
  // Head_dim 128 on compute capability 9.0 (the wgmma kernel's sm_90a code runs nowhere else).
  // H200, Llama-3-8B shape: prefill 8K 234.7-242.3 ms against 244.8-252.0 with the mma.sync
  // kernel (bench/RESULTS.md).
  if (allow_wgmma && kv.head_dim == 128 && p.q_vector && p.out_vector && CurrentDeviceIsSm90()) {
    return LaunchPrefillAttentionSm90(p, num_seqs, max_new_tokens, kv.num_slots, stream);
  }
  const int q_tiles = CeilDiv(max_new_tokens, kBlockM);
  if (q_tiles > kMaxGridZ) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(num_heads), static_cast<unsigned>(num_seqs),
                  static_cast<unsigned>(q_tiles));
  switch (kv.head_dim) {
    case 32:
      return LaunchForHeadDim<32>(p, grid, stream);
    case 64:
      return LaunchForHeadDim<64>(p, grid, stream);
    case 128:
      return LaunchForHeadDim<128>(p, grid, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda::internal

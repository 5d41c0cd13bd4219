#pragma once
// Index maps of the Hopper (sm_90a, wgmma) prefill attention kernel (prefill_attention_sm90.cu),
// shared with its host emulation test (prefill_attention_sm90_emulation_test.cc). Plain C++;
// __host__ __device__ under nvcc.
//
// Shared tiles. Q (64 rows x 128 dims), K and V (kBlockN = 64 or 128 keys x 128 dims) all use one
// layout, the canonical 128-byte-swizzled layout of wgmma operands: two "atoms" of 64 dims (128
// bytes) side by side, each `rows` rows x 128 bytes, rows 128 bytes apart in groups of 8 rows
// (1024 bytes), and the 16-byte chunk index of a row XORed with row % 8 (Swizzle<3,4,3> on the
// byte address). Read through descriptors:
//   - Q as A and K as B of S = Q K^T are K-major (the dims are the K dimension and contiguous):
//     8-row groups SBO = 1024 bytes apart; k-step kk (dims 16 kk .. 16 kk + 15) starts at atom
//     kk / 4, byte 32 (kk % 4) (the swizzle is applied to the final address, so stepping the start
//     inside an atom reads the right chunks); a 128-key K tile is the B of an m64n128k16;
//   - V as B of O += P V is MN-major (N = dims contiguous, K = keys): 8-key groups SBO = 1024
//     bytes apart, the two 64-dim halves LBO = one atom (rows x 128 bytes) apart; k-step kc (keys
//     16 kc .. 16 kc + 15) starts 2048 kc bytes in.
// Registers (per warp w of the warpgroup, lane = 4 g + t): accumulator element 4 i + e of an
// m64nN D holds row 16 w + g (+ 8 for e >= 2), column 8 i + 2 t (+ 1 for odd e); an A fragment in
// registers is the mma.m16n8k16 A fragment of rows 16 w .. 16 w + 15.

#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_SM90_HD __host__ __device__
#else
#define TANDEM_SM90_HD
#endif

namespace tandem::cuda::sm90_attention {

constexpr int kHeadDim = 128;
constexpr int kBlockM = 64;  // query rows per CTA (one warpgroup)
constexpr int kBlockN = 64;  // keys per tile of the 64-key kernel (the 128-key one passes its own)
constexpr int kThreads = 128;
constexpr int kAtomBytes = 8192;             // 64 rows x 128 bytes
constexpr int kTileBytes = 2 * kAtomBytes;   // 64 rows x 128 dims bf16
constexpr int kGroupBytes = 1024;            // 8 rows: the SBO of every operand
constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks

// Bytes of one atom (64 dims) and of a whole tile of `rows` rows.
TANDEM_SM90_HD constexpr int AtomBytes(int rows) { return rows * 128; }
TANDEM_SM90_HD constexpr int TileBytes(int rows) { return 2 * AtomBytes(rows); }

// Byte offset of 16-byte chunk `chunk` (dims 8 chunk .. 8 chunk + 7) of row `row` in a tile of
// `rows` rows (Q: 64).
TANDEM_SM90_HD constexpr int TileOffset(int row, int chunk, int rows = kBlockM) {
  return (chunk / 8) * AtomBytes(rows) + (row / 8) * kGroupBytes + (row % 8) * 128 +
         (((chunk % 8) ^ (row % 8)) << 4);
}

// Byte offset (from the tile base) where the descriptor of k-step kk of Q or K (`rows` rows)
// starts.
TANDEM_SM90_HD constexpr int QkStepOffset(int kk, int rows = kBlockM) {
  return (kk / 4) * AtomBytes(rows) + (kk % 4) * 32;
}
// Byte offset (from the V tile base) where the descriptor of k-step kc of P V starts.
TANDEM_SM90_HD constexpr int PvStepOffset(int kc) { return kc * 2 * kGroupBytes; }

// wgmma shared-memory matrix descriptor: start address, leading and stride byte offsets (each
// >> 4, 14 bits), swizzle mode 1 (128-byte) in bits 62-63, base offset 0 (atoms 1024-aligned).
TANDEM_SM90_HD constexpr uint64_t MakeDescriptor(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16 |
         static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32 | uint64_t{1} << 62;
}
// K-major operands (Q, K): LBO is unused with a swizzled layout (1 by convention).
constexpr uint32_t kKMajorLbo = 16;
constexpr uint32_t kVLbo = kAtomBytes;  // MN-major 64-key V: the second 64-dim half
TANDEM_SM90_HD constexpr uint32_t VLbo(int rows) { return static_cast<uint32_t>(AtomBytes(rows)); }
constexpr uint32_t kSbo = kGroupBytes;

// cp.async slots of a K or V tile: thread tid copies chunks LoadChunk(tid, i), i < 8, of key row
// LoadRow(tid); of the Q tile, chunk QLoadChunk(tid, i) of row QLoadRow(tid), i < 8.
TANDEM_SM90_HD constexpr int LoadRow(int tid) { return tid / 2; }
TANDEM_SM90_HD constexpr int LoadChunk(int tid, int i) { return tid % 2 + 2 * i; }
// Of a K or V tile of `rows` keys (64 or 128): i < rows / 8, row KvLoadRow(tid, i), chunk
// KvLoadChunk(tid, i) (two threads per row, rows tid / 2 and tid / 2 + 64).
TANDEM_SM90_HD constexpr int KvLoadRow(int tid, int i) { return tid / 2 + 64 * (i / 8); }
TANDEM_SM90_HD constexpr int KvLoadChunk(int tid, int i) { return tid % 2 + 2 * (i % 8); }
// The same copies decomposed the way the kernel's copy loop issues them (per-thread registers
// plus immediates). With k = i % 4, a = i / 4 % 2 (the atom) and j = i / 8 (the row):
//   TileOffset(KvLoadRow(tid, i), KvLoadChunk(tid, i), rows)
//       == KvRowBase(tid) + KvSwizzle(tid, k) + a * AtomBytes(rows) + j * 8 * kGroupBytes,
// and chunk KvLoadChunk(tid, i) starts at element 8 (tid % 2) + 16 k + 64 a of its row.
TANDEM_SM90_HD constexpr int KvRowBase(int tid) {
  return (tid / 2 / 8) * kGroupBytes + (tid / 2 % 8) * 128;
}
TANDEM_SM90_HD constexpr int KvSwizzle(int tid, int k) {
  return (((tid % 2 + 2 * k) % 8) ^ (tid / 2 % 8)) << 4;
}
TANDEM_SM90_HD constexpr int QLoadRow(int tid) { return tid / 2; }
TANDEM_SM90_HD constexpr int QLoadChunk(int tid, int i) { return tid % 2 + 2 * i; }

// Accumulator element r = 4 i + e of warp w, lane: row and column of the m64nN D tile.
TANDEM_SM90_HD constexpr int AccRow(int warp, int lane, int r) {
  return 16 * warp + lane / 4 + ((r % 4) >= 2 ? 8 : 0);
}
TANDEM_SM90_HD constexpr int AccCol(int lane, int r) {
  return 8 * (r / 4) + 2 * (lane % 4) + (r % 2);
}

// The P A-fragment register q (0..3) of k-step kc packs the S accumulators PIndex(kc, q) and
// PIndex(kc, q) + 1 (columns 16 kc .. 16 kc + 15 of the thread's two rows).
TANDEM_SM90_HD constexpr int PIndex(int kc, int q) {
  // q = 0: row g, cols 16 kc + 2t (n8 tile 2 kc, e = 0, 1); 1: row g + 8 (e = 2, 3);
  // 2: row g, n8 tile 2 kc + 1; 3: row g + 8, n8 tile 2 kc + 1.
  return 4 * (2 * kc + q / 2) + 2 * (q % 2);
}

// Causal bookkeeping (tiles of block_n keys) of the CTA of query tile q0 (new-token index) of a
// sequence with `num_new` new tokens after `start` cached ones: the keys it needs are [0, KvEnd),
// in NumTiles tiles; a warp's rows start at position WarpPos0; row h (0: lane / 4, 1: + 8) of a
// lane sees keys [0, RowLimit); a tile is masked only if TileNeedsMask for the warp (every other
// tile is fully visible to all of the warp's rows).
TANDEM_SM90_HD constexpr int KvEnd(int start, int q0, int num_new) {
  return start + (q0 + kBlockM < num_new ? q0 + kBlockM : num_new);
}
TANDEM_SM90_HD constexpr int NumTiles(int kv_end, int block_n = kBlockN) {
  return (kv_end + block_n - 1) / block_n;
}
TANDEM_SM90_HD constexpr int WarpPos0(int start, int q0, int warp) {
  return start + q0 + 16 * warp;
}
TANDEM_SM90_HD constexpr int RowLimit(int warp_pos0, int lane, int h, int kv_end) {
  return warp_pos0 + lane / 4 + 8 * h + 1 < kv_end ? warp_pos0 + lane / 4 + 8 * h + 1 : kv_end;
}
TANDEM_SM90_HD constexpr bool TileNeedsMask(int key0, int warp_pos0, int block_n = kBlockN) {
  return key0 + block_n - 1 > warp_pos0;
}

}  // namespace tandem::cuda::sm90_attention

#undef TANDEM_SM90_HD

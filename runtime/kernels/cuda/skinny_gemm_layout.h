#pragma once
// Index maps of the skinny GEMM kernel (skinny_gemm.cu): which tile row and chunk each thread
// copies, where a chunk lives in the swizzled shared tiles, which rows each lane hands to ldmatrix,
// and which output element each accumulator register holds. The kernel computes every index with
// these functions, and skinny_gemm_emulation_test.cc runs the kernel's data flow on the host with
// the same functions (ldmatrix and mma.m16n8k16 emulated by their PTX definitions), so a wrong map
// fails on a machine without a GPU. Plain C++ (no CUDA headers); __host__ __device__ under nvcc.

#if defined(__CUDACC__)
#define TANDEM_SKINNY_HD __host__ __device__
#else
#define TANDEM_SKINNY_HD
#endif

namespace tandem::cuda::skinny_layout {

constexpr int kThreads = 128;       // 4 warps
constexpr int kRows = 64;           // weight rows per output tile (gated: 32 gate + 32 up)
constexpr int kBk = 64;             // k per pipeline stage
constexpr int kChunks = kBk / 8;    // 16-byte chunks per tile row
constexpr int kRowBytes = kBk * 2;  // bf16
constexpr int kWLoadsPerThread = kRows * kChunks / kThreads;  // 4
constexpr int kWarpRowsN = 32;      // weight rows per warp (two m16 tiles)
constexpr int kKSlicesPerWarp = 2;  // k16 slices per warp and stage (of kBk / 16 = 4)

// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][kChunks] tile whose chunk index is
// XORed with row % 8: the 8 rows of an ldmatrix phase, and the 8 chunks of a copied row, fall in
// distinct bank groups.
TANDEM_SKINNY_HD constexpr int Swizzle(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}

// cp.async slot i of thread tid copies chunk LoadChunk(tid) of tile row LoadRow(tid, i); weights
// use slots 0..kWLoadsPerThread-1, activations (16 kM16 rows) slots 0..kM16-1.
TANDEM_SKINNY_HD constexpr int LoadRow(int tid, int i) { return tid / kChunks + 16 * i; }
TANDEM_SKINNY_HD constexpr int LoadChunk(int tid) { return tid % kChunks; }

// Row of the [n, k] (gated: [2n, k]) weight matrix behind tile row r of output tile `tile`, or -1
// past the matrix. Gated tiles hold gate rows j0..j0+31 then the matching up rows n+j0..n+j0+31.
TANDEM_SKINNY_HD constexpr int WeightRow(int tile, int r, int n, bool gated) {
  if (gated) {
    const int j = tile * (kRows / 2) + r % (kRows / 2);
    return j < n ? (r < kRows / 2 ? j : n + j) : -1;
  }
  const int row = tile * kRows + r;
  return row < n ? row : -1;
}

// Rope mode (the fused QKV projection with RoPE): rotation pairs are numbered p = head *
// (head_dim / 2) + i over all q, k and v heads; tile `tile` holds pairs 32 tile .. 32 tile + 31,
// tile row r < 32 the first element of pair 32 tile + r (feature head * head_dim + i), row 32 + r
// its partner (+ head_dim / 2). -1 past the last pair.
TANDEM_SKINNY_HD constexpr int RopeWeightRow(int tile, int r, int num_pairs, int head_dim) {
  const int pair = tile * (kRows / 2) + r % (kRows / 2);
  if (pair >= num_pairs) return -1;
  const int half = head_dim / 2;
  return (pair / half) * head_dim + pair % half + (r < kRows / 2 ? 0 : half);
}

// Output features per tile.
TANDEM_SKINNY_HD constexpr int FeaturesPerTile(bool gated) { return gated ? kRows / 2 : kRows; }

// Warp w: weight rows 32 WarpN(w) .. + 31, k16 slices KSlice(WarpK(w), kk) for kk < 2.
TANDEM_SKINNY_HD constexpr int WarpN(int warp) { return warp % 2; }
TANDEM_SKINNY_HD constexpr int WarpK(int warp) { return warp / 2; }
TANDEM_SKINNY_HD constexpr int KSlice(int wk, int kk) { return wk + 2 * kk; }

// ldmatrix.x4 row addresses for the A operand (weights; m16 tile i of the warp, k16 slice ks):
// lanes 0-15 rows 0-15 at the slice's first chunk, lanes 16-31 the same rows at its second, so the
// four matrices are a0..a3 of the mma A fragment.
TANDEM_SKINNY_HD constexpr int ARow(int wn, int i, int lane) {
  return kWarpRowsN * wn + 16 * i + lane % 16;
}
TANDEM_SKINNY_HD constexpr int AChunk(int ks, int lane) { return 2 * ks + lane / 16; }

// ldmatrix.x4 row addresses for the B operand (activation rows 16 j2 .. 16 j2 + 15 as two n8
// tiles): matrices (rows +0, first chunk), (+0, second), (+8, first), (+8, second) = b0, b1 of
// n8 tile 2 j2 and b0, b1 of n8 tile 2 j2 + 1.
TANDEM_SKINNY_HD constexpr int BRow(int j2, int lane) {
  return 16 * j2 + (lane / 16) * 8 + lane % 8;
}
TANDEM_SKINNY_HD constexpr int BChunk(int ks, int lane) { return 2 * ks + (lane / 8) % 2; }

// Accumulator element e (0..3) of (m16 tile i, n8 tile j) of a lane of warp column wn: its tile
// row (weight row within the output tile) and activation row.
TANDEM_SKINNY_HD constexpr int AccRow(int wn, int i, int lane, int e) {
  return kWarpRowsN * wn + 16 * i + lane / 4 + (e >= 2 ? 8 : 0);
}
TANDEM_SKINNY_HD constexpr int AccCol(int j, int lane, int e) {
  return 8 * j + 2 * (lane % 4) + (e & 1);
}

}  // namespace tandem::cuda::skinny_layout

#undef TANDEM_SKINNY_HD

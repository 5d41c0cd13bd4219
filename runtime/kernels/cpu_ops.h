#pragma once
// CPU reference ops for the model forward pass: plain functions over caller-owned float32 arrays.
// They are the numerical reference every device kernel is checked against, and the CPU engine's
// hot path, so they allocate nothing (scratch comes from the caller) and keep inner loops simple
// enough for the compiler to vectorize. GEMMs go through OpenBLAS (cblas).
//
// Conventions: every matrix is row-major and densely packed unless a stride is given; shapes are
// written as [rows, cols]. Pointers must not be null and the shapes must match (a mismatch is a
// broken invariant of the caller, not bad input: nothing here validates or returns a Status).
// Thread-safety: every function is reentrant; concurrent calls on disjoint outputs are fine.

#include <cstddef>
#include <cstdint>

namespace tandem::cpu {

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight[:], for r in [0, rows).
// x, out: [rows, dim]; weight: [dim]. `out` may alias `x`. The mean is accumulated in float32
// over the row, as HF's LlamaRMSNorm does after casting to float32.
void RmsNorm(const float* x, const float* weight, int rows, int dim, float eps, float* out);

// x[i] += y[i] for i in [0, n) (the residual connection).
void AddInPlace(float* x, const float* y, size_t n);

// out[rows, out_features] = x[rows, in_features] · weight[out_features, in_features]^T + bias.
// `weight` keeps the HF Linear layout; `bias` is [out_features] or null. `out` must not alias
// `x`. One cblas_sgemm (cblas_sgemv when rows == 1).
void Linear(const float* x, const float* weight, const float* bias, int rows, int in_features,
            int out_features, float* out);

// Llama 3.1 rope_scaling ("rope_type": "llama3").
struct Llama3RopeScaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

// inv_freq[head_dim / 2] exactly as HF computes it in float32:
//   inv_freq[i] = 1 / theta^((2i) / head_dim)
// then, when `llama3` is non-null, `_compute_llama3_parameters`: wavelengths longer than
// original_max / low_freq_factor are divided by `factor`, shorter than original_max /
// high_freq_factor kept, and those in between interpolated with
//   smooth = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
//   inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq.
// head_dim must be even.
void RopeInvFreq(int head_dim, float theta, const Llama3RopeScaling* llama3, float* inv_freq);

// cos/sin tables [max_positions, head_dim / 2]: angle(p, i) = float(p) * inv_freq[i] (rounded to
// float32 first, as HF's float32 matmul does), cos/sin evaluated in double and stored as float.
void RopeTables(const float* inv_freq, int head_dim, int max_positions, float* cos_table,
                float* sin_table);

// Rotates, in place, the heads of `rows` tokens, neox style (HF `rotate_half`): for each head,
// with h = head_dim / 2 and (c, s) = tables[positions[r], i]:
//   y[i]     = x[i] * c - x[i + h] * s
//   y[i + h] = x[i + h] * c + x[i] * s
// x: [rows, row_stride] where token r's heads start at x + r * row_stride and are packed
// [num_heads, head_dim]. positions: [rows], each in [0, max_positions) of the tables.
void ApplyRope(float* x, int rows, int row_stride, int num_heads, int head_dim,
               const int32_t* positions, const float* cos_table, const float* sin_table);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). `out` may alias either input.
void SiluAndMul(const float* gate, const float* up, size_t n, float* out);

// out[r, :] = table[ids[r], :]. table: [vocab, hidden]; ids must be in [0, vocab).
void EmbeddingGather(const float* table, int hidden, const int32_t* ids, int rows, float* out);

// One layer's paged K or V cache, [num_blocks, block_size, num_kv_heads, head_dim]; position p of a
// sequence lives in block block_table[p / block_size], slot p % block_size.
struct PagedKvShape {
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  size_t BlockStride() const { return static_cast<size_t>(block_size) * SlotStride(); }
  size_t SlotStride() const { return static_cast<size_t>(num_kv_heads) * head_dim; }
};

// Writes the K and V of positions [start_pos, start_pos + rows) of one sequence into the caches.
// k, v: [rows, num_kv_heads * head_dim] with row strides `k_stride` / `v_stride` (floats);
// block_table must cover position start_pos + rows - 1 with valid block ids.
void PagedKvAppend(const float* k, int k_stride, const float* v, int v_stride, int rows,
                   int start_pos, const int32_t* block_table, const PagedKvShape& shape,
                   float* k_cache, float* v_cache);

// Causal attention of one sequence's `rows` query tokens at positions [start_pos, start_pos + rows)
// over its cached K/V of positions [0, start_pos + rows) (already appended). GQA: query head h
// reads KV head h / (num_heads / num_kv_heads). Query token i sees keys [0, start_pos + i].
// Softmax in float32 with max subtraction; scores scaled by `scale` (1/sqrt(head_dim) for Llama).
// q: [rows, q_stride] with token r's heads packed [num_heads, head_dim] at q + r * q_stride.
// out: [rows, num_heads * head_dim], packed. scratch: at least start_pos + rows floats.
void PagedAttention(const float* q, int q_stride, int rows, int start_pos, int num_heads,
                    const int32_t* block_table, const PagedKvShape& shape, const float* k_cache,
                    const float* v_cache, float scale, float* scratch, float* out);

// Index of the largest of x[0..n); the smallest such index on ties. n > 0.
int Argmax(const float* x, int n);

}  // namespace tandem::cpu

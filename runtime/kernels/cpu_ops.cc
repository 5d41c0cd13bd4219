#include "runtime/kernels/cpu_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

namespace tandem::cpu {
namespace {

// Dot product with 8 independent partial sums so the loop vectorizes without -ffast-math.
inline float Dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y[i] += alpha * x[i].
inline void Axpy(float alpha, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace

void RmsNorm(const float* x, const float* weight, int rows, int dim, float eps, float* out) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * dim;
    float* outr = out + static_cast<size_t>(r) * dim;
    const float mean_sq = Dot(xr, xr, dim) / static_cast<float>(dim);
    const float inv = 1.0f / std::sqrt(mean_sq + eps);
    for (int i = 0; i < dim; ++i) outr[i] = weight[i] * (xr[i] * inv);
  }
}

void AddInPlace(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

void Linear(const float* x, const float* weight, const float* bias, int rows, int in_features,
            int out_features, float* out) {
  if (rows == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, out_features, in_features, 1.0f, weight, in_features,
                x, 1, 0.0f, out, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out_features, in_features, 1.0f, x,
                in_features, weight, in_features, 0.0f, out, out_features);
  }
  if (bias != nullptr) {
    for (int r = 0; r < rows; ++r)
      AddInPlace(out + static_cast<size_t>(r) * out_features, bias,
                 static_cast<size_t>(out_features));
  }
}

void RopeInvFreq(int head_dim, float theta, const Llama3RopeScaling* llama3, float* inv_freq) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    // torch: base ** (arange(0, dim, 2).float() / dim), then 1.0 / that, all in float32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float power = std::pow(theta, exponent);
    inv_freq[i] = 1.0f / power;
  }
  if (llama3 == nullptr) return;
  const float factor = llama3->factor;
  const float low = llama3->low_freq_factor;
  const float high = llama3->high_freq_factor;
  const float old_context = static_cast<float>(llama3->original_max_position_embeddings);
  const float low_freq_wavelen = old_context / low;
  const float high_freq_wavelen = old_context / high;
  for (int i = 0; i < half; ++i) {
    const float f = inv_freq[i];
    const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
    float scaled = wavelen > low_freq_wavelen ? f / factor : f;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      const float smooth = (old_context / wavelen - low) / (high - low);
      scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
    inv_freq[i] = scaled;
  }
}

void RopeTables(const float* inv_freq, int head_dim, int max_positions, float* cos_table,
                float* sin_table) {
  const int half = head_dim / 2;
  for (int p = 0; p < max_positions; ++p) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[i];
      cos_table[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(double{angle}));
      sin_table[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(double{angle}));
    }
  }
}

void ApplyRope(float* x, int rows, int row_stride, int num_heads, int head_dim,
               const int32_t* positions, const float* cos_table, const float* sin_table) {
  const int half = head_dim / 2;
  for (int r = 0; r < rows; ++r) {
    const float* c = cos_table + static_cast<size_t>(positions[r]) * half;
    const float* s = sin_table + static_cast<size_t>(positions[r]) * half;
    for (int h = 0; h < num_heads; ++h) {
      float* lo = x + static_cast<size_t>(r) * row_stride + static_cast<size_t>(h) * head_dim;
      float* hi = lo + half;
      for (int i = 0; i < half; ++i) {
        const float a = lo[i];
        const float b = hi[i];
        lo[i] = a * c[i] - b * s[i];
        hi[i] = b * c[i] + a * s[i];
      }
    }
  }
}

void SiluAndMul(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void EmbeddingGather(const float* table, int hidden, const int32_t* ids, int rows, float* out) {
  for (int r = 0; r < rows; ++r) {
    std::memcpy(out + static_cast<size_t>(r) * hidden, table + static_cast<size_t>(ids[r]) * hidden,
                sizeof(float) * hidden);
  }
}

void PagedKvAppend(const float* k, int k_stride, const float* v, int v_stride, int rows,
                   int start_pos, const int32_t* block_table, const PagedKvShape& shape,
                   float* k_cache, float* v_cache) {
  const size_t slot_floats = shape.SlotStride();
  for (int r = 0; r < rows; ++r) {
    const int pos = start_pos + r;
    const size_t offset =
        static_cast<size_t>(block_table[pos / shape.block_size]) * shape.BlockStride() +
        static_cast<size_t>(pos % shape.block_size) * slot_floats;
    std::memcpy(k_cache + offset, k + static_cast<size_t>(r) * k_stride,
                sizeof(float) * slot_floats);
    std::memcpy(v_cache + offset, v + static_cast<size_t>(r) * v_stride,
                sizeof(float) * slot_floats);
  }
}

void PagedAttention(const float* q, int q_stride, int rows, int start_pos, int num_heads,
                    const int32_t* block_table, const PagedKvShape& shape, const float* k_cache,
                    const float* v_cache, float scale, float* scratch, float* out) {
  const int head_dim = shape.head_dim;
  const int group = num_heads / shape.num_kv_heads;
  const int bs = shape.block_size;
  const size_t slot = shape.SlotStride();
  for (int r = 0; r < rows; ++r) {
    const int num_keys = start_pos + r + 1;
    for (int h = 0; h < num_heads; ++h) {
      const int kv_head = h / group;
      const float* qh = q + static_cast<size_t>(r) * q_stride + static_cast<size_t>(h) * head_dim;
      float* oh = out + (static_cast<size_t>(r) * num_heads + h) * head_dim;
      // Scores, block by block.
      float max_score = -INFINITY;
      for (int base = 0; base < num_keys; base += bs) {
        const float* kb = k_cache +
                          static_cast<size_t>(block_table[base / bs]) * shape.BlockStride() +
                          static_cast<size_t>(kv_head) * head_dim;
        const int n = std::min(bs, num_keys - base);
        for (int j = 0; j < n; ++j) {
          const float sc = Dot(qh, kb + j * slot, head_dim) * scale;
          scratch[base + j] = sc;
          max_score = std::max(max_score, sc);
        }
      }
      float sum = 0.0f;
      for (int j = 0; j < num_keys; ++j) {
        const float e = std::exp(scratch[j] - max_score);
        scratch[j] = e;
        sum += e;
      }
      const float inv_sum = 1.0f / sum;
      std::fill(oh, oh + head_dim, 0.0f);
      for (int base = 0; base < num_keys; base += bs) {
        const float* vb = v_cache +
                          static_cast<size_t>(block_table[base / bs]) * shape.BlockStride() +
                          static_cast<size_t>(kv_head) * head_dim;
        const int n = std::min(bs, num_keys - base);
        for (int j = 0; j < n; ++j) Axpy(scratch[base + j] * inv_sum, vb + j * slot, oh, head_dim);
      }
    }
  }
}

int Argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace tandem::cpu

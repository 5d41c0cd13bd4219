// Differential tests of the CUDA embedding, RoPE, KV append, SiLU-mul and argmax kernels against
// the CPU reference ops (cpu_ops.h) on bf16-rounded inputs. Skipped without a GPU.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/float16.h"
#include "runtime/kernels/cpu_ops.h"
#include "runtime/kernels/cuda/cuda_kernel_test_util.h"
#include "runtime/kernels/cuda/gemv_kernels.h"
#include "runtime/kernels/cuda/model_kernels.h"

namespace tandem {
namespace {

using testing_util::Bf16ToFloats;
using testing_util::CudaKernelTest;
using testing_util::ExpectClose;
using testing_util::FastRng;
using testing_util::kBf16Poison;
using testing_util::RandomBf16;

// One bf16 ulp (8 significant bits: at most 2^-7 relative) for a bf16-rounded result of float32
// math; rounding alone is at most half of it.
constexpr double kBf16Rtol = 1.0 / 128;

class ElementwiseCudaTest : public CudaKernelTest {};

TEST_F(ElementwiseCudaTest, EmbeddingMatchesGather) {
  for (const auto& [n, hidden, vocab] : std::vector<std::tuple<int, int, int>>{
           {1, 4096, 1000}, {17, 2048, 5000}, {300, 256, 500}, {9, 77, 31}}) {
    SCOPED_TRACE(absl::StrCat("n=", n, " hidden=", hidden, " vocab=", vocab));
    FastRng rng(n * 7 + hidden);
    std::vector<uint16_t> table = RandomBf16(static_cast<size_t>(vocab) * hidden, 1.0f, rng);
    std::vector<int32_t> ids(n);
    for (auto& id : ids) id = rng.UniformInt(0, vocab - 1);
    ids[0] = vocab - 1;
    std::vector<float> ref(static_cast<size_t>(n) * hidden);
    const std::vector<float> table_f = Bf16ToFloats(table);
    cpu::EmbeddingGather(table_f.data(), hidden, ids.data(), n, ref.data());

    DeviceBuffer d_table = Upload(table);
    DeviceBuffer d_ids = Upload(ids);
    DeviceBuffer d_out = Upload(std::vector<uint16_t>(ref.size(), kBf16Poison));
    ASSERT_TRUE(cuda::LaunchEmbedding(static_cast<const int32_t*>(d_ids.data), d_table.data, n,
                                      hidden, vocab, d_out.data, stream())
                    .ok());
    const std::vector<float> got = Bf16ToFloats(Download<uint16_t>(d_out, ref.size()));
    ExpectClose(got, ref, 0.0, 0.0, 0.0, absl::StrCat("embedding n=", n, " hidden=", hidden));
    FreeAll();
  }
}

struct HeadShape {
  int heads;
  int kv_heads;
  int head_dim;
};

// The paged cache over one allocation in KvCacheLayout order ([layer][k|v][block]): k and v of a
// layer interleaved, layer_stride two layers' worth of elements.
cuda::PagedKvCache InterleavedCache(void* base, int layers, int num_blocks, int block_size,
                                    const HeadShape& shape) {
  const size_t layer_elems =
      static_cast<size_t>(num_blocks) * block_size * shape.kv_heads * shape.head_dim;
  cuda::PagedKvCache kv;
  kv.k = base;
  kv.v = static_cast<uint16_t*>(base) + layer_elems;
  kv.num_layers = layers;
  kv.num_blocks = num_blocks;
  kv.block_size = block_size;
  kv.num_kv_heads = shape.kv_heads;
  kv.head_dim = shape.head_dim;
  kv.layer_stride = 2 * layer_elems;
  return kv;
}

std::string Name(const HeadShape& s) {
  return absl::StrCat(s.heads, "x", s.kv_heads, "x", s.head_dim);
}

TEST_F(ElementwiseCudaTest, RopeMatchesCpuReference) {
  constexpr int kMaxPositions = 32768;
  for (const HeadShape& shape :
       {HeadShape{32, 8, 128}, HeadShape{32, 8, 64}, HeadShape{8, 2, 32}}) {
    for (const bool llama3 : {true, false}) {
      // Llama 3.1 scaling with theta 500000, or plain theta 10000 (Llama 2).
      cpu::Llama3RopeScaling scaling;
      std::vector<float> inv_freq(shape.head_dim / 2);
      cpu::RopeInvFreq(shape.head_dim, llama3 ? 500000.0f : 10000.0f, llama3 ? &scaling : nullptr,
                       inv_freq.data());
      std::vector<float> cos_table(static_cast<size_t>(kMaxPositions) * shape.head_dim / 2);
      std::vector<float> sin_table(cos_table.size());
      cpu::RopeTables(inv_freq.data(), shape.head_dim, kMaxPositions, cos_table.data(),
                      sin_table.data());
      for (const int n : {1, 7, 333}) {
        const std::string what = absl::StrCat("rope ", Name(shape), " llama3=", llama3, " n=", n);
        SCOPED_TRACE(what);
        FastRng rng(n * 31 + shape.head_dim + llama3);
        const int row = (shape.heads + 2 * shape.kv_heads) * shape.head_dim;
        std::vector<uint16_t> qkv = RandomBf16(static_cast<size_t>(n) * row, 2.0f, rng);
        std::vector<int32_t> positions(n);
        for (auto& p : positions) p = rng.UniformInt(0, kMaxPositions - 1);
        positions[0] = n > 1 ? 0 : kMaxPositions - 1;

        std::vector<float> ref = Bf16ToFloats(qkv);
        cpu::ApplyRope(ref.data(), n, row, shape.heads + shape.kv_heads, shape.head_dim,
                       positions.data(), cos_table.data(), sin_table.data());

        DeviceBuffer d_qkv = Upload(qkv);
        DeviceBuffer d_pos = Upload(positions);
        DeviceBuffer d_inv = Upload(inv_freq);
        ASSERT_TRUE(cuda::LaunchRope(d_qkv.data, static_cast<const int32_t*>(d_pos.data),
                                     static_cast<const float*>(d_inv.data), n, shape.heads,
                                     shape.kv_heads, shape.head_dim, stream())
                        .ok());
        const std::vector<uint16_t> got_bits = Download<uint16_t>(d_qkv, qkv.size());
        // Values near zero after cancellation: allow float32 noise relative to the inputs (|x| <
        // 3.5); otherwise one bf16 rounding.
        ExpectClose(Bf16ToFloats(got_bits), ref, 1e-5 * 4, kBf16Rtol, 4e-3, what);
        int64_t v_changed = 0;
        const int v_begin = (shape.heads + shape.kv_heads) * shape.head_dim;
        for (int r = 0; r < n; ++r) {
          for (int i = v_begin; i < row; ++i) {
            v_changed +=
                got_bits[static_cast<size_t>(r) * row + i] != qkv[static_cast<size_t>(r) * row + i];
          }
        }
        EXPECT_EQ(v_changed, 0) << "v heads must be untouched";
        FreeAll();
      }
    }
  }
}

TEST_F(ElementwiseCudaTest, KvAppendWritesSlotsOfOneLayer) {
  for (const HeadShape& shape :
       {HeadShape{32, 8, 128}, HeadShape{32, 8, 64}, HeadShape{8, 2, 32}, HeadShape{4, 2, 6}}) {
    for (const int n : {1, 17, 200}) {
      const std::string what = absl::StrCat("kv_append ", Name(shape), " n=", n);
      SCOPED_TRACE(what);
      FastRng rng(n * 13 + shape.head_dim);
      constexpr int kLayers = 3, kLayer = 1, kBlockSize = 16;
      const int num_blocks = (n + kBlockSize - 1) / kBlockSize + 5;
      const size_t slot_elems = static_cast<size_t>(shape.kv_heads) * shape.head_dim;
      const size_t layer_elems = static_cast<size_t>(num_blocks) * kBlockSize * slot_elems;
      // KvCacheLayout order: [layer][k|v][block], one allocation, k and v interleaved by layer.
      std::vector<uint16_t> cache(2 * kLayers * layer_elems, kBf16Poison);
      const int row = (shape.heads + 2 * shape.kv_heads) * shape.head_dim;
      std::vector<uint16_t> qkv = RandomBf16(static_cast<size_t>(n) * row, 1.0f, rng);
      // Distinct random slots; every fifth row is padding (-1).
      std::vector<int32_t> all_slots(static_cast<size_t>(num_blocks) * kBlockSize);
      std::iota(all_slots.begin(), all_slots.end(), 0);
      for (size_t i = all_slots.size() - 1; i > 0; --i) {
        std::swap(all_slots[i], all_slots[rng.Next() % (i + 1)]);
      }
      std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + n);
      for (int r = 4; r < n; r += 5) slots[r] = -1;

      std::vector<uint16_t> expected = cache;
      for (int r = 0; r < n; ++r) {
        if (slots[r] < 0) continue;
        const uint16_t* k = &qkv[static_cast<size_t>(r) * row + shape.heads * shape.head_dim];
        const size_t k_dst = (2 * kLayer) * layer_elems + slots[r] * slot_elems;
        const size_t v_dst = (2 * kLayer + 1) * layer_elems + slots[r] * slot_elems;
        std::copy(k, k + slot_elems, expected.begin() + k_dst);
        std::copy(k + slot_elems, k + 2 * slot_elems, expected.begin() + v_dst);
      }

      DeviceBuffer d_cache = Upload(cache);
      DeviceBuffer d_qkv = Upload(qkv);
      DeviceBuffer d_slots = Upload(slots);
      const cuda::PagedKvCache kv =
          InterleavedCache(d_cache.data, kLayers, num_blocks, kBlockSize, shape);
      ASSERT_TRUE(cuda::LaunchKvAppend(d_qkv.data, static_cast<const int32_t*>(d_slots.data), n,
                                       shape.heads, kv, kLayer, stream())
                      .ok());
      const std::vector<uint16_t> got = Download<uint16_t>(d_cache, cache.size());
      int64_t mismatches = 0;
      size_t first = got.size();
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] != expected[i]) {
          ++mismatches;
          first = std::min(first, i);
        }
      }
      EXPECT_EQ(mismatches, 0) << what << ": cache differs from the expected copy (first at "
                               << first << "); other layers and slots must stay untouched";
      FreeAll();
    }
  }
}

// The fused RoPE + KV append must equal LaunchRope then LaunchKvAppend bit for bit, in qkv and in
// the whole cache (both tested against the CPU reference above), padding slots included.
TEST_F(ElementwiseCudaTest, RopeKvAppendEqualsRopeThenKvAppend) {
  for (const HeadShape& shape :
       {HeadShape{32, 8, 128}, HeadShape{32, 8, 64}, HeadShape{8, 2, 32}, HeadShape{4, 2, 6}}) {
    for (const int n : {1, 19, 130}) {
      const std::string what = absl::StrCat("rope_kv ", Name(shape), " n=", n);
      SCOPED_TRACE(what);
      FastRng rng(n * 7 + shape.head_dim);
      constexpr int kLayers = 2, kLayer = 1, kBlockSize = 16;
      const int num_blocks = (n + kBlockSize - 1) / kBlockSize + 3;
      const size_t slot_elems = static_cast<size_t>(shape.kv_heads) * shape.head_dim;
      const size_t layer_elems = static_cast<size_t>(num_blocks) * kBlockSize * slot_elems;
      const std::vector<uint16_t> cache(2 * kLayers * layer_elems, kBf16Poison);
      const int row = (shape.heads + 2 * shape.kv_heads) * shape.head_dim;
      const std::vector<uint16_t> qkv = RandomBf16(static_cast<size_t>(n) * row, 2.0f, rng);
      std::vector<int32_t> positions(n), slots(n);
      for (int r = 0; r < n; ++r) {
        positions[r] = rng.UniformInt(0, 100000);
        slots[r] = r % 6 == 5 ? -1 : (r * 7919) % (num_blocks * kBlockSize);
      }
      std::vector<float> inv_freq(shape.head_dim / 2);
      cpu::Llama3RopeScaling scaling;
      cpu::RopeInvFreq(shape.head_dim, 500000.0f, &scaling, inv_freq.data());
      const DeviceBuffer d_pos = Upload(positions);
      const DeviceBuffer d_slots = Upload(slots);
      const DeviceBuffer d_inv = Upload(inv_freq);
      std::vector<uint16_t> got_qkv[2], got_cache[2];
      for (const bool fused : {false, true}) {
        const DeviceBuffer d_qkv = Upload(qkv);
        const DeviceBuffer d_cache = Upload(cache);
        const cuda::PagedKvCache kv =
            InterleavedCache(d_cache.data, kLayers, num_blocks, kBlockSize, shape);
        const auto* pos = static_cast<const int32_t*>(d_pos.data);
        const auto* slot = static_cast<const int32_t*>(d_slots.data);
        const auto* inv = static_cast<const float*>(d_inv.data);
        if (fused) {
          ASSERT_TRUE(cuda::LaunchRopeKvAppend(d_qkv.data, pos, inv, slot, n, shape.heads, kv,
                                               kLayer, stream())
                          .ok());
        } else {
          ASSERT_TRUE(cuda::LaunchRope(d_qkv.data, pos, inv, n, shape.heads, shape.kv_heads,
                                       shape.head_dim, stream())
                          .ok());
          ASSERT_TRUE(
              cuda::LaunchKvAppend(d_qkv.data, slot, n, shape.heads, kv, kLayer, stream()).ok());
        }
        got_qkv[fused] = Download<uint16_t>(d_qkv, qkv.size());
        got_cache[fused] = Download<uint16_t>(d_cache, cache.size());
      }
      EXPECT_TRUE(got_qkv[0] == got_qkv[1]) << what << ": qkv differs";
      EXPECT_TRUE(got_cache[0] == got_cache[1]) << what << ": cache differs";
      EXPECT_FALSE(got_cache[0] == cache) << what << ": nothing was appended";
      FreeAll();
    }
  }
}

// The QKV GEMV with RoPE and the KV append in its epilogue must equal the GEMV followed by the
// fused RoPE + KV append bit for bit, in qkv and in the whole cache, with and without a bias
// (Qwen2), for 1 to 8 tokens with a padding slot.
TEST_F(ElementwiseCudaTest, QkvGemvRopeKvAppendEqualsGemvThenRopeKvAppend) {
  for (const HeadShape& shape : {HeadShape{32, 8, 128}, HeadShape{8, 2, 64}, HeadShape{4, 2, 6}}) {
    for (const int m : {1, 2, 5, 8}) {
      for (const int variant : {0, 1}) {
        const bool with_bias = variant == 1;
        const std::string what =
            absl::StrCat("qkv_gemv_rope ", Name(shape), " m=", m, with_bias ? " bias" : "");
        SCOPED_TRACE(what);
        FastRng rng(m * 31 + shape.head_dim + variant);
        const int hidden = shape.head_dim == 128 ? 4096 : 256;
        constexpr int kLayers = 2, kLayer = 1, kBlockSize = 16, kNumBlocks = 4;
        const size_t layer_elems =
            static_cast<size_t>(kNumBlocks) * kBlockSize * shape.kv_heads * shape.head_dim;
        const std::vector<uint16_t> cache(2 * kLayers * layer_elems, kBf16Poison);
        const int row = (shape.heads + 2 * shape.kv_heads) * shape.head_dim;
        const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(m) * hidden, 1.0f, rng);
        const std::vector<uint16_t> w =
            RandomBf16(static_cast<size_t>(row) * hidden, 1.0f / std::sqrt(float(hidden)), rng);
        const std::vector<uint16_t> bias = RandomBf16(row, 0.5f, rng);
        std::vector<int32_t> positions(m), slots(m);
        for (int r = 0; r < m; ++r) {
          positions[r] = rng.UniformInt(0, 100000);
          slots[r] = r == 1 ? -1 : (r * 13 + 3) % (kNumBlocks * kBlockSize);
        }
        std::vector<float> inv_freq(shape.head_dim / 2);
        cpu::Llama3RopeScaling scaling;
        cpu::RopeInvFreq(shape.head_dim, 500000.0f, &scaling, inv_freq.data());
        const DeviceBuffer d_x = Upload(x), d_w = Upload(w), d_bias = Upload(bias);
        const DeviceBuffer d_pos = Upload(positions), d_slots = Upload(slots),
                           d_inv = Upload(inv_freq);
        const auto* pos = static_cast<const int32_t*>(d_pos.data);
        const auto* slot = static_cast<const int32_t*>(d_slots.data);
        const auto* inv = static_cast<const float*>(d_inv.data);
        std::vector<uint16_t> got_qkv[2], got_cache[2];
        for (const bool fused : {false, true}) {
          const DeviceBuffer d_qkv =
              Upload(std::vector<uint16_t>(static_cast<size_t>(m) * row, kBf16Poison));
          const DeviceBuffer d_cache = Upload(cache);
          const cuda::PagedKvCache kv =
              InterleavedCache(d_cache.data, kLayers, kNumBlocks, kBlockSize, shape);
          const void* b = with_bias ? d_bias.data : nullptr;
          if (fused) {
            ASSERT_TRUE(cuda::LaunchQkvGemvRopeKvAppend(d_x.data, d_w.data, b, m, hidden,
                                                        d_qkv.data, pos, inv, slot, shape.heads, kv,
                                                        kLayer, stream())
                            .ok());
          } else {
            cuda::GemvArgs a;
            a.x = d_x.data;
            a.w = d_w.data;
            a.bias = b;
            a.out = d_qkv.data;
            a.m = m;
            a.n = row;
            a.k = hidden;
            ASSERT_TRUE(cuda::LaunchGemv(a, stream()).ok());
            ASSERT_TRUE(cuda::LaunchRopeKvAppend(d_qkv.data, pos, inv, slot, m, shape.heads, kv,
                                                 kLayer, stream())
                            .ok());
          }
          got_qkv[fused] = Download<uint16_t>(d_qkv, static_cast<size_t>(m) * row);
          got_cache[fused] = Download<uint16_t>(d_cache, cache.size());
        }
        EXPECT_TRUE(got_qkv[0] == got_qkv[1]) << what << ": qkv differs";
        EXPECT_TRUE(got_cache[0] == got_cache[1]) << what << ": cache differs";
        EXPECT_FALSE(got_cache[0] == cache) << what << ": nothing was appended";
        FreeAll();
      }
    }
  }
}

TEST_F(ElementwiseCudaTest, SiluMulMatchesCpuReference) {
  for (const auto& [n, inter] :
       std::vector<std::pair<int, int>>{{1, 14336}, {5, 8192}, {64, 14336}, {3, 77}, {2, 5632}}) {
    const std::string what = absl::StrCat("silu_mul n=", n, " inter=", inter);
    SCOPED_TRACE(what);
    FastRng rng(n + inter);
    std::vector<uint16_t> gate_up = RandomBf16(static_cast<size_t>(n) * 2 * inter, 4.0f, rng);
    const std::vector<float> f = Bf16ToFloats(gate_up);
    std::vector<float> ref(static_cast<size_t>(n) * inter);
    for (int r = 0; r < n; ++r) {
      const float* row = f.data() + static_cast<size_t>(r) * 2 * inter;
      cpu::SiluAndMul(row, row + inter, inter, ref.data() + static_cast<size_t>(r) * inter);
    }
    DeviceBuffer d_in = Upload(gate_up);
    DeviceBuffer d_out = Upload(std::vector<uint16_t>(ref.size(), kBf16Poison));
    ASSERT_TRUE(cuda::LaunchSiluMul(d_in.data, n, inter, d_out.data, stream()).ok());
    ExpectClose(Bf16ToFloats(Download<uint16_t>(d_out, ref.size())), ref, 1e-6, kBf16Rtol, 4e-3,
                what);
    FreeAll();
  }
}

TEST_F(ElementwiseCudaTest, ArgmaxMatchesCpuReferenceWithTies) {
  for (const auto& [rows, vocab] :
       std::vector<std::pair<int, int>>{{1, 128256}, {8, 32000}, {64, 128256}, {5, 1001}, {3, 7}}) {
    const std::string what = absl::StrCat("argmax rows=", rows, " vocab=", vocab);
    SCOPED_TRACE(what);
    FastRng rng(rows * 3 + vocab);
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    for (auto& x : logits) x = rng.Uniform(-20.0f, 20.0f);
    for (int r = 0; r < rows; ++r) {
      float* row = logits.data() + static_cast<size_t>(r) * vocab;
      if (r % 2 == 1) {
        // A tie for the maximum at two places: the smaller index wins.
        const int a = rng.UniformInt(0, vocab - 1);
        const int b = rng.UniformInt(0, vocab - 1);
        row[a] = 25.0f;
        row[b] = 25.0f;
      }
      if (r % 3 == 2) row[vocab - 1] = 30.0f;  // the last element
    }
    std::vector<int32_t> ref(rows);
    for (int r = 0; r < rows; ++r) {
      ref[r] = cpu::Argmax(logits.data() + static_cast<size_t>(r) * vocab, vocab);
    }
    DeviceBuffer d_logits = Upload(logits);
    DeviceBuffer d_out = Upload(std::vector<int32_t>(rows, -7));
    ASSERT_TRUE(cuda::LaunchArgmax(static_cast<const float*>(d_logits.data), rows, vocab,
                                   static_cast<int32_t*>(d_out.data), stream())
                    .ok());
    EXPECT_EQ(Download<int32_t>(d_out, rows), ref) << what;
    FreeAll();
  }
}

}  // namespace
}  // namespace tandem

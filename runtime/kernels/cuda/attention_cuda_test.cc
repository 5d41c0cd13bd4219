// Differential tests of the CUDA paged decode and prefill attention against cpu::PagedAttention on
// bf16-rounded inputs, at the head shapes of Llama-3-8B (32/8/128), Llama-3.2-1B (32/8/64), the
// tiny synthetic model (8/2/32) and GQA groups of 1 to 16, with random non-contiguous block
// tables, a KvCacheLayout-style interleaved cache whose other layer is NaN (reading it fails), and
// NaN-poisoned outputs (an element not written fails); decode again under other tunings
// (decode_attention_tuning.h), and head_dim-128 prefill again on the portable mma.sync kernel
// (which compute capability 9.0 otherwise replaces with the wgmma kernel). Skipped without a GPU.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/float16.h"
#include "runtime/kernels/cpu_ops.h"
#include "runtime/kernels/cuda/cuda_kernel_test_util.h"
#include "runtime/kernels/cuda/model_kernels.h"
#include "runtime/kernels/cuda/model_kernels_internal.h"

namespace tandem {
namespace {

using testing_util::Bf16ToFloats;
using testing_util::CudaKernelTest;
using testing_util::ExpectClose;
using testing_util::FastRng;
using testing_util::kBf16Poison;
using testing_util::RandomBf16;

struct AttnShape {
  const char* name;
  int heads;
  int kv_heads;
  int head_dim;
  int block_size;
};

void PrintTo(const AttnShape& s, std::ostream* os) {
  *os << s.name << " (" << s.heads << " heads, " << s.kv_heads << " kv heads, head_dim "
      << s.head_dim << ", block_size " << s.block_size << ")";
}

constexpr int kLayers = 2;
constexpr int kLayer = 1;  // layer 0 is NaN

using EvictFirst = cuda::DecodeAttentionTuning::EvictFirst;

std::string TuningName(const cuda::DecodeAttentionTuning& t) {
  const char* evict = t.evict_first == EvictFirst::kAuto     ? "auto"
                      : t.evict_first == EvictFirst::kAlways ? "on"
                                                             : "off";
  return absl::StrCat("target ", t.split_target, " floor ", t.min_split_tokens, " chain ",
                      t.max_chain, " evict ", evict);
}

// The decode tunings besides the default: no chaining, splits as short as one tile, the
// evict-first L2 policy at every batch size and at none, the most work items.
std::vector<cuda::DecodeAttentionTuning> OtherDecodeTunings() {
  std::vector<cuda::DecodeAttentionTuning> out(5);
  out[0].max_chain = 0;
  out[1].min_split_tokens = cuda::kDecodeSplitTokensStep;
  out[2].evict_first = EvictFirst::kAlways;
  out[3].evict_first = EvictFirst::kNever;
  out[4].split_target = cuda::kDecodeSplitTargetMax;
  return out;
}

// A paged cache on the host and the device, holding `tokens[s]` positions for each sequence in
// randomly scattered blocks, plus the inputs of one attention call.
struct PagedSetup {
  int num_blocks = 0;
  int max_blocks_per_seq = 0;
  size_t layer_elems = 0;
  std::vector<int32_t> block_tables;    // [num_seqs, max_blocks_per_seq]
  std::vector<float> k_layer, v_layer;  // layer kLayer as float32
  std::vector<uint16_t> qkv;            // [rows, q_stride]
  int q_stride = 0;
  DeviceBuffer d_cache, d_tables, d_qkv, d_out;
  cuda::PagedKvCache cache;
};

class AttentionCudaTest : public CudaKernelTest, public ::testing::WithParamInterface<AttnShape> {
 protected:
  // Builds the cache for sequences of the given total lengths and `rows` query rows.
  PagedSetup Build(const std::vector<int>& tokens, int rows, float q_std, uint64_t seed) {
    const AttnShape& sh = GetParam();
    FastRng rng(seed);
    PagedSetup s;
    const int num_seqs = static_cast<int>(tokens.size());
    int needed = 0;
    for (const int t : tokens) {
      const int blocks = (t + sh.block_size - 1) / sh.block_size;
      needed += blocks;
      s.max_blocks_per_seq = std::max(s.max_blocks_per_seq, blocks);
    }
    s.max_blocks_per_seq += 2;
    s.num_blocks = needed + 3;
    std::vector<int32_t> perm(s.num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[rng.Next() % (i + 1)]);
    s.block_tables.assign(static_cast<size_t>(num_seqs) * s.max_blocks_per_seq, 0);
    int next = 0;
    for (int q = 0; q < num_seqs; ++q) {
      const int blocks = (tokens[q] + sh.block_size - 1) / sh.block_size;
      for (int b = 0; b < s.max_blocks_per_seq; ++b) {
        // Entries past the sequence's blocks hold some valid id that must not be read.
        s.block_tables[static_cast<size_t>(q) * s.max_blocks_per_seq + b] =
            b < blocks ? perm[next++] : perm[rng.Next() % perm.size()];
      }
    }
    const size_t slot = static_cast<size_t>(sh.kv_heads) * sh.head_dim;
    s.layer_elems = static_cast<size_t>(s.num_blocks) * sh.block_size * slot;
    // KvCacheLayout order [layer][k|v][block]; layer 0 stays NaN.
    std::vector<uint16_t> cache(2 * kLayers * s.layer_elems, kBf16Poison);
    const std::vector<uint16_t> k = RandomBf16(s.layer_elems, 1.0f, rng);
    const std::vector<uint16_t> v = RandomBf16(s.layer_elems, 1.0f, rng);
    std::copy(k.begin(), k.end(), cache.begin() + 2 * kLayer * s.layer_elems);
    std::copy(v.begin(), v.end(), cache.begin() + (2 * kLayer + 1) * s.layer_elems);
    s.k_layer = Bf16ToFloats(k);
    s.v_layer = Bf16ToFloats(v);
    s.q_stride = (sh.heads + 2 * sh.kv_heads) * sh.head_dim;
    s.qkv = RandomBf16(static_cast<size_t>(rows) * s.q_stride, q_std, rng);

    s.d_cache = Upload(cache);
    s.d_tables = Upload(s.block_tables);
    s.d_qkv = Upload(s.qkv);
    s.d_out = Upload(
        std::vector<uint16_t>(static_cast<size_t>(rows) * sh.heads * sh.head_dim, kBf16Poison));
    s.cache.k = s.d_cache.data;
    s.cache.v = static_cast<uint16_t*>(s.d_cache.data) + s.layer_elems;
    s.cache.num_layers = kLayers;
    s.cache.num_blocks = s.num_blocks;
    s.cache.block_size = sh.block_size;
    s.cache.num_kv_heads = sh.kv_heads;
    s.cache.head_dim = sh.head_dim;
    s.cache.layer_stride = 2 * s.layer_elems;
    return s;
  }

  // cpu::PagedAttention of sequence q's `rows` queries (starting at query row `row0`) at positions
  // [start, start + rows), into ref rows [row0, row0 + rows).
  void Reference(const PagedSetup& s, const std::vector<float>& q, int seq, int row0, int rows,
                 int start, std::vector<float>& ref) {
    const AttnShape& sh = GetParam();
    cpu::PagedKvShape shape;
    shape.block_size = sh.block_size;
    shape.num_kv_heads = sh.kv_heads;
    shape.head_dim = sh.head_dim;
    std::vector<float> scratch(start + rows);
    cpu::PagedAttention(q.data() + static_cast<size_t>(row0) * s.q_stride, s.q_stride, rows, start,
                        sh.heads,
                        s.block_tables.data() + static_cast<size_t>(seq) * s.max_blocks_per_seq,
                        shape, s.k_layer.data(), s.v_layer.data(), Scale(), scratch.data(),
                        ref.data() + static_cast<size_t>(row0) * sh.heads * sh.head_dim);
  }

  float Scale() const { return 1.0f / std::sqrt(static_cast<float>(GetParam().head_dim)); }

  // Decode: one query per sequence over `contexts[s]` cached tokens (the last is its own).
  void RunDecode(const std::vector<int>& contexts, int hint = 0, float q_std = 1.0f,
                 const cuda::DecodeAttentionTuning& tuning = {}) {
    const AttnShape& sh = GetParam();
    const int num_seqs = static_cast<int>(contexts.size());
    const int max_context = *std::max_element(contexts.begin(), contexts.end());
    if (hint == 0) hint = max_context;
    std::string what = absl::StrCat("decode ", sh.name, " bs=", sh.block_size, " seqs=", num_seqs,
                                    " max_context=", max_context, " hint=", hint, " q_std=", q_std,
                                    " tuning=", TuningName(tuning));
    if (num_seqs <= 8) absl::StrAppend(&what, " contexts=", absl::StrJoin(contexts, ","));
    SCOPED_TRACE(what);
    PagedSetup s = Build(contexts, num_seqs, q_std, num_seqs * 1000003ull + max_context + hint);
    const std::vector<float> q = Bf16ToFloats(s.qkv);
    std::vector<float> ref(static_cast<size_t>(num_seqs) * sh.heads * sh.head_dim);
    for (int i = 0; i < num_seqs; ++i) Reference(s, q, i, i, 1, contexts[i] - 1, ref);

    DeviceBuffer d_lens = Upload(contexts);
    const size_t ws_bytes =
        cuda::DecodeAttentionWorkspaceBytes(num_seqs, sh.heads, sh.head_dim, hint, tuning);
    DeviceBuffer d_ws = Upload(std::vector<uint8_t>(std::max<size_t>(ws_bytes, 16), 0));
    cuda::DecodeAttentionArgs a;
    a.q = s.d_qkv.data;
    a.q_row_stride = s.q_stride;
    a.cache = &s.cache;
    a.layer = kLayer;
    a.block_tables = static_cast<const int32_t*>(s.d_tables.data);
    a.max_blocks_per_seq = s.max_blocks_per_seq;
    a.context_lens = static_cast<const int32_t*>(d_lens.data);
    a.num_seqs = num_seqs;
    a.num_heads = sh.heads;
    a.scale = Scale();
    a.out = s.d_out.data;
    a.workspace = ws_bytes > 0 ? d_ws.data : nullptr;
    a.workspace_bytes = ws_bytes;
    a.max_context_len = hint;
    a.tuning = tuning;
    const absl::Status status = cuda::LaunchPagedDecodeAttention(a, stream());
    ASSERT_TRUE(status.ok()) << status;
    const std::vector<uint16_t> first = Download<uint16_t>(s.d_out, ref.size());
    const std::vector<float> got = Bf16ToFloats(first);
    // P keeps ~16 bits (bf16 high + low parts): only the output's bf16 rounding and float32
    // summation order differ.
    ExpectClose(got, ref, 1e-4, 1.0 / 128, 5e-3, what);
    // A second launch on the same workspace (as every decode step does) gives the same bits.
    ASSERT_TRUE(cuda::LaunchPagedDecodeAttention(a, stream()).ok());
    EXPECT_TRUE(Download<uint16_t>(s.d_out, ref.size()) == first) << what << ": relaunch differs";
    FreeAll();
  }

  // The chained decode kernel (`chain` (sequence, KV head) items per CTA) against one item per
  // CTA, both through the raw launcher with a one-split plan: the per-warp arithmetic and the
  // merge are the same, so the bits must be; and against the CPU reference. Returns false (and
  // checks nothing) where the chained kernel does not take the shape on this GPU.
  bool RunDecodeChain(const std::vector<int>& contexts, int chain) {
    const AttnShape& sh = GetParam();
    const int group = sh.heads / sh.kv_heads;
    if (!cuda::internal::DecodeChainRuns(sh.head_dim, group)) return false;
    const int num_seqs = static_cast<int>(contexts.size());
    const int max_context = std::max(1, *std::max_element(contexts.begin(), contexts.end()));
    const std::string what =
        absl::StrCat("chain ", sh.name, " bs=", sh.block_size, " seqs=", num_seqs, " chain=", chain,
                     " max_context=", max_context);
    SCOPED_TRACE(what);
    PagedSetup s = Build(contexts, num_seqs, 1.0f, num_seqs * 131ull + chain + max_context);
    const std::vector<float> q = Bf16ToFloats(s.qkv);
    std::vector<float> ref(static_cast<size_t>(num_seqs) * sh.heads * sh.head_dim);
    for (int i = 0; i < num_seqs; ++i) {
      if (contexts[i] > 0) Reference(s, q, i, i, 1, contexts[i] - 1, ref);
    }
    DeviceBuffer d_lens = Upload(contexts);
    cuda::internal::PagedLayerView view;
    view.k = static_cast<uint16_t*>(s.cache.k) + kLayer * s.cache.layer_stride;
    view.v = static_cast<uint16_t*>(s.cache.v) + kLayer * s.cache.layer_stride;
    view.block_size = sh.block_size;
    view.num_kv_heads = sh.kv_heads;
    view.head_dim = sh.head_dim;
    view.block_tables = static_cast<const int32_t*>(s.d_tables.data);
    view.max_blocks_per_seq = s.max_blocks_per_seq;
    std::vector<uint16_t> got[2];
    for (const int c : {1, chain}) {
      cuda::internal::DecodeSplitPlan plan;
      plan.num_splits = 1;
      plan.partition_size = (max_context + 63) / 64 * 64;
      plan.chain = c;
      const cudaError_t e = cuda::internal::LaunchDecodeAttentionRaw(
          s.d_qkv.data, s.q_stride, view, static_cast<const int32_t*>(d_lens.data), num_seqs,
          sh.heads, Scale(), s.d_out.data, nullptr, plan, /*evict_first=*/true,
          static_cast<cudaStream_t>(stream()));
      EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
      got[c > 1] = Download<uint16_t>(s.d_out, ref.size());
    }
    EXPECT_TRUE(got[1] == got[0]) << what << ": chained output differs from one item per CTA";
    ExpectClose(Bf16ToFloats(got[1]), ref, 1e-4, 1.0 / 128, 5e-3, what);
    FreeAll();
    return true;
  }

  // Prefill: sequence i has new_tokens[i] queries after start_pos[i] cached tokens. `portable`:
  // through the raw launcher on the mma.sync kernel whatever the GPU.
  void RunPrefill(const std::vector<int>& new_tokens, const std::vector<int>& start_pos,
                  float q_std = 1.0f, bool portable = false) {
    const AttnShape& sh = GetParam();
    const int num_seqs = static_cast<int>(new_tokens.size());
    const std::string what = absl::StrCat(
        "prefill ", sh.name, " bs=", sh.block_size, " new=", absl::StrJoin(new_tokens, ","),
        " start=", absl::StrJoin(start_pos, ","), " q_std=", q_std, portable ? " mma.sync" : "");
    SCOPED_TRACE(what);
    std::vector<int> totals(num_seqs);
    std::vector<int32_t> starts_rows(num_seqs + 1, 0);
    for (int i = 0; i < num_seqs; ++i) {
      totals[i] = start_pos[i] + new_tokens[i];
      starts_rows[i + 1] = starts_rows[i] + new_tokens[i];
    }
    const int rows = starts_rows[num_seqs];
    PagedSetup s = Build(totals, rows, q_std, rows * 7919ull + totals[0]);
    const std::vector<float> q = Bf16ToFloats(s.qkv);
    std::vector<float> ref(static_cast<size_t>(rows) * sh.heads * sh.head_dim);
    for (int i = 0; i < num_seqs; ++i) {
      Reference(s, q, i, starts_rows[i], new_tokens[i], start_pos[i], ref);
    }

    DeviceBuffer d_rows = Upload(starts_rows);
    DeviceBuffer d_start = Upload(start_pos);
    cuda::PrefillAttentionArgs a;
    a.q = s.d_qkv.data;
    a.q_row_stride = s.q_stride;
    a.cache = &s.cache;
    a.layer = kLayer;
    a.block_tables = static_cast<const int32_t*>(s.d_tables.data);
    a.max_blocks_per_seq = s.max_blocks_per_seq;
    a.seq_start_rows = static_cast<const int32_t*>(d_rows.data);
    a.start_pos = static_cast<const int32_t*>(d_start.data);
    a.num_seqs = num_seqs;
    a.max_new_tokens = *std::max_element(new_tokens.begin(), new_tokens.end());
    a.num_heads = sh.heads;
    a.scale = Scale();
    a.out = s.d_out.data;
    if (portable) {
      cuda::internal::PagedLayerView view;
      view.k = static_cast<uint16_t*>(s.cache.k) + kLayer * s.cache.layer_stride;
      view.v = static_cast<uint16_t*>(s.cache.v) + kLayer * s.cache.layer_stride;
      view.block_size = sh.block_size;
      view.num_kv_heads = sh.kv_heads;
      view.head_dim = sh.head_dim;
      view.block_tables = a.block_tables;
      view.max_blocks_per_seq = a.max_blocks_per_seq;
      view.num_slots = static_cast<int64_t>(s.num_blocks) * sh.block_size;
      const cudaError_t e = cuda::internal::LaunchPrefillAttentionRaw(
          a.q, a.q_row_stride, view, a.seq_start_rows, a.start_pos, a.num_seqs, a.max_new_tokens,
          a.num_heads, a.scale, a.out, /*allow_wgmma=*/false, static_cast<cudaStream_t>(stream()));
      ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
    } else {
      const absl::Status status = cuda::LaunchPrefillAttention(a, stream());
      ASSERT_TRUE(status.ok()) << status;
    }
    const std::vector<float> got = Bf16ToFloats(Download<uint16_t>(s.d_out, ref.size()));
    // P is rounded to bf16 for the tensor-core P V product (as FlashAttention): each output moves
    // by at most 2^-8 * max|v| (|v| < 1.74) on top of its own bf16 rounding.
    ExpectClose(got, ref, 8e-3, 1.0 / 128, 1e-2, what);
    FreeAll();
  }
};

// Model shapes: every case.
class ModelShapeTest : public AttentionCudaTest {};
// Other GQA groups and block sizes: a few cases.
class GroupShapeTest : public AttentionCudaTest {};

TEST_P(ModelShapeTest, DecodeBatch1) {
  for (const int context : {1, 17, 1000, 8192}) RunDecode({context});
}

TEST_P(ModelShapeTest, DecodeBatch8MixedContexts) {
  RunDecode({8192, 1000, 17, 1, 4000, 8191, 129, 600});
}

TEST_P(ModelShapeTest, DecodeBatch64) {
  std::vector<int> contexts(64);
  FastRng rng(64);
  for (auto& c : contexts) c = rng.UniformInt(1, 600);
  contexts[5] = 3000;
  contexts[63] = 1;
  RunDecode(contexts);
}

TEST_P(ModelShapeTest, DecodePeakedScores) { RunDecode({2000, 300, 5}, 0, /*q_std=*/6.0f); }

// The hint is below the real context: the last split takes the rest, results stay right.
TEST_P(ModelShapeTest, DecodeHintBelowContext) { RunDecode({8192, 50}, /*hint=*/1000); }

TEST_P(ModelShapeTest, PrefillNoCache) {
  RunPrefill({1}, {0});
  RunPrefill({17}, {0});
  RunPrefill({512}, {0});
}

TEST_P(ModelShapeTest, PrefillWithCachedPrefix) {
  RunPrefill({100}, {37});
  RunPrefill({1, 64, 200}, {0, 1000, 5});
  RunPrefill({512, 300}, {300, 0});
}

TEST_P(ModelShapeTest, PrefillTileBoundaries) {
  RunPrefill({65, 127, 128, 129, 63}, {63, 64, 0, 1, 200});
}

TEST_P(ModelShapeTest, PrefillPeakedScores) { RunPrefill({130, 40}, {70, 0}, /*q_std=*/6.0f); }

// The batch-1, -8 and -64 cases under each other tuning: splits and reads change, results do not
// (beyond float32 summation order).
TEST_P(ModelShapeTest, DecodeOtherTunings) {
  std::vector<int> batch64(64);
  FastRng rng(64);
  for (auto& c : batch64) c = rng.UniformInt(1, 600);
  batch64[5] = 3000;
  batch64[63] = 1;
  for (const cuda::DecodeAttentionTuning& t : OtherDecodeTunings()) {
    for (const int context : {1, 17, 1000, 8192}) RunDecode({context}, 0, 1.0f, t);
    RunDecode({8192, 1000, 17, 1, 4000, 8191, 129, 600}, 0, 1.0f, t);
    RunDecode(batch64, 0, 1.0f, t);
    RunDecode({8192, 50}, /*hint=*/1000, 1.0f, t);
  }
}

// Head_dim 128 prefill on the portable mma.sync kernel (compute capability 9.0 takes the wgmma
// kernel by default; other head dims take the mma.sync kernel in every case above).
TEST_P(ModelShapeTest, PrefillPortableKernel) {
  if (GetParam().head_dim != 128) GTEST_SKIP() << "head_dim " << GetParam().head_dim;
  RunPrefill({1}, {0}, 1.0f, /*portable=*/true);
  RunPrefill({512}, {0}, 1.0f, true);
  RunPrefill({1, 64, 200}, {0, 1000, 5}, 1.0f, true);
  RunPrefill({65, 127, 128, 129, 63}, {63, 64, 0, 1, 200}, 1.0f, true);
  RunPrefill({130, 40}, {70, 0}, /*q_std=*/6.0f, true);
}

// Chained decode: short contexts (warps without tiles in an item), padding rows, tile and block
// boundaries, long contexts; chains of 2, 3 and the most items per CTA.
TEST_P(ModelShapeTest, DecodeChained) {
  if (GetParam().head_dim != 128) {
    // The launcher takes one item per CTA for other head sizes (covered by the plain cases).
    EXPECT_FALSE(cuda::internal::DecodeChainRuns(GetParam().head_dim, 4));
    GTEST_SKIP() << "chained decode attention is for head_dim 128 only";
  }
  std::vector<int> contexts(37);
  FastRng rng(37);
  for (auto& c : contexts) c = rng.UniformInt(1, 700);
  const std::vector<int> special = {0, 1, 15, 16, 17, 48, 49, 64, 65, 2000, 0, 129};
  std::copy(special.begin(), special.end(), contexts.begin());
  for (const int chain : {2, 3, cuda::internal::kDecodeMaxChain}) {
    // head_dim 128 with a group of 4, which the chained kernel takes on any GPU that runs the
    // two-CTA-per-SM decode kernel.
    ASSERT_TRUE(RunDecodeChain(contexts, chain)) << "chained kernel not taken";
  }
}

TEST_P(GroupShapeTest, DecodeChained) {
  if (!RunDecodeChain({300, 1, 0, 77, 1000, 16}, 2)) {
    GTEST_SKIP() << "the chained kernel does not take this group on this GPU";
  }
}

TEST_P(GroupShapeTest, Decode) {
  RunDecode({8192});
  RunDecode({8192, 1000, 17, 1, 4000, 8191, 129, 600});
}

TEST_P(GroupShapeTest, DecodeOtherTunings) {
  for (const cuda::DecodeAttentionTuning& t : OtherDecodeTunings()) {
    RunDecode({8192, 1000, 17, 1, 4000, 8191, 129, 600}, 0, 1.0f, t);
  }
}

TEST_P(GroupShapeTest, Prefill) { RunPrefill({1, 64, 200}, {0, 1000, 5}); }

TEST_P(GroupShapeTest, PrefillPortableKernel) {
  if (GetParam().head_dim != 128) GTEST_SKIP() << "head_dim " << GetParam().head_dim;
  RunPrefill({1, 64, 200}, {0, 1000, 5}, 1.0f, /*portable=*/true);
}

INSTANTIATE_TEST_SUITE_P(Models, ModelShapeTest,
                         ::testing::Values(AttnShape{"llama3_8b", 32, 8, 128, 16},
                                           AttnShape{"llama3_2_1b", 32, 8, 64, 16},
                                           AttnShape{"tiny", 8, 2, 32, 16}),
                         [](const auto& info) { return std::string(info.param.name); });

INSTANTIATE_TEST_SUITE_P(Groups, GroupShapeTest,
                         ::testing::Values(AttnShape{"group16_bs7", 16, 1, 64, 7},
                                           AttnShape{"group8_bs32", 32, 4, 128, 32},
                                           AttnShape{"group1_bs1", 8, 8, 64, 1},
                                           AttnShape{"group2_bs5", 4, 2, 32, 5},
                                           // Larger KV blocks: the TMA prefill producer's 64- and
                                           // 128-row boxes.
                                           AttnShape{"group4_bs64", 32, 8, 128, 64},
                                           AttnShape{"group4_bs128", 32, 8, 128, 128},
                                           // The wgmma prefill kernel without its TMA producer:
                                           // paired heads where block_size % 16 != 0, one head
                                           // per CTA where the group is odd.
                                           AttnShape{"group2_bs5_hd128", 8, 4, 128, 5},
                                           AttnShape{"group3_hd128", 12, 4, 128, 16}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tandem

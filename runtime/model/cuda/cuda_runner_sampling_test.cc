// The CUDA runner's sampling on the GPU (SequenceChunk::sample) against the CPU sampler on the
// runner's own logits: every step of many sequences runs twice, once returning logits and once
// returning sampled tokens (same batch, same KV writes), and each sampled token must be
// SampleFromRequest on that row's logits exactly (logprob within 1e-4). Batch sizes cover the
// CUDA-graph buckets (1, 4 padded from 3, 8, 64, 256 padded from 130) over enough decode steps for
// graph replays, an eager batch over 256 logits rows (two sampling launches) and prefill steps.
// The checkpoint has a 32000-token vocabulary and near-flat logits, so top-p sets exceed the
// kernel's shared-memory path. Skipped without a GPU.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/float16.h"
#include "runtime/device/cuda/cuda_device.h"
#include "runtime/model/cuda/cuda_model_runner.h"
#include "runtime/model/cuda/random_checkpoint_for_test.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/sampling/sampler.h"

namespace tandem {
namespace {

constexpr int kVocab = 32000;
constexpr int kBlockSize = 16;
constexpr int kBlocksPerSeq = 4;  // 64 positions per sequence
constexpr int kMaxSeqs = 300;

// A small Llama-shaped bf16 checkpoint (untied LM head with small weights: near-flat logits).
std::string WriteCheckpoint() {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(base != nullptr ? base : "/tmp") /
                                    ("tandem_cuda_sampling_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  testing_util::RandomCheckpoint spec;
  spec.vocab = kVocab;
  spec.hidden = 128;
  spec.inter = 256;
  spec.head_dim = 32;
  spec.max_positions = 2048;
  spec.rms_norm_eps = 1e-5;
  spec.rope_theta = 10000.0;
  spec.lm_head_std = 0.08f;
  spec.proj_std = 0.08f;
  spec.seed = 3;
  return testing_util::WriteRandomCheckpoint(dir.string(), spec);
}

// Random parameters of every kind, greedy included, as the engine would build them.
SampleRequest RandomRequest(std::mt19937_64& rng, uint64_t step) {
  SamplingParams p;
  std::uniform_int_distribution<int> mode(0, 7);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  switch (mode(rng)) {
    case 0:
      p.temperature = 0.0f;
      break;
    case 1:
      p.temperature = 0.3f + 1.7f * unit(rng);
      break;
    case 2:
      p.temperature = 0.8f;
      p.top_k = 50;
      break;
    case 3:
      p.temperature = 1.0f;
      p.top_p = 0.9f;  // thousands of candidates on near-flat logits
      break;
    case 4:
      p.temperature = 0.7f;
      p.top_p = 0.5f;
      break;
    case 5:
      p.temperature = 1.3f;
      p.min_p = 0.2f + 0.6f * unit(rng);
      break;
    case 6:
      p.temperature = 0.5f + unit(rng);
      p.top_k = 3000;
      p.top_p = 0.1f + 0.8f * unit(rng);
      p.min_p = 0.05f;
      break;
    default:
      p.temperature = 0.05f;  // nearly greedy: exp underflows for most tokens
      p.top_k = 1 + static_cast<int>(unit(rng) * 40);
      break;
  }
  return MakeSampleRequest(p, rng(), step);
}

class CudaRunnerSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) GTEST_SKIP() << "no usable CUDA GPU: " << count.status();
    if (*count == 0) GTEST_SKIP() << "no CUDA GPU present (cudaGetDeviceCount = 0)";
  }

  // A runner on the random checkpoint, with the weights it was made from (kept alive for the
  // test); runner null, with the failure recorded, when it cannot be made.
  struct Made {
    std::unique_ptr<TensorStore> store;
    std::unique_ptr<CudaModelRunner> runner;
  };
  Made MakeRunner() {
    Made m;
    const std::string dir = WriteCheckpoint();
    if (HasFailure()) return m;
    absl::StatusOr<ModelConfig> config = LoadModelConfig(dir);
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return m;
    absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(dir);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return m;
    m.store = *std::move(store);
    CudaRunnerOptions options;
    options.block_size = kBlockSize;
    options.num_blocks = kMaxSeqs * kBlocksPerSeq;
    options.max_batch_tokens = 512;
    auto made = CreateCudaModelRunner(*config, *m.store, options);
    EXPECT_TRUE(made.ok()) << made.status();
    if (made.ok()) m.runner = *std::move(made);
    return m;
  }
};

TEST_F(CudaRunnerSamplingTest, DeviceSampledTokensMatchCpuSamplerOnOwnLogits) {
  Made made = MakeRunner();
  ASSERT_NE(made.runner, nullptr);
  CudaModelRunner& runner = *made.runner;
  ASSERT_TRUE(runner.SupportsDeviceSampling());

  std::mt19937_64 rng(17);
  int cases = 0, replayed_sampled_steps = 0, distinct_steps = 0;
  // (sequences, decode steps): buckets 1, 4 (padded), 8, 64, 256 (padded) and eager 300.
  const std::pair<int, int> groups[] = {{1, 8}, {3, 6}, {8, 6}, {64, 5}, {130, 4}, {300, 3}};
  int first_seq = 0;
  for (const auto& [num_seqs, decode_steps] : groups) {
    struct Seq {
      std::vector<int32_t> tokens;
      std::vector<int32_t> table;
      int computed = 0;
      int generated = 0;
    };
    std::vector<Seq> seqs(num_seqs);
    for (int i = 0; i < num_seqs; ++i) {
      Seq& s = seqs[i];
      const int len = 2 + static_cast<int>(rng() % 14);
      for (int t = 0; t < len; ++t) s.tokens.push_back(static_cast<int32_t>(rng() % kVocab));
      for (int b = 0; b < kBlocksPerSeq; ++b) {
        s.table.push_back(static_cast<int32_t>(((first_seq + i) % kMaxSeqs) * kBlocksPerSeq + b));
      }
    }
    first_seq += num_seqs;
    for (int step = 0; step <= decode_steps; ++step) {
      // Step 0 prefills every prompt; later steps decode one token per sequence.
      std::vector<SampleRequest> requests;
      for (int i = 0; i < num_seqs; ++i) {
        requests.push_back(RandomRequest(rng, static_cast<uint64_t>(seqs[i].generated)));
      }
      auto batch_of = [&](bool sample) {
        ForwardBatch batch;
        for (int i = 0; i < num_seqs; ++i) {
          const Seq& s = seqs[i];
          SequenceChunk ch;
          ch.tokens = std::span<const int32_t>(s.tokens).subspan(s.computed);
          ch.start_pos = s.computed;
          ch.block_table = s.table;
          ch.sample = sample ? &requests[i] : nullptr;
          batch.chunks.push_back(ch);
        }
        return batch;
      };
      const std::string what = absl::StrCat(num_seqs, " sequences, step ", step);
      ForwardOutput logits_out, sampled_out;
      ASSERT_TRUE(runner.Forward(batch_of(false), &logits_out).ok()) << what;
      ASSERT_EQ(logits_out.rows, num_seqs) << what;
      ASSERT_TRUE(logits_out.tokens.empty()) << what;
      ASSERT_TRUE(runner.Forward(batch_of(true), &sampled_out).ok()) << what;
      const CudaStepStats stats = runner.last_step_stats();
      replayed_sampled_steps += stats.graph_replayed ? 1 : 0;
      ASSERT_EQ(sampled_out.rows, num_seqs) << what;
      ASSERT_TRUE(sampled_out.logits.empty()) << what;
      ASSERT_EQ(sampled_out.tokens.size(), static_cast<size_t>(num_seqs)) << what;
      ASSERT_EQ(sampled_out.logprobs.size(), static_cast<size_t>(num_seqs)) << what;
      int mismatches = 0;
      for (int i = 0; i < num_seqs; ++i) {
        const std::span<const float> row(logits_out.logits.data() + static_cast<size_t>(i) * kVocab,
                                         kVocab);
        const SampleResult want = SampleFromRequest(requests[i], row);
        ++cases;
        if (sampled_out.tokens[i] != want.token) ++mismatches;
        EXPECT_EQ(sampled_out.tokens[i], want.token)
            << what << " row " << i << ": T=" << requests[i].temperature
            << " top_k=" << requests[i].top_k << " top_p=" << requests[i].top_p
            << " min_p=" << requests[i].min_p << " greedy=" << requests[i].greedy
            << " seed=" << requests[i].seed << " step=" << requests[i].step
            << " bucket=" << stats.graph_bucket << " replayed=" << stats.graph_replayed;
        EXPECT_NEAR(sampled_out.logprobs[i], want.logprob, 1e-4) << what << " row " << i;
      }
      std::printf("%-28s bucket=%3d replayed=%d mismatches=%d\n", what.c_str(), stats.graph_bucket,
                  stats.graph_replayed, mismatches);
      // Continue every sequence with its sampled token.
      int distinct = 0;
      for (int i = 0; i < num_seqs; ++i) {
        Seq& s = seqs[i];
        s.computed = static_cast<int>(s.tokens.size());
        s.tokens.push_back(sampled_out.tokens[i]);
        ++s.generated;
        distinct += sampled_out.tokens[i] != sampled_out.tokens[0];
      }
      distinct_steps += distinct > 0 ? 1 : 0;
    }
  }
  std::printf("device sampling: %d cases, %d replayed sampled steps\n", cases,
              replayed_sampled_steps);
  EXPECT_GT(cases, 2000);
  EXPECT_GT(replayed_sampled_steps, 5);  // graph replays of the sampling step were checked
  EXPECT_GT(distinct_steps, 10);         // the rows do not all collapse to one token
}

// Guided rows (SequenceChunk::allowed, filled late by ForwardBatch::masks_ready, which the runner
// must call exactly once per sampling step): every masked row's token must be
// SampleFromRequest(request, logits, allowed) on the runner's own logits, and in the mask; the
// unmasked rows of the same batch as before. Graph buckets and an eager batch of 300.
TEST_F(CudaRunnerSamplingTest, GrammarMaskedRowsMatchCpuSamplerOnOwnLogits) {
  Made made = MakeRunner();
  ASSERT_NE(made.runner, nullptr);
  CudaModelRunner& runner = *made.runner;
  constexpr int kWords = (kVocab + 63) / 64;
  std::mt19937_64 rng(23);
  int cases = 0, masked_cases = 0;
  const std::pair<int, int> groups[] = {{1, 4}, {8, 4}, {64, 3}, {300, 2}};
  for (const auto& [num_seqs, decode_steps] : groups) {
    struct Seq {
      std::vector<int32_t> tokens;
      std::vector<int32_t> table;
      int computed = 0;
      int generated = 0;
    };
    std::vector<Seq> seqs(num_seqs);
    for (int i = 0; i < num_seqs; ++i) {
      Seq& s = seqs[i];
      const int len = 2 + static_cast<int>(rng() % 14);
      for (int t = 0; t < len; ++t) s.tokens.push_back(static_cast<int32_t>(rng() % kVocab));
      for (int b = 0; b < kBlocksPerSeq; ++b) {
        s.table.push_back(static_cast<int32_t>(i * kBlocksPerSeq + b));
      }
    }
    for (int step = 0; step <= decode_steps; ++step) {
      std::vector<SampleRequest> requests;
      std::vector<std::vector<uint64_t>> want_masks(num_seqs);
      std::vector<std::vector<uint64_t>> masks(num_seqs);
      for (int i = 0; i < num_seqs; ++i) {
        requests.push_back(RandomRequest(rng, static_cast<uint64_t>(seqs[i].generated)));
        if (i % 3 == 2) continue;  // unmasked
        std::vector<uint64_t>& m = want_masks[i];
        m.assign(kWords, 0);
        const int kind = static_cast<int>(rng() % 3);
        for (int t = 0; t < kVocab; ++t) {
          const bool on = kind == 0   ? rng() % 1000 == 0
                          : kind == 1 ? rng() % 4 == 0
                                      : rng() % 50 != 0;
          if (on) m[t >> 6] |= uint64_t{1} << (t & 63);
        }
        m[0] |= 1;                   // never empty
        masks[i].assign(kWords, 0);  // filled by masks_ready
      }
      auto batch_of = [&](bool sample) {
        ForwardBatch batch;
        for (int i = 0; i < num_seqs; ++i) {
          const Seq& s = seqs[i];
          SequenceChunk ch;
          ch.tokens = std::span<const int32_t>(s.tokens).subspan(s.computed);
          ch.start_pos = s.computed;
          ch.block_table = s.table;
          ch.sample = sample ? &requests[i] : nullptr;
          if (sample) ch.allowed = masks[i];
          batch.chunks.push_back(ch);
        }
        return batch;
      };
      const std::string what = absl::StrCat(num_seqs, " sequences, step ", step);
      ForwardOutput logits_out, sampled_out;
      ASSERT_TRUE(runner.Forward(batch_of(false), &logits_out).ok()) << what;
      ForwardBatch sampled = batch_of(true);
      int ready_calls = 0;
      sampled.masks_ready = [&]() {
        ++ready_calls;
        for (int i = 0; i < num_seqs; ++i) {
          if (!want_masks[i].empty())
            std::copy(want_masks[i].begin(), want_masks[i].end(), masks[i].begin());
        }
        return absl::OkStatus();
      };
      ASSERT_TRUE(runner.Forward(sampled, &sampled_out).ok()) << what;
      EXPECT_EQ(ready_calls, 1) << what;
      ASSERT_EQ(sampled_out.tokens.size(), static_cast<size_t>(num_seqs)) << what;
      for (int i = 0; i < num_seqs; ++i) {
        const std::span<const float> row(logits_out.logits.data() + static_cast<size_t>(i) * kVocab,
                                         kVocab);
        const SampleResult want = SampleFromRequest(requests[i], row, want_masks[i]);
        ++cases;
        const int32_t got = sampled_out.tokens[i];
        EXPECT_EQ(got, want.token) << what << " row " << i << " masked " << !want_masks[i].empty();
        if (!want_masks[i].empty()) {
          ++masked_cases;
          EXPECT_TRUE((want_masks[i][got >> 6] >> (got & 63)) & 1) << what << " row " << i;
        }
        EXPECT_NEAR(sampled_out.logprobs[i], want.logprob, 1e-4) << what << " row " << i;
      }
      for (int i = 0; i < num_seqs; ++i) {
        Seq& s = seqs[i];
        s.computed = static_cast<int>(s.tokens.size());
        s.tokens.push_back(sampled_out.tokens[i]);
        ++s.generated;
      }
    }
  }
  std::printf("grammar-masked device sampling: %d cases, %d masked\n", cases, masked_cases);
  EXPECT_GT(masked_cases, 700);  // two rows in three
}

// num_logits (model_runner.h): the last k tokens of a prefill chunk each get the logits row a
// prefill of that prefix alone gives (bf16: within 2% of the row's largest logit); without
// sample requests the step returns those logits, no tokens. Chunks of 2 to 40 tokens, k up to the
// whole chunk. (A chunk that samples carries one request per row: model_runner.h; the test used
// to hand every multi-row chunk a single request, which the runner now reads past.)
TEST_F(CudaRunnerSamplingTest, MultiRowLogitsMatchEachPrefixsOwnPrefill) {
  Made made = MakeRunner();
  ASSERT_NE(made.runner, nullptr);
  CudaModelRunner& runner = *made.runner;
  std::mt19937_64 rng(31);
  int rows = 0;
  double worst = 0;
  for (int trial = 0; trial < 6; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 39);
    const int k = 1 + static_cast<int>(rng() % n);
    std::vector<int32_t> tokens;
    for (int t = 0; t < n; ++t) tokens.push_back(static_cast<int32_t>(rng() % kVocab));
    std::vector<int32_t> table;
    for (int b = 0; b < kBlocksPerSeq; ++b) table.push_back(b);
    ForwardBatch batch;
    SequenceChunk ch;
    ch.tokens = tokens;
    ch.block_table = table;
    ch.num_logits = k;
    batch.chunks.push_back(ch);
    ForwardOutput multi;
    const absl::Status forward = runner.Forward(batch, &multi);
    ASSERT_TRUE(forward.ok()) << "trial " << trial << ", " << n << " tokens, " << k
                              << " logits rows: " << forward;
    ASSERT_EQ(multi.rows, k);
    ASSERT_EQ(multi.logits.size(), static_cast<size_t>(k) * kVocab);
    EXPECT_TRUE(multi.tokens.empty());
    for (int j = 0; j < k; ++j) {
      // The prefix ending at token n - k + j, prefilled alone in other blocks.
      const int len = n - k + j + 1;
      std::vector<int32_t> other;
      for (int b = 0; b < kBlocksPerSeq; ++b) other.push_back(kBlocksPerSeq + b);
      ForwardBatch single;
      SequenceChunk sc;
      sc.tokens = std::span<const int32_t>(tokens).first(len);
      sc.block_table = other;
      single.chunks.push_back(sc);
      ForwardOutput one;
      ASSERT_TRUE(runner.Forward(single, &one).ok());
      ASSERT_EQ(one.rows, 1);
      float scale = 0, diff = 0;
      for (int v = 0; v < kVocab; ++v) {
        scale = std::max(scale, std::abs(one.logits[v]));
        diff = std::max(
            diff, std::abs(one.logits[v] - multi.logits[static_cast<size_t>(j) * kVocab + v]));
      }
      worst = std::max(worst, static_cast<double>(diff / std::max(scale, 1e-6f)));
      EXPECT_LE(diff, 0.02f * scale) << "n " << n << " k " << k << " row " << j;
      ++rows;
    }
  }
  std::printf("multi-row logits: %d rows, worst relative difference %.4f\n", rows, worst);
  EXPECT_GT(rows, 6);
}

}  // namespace
}  // namespace tandem

// Differential test of guided sampling on the GPU (token_mask_kernels.h around LaunchSampling)
// against tandem::Sample with allowed_bits (the CPU reference): random logits over the Llama 3
// vocabulary and small ones, masks from one token to nearly all (and rows without a mask mixed
// into the same batch), greedy and sampled parameters. Tokens must match exactly and lie in the
// mask; logprobs (the raw log-softmax) within 1e-4. Also prints the time of the two mask kernels
// on 32 x 128256. Skipped without a GPU.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include "runtime/kernels/cuda/cuda_kernel_test_util.h"
#include "runtime/kernels/cuda/sampling_kernels.h"
#include "runtime/kernels/cuda/token_mask_kernels.h"
#include "runtime/sampling/sampler.h"
#include "runtime/sampling/sampling_params.h"

namespace tandem {
namespace {

using cuda::SamplingRow;
using testing_util::CudaKernelTest;
using testing_util::FastRng;

class TokenMaskCudaTest : public CudaKernelTest {
 protected:
  int Compare(int rows, int vocab, uint64_t seed, bool time_it = false) {
    FastRng rng(seed);
    const int words = (vocab + 63) / 64;
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    for (float& x : logits) x = rng.Uniform(-6.0f, 6.0f);
    std::vector<uint64_t> allowed(static_cast<size_t>(rows) * words, 0);
    std::vector<int32_t> flags(rows, 0);
    std::vector<SamplingParams> params(rows);
    std::vector<SamplingRow> host_rows(rows);
    for (int r = 0; r < rows; ++r) {
      flags[r] = r % 5 != 4;  // every fifth row unmasked
      uint64_t* w = allowed.data() + static_cast<size_t>(r) * words;
      const int density = rng.UniformInt(0, 3);
      for (int t = 0; t < vocab; ++t) {
        const bool on = density == 0   ? t == rng.UniformInt(0, vocab - 1) || t == r % vocab
                        : density == 1 ? rng.UniformInt(0, 99) < 2
                        : density == 2 ? rng.UniformInt(0, 1) == 0
                                       : rng.UniformInt(0, 99) < 98;
        if (on) w[t >> 6] |= uint64_t{1} << (t & 63);
      }
      w[(r % vocab) >> 6] |= uint64_t{1} << ((r % vocab) & 63);  // never empty
      // Bits past the vocabulary must be ignored.
      if (vocab % 64 != 0) w[words - 1] |= ~uint64_t{0} << (vocab % 64);
      SamplingParams& p = params[r];
      p.temperature = r % 3 == 0 ? 0.0f : rng.Uniform(0.5f, 1.5f);
      if (r % 4 == 1) p.top_p = 0.7f;
      if (r % 6 == 2) p.top_k = 20;
      host_rows[r] = MakeSampleRequest(p, rng.Next(), rng.Next() % 1000);
    }
    const DeviceBuffer d_logits = Upload(logits);
    const DeviceBuffer d_allowed = Upload(allowed);
    const DeviceBuffer d_flags = Upload(flags);
    const DeviceBuffer d_lse = Alloc(rows * sizeof(double));
    const DeviceBuffer d_params = Alloc(rows * sizeof(SamplingRow));
    const DeviceBuffer d_tokens = Alloc(rows * sizeof(int32_t));
    const DeviceBuffer d_logprobs = Alloc(rows * sizeof(float));
    EXPECT_TRUE(
        device_
            ->CopyHostToDevice(host_rows.data(), rows * sizeof(SamplingRow), d_params, 0, stream_)
            .ok());
    cuda::TokenMaskArgs m;
    m.logits = static_cast<float*>(d_logits.data);
    m.allowed = static_cast<const uint64_t*>(d_allowed.data);
    m.mask = static_cast<const int32_t*>(d_flags.data);
    m.rows = rows;
    m.vocab = vocab;
    m.words = words;
    m.lse = static_cast<double*>(d_lse.data);
    cuda::SamplingArgs a;
    a.logits = static_cast<const float*>(d_logits.data);
    a.params = static_cast<const SamplingRow*>(d_params.data);
    a.rows = rows;
    a.vocab = vocab;
    a.tokens = static_cast<int32_t*>(d_tokens.data);
    a.logprobs = static_cast<float*>(d_logprobs.data);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(cuda::LaunchApplyTokenMask(m, stream()).ok());
    EXPECT_TRUE(cuda::LaunchSampling(a, stream()).ok());
    EXPECT_TRUE(cuda::LaunchMaskedLogprobs(m, a.tokens, a.logprobs, stream()).ok());
    const std::vector<int32_t> tokens = Download<int32_t>(d_tokens, rows);
    const std::vector<float> logprobs = Download<float>(d_logprobs, rows);
    if (time_it) {
      // Warm, then the two mask kernels alone (the logits are masked already: same work).
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) {
        EXPECT_TRUE(cuda::LaunchApplyTokenMask(m, stream()).ok());
        EXPECT_TRUE(cuda::LaunchMaskedLogprobs(m, a.tokens, a.logprobs, stream()).ok());
      }
      Download<int32_t>(d_tokens, 1);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      std::printf("mask kernels, %d x %d: %.1f us per step (first step with sampling %.1f us)\n",
                  rows, vocab, us / 20,
                  std::chrono::duration<double, std::micro>(t0 - start).count());
    }
    int cases = 0;
    for (int r = 0; r < rows; ++r) {
      const std::span<const float> row(logits.data() + static_cast<size_t>(r) * vocab, vocab);
      const std::span<const uint64_t> bits(allowed.data() + static_cast<size_t>(r) * words, words);
      const SampleResult want = Sample(params[r], row, {}, {}, host_rows[r].seed, host_rows[r].step,
                                       {}, flags[r] ? bits : std::span<const uint64_t>());
      ++cases;
      EXPECT_EQ(tokens[r], want.token) << "vocab " << vocab << " row " << r;
      if (flags[r]) {
        EXPECT_TRUE((bits[tokens[r] >> 6] >> (tokens[r] & 63)) & 1) << "row " << r;
      }
      EXPECT_NEAR(logprobs[r], want.logprob, 1e-4) << "vocab " << vocab << " row " << r;
    }
    FreeAll();
    return cases;
  }
};

TEST_F(TokenMaskCudaTest, MatchesCpuOnLlama3Vocab) {
  int cases = Compare(32, 128256, 1, /*time_it=*/true);
  cases += Compare(64, 128256, 2);
  std::printf("vocab 128256: %d cases\n", cases);
}

TEST_F(TokenMaskCudaTest, MatchesCpuOnSmallVocabs) {
  int cases = 0;
  uint64_t seed = 10;
  for (const int vocab : {1, 2, 63, 64, 65, 1000, 32000}) cases += Compare(48, vocab, ++seed);
  std::printf("small vocabs: %d cases\n", cases);
}

TEST(TokenMaskArgsTest, BadArgumentsAreRefusedBeforeLaunch) {
  float logits = 0;
  uint64_t words = 1;
  int32_t flag = 1;
  double lse = 0;
  cuda::TokenMaskArgs m{&logits, &words, &flag, 1, 1, 1, &lse};
  m.words = 0;
  EXPECT_EQ(cuda::LaunchApplyTokenMask(m, nullptr).code(), absl::StatusCode::kInvalidArgument);
  m.words = 1;
  m.rows = cuda::kSamplingMaxRows + 1;
  EXPECT_EQ(cuda::LaunchApplyTokenMask(m, nullptr).code(), absl::StatusCode::kInvalidArgument);
  m.rows = 1;
  m.allowed = nullptr;
  EXPECT_EQ(cuda::LaunchMaskedLogprobs(m, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem

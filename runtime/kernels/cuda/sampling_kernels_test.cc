// Host-side checks of the GPU sampling launcher: argument validation happens before any CUDA call
// (so no GPU is needed), ValidateSamplingRow's ranges, and the workspace size.

#include "runtime/kernels/cuda/sampling_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace tandem::cuda {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// Fake device pointers: never dereferenced, since every call here fails validation.
float g_logits[16];
SamplingRow g_params[4];
int32_t g_tokens[4];
float g_logprobs[4];

SamplingArgs Valid() {
  SamplingArgs a;
  a.logits = g_logits;
  a.params = g_params;
  a.rows = 4;
  a.vocab = 4;
  a.tokens = g_tokens;
  a.logprobs = g_logprobs;
  return a;
}

TEST(SamplingKernelsTest, RejectsBadArguments) {
  const std::vector<std::function<void(SamplingArgs&)>> mutations = {
      [](SamplingArgs& a) { a.logits = nullptr; },
      [](SamplingArgs& a) { a.params = nullptr; },
      [](SamplingArgs& a) { a.tokens = nullptr; },
      [](SamplingArgs& a) { a.logprobs = nullptr; },
      [](SamplingArgs& a) { a.rows = 0; },
      [](SamplingArgs& a) { a.rows = -3; },
      [](SamplingArgs& a) { a.rows = kSamplingMaxRows + 1; },
      [](SamplingArgs& a) { a.vocab = 0; },
      [](SamplingArgs& a) { a.vocab = -1; },
      [](SamplingArgs& a) { a.vocab = kSamplingMaxVocab + 1; },
  };
  for (size_t i = 0; i < mutations.size(); ++i) {
    SamplingArgs a = Valid();
    mutations[i](a);
    const absl::Status s = LaunchSampling(a, nullptr);
    EXPECT_EQ(s.code(), kInvalid) << "mutation " << i << ": " << s;
  }
}

TEST(SamplingKernelsTest, WorkspaceIsSizedByTheHelper) {
  for (const int rows : {1, 64, kSamplingMaxRows}) {
    for (const int vocab : {1, 128256, kSamplingMaxVocab}) {
      // The kernel keeps its state in shared memory; a null workspace of that size is accepted
      // by validation (checked below with a shape that fails for another reason).
      EXPECT_EQ(SamplingWorkspaceBytes(rows, vocab), 0u) << rows << " x " << vocab;
    }
  }
  SamplingArgs a = Valid();
  a.rows = 0;
  a.workspace = nullptr;
  a.workspace_bytes = 0;
  EXPECT_EQ(LaunchSampling(a, nullptr).code(), kInvalid);
}

TEST(SamplingKernelsTest, ValidatesRows) {
  SamplingRow ok;
  ok.temperature = 0.7f;
  ok.top_k = 50;
  ok.top_p = 0.9f;
  ok.min_p = 0.05f;
  EXPECT_TRUE(ValidateSamplingRow(ok).ok());
  SamplingRow edge;
  edge.top_p = 1.0f;
  edge.min_p = 1.0f;
  edge.top_k = -1;
  EXPECT_TRUE(ValidateSamplingRow(edge).ok());

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::function<void(SamplingRow&)>> bad = {
      [](SamplingRow& r) { r.temperature = 0.0f; }, [](SamplingRow& r) { r.temperature = -1.0f; },
      [&](SamplingRow& r) { r.temperature = nan; }, [&](SamplingRow& r) { r.temperature = inf; },
      [](SamplingRow& r) { r.top_p = 0.0f; },       [](SamplingRow& r) { r.top_p = 1.5f; },
      [&](SamplingRow& r) { r.top_p = nan; },       [](SamplingRow& r) { r.min_p = -0.1f; },
      [](SamplingRow& r) { r.min_p = 1.01f; },      [&](SamplingRow& r) { r.min_p = nan; },
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    SamplingRow r = ok;
    bad[i](r);
    EXPECT_EQ(ValidateSamplingRow(r).code(), kInvalid) << "mutation " << i;
    // A greedy row ignores the sampling fields.
    r.greedy = 1;
    EXPECT_TRUE(ValidateSamplingRow(r).ok()) << "mutation " << i;
  }
}

}  // namespace
}  // namespace tandem::cuda

#pragma once
// Token sampling from one row of logits, per request and deterministic.
//
// Order (vLLM v1): logprobs are taken from the raw logits; then repetition penalty (HF: positive
// logits divided, negative multiplied, for tokens in prompt + output), presence and frequency
// penalties (OpenAI: logit -= presence * [count > 0] + frequency * count, over output tokens);
// greedy picks the argmax (lowest id on ties). Otherwise temperature, then min_p (drop tokens with
// prob < min_p * max prob), top_k, top_p (smallest set of most likely tokens whose mass reaches
// top_p; the token crossing the threshold stays), and one inverse-CDF draw from a uniform number
// derived only from (seed, step), so a request's tokens do not depend on what else is batched.
//
// Pure functions; thread-compatible.

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/sampling/sampling_params.h"

namespace tandem {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                    // of the sampled token, raw log-softmax
  std::vector<TokenLogprob> top_logprobs;  // params.logprobs entries, most likely first
};

// A uniform double in [0, 1) from (seed, step) with a splitmix64-based counter RNG.
double UniformFromSeed(uint64_t seed, uint64_t step);

// Log-softmax of `logits`.
std::vector<float> LogSoftmax(std::span<const float> logits);

// Penalties in place, as described above. `prompt` and `output` are the request's tokens.
void ApplyPenalties(const SamplingParams& params, std::span<const int32_t> prompt,
                    std::span<const int32_t> output, std::span<float> logits);

// Probabilities after temperature, min_p, top_k and top_p (zeros for dropped tokens, the rest
// renormalized). Requires temperature > 0.
std::vector<double> FilteredProbs(const SamplingParams& params, std::span<const float> logits);

// Samples the next token. `step` is the number of tokens the request generated so far; `seed` is
// params.seed or the engine's per-request seed.
SampleResult Sample(const SamplingParams& params, std::span<const float> logits,
                    std::span<const int32_t> prompt, std::span<const int32_t> output, uint64_t seed,
                    uint64_t step);

}  // namespace tandem

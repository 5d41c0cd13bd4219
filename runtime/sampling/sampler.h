#pragma once
// Token sampling from one row of logits, per request and deterministic.
//
// Order (vLLM v1): logprobs are taken from the raw logits; then the logit controls (logit_bias
// added; tokens outside allowed_token_ids and the caller's `suppressed` tokens set to -inf:
// ApplyLogitControls); then repetition penalty (HF: positive
// logits divided, negative multiplied, for tokens in prompt + output), presence and frequency
// penalties (OpenAI: logit -= presence * [count > 0] + frequency * count, over output tokens);
// greedy picks the argmax (lowest id on ties). Otherwise temperature, then min_p (drop tokens with
// prob < min_p * max prob), top_k, top_p (smallest set of most likely tokens whose mass reaches
// top_p; the token crossing the threshold stays), and one inverse-CDF draw from a uniform number
// derived only from (seed, step), so a request's tokens do not depend on what else is batched.
//
// Exact arithmetic (sampling_math.h): after temperature each token gets an integer weight
// q = llround(exp(x / T - max / T) * 2^40), i.e. probabilities at a precision of 2^-40 relative to
// the most likely token (tokens below 2^-41 of it are never drawn). The rank order is (q
// descending, id ascending); min_p keeps q >= ceil(min_p * 2^40); top_p compares integer prefix
// sums with ceil(top_p * total); the draw is floor(u * total) against integer prefix sums in id
// order. The GPU sampler (runtime/kernels/cuda/sampling_kernels.h) uses the same formulas, so the
// two agree token for token.
//
// Pure functions; thread-compatible.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "runtime/sampling/sample_request.h"
#include "runtime/sampling/sampling_params.h"

namespace tandem {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// A given token scored against one row of logits (prompt logprobs): its raw log-softmax logprob,
// its rank (1 + the number of tokens with a strictly higher logprob) and the `top_n` most likely
// tokens (logprob descending, lower id first on ties).
struct ScoredToken {
  int32_t token = 0;
  float logprob = 0.0f;
  int rank = 0;
  std::vector<TokenLogprob> top;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                    // of the sampled token, raw log-softmax
  std::vector<TokenLogprob> top_logprobs;  // params.logprobs entries, most likely first
};

// A uniform double in [0, 1) from (seed, step) with a splitmix64-based counter RNG: the 53 bits of
// sampling_math::UniformBits times 2^-53.
double UniformFromSeed(uint64_t seed, uint64_t step);

// Log-softmax of `logits`.
std::vector<float> LogSoftmax(std::span<const float> logits);

// `token`'s ScoredToken in `logits` (token must be in range).
ScoredToken ScoreToken(std::span<const float> logits, int32_t token, int top_n);

// Penalties in place, as described above. `prompt` and `output` are the request's tokens.
void ApplyPenalties(const SamplingParams& params, std::span<const int32_t> prompt,
                    std::span<const int32_t> output, std::span<float> logits);

// logit_bias, allowed_token_ids and `suppressed` (the engine's min_tokens mask: EOS and
// stop_token_ids while too few tokens were generated) in place; ids outside the vocabulary are
// skipped.
// `allowed_bits` (a grammar's mask, one bit per token id; empty: no mask): a token whose bit is
// clear, or beyond the bits, gets -inf too.
void ApplyLogitControls(const SamplingParams& params, std::span<const int32_t> suppressed,
                        std::span<float> logits, std::span<const uint64_t> allowed_bits = {});

// Integer weights after temperature, min_p, top_k and top_p (zeros for dropped tokens); the
// sampled distribution is weight / sum. Requires temperature > 0.
std::vector<uint64_t> FilteredWeights(const SamplingParams& params, std::span<const float> logits);

// FilteredWeights normalized to probabilities (for tests and diagnostics).
std::vector<double> FilteredProbs(const SamplingParams& params, std::span<const float> logits);

// Samples the next token. `step` is the number of tokens the request generated so far; `seed` is
// params.seed or the engine's per-request seed; `suppressed` tokens cannot be drawn, unless every
// token the logit controls leave is suppressed (then `suppressed` is ignored).
SampleResult Sample(const SamplingParams& params, std::span<const float> logits,
                    std::span<const int32_t> prompt, std::span<const int32_t> output, uint64_t seed,
                    uint64_t step, std::span<const int32_t> suppressed = {},
                    std::span<const uint64_t> allowed_bits = {});

// Whether Sample's result for `params` depends on the logits, seed and step only (no repetition,
// presence or frequency penalty, no top-logprob list, no logit controls, no min_tokens): such a
// row can be sampled where its logits are (SampleRequest, model_runner.h).
bool SamplesFromLogitsOnly(const SamplingParams& params);

// The request a runner needs to reproduce Sample(params, logits, {}, {}, seed, step).
SampleRequest MakeSampleRequest(const SamplingParams& params, uint64_t seed, uint64_t step);

// InvalidArgument naming the field when a non-greedy request has a temperature that is not finite
// and > 0, top_p outside (0, 1] or min_p outside [0, 1] (what ValidateSamplingParams guarantees
// for the params MakeSampleRequest takes).
absl::Status ValidateSampleRequest(const SampleRequest& request);

// Sample(params, logits, {}, {}, request.seed, request.step) for the params `request` came from
// (top_logprobs empty).
// `allowed`: the row's grammar mask (Sample's allowed_bits); empty for none.
// SamplesFromLogitsOnly but for a guided constraint: the runner samples such a row under its
// grammar mask (model_runner.h, SequenceChunk::allowed).
bool SamplesFromLogitsAndGrammarOnly(const SamplingParams& params);

SampleResult SampleFromRequest(const SampleRequest& request, std::span<const float> logits,
                               std::span<const uint64_t> allowed = {});

}  // namespace tandem

#include "runtime/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/sampling/sampling_math.h"

namespace tandem {
namespace {

// Token ids sorted by value, descending; ties by lower id.
template <typename T>
std::vector<int32_t> SortedDesc(std::span<const T> values, size_t keep) {
  std::vector<int32_t> ids(values.size());
  std::iota(ids.begin(), ids.end(), 0);
  keep = std::min(keep, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  ids.resize(keep);
  return ids;
}

}  // namespace

double UniformFromSeed(uint64_t seed, uint64_t step) {
  return static_cast<double>(sampling_math::UniformBits(seed, step)) *
         (1.0 / 9007199254740992.0);  // 2^-53
}

std::vector<float> LogSoftmax(std::span<const float> logits) {
  float max = -std::numeric_limits<float>::infinity();
  for (float x : logits) max = std::max(max, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  const double log_sum = std::log(sum) + max;
  std::vector<float> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(logits[i] - log_sum);
  return out;
}

void ApplyPenalties(const SamplingParams& params, std::span<const int32_t> prompt,
                    std::span<const int32_t> output, std::span<float> logits) {
  const int vocab = static_cast<int>(logits.size());
  if (params.repetition_penalty != 1.0f) {
    std::vector<bool> seen(vocab, false);
    auto mark = [&](std::span<const int32_t> ids) {
      for (int32_t t : ids) {
        if (t >= 0 && t < vocab) seen[t] = true;
      }
    };
    mark(prompt);
    mark(output);
    for (int t = 0; t < vocab; ++t) {
      if (!seen[t]) continue;
      logits[t] = logits[t] > 0 ? logits[t] / params.repetition_penalty
                                : logits[t] * params.repetition_penalty;
    }
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    absl::flat_hash_map<int32_t, int> counts;
    for (int32_t t : output) {
      if (t >= 0 && t < vocab) ++counts[t];
    }
    for (const auto& [t, n] : counts) {
      logits[t] -= params.presence_penalty + params.frequency_penalty * static_cast<float>(n);
    }
  }
}

std::vector<uint64_t> FilteredWeights(const SamplingParams& params, std::span<const float> logits) {
  CHECK_GT(params.temperature, 0.0f);
  namespace sm = sampling_math;
  const size_t vocab = logits.size();
  const double temperature = params.temperature;
  double max_scaled = -std::numeric_limits<double>::infinity();
  for (float x : logits) max_scaled = std::max(max_scaled, sm::ScaledLogit(x, temperature));
  const uint64_t min_weight = sm::MinPWeight(params.min_p);
  std::vector<uint64_t> weights(vocab);
  for (size_t i = 0; i < vocab; ++i) {
    const uint64_t q = sm::TokenWeight(logits[i], temperature, max_scaled);
    weights[i] = q >= min_weight ? q : 0;
  }
  const bool top_k_on = params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab;
  if (top_k_on || params.top_p < 1.0f) {
    const size_t k = top_k_on ? static_cast<size_t>(params.top_k) : vocab;
    const std::vector<int32_t> order = SortedDesc<uint64_t>(weights, k);
    uint64_t total = 0;
    for (int32_t id : order) total += weights[id];
    const uint64_t target = sm::TopPTarget(params.top_p, total);
    std::vector<bool> keep(vocab, false);
    uint64_t kept = 0;
    for (int32_t id : order) {
      if (weights[id] == 0) break;
      keep[id] = true;
      kept += weights[id];
      if (kept >= target) break;
    }
    for (size_t i = 0; i < vocab; ++i) {
      if (!keep[i]) weights[i] = 0;
    }
  }
  return weights;
}

std::vector<double> FilteredProbs(const SamplingParams& params, std::span<const float> logits) {
  const std::vector<uint64_t> weights = FilteredWeights(params, logits);
  const double total =
      static_cast<double>(std::accumulate(weights.begin(), weights.end(), uint64_t{0}));
  std::vector<double> probs(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) probs[i] = static_cast<double>(weights[i]) / total;
  return probs;
}

void ApplyLogitControls(const SamplingParams& params, std::span<const int32_t> suppressed,
                        std::span<float> logits, std::span<const uint64_t> allowed_bits) {
  const int vocab = static_cast<int>(logits.size());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (const auto& [id, bias] : params.logit_bias) {
    if (id >= 0 && id < vocab) logits[id] += bias;
  }
  if (!params.allowed_token_ids.empty()) {
    std::vector<bool> allowed(vocab, false);
    for (int32_t id : params.allowed_token_ids) {
      if (id >= 0 && id < vocab) allowed[id] = true;
    }
    for (int t = 0; t < vocab; ++t) {
      if (!allowed[t]) logits[t] = kNegInf;
    }
  }
  for (int32_t id : suppressed) {
    if (id >= 0 && id < vocab) logits[id] = kNegInf;
  }
  if (!allowed_bits.empty()) {
    for (int t = 0; t < vocab; ++t) {
      const size_t w = static_cast<size_t>(t) >> 6;
      if (w >= allowed_bits.size() || ((allowed_bits[w] >> (t & 63)) & 1) == 0) {
        logits[t] = kNegInf;
      }
    }
  }
}

SampleResult Sample(const SamplingParams& params, std::span<const float> raw_logits,
                    std::span<const int32_t> prompt, std::span<const int32_t> output, uint64_t seed,
                    uint64_t step, std::span<const int32_t> suppressed,
                    std::span<const uint64_t> allowed_bits) {
  CHECK(!raw_logits.empty());
  SampleResult result;
  const std::vector<float> logprobs = LogSoftmax(raw_logits);
  std::vector<float> logits(raw_logits.begin(), raw_logits.end());
  ApplyLogitControls(params, suppressed, logits, allowed_bits);
  if (!suppressed.empty() &&
      std::none_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); })) {
    // Everything allowed is suppressed (allowed_token_ids holding only stop tokens): the request
    // may end rather than draw from nothing.
    logits.assign(raw_logits.begin(), raw_logits.end());
    ApplyLogitControls(params, {}, logits, allowed_bits);
  }
  ApplyPenalties(params, prompt, output, logits);

  if (params.greedy()) {
    result.token = SortedDesc<float>(logits, 1)[0];
  } else {
    const std::vector<uint64_t> weights = FilteredWeights(params, logits);
    const uint64_t total = std::accumulate(weights.begin(), weights.end(), uint64_t{0});
    const uint64_t threshold =
        sampling_math::DrawThreshold(sampling_math::UniformBits(seed, step), total);
    // The max token always has weight 2^40, so total > threshold and the walk finds a token.
    uint64_t cum = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      cum += weights[i];
      if (cum > threshold) {
        result.token = static_cast<int32_t>(i);
        break;
      }
    }
  }
  result.logprob = logprobs[result.token];
  if (params.logprobs.has_value() && *params.logprobs > 0) {
    for (int32_t id : SortedDesc<float>(logprobs, *params.logprobs)) {
      result.top_logprobs.push_back({id, logprobs[id]});
    }
  }
  return result;
}

ScoredToken ScoreToken(std::span<const float> logits, int32_t token, int top_n) {
  CHECK(token >= 0 && static_cast<size_t>(token) < logits.size());
  const std::vector<float> logprobs = LogSoftmax(logits);
  ScoredToken scored;
  scored.token = token;
  scored.logprob = logprobs[token];
  scored.rank = 1 + static_cast<int>(std::count_if(logprobs.begin(), logprobs.end(),
                                                   [&](float x) { return x > scored.logprob; }));
  if (top_n > 0) {
    for (int32_t id : SortedDesc<float>(logprobs, static_cast<size_t>(top_n))) {
      scored.top.push_back({id, logprobs[id]});
    }
  }
  return scored;
}

bool SamplesFromLogitsOnly(const SamplingParams& params) {
  return params.repetition_penalty == 1.0f && params.presence_penalty == 0.0f &&
         params.frequency_penalty == 0.0f &&
         (!params.logprobs.has_value() || *params.logprobs == 0) && params.logit_bias.empty() &&
         params.allowed_token_ids.empty() && params.min_tokens == 0 && params.guided.empty();
}

bool SamplesFromLogitsAndGrammarOnly(const SamplingParams& params) {
  SamplingParams unguided = params;
  unguided.guided = {};
  return SamplesFromLogitsOnly(unguided);
}

SampleRequest MakeSampleRequest(const SamplingParams& params, uint64_t seed, uint64_t step) {
  SampleRequest r;
  r.seed = seed;
  r.step = step;
  r.temperature = params.temperature;
  r.top_p = params.top_p;
  r.min_p = params.min_p;
  r.top_k = params.top_k;
  r.greedy = params.greedy() ? 1 : 0;
  return r;
}

absl::Status ValidateSampleRequest(const SampleRequest& r) {
  if (r.greedy != 0) return absl::OkStatus();
  if (!std::isfinite(r.temperature) || r.temperature <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample request: temperature ", r.temperature, " must be finite and > 0"));
  }
  if (!(r.top_p > 0.0f && r.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample request: top_p ", r.top_p, " is not in (0, 1]"));
  }
  if (!(r.min_p >= 0.0f && r.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample request: min_p ", r.min_p, " is not in [0, 1]"));
  }
  return absl::OkStatus();
}

SampleResult SampleFromRequest(const SampleRequest& request, std::span<const float> logits,
                               std::span<const uint64_t> allowed) {
  SamplingParams params;
  params.temperature = request.greedy != 0 ? 0.0f : request.temperature;
  params.top_p = request.top_p;
  params.min_p = request.min_p;
  params.top_k = request.top_k;
  return Sample(params, logits, {}, {}, request.seed, request.step, {}, allowed);
}

}  // namespace tandem

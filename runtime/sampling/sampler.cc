#include "runtime/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "runtime/base/logging.h"

namespace tandem {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

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
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ SplitMix64(step + 0x632be59bd9b4e019ULL));
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
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

std::vector<double> FilteredProbs(const SamplingParams& params, std::span<const float> logits) {
  CHECK_GT(params.temperature, 0.0f);
  const size_t vocab = logits.size();
  std::vector<double> probs(vocab);
  double max = -std::numeric_limits<double>::infinity();
  for (float x : logits) max = std::max(max, static_cast<double>(x) / params.temperature);
  double sum = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    probs[i] = std::exp(static_cast<double>(logits[i]) / params.temperature - max);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;

  if (params.min_p > 0.0f) {
    const double max_p = *std::max_element(probs.begin(), probs.end());
    for (double& p : probs) {
      if (p < params.min_p * max_p) p = 0.0;
    }
  }
  const bool top_k_on = params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab;
  if (top_k_on || params.top_p < 1.0f) {
    const size_t k = top_k_on ? static_cast<size_t>(params.top_k) : vocab;
    std::vector<int32_t> order = SortedDesc<double>(probs, k);
    std::vector<bool> keep(vocab, false);
    double kept_mass = 0.0;
    double total = 0.0;
    for (int32_t id : order) total += probs[id];
    for (int32_t id : order) {
      if (probs[id] == 0.0) break;
      keep[id] = true;
      kept_mass += probs[id];
      if (kept_mass >= params.top_p * total) break;
    }
    for (size_t i = 0; i < vocab; ++i) {
      if (!keep[i]) probs[i] = 0.0;
    }
  }
  sum = std::accumulate(probs.begin(), probs.end(), 0.0);
  for (double& p : probs) p /= sum;
  return probs;
}

SampleResult Sample(const SamplingParams& params, std::span<const float> raw_logits,
                    std::span<const int32_t> prompt, std::span<const int32_t> output, uint64_t seed,
                    uint64_t step) {
  CHECK(!raw_logits.empty());
  SampleResult result;
  const std::vector<float> logprobs = LogSoftmax(raw_logits);
  std::vector<float> logits(raw_logits.begin(), raw_logits.end());
  ApplyPenalties(params, prompt, output, logits);

  if (params.greedy()) {
    result.token = SortedDesc<float>(logits, 1)[0];
  } else {
    const std::vector<double> probs = FilteredProbs(params, logits);
    const double u = UniformFromSeed(seed, step);
    double cum = 0.0;
    int32_t last_nonzero = 0;
    result.token = -1;
    for (size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] == 0.0) continue;
      last_nonzero = static_cast<int32_t>(i);
      cum += probs[i];
      if (u < cum) {
        result.token = static_cast<int32_t>(i);
        break;
      }
    }
    if (result.token < 0) result.token = last_nonzero;  // rounding: u just below the total
  }
  result.logprob = logprobs[result.token];
  if (params.logprobs.has_value() && *params.logprobs > 0) {
    for (int32_t id : SortedDesc<float>(logprobs, *params.logprobs)) {
      result.top_logprobs.push_back({id, logprobs[id]});
    }
  }
  return result;
}

}  // namespace tandem

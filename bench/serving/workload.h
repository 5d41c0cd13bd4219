#pragma once
// What a serving benchmark sends and when: prompts with their requested output lengths (synthetic
// or from a JSONL dataset) and request arrival times (Poisson, constant spacing, or all at once).
//
// Pure functions of their arguments and seed (std::mt19937_64): the same seed gives the same
// prompts and schedule. Errors (unreadable or malformed dataset) are returned, never thrown.

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {
class Tokenizer;
}

namespace tandem::bench {

struct WorkItem {
  std::string prompt;  // user message (chat) or prompt text (completions)
  // Prompt tokens as the client knows them: exact with a tokenizer, else the word count (an
  // estimate); -1 when unknown. The server's `usage` replaces it when reported.
  int input_len = -1;
  int output_len = 0;  // max_tokens to request
};

struct SyntheticSpec {
  int num_prompts = 1000;
  int input_len = 1024;
  int output_len = 128;
  double range_ratio = 0;  // lengths uniform in [len*(1-r), len*(1+r)], as vLLM's random dataset
  uint64_t seed = 0;
  // Shared prefixes (vLLM's prefix-repetition dataset): with prefix_groups > 0, `prefix_groups`
  // random prefixes of `prefix_len` tokens are drawn, and prompt i is prefix (i mod groups)
  // followed by its own random input_len tokens; the prompts are then shuffled (seeded).
  int prefix_groups = 0;
  int prefix_len = 0;
};

// Prompts of random words (about one token each for BPE vocabularies), `input_len` words each.
// With `tokenizer`, prompts are built from random non-special vocabulary tokens and re-encoded
// until they encode to exactly the drawn length (without special tokens). With shared prefixes,
// input_len counts the prefix too.
std::vector<WorkItem> SyntheticWorkload(const SyntheticSpec& spec, const Tokenizer* tokenizer);

// JSON Lines, one request per line: {"prompt": "..."} with optional "output_len" (or
// "max_tokens") and "input_len". Lines without an output length get `default_output_len`.
// Blank lines are skipped. With `tokenizer`, input_len is the prompt's exact token count.
absl::StatusOr<std::vector<WorkItem>> LoadDataset(const std::string& path, int default_output_len,
                                                  const Tokenizer* tokenizer);

enum class Arrival { kPoisson, kConstant };

// Request send times, seconds after the start: exponential gaps of mean 1/rate (Poisson), gaps
// of exactly 1/rate (constant), or all zero when `rate` is infinite. Stateful so that --duration
// runs can draw as many as they need.
class ArrivalSchedule {
 public:
  ArrivalSchedule(double rate, Arrival arrival, uint64_t seed);
  double Next();  // the next send time; non-decreasing

 private:
  double rate_;
  Arrival arrival_;
  std::mt19937_64 rng_;
  double t_ = 0;
  int64_t count_ = 0;  // arrivals after the first (constant spacing)
  bool first_ = true;
};

}  // namespace tandem::bench

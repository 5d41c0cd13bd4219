#include "bench/serving/workload.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "runtime/model/tokenizer.h"

namespace tandem::bench {
namespace {

// Short common words: one BPE token each (with the leading space) in Llama/Qwen vocabularies.
constexpr std::array<const char*, 96> kWords = {
    "the",   "of",    "and",   "to",     "in",   "is",   "you",   "that",   "it",    "he",
    "was",   "for",   "on",    "are",    "as",   "with", "his",   "they",   "at",    "be",
    "this",  "have",  "from",  "or",     "one",  "had",  "by",    "word",   "but",   "not",
    "what",  "all",   "were",  "we",     "when", "your", "can",   "said",   "there", "use",
    "an",    "each",  "which", "she",    "do",   "how",  "their", "if",     "will",  "up",
    "other", "about", "out",   "many",   "then", "them", "these", "so",     "some",  "her",
    "would", "make",  "like",  "him",    "into", "time", "has",   "look",   "two",   "more",
    "write", "go",    "see",   "number", "no",   "way",  "could", "people", "my",    "than",
    "first", "water", "been",  "call",   "who",  "oil",  "its",   "now",    "find",  "long",
    "down",  "day",   "did",   "get",    "come", "made"};

int DrawLen(int len, double ratio, std::mt19937_64& rng) {
  if (ratio <= 0) return std::max(1, len);
  const int lo = std::max(1, static_cast<int>(std::floor(len * (1 - ratio))));
  const int hi = std::max(lo, static_cast<int>(std::ceil(len * (1 + ratio))));
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

std::string RandomWords(int n, std::mt19937_64& rng) {
  std::uniform_int_distribution<size_t> pick(0, kWords.size() - 1);
  std::string out;
  out.reserve(static_cast<size_t>(n) * 5);
  for (int i = 0; i < n; ++i) {
    if (i > 0) out.push_back(' ');
    out.append(kWords[pick(rng)]);
  }
  return out;
}

// Token ids that survive decode -> encode on their own (no byte fragments, no special tokens):
// prompts built from them re-tokenize to about the same length, so ExactTokens converges fast.
std::vector<int32_t> CleanIds(const Tokenizer& tok, std::mt19937_64& rng) {
  const int vocab = tok.vocab_size();
  std::vector<int32_t> candidates;
  if (vocab <= 20000) {
    for (int32_t id = 0; id < vocab; ++id) candidates.push_back(id);
  } else {
    std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
    for (int i = 0; i < 20000; ++i) candidates.push_back(pick(rng));
  }
  std::vector<int32_t> clean;
  for (int32_t id : candidates) {
    if (tok.IsSpecial(id)) continue;
    const int32_t one[] = {id};
    const std::string text = tok.Decode(one, /*skip_special_tokens=*/true);
    if (text.empty() || text.find("\xEF\xBF\xBD") != std::string::npos) continue;  // U+FFFD
    std::vector<int32_t> again = tok.Encode(text, /*add_special_tokens=*/false);
    if (again.size() == 1 && again[0] == id) clean.push_back(id);
  }
  return clean;
}

// Text that encodes to exactly `n` tokens: decode random ids, re-encode, then trim or extend the
// ids and try again (decode/encode is not a bijection, so a few rounds may be needed).
std::string ExactTokens(const Tokenizer& tok, const std::vector<int32_t>& pool, int n,
                        std::mt19937_64& rng) {
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(pool[pick(rng)]);
  std::string text;
  for (int round = 0; round < 32; ++round) {
    text = tok.Decode(ids, /*skip_special_tokens=*/true);
    std::vector<int32_t> again = tok.Encode(text, /*add_special_tokens=*/false);
    if (static_cast<int>(again.size()) == n) return text;
    ids = std::move(again);
    if (static_cast<int>(ids.size()) > n) {
      ids.resize(n);
    } else {
      while (static_cast<int>(ids.size()) < n) ids.push_back(pool[pick(rng)]);
    }
  }
  return text;  // the closest found; the caller re-counts its tokens
}

}  // namespace

std::vector<WorkItem> SyntheticWorkload(const SyntheticSpec& spec, const Tokenizer* tokenizer) {
  std::mt19937_64 rng(spec.seed);
  std::vector<WorkItem> items;
  items.reserve(spec.num_prompts);
  std::vector<int32_t> pool;
  if (tokenizer != nullptr) pool = CleanIds(*tokenizer, rng);
  if (pool.empty()) tokenizer = nullptr;  // nothing usable: fall back to words
  auto draw_text = [&](int len) {
    return tokenizer != nullptr ? ExactTokens(*tokenizer, pool, len, rng) : RandomWords(len, rng);
  };
  std::vector<std::string> prefixes;
  if (spec.prefix_groups > 0 && spec.prefix_len > 0) {
    for (int g = 0; g < spec.prefix_groups; ++g) prefixes.push_back(draw_text(spec.prefix_len));
  }
  for (int i = 0; i < spec.num_prompts; ++i) {
    WorkItem w;
    const int in = DrawLen(spec.input_len, spec.range_ratio, rng);
    w.output_len = DrawLen(spec.output_len, spec.range_ratio, rng);
    w.prompt = draw_text(in);
    if (!prefixes.empty()) w.prompt = absl::StrCat(prefixes[i % prefixes.size()], " ", w.prompt);
    w.input_len = tokenizer != nullptr ? static_cast<int>(tokenizer->Encode(w.prompt, false).size())
                                       : in + (prefixes.empty() ? 0 : spec.prefix_len);
    items.push_back(std::move(w));
  }
  if (!prefixes.empty()) std::shuffle(items.begin(), items.end(), rng);
  return items;
}

absl::StatusOr<std::vector<WorkItem>> LoadDataset(const std::string& path, int default_output_len,
                                                  const Tokenizer* tokenizer) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open dataset ", path));
  std::vector<WorkItem> items;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    auto where = [&] { return absl::StrCat(path, ":", line_no, ": "); };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "invalid JSON: ", e.what()));
    }
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "expected {\"prompt\": string}"));
    }
    WorkItem w;
    w.prompt = j["prompt"].get<std::string>();
    w.output_len = default_output_len;
    for (const char* key : {"output_len", "max_tokens"}) {
      if (!j.contains(key)) continue;
      if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1 ||
          j[key].get<int64_t>() > (1 << 30)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "\"", key, "\" must be a positive integer"));
      }
      w.output_len = j[key].get<int>();
      break;
    }
    if (tokenizer != nullptr) {
      w.input_len = static_cast<int>(tokenizer->Encode(w.prompt, false).size());
    } else if (j.contains("input_len") && j["input_len"].is_number_integer()) {
      w.input_len = j["input_len"].get<int>();
    } else {
      w.input_len = static_cast<int>(
          std::vector<absl::string_view>(absl::StrSplit(w.prompt, ' ', absl::SkipWhitespace()))
              .size());
    }
    items.push_back(std::move(w));
  }
  if (items.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no requests"));
  return items;
}

ArrivalSchedule::ArrivalSchedule(double rate, Arrival arrival, uint64_t seed)
    : rate_(rate), arrival_(arrival), rng_(seed) {}

double ArrivalSchedule::Next() {
  if (first_ || std::isinf(rate_)) {
    first_ = false;
    return t_;
  }
  switch (arrival_) {
    case Arrival::kPoisson:
      t_ += std::exponential_distribution<double>(rate_)(rng_);
      break;
    case Arrival::kConstant:
      t_ = static_cast<double>(++count_) / rate_;  // k / rate exactly, no accumulated rounding
      break;
  }
  return t_;
}

}  // namespace tandem::bench

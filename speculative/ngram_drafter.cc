#include "speculative/ngram_drafter.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::speculative {
namespace {

constexpr int32_t kSeparator = -1;  // between corpus documents: never a token, never matched

uint64_t Mix(uint64_t h, int32_t token) {
  h ^= static_cast<uint64_t>(static_cast<uint32_t>(token)) + 0x9e3779b97f4a7c15ULL + (h << 6) +
       (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

uint64_t Key(uint64_t chain, int n) {
  return chain ^ (static_cast<uint64_t>(n) * 0xc2b2ae3d27d4eb4fULL);
}

}  // namespace

void NgramIndex::Extend(std::span<const int32_t> tokens) {
  const int len = static_cast<int>(tokens.size());
  // N-grams ending (exclusive) at e < len: each has a continuation token at e.
  for (int e = std::max(indexed_, 1); e < len; ++e) {
    uint64_t chain = 0;
    for (int n = 1; n <= max_ && n <= e; ++n) {
      const int32_t t = tokens[static_cast<size_t>(e - n)];
      if (t == kSeparator) break;
      chain = Mix(chain, t);
      if (n >= min_) ends_[Key(chain, n)] = e;
    }
  }
  indexed_ = std::max(indexed_, len);
}

NgramIndex::Match NgramIndex::Find(std::span<const int32_t> tokens,
                                   std::span<const int32_t> suffix) const {
  const int len = static_cast<int>(suffix.size());
  const int longest = std::min(max_, len);
  std::vector<uint64_t> keys(static_cast<size_t>(longest) + 1);
  uint64_t chain = 0;
  for (int n = 1; n <= longest; ++n) {
    chain = Mix(chain, suffix[static_cast<size_t>(len - n)]);
    keys[static_cast<size_t>(n)] = Key(chain, n);
  }
  for (int n = longest; n >= min_; --n) {
    const auto it = ends_.find(keys[static_cast<size_t>(n)]);
    if (it == ends_.end()) continue;
    const int end = it->second;
    if (end < n || end > static_cast<int>(tokens.size())) continue;
    if (std::equal(tokens.begin() + (end - n), tokens.begin() + end, suffix.end() - n)) {
      return Match{n, end};
    }
  }
  return Match{};
}

absl::StatusOr<std::unique_ptr<NgramDrafter>> NgramDrafter::Create(
    const NgramDrafterOptions& options) {
  if (options.min_match < 1 || options.max_match < options.min_match || options.max_match > 64) {
    return absl::InvalidArgumentError(absl::StrCat("ngram drafter: need 1 <= min_match (",
                                                   options.min_match, ") <= max_match (",
                                                   options.max_match, ") <= 64"));
  }
  if (options.tokens_per_matched_token < 1 || options.corpus_tokens < 0) {
    return absl::InvalidArgumentError(
        "ngram drafter: tokens_per_matched_token must be >= 1 and corpus_tokens >= 0");
  }
  return std::unique_ptr<NgramDrafter>(new NgramDrafter(options));
}

std::vector<int32_t> NgramDrafter::ProposeOne(const DraftRequest& request) {
  const std::span<const int32_t> tokens = request.tokens;
  auto [it, inserted] = sequences_.try_emplace(request.key, options_.min_match, options_.max_match);
  NgramIndex& own = it->second;
  if (own.indexed() > static_cast<int>(tokens.size())) own.Reset();  // came back shorter
  own.Extend(tokens);
  const NgramIndex::Match mine = own.Find(tokens, tokens);
  const NgramIndex::Match theirs =
      corpus_.empty() ? NgramIndex::Match{} : corpus_index_.Find(corpus_, tokens);
  const bool use_corpus = theirs.n > mine.n;
  const NgramIndex::Match m = use_corpus ? theirs : mine;
  if (m.n == 0) return {};
  const std::span<const int32_t> source = use_corpus ? std::span<const int32_t>(corpus_) : tokens;
  const int64_t limit = std::min<int64_t>(
      request.max_tokens, static_cast<int64_t>(options_.tokens_per_matched_token) * m.n);
  std::vector<int32_t> out;
  for (size_t p = static_cast<size_t>(m.end);
       p < source.size() && static_cast<int64_t>(out.size()) < limit && source[p] != kSeparator;
       ++p) {
    out.push_back(source[p]);
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> NgramDrafter::Propose(
    std::span<const DraftRequest> requests, absl::Time /*deadline*/) {
  std::vector<std::vector<int32_t>> out;
  out.reserve(requests.size());
  for (const DraftRequest& r : requests) {
    if (r.max_tokens < 1 || r.tokens.empty()) {
      out.emplace_back();
      continue;
    }
    out.push_back(ProposeOne(r));
  }
  return out;
}

void NgramDrafter::Release(int64_t key, std::span<const int32_t> tokens, int num_prompt_tokens) {
  sequences_.erase(key);
  if (options_.corpus_tokens == 0) return;
  const size_t start = static_cast<size_t>(std::clamp<int>(num_prompt_tokens, 0, tokens.size()));
  if (start == tokens.size()) return;
  // The output only (prompts are the clients' own text), capped at the corpus size.
  const size_t keep = std::min<size_t>(tokens.size() - start, options_.corpus_tokens);
  corpus_.insert(corpus_.end(), tokens.end() - static_cast<std::ptrdiff_t>(keep), tokens.end());
  corpus_.push_back(kSeparator);
  if (static_cast<int64_t>(corpus_.size()) > 2 * options_.corpus_tokens) {
    // Drop the oldest documents down to corpus_tokens, at a document boundary, and re-index.
    const auto cut =
        std::find(corpus_.end() - options_.corpus_tokens - 1, corpus_.end(), kSeparator);
    corpus_.erase(corpus_.begin(), cut + 1);
    corpus_index_.Reset();
  }
  corpus_index_.Extend(corpus_);
}

}  // namespace tandem::speculative

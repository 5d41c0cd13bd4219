#pragma once
// NgramDrafter ("ngram"): prompt lookup and suffix decoding without a model. For each sequence
// it finds the longest recent n-gram (min_match <= n <= max_match) that ends the sequence's
// tokens and also occurs earlier, and proposes the tokens that followed that earlier occurrence:
// first in the sequence itself (its prompt and output: edits, code, quoting), then in a corpus of
// the worker's recent outputs (answers that repeat across requests). The longer the match, the
// more it proposes: up to tokens_per_matched_token * n, capped by the request's max_tokens.
//
// Index: per sequence, a hash map per n from the hash of each n-gram to the end of its latest
// occurrence, extended incrementally as the sequence grows (O(max_match) per token); matches are
// checked token by token, so a hash collision never proposes a wrong continuation. The corpus
// keeps the outputs of the last released sequences up to corpus_tokens tokens (oldest dropped,
// re-indexed when it has doubled).
//
// Thread-compatible (one engine thread).

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "speculative/drafter.h"

namespace tandem::speculative {

struct NgramDrafterOptions {
  int min_match = 2;  // shortest n-gram that counts as a match
  int max_match = 8;  // longest n-gram looked up
  int tokens_per_matched_token = 2;
  int64_t corpus_tokens = 1 << 16;  // recent outputs kept for cross-request matches; 0: none
};

// An n-gram index over one token sequence (exposed for tests).
class NgramIndex {
 public:
  NgramIndex(int min_match, int max_match) : min_(min_match), max_(max_match) {}
  // Indexes every n-gram of tokens that ends before tokens.size() - 1 more than last time
  // (tokens must extend what was indexed before; a shorter or different sequence: Reset first).
  void Extend(std::span<const int32_t> tokens);
  void Reset() { ends_.clear(), indexed_ = 0; }
  int indexed() const { return indexed_; }
  // The longest n-gram ending `suffix` that occurs (ends) in the indexed tokens: its length n and
  // where that occurrence ends (an index into `tokens`). n == 0: none.
  struct Match {
    int n = 0;
    int end = 0;
  };
  Match Find(std::span<const int32_t> tokens, std::span<const int32_t> suffix) const;

 private:
  int min_, max_;
  int indexed_ = 0;  // n-grams ending at positions < indexed_ are in ends_
  absl::flat_hash_map<uint64_t, int32_t> ends_;  // hash(n, n-gram) -> latest end
};

class NgramDrafter : public Drafter {
 public:
  static absl::StatusOr<std::unique_ptr<NgramDrafter>> Create(const NgramDrafterOptions& options);
  std::string_view name() const override { return "ngram"; }
  absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(std::span<const DraftRequest> requests,
                                                            absl::Time deadline) override;
  void Release(int64_t key, std::span<const int32_t> tokens, int num_prompt_tokens) override;

  int64_t corpus_size() const { return static_cast<int64_t>(corpus_.size()); }

 private:
  explicit NgramDrafter(const NgramDrafterOptions& options)
      : options_(options), corpus_index_(options.min_match, options.max_match) {}
  std::vector<int32_t> ProposeOne(const DraftRequest& request);

  NgramDrafterOptions options_;
  absl::flat_hash_map<int64_t, NgramIndex> sequences_;
  // Released outputs, oldest first, each followed by a separator (-1).
  std::vector<int32_t> corpus_;
  NgramIndex corpus_index_;
};

}  // namespace tandem::speculative

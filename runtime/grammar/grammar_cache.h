#pragma once
// CompiledGrammar: a guided-decoding constraint (a regex or a list of choices) compiled for one
// vocabulary: its byte automaton and its token masker. GrammarCache compiles each distinct
// constraint once per engine and shares it between the requests that use it (vLLM users send
// the same schema with every request).
//
// Thread-safety: a CompiledGrammar is immutable (its masker caches under its own lock); the cache
// takes a lock per lookup. The token bytes passed to the cache must outlive it.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/grammar/byte_dfa.h"
#include "runtime/grammar/token_mask.h"

namespace tandem::grammar {

class CompiledGrammar {
 public:
  // Exactly one of `regex` (non-empty) and `choices` (non-empty).
  static absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(
      const std::string& regex, const std::vector<std::string>& choices,
      const std::vector<std::string>* token_bytes);

  const ByteDfa& dfa() const { return dfa_; }
  const TokenMasker& masker() const { return *masker_; }

 private:
  explicit CompiledGrammar(ByteDfa dfa) : dfa_(std::move(dfa)) {}
  ByteDfa dfa_;
  std::unique_ptr<TokenMasker> masker_;  // points at dfa_: the object never moves (shared_ptr)
};

class GrammarCache {
 public:
  explicit GrammarCache(const std::vector<std::string>* token_bytes, size_t capacity = 64)
      : token_bytes_(token_bytes), capacity_(capacity) {}
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Get(
      const std::string& regex, const std::vector<std::string>& choices);
  size_t size() const;

 private:
  const std::vector<std::string>* token_bytes_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const CompiledGrammar>> entries_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::grammar

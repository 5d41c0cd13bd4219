#pragma once
// CompiledGrammar: a guided-decoding constraint (a regex, a list of choices or a GBNF grammar)
// compiled for one vocabulary: its byte automaton (a ByteDfa, or a GrammarPda for a grammar) and
// its token masker. GrammarCache compiles each distinct
// constraint once per engine and shares it between the requests that use it (vLLM users send
// the same schema with every request).
//
// Thread-safety: a CompiledGrammar is immutable (its masker caches under its own lock); the cache
// takes a lock per lookup.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/grammar/byte_automaton.h"
#include "runtime/grammar/token_mask.h"

namespace tandem::grammar {

class CompiledGrammar {
 public:
  // Exactly one of `regex`, `choices` and `gbnf` non-empty.
  static absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(
      const std::string& regex, const std::vector<std::string>& choices, const std::string& gbnf,
      std::shared_ptr<const VocabTrie> vocab);

  const ByteAutomaton& automaton() const { return *automaton_; }
  const TokenMasker& masker() const { return *masker_; }

 private:
  explicit CompiledGrammar(std::unique_ptr<const ByteAutomaton> automaton)
      : automaton_(std::move(automaton)) {}
  std::unique_ptr<const ByteAutomaton> automaton_;
  std::unique_ptr<TokenMasker> masker_;  // points at *automaton_
};

class GrammarCache {
 public:
  // Builds the vocabulary's trie once, for every constraint.
  // At most `capacity` constraints (each with at most TokenMasker::kDefaultMaxCached masks: 4 MiB
  // at 131,072 tokens, so 128 MiB in all at the default).
  explicit GrammarCache(const std::vector<std::string>& token_bytes, size_t capacity = 32)
      : vocab_(std::make_shared<const VocabTrie>(token_bytes)), capacity_(capacity) {}
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Get(
      const std::string& regex, const std::vector<std::string>& choices,
      const std::string& gbnf = "");
  size_t size() const;

 private:
  const std::shared_ptr<const VocabTrie> vocab_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const CompiledGrammar>> entries_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::grammar

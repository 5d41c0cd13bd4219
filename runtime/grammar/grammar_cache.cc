#include "runtime/grammar/grammar_cache.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/grammar/byte_dfa.h"
#include "runtime/grammar/pda.h"

namespace tandem::grammar {

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Compile(
    const std::string& regex, const std::vector<std::string>& choices, const std::string& gbnf,
    std::shared_ptr<const VocabTrie> vocab) {
  if (!regex.empty() + !choices.empty() + !gbnf.empty() != 1) {
    return absl::InvalidArgumentError(
        "guided decoding: give one of a regex, choices and a grammar");
  }
  std::unique_ptr<const ByteAutomaton> automaton;
  if (!gbnf.empty()) {
    absl::StatusOr<std::unique_ptr<GrammarPda>> pda = GrammarPda::FromGbnf(gbnf);
    if (!pda.ok()) return pda.status();
    automaton = *std::move(pda);
  } else {
    absl::StatusOr<ByteDfa> dfa =
        regex.empty() ? ByteDfa::FromChoices(choices) : ByteDfa::FromRegex(regex);
    if (!dfa.ok()) return dfa.status();
    automaton = std::make_unique<const ByteDfa>(*std::move(dfa));
  }
  std::shared_ptr<CompiledGrammar> g(new CompiledGrammar(std::move(automaton)));
  g->masker_ = std::make_unique<TokenMasker>(g->automaton_.get(), std::move(vocab));
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCache::Get(
    const std::string& regex, const std::vector<std::string>& choices, const std::string& gbnf) {
  // Key: the kind, then the parts with their lengths (no separator can be forged).
  std::string key = !gbnf.empty()   ? absl::StrCat("g", gbnf.size(), ":", gbnf)
                    : regex.empty() ? "c"
                                    : absl::StrCat("r", regex.size(), ":", regex);
  for (const std::string& c : choices) absl::StrAppend(&key, c.size(), ":", c);
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
  }
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g =
      CompiledGrammar::Compile(regex, choices, gbnf, vocab_);
  if (!g.ok()) return g.status();
  absl::MutexLock lock(&mu_);
  if (entries_.size() >= capacity_) entries_.clear();  // a simple bound; recompiles are cheap
  return entries_.emplace(std::move(key), *std::move(g)).first->second;
}

size_t GrammarCache::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace tandem::grammar

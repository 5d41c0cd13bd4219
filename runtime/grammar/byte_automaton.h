#pragma once
// ByteAutomaton: what guided decoding needs of a constraint, whatever compiled it. States are
// ints (start() first, kDeadState for "no match can follow"); the engine keeps one per guided
// sequence, feeds it each sampled token's bytes (Walk), asks whether the output may end there
// (accepting) or go on (can_continue), and masks the vocabulary with AllowedTokens.
//
// Implementations: ByteDfa (byte_dfa.h: regexes, choices and JSON Schemas, every state
// precomputed) and GrammarPda (pda.h: GBNF grammars, a pushdown automaton whose states are made
// as they are reached).
//
// Thread-safety: every method may be called from any thread at once.

#include <cstdint>

#include "absl/strings/string_view.h"

namespace tandem::grammar {

inline constexpr int kDeadState = -1;

class TokenBitmask;
class VocabTrie;

class ByteAutomaton {
 public:
  virtual ~ByteAutomaton() = default;

  virtual int start() const = 0;
  // `bytes` from `state` (a live state); kDeadState as soon as no match can follow.
  virtual int Walk(int state, absl::string_view bytes) const = 0;
  // Whether the text that led to `state` is a whole match.
  virtual bool accepting(int state) const = 0;
  // Whether some non-empty continuation from `state` can still match (else only the end can).
  virtual bool can_continue(int state) const = 0;
  // Sets the bit of every token of `trie` whose bytes, fed from `state`, do not reach
  // kDeadState. `mask` has trie.vocab_size() bits; other bits are left as they are.
  virtual void AllowedTokens(int state, const VocabTrie& trie, TokenBitmask* mask) const = 0;

  // Full match of `text`.
  bool Matches(absl::string_view text) const {
    const int s = Walk(start(), text);
    return s != kDeadState && accepting(s);
  }
};

}  // namespace tandem::grammar

#pragma once
// ByteDfa: a deterministic automaton over bytes, compiled from a regular expression or from a
// list of literal choices (vLLM's guided_regex and guided_choice), for grammar-constrained
// decoding. A whole output must match (full-match semantics: `^` and `$` at the ends are
// accepted and change nothing).
//
// The regex subset, over UTF-8 text:
//   literals (UTF-8 characters are their bytes), `.` (any UTF-8 character but "\n"),
//   escapes \d \D \w \W \s \S \n \r \t \f \v \0 \xHH and \ before any punctuation,
//   classes [a-z_0-9] and [^...] (ASCII members and ranges, and the escapes above; a negated class
//   also matches every non-ASCII character), groups (...) and (?:...), alternation |,
//   quantifiers * + ? {m} {m,} {m,n} (m, n <= 256), lazy suffixes (`*?` ...: the same language).
// Not supported, refused with InvalidArgument naming the construct and its offset: lookaround,
// backreferences, named groups, \b, anchors other than at the ends, non-ASCII class members.
//
// Compilation: Thompson NFA, then subset construction (bounded by 4 * `max_states`), then
// Hopcroft minimization over the pattern's byte classes, bounded by `max_states` (InvalidArgument
// past either, so a hostile pattern cannot take the server's memory). Dead states are pruned:
// every state the DFA keeps can still reach an accepting state. State 0 is the start.
//
// Value type; immutable after construction; thread-safe to share. A ByteAutomaton
// (byte_automaton.h).

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/grammar/byte_automaton.h"

namespace tandem::grammar {

struct ByteDfaLimits {
  int max_states = 4096;  // of the minimal automaton; the subset construction may take 4x
  // Minimize (Hopcroft): equivalent states merge, so `A(,A)*` costs about as much as `A`. Off
  // only for tests that compare against the unminimized automaton.
  bool minimize = true;
  size_t max_pattern_bytes = 128 << 10;  // JSON Schemas compile to regexes of up to 96 KiB
  int max_repeat = 256;                  // m and n of {m,n}
};

// `text` with every metacharacter of this regex subset escaped, so it matches itself (bytes,
// UTF-8 included, stay literal).
std::string RegexEscape(absl::string_view text);

class ByteDfa final : public ByteAutomaton {
 public:
  static absl::StatusOr<ByteDfa> FromRegex(absl::string_view pattern,
                                           const ByteDfaLimits& limits = {});
  // Exactly one of `choices` (each non-empty), as guided_choice.
  static absl::StatusOr<ByteDfa> FromChoices(const std::vector<std::string>& choices,
                                             const ByteDfaLimits& limits = {});

  int start() const override { return 0; }
  int num_states() const { return static_cast<int>(next_.size()); }
  // The state after `byte` from `state` (kDeadState: no match can follow).
  int Next(int state, uint8_t byte) const { return next_[state][byte]; }
  int Walk(int state, absl::string_view bytes) const override;
  bool accepting(int state) const override { return accepting_[state]; }
  bool can_continue(int state) const override { return can_continue_[state]; }
  // Walks the trie alongside the automaton: tokens that share a prefix share its steps, and a
  // dead branch is cut with all the tokens under it.
  void AllowedTokens(int state, const VocabTrie& trie, TokenBitmask* mask) const override;

 private:
  std::vector<std::array<int32_t, 256>> next_;
  std::vector<bool> accepting_;
  std::vector<bool> can_continue_;
  friend class DfaBuilder;
};

}  // namespace tandem::grammar

#pragma once
// GBNF grammars (llama.cpp's and XGrammar's EBNF dialect; vLLM's `guided_grammar`): the parser.
// GrammarPda (pda.h) compiles the parsed rules into a pushdown automaton for guided decoding.
//
// The dialect:
//   rule-name ::= alternatives        a rule may start on the line after '::=', span lines
//                                     inside ( ), and go on on a line that starts with a bar
//   "literal"                         escapes \n \r \t \\ \" \' \[ \] \xHH \uHHHH \UHHHHHHHH
//   [a-z0-9_] [^"\\]                  classes with ranges and the same escapes; a negated class
//                                     matches any character (code point) not listed
//   .                                 any character, newline included
//   ( ... )  a | b  x* x+ x? x{m} x{m,} x{m,n}   (m, n <= 256)
//   # comment to the end of the line
// `root` is the start rule. Rule names are letters, digits, '-' and '_'.
//
// Errors (InvalidArgument, naming line:column or the rule): syntax errors, a rule used but never
// defined, no `root`, a rule defined twice, more than `max_rules` rules, a grammar over
// `max_grammar_bytes`.
//
// Thread-safety: pure functions; GbnfGrammar is a value.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::grammar {

struct GbnfOptions {
  size_t max_grammar_bytes = 64 << 10;  // of the grammar text
  int max_rules = 1024;
};

// One node of a rule's body.
struct GbnfNode {
  enum class Kind { kSeq, kAlt, kLiteral, kClass, kAny, kRef, kRepeat };
  Kind kind = Kind::kSeq;
  std::vector<GbnfNode> kids;                         // kSeq, kAlt: the parts; kRepeat: one
  std::string text;                                   // kLiteral: UTF-8 bytes; kRef: the rule name
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // kClass, inclusive code points
  bool negated = false;                               // kClass
  int min = 0, max = 0;                               // kRepeat; max -1: unbounded
  int rule = -1;                                      // kRef: index into GbnfGrammar::rules
  size_t pos = 0;                                     // where it starts in the grammar text
};

struct GbnfGrammar {
  std::vector<std::pair<std::string, GbnfNode>> rules;  // in definition order
  int root = 0;                                         // the `root` rule's index
  std::string text;                                     // the grammar, for Where()
  // "line:column" of a byte offset of `text`.
  std::string Where(size_t pos) const;
};

// Parses and checks references (every kRef has its `rule`).
absl::StatusOr<GbnfGrammar> ParseGbnf(absl::string_view text, const GbnfOptions& options = {});

}  // namespace tandem::grammar

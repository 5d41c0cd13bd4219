#pragma once
// GBNF grammars (llama.cpp's and XGrammar's EBNF dialect; vLLM's `guided_grammar`) compiled to a
// regular expression in the ByteDfa subset (byte_dfa.h), the way json_schema.h compiles schemas,
// so guided decoding runs them through the same automaton and masks.
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
// Recursion: a grammar is context-free and an automaton is not, so a recursive rule is expanded
// at most `max_recursion_depth` times along any derivation (a JSON value nests that deep); past
// it the recursive alternative is not offered. Every output the automaton accepts is still a
// sentence of the grammar; only deeper nesting is not produced. The compiler uses the largest
// depth <= max_recursion_depth whose automaton fits the limits, and reports it.
//
// Errors (InvalidArgument, naming line:column or the rule): syntax errors, a rule used but never
// defined, no `root`, a rule defined twice, a rule that can never finish (every alternative
// recurses), non-ASCII class ranges wider than 256 code points, and grammars too large for the
// limits at every depth.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::grammar {

struct GbnfOptions {
  int max_recursion_depth = 4;          // expansions of one rule along a derivation
  size_t max_grammar_bytes = 64 << 10;  // of the grammar text
  size_t max_regex_bytes = 96 << 10;    // of the regex produced
  int max_rules = 1024;
};

struct GbnfRegex {
  std::string regex;
  int recursion_depth = 0;  // the depth used; 0 when the grammar does not recurse
};

absl::StatusOr<GbnfRegex> GbnfToRegex(absl::string_view grammar, const GbnfOptions& options = {});

}  // namespace tandem::grammar

#pragma once
// Lexer of the chat-template Jinja subset: splits template source into text and the tokens inside
// `{{ }}` / `{% %}` (comments `{# #}` are dropped), applying whitespace control exactly as Jinja
// does: `-` on a tag strips all whitespace on that side; `trim_blocks` drops the first newline
// after a block or comment tag; `lstrip_blocks` drops spaces/tabs between a line start and a block
// or comment tag (`{%+` opts out); one trailing newline of the source is dropped unless
// `keep_trailing_newline`.
//
// Pure function; errors (unterminated tag or string, stray character) carry the line number.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::jinja {

struct LexOptions {
  // Hugging Face compiles chat templates with trim_blocks=True, lstrip_blocks=True (and so does
  // the transformers.js Jinja implementation); these defaults match it.
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

enum class TokenType {
  kText,       // literal template text (already whitespace-controlled)
  kExprOpen,   // {{
  kExprClose,  // }}
  kStmtOpen,   // {%
  kStmtClose,  // %}
  kName,       // identifier or keyword
  kString,     // string literal, escapes decoded
  kInt,
  kFloat,
  kOp,  // operator or punctuation: + - * / // % ** ~ == != < > <= >= = ( ) [ ] { } , . : |
  kEnd,
};

struct Token {
  TokenType type = TokenType::kEnd;
  std::string text;  // text, name, decoded string, or operator
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0;
};

// The last token is always kEnd.
absl::StatusOr<std::vector<Token>> Lex(std::string_view source, const LexOptions& options = {});

}  // namespace tandem::jinja

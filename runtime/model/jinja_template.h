#pragma once
// A small Jinja interpreter for chat templates: the subset that the Llama 3 / 3.1 / 3.2 and ChatML
// (Qwen2, Qwen2.5, Qwen3) templates use, with the semantics of Hugging Face's Jinja environment
// (trim_blocks, lstrip_blocks, Python value semantics, default Undefined).
//
// Subset:
//   statements  if/elif/else, for (tuple targets, `else`, loop.index/index0/revindex/revindex0/
//               first/last/length/previtem/nextitem), set (names and namespace attributes);
//               `{# #}` comments; `-` whitespace control.
//   expressions literals (strings with escapes, ints, floats, true/false/none in both cases,
//               lists, tuples, dicts), names, `.attr`, `[item]`, slices `[a:b:c]`, `+ - * / // %
//               ** ~`, comparisons (chained), `in`/`not in`, `and`/`or`/`not`, `x if c else y`.
//   filters     trim length count tojson(indent) upper lower default/d items string join reject
//               select first last list int float replace title abs capitalize unique
//   tests       defined undefined none string mapping iterable sequence number integer float
//               boolean true false equalto/eq ne odd even lower upper callable in
//   methods     str: strip lstrip rstrip startswith endswith split upper lower replace title
//               capitalize find; dict: items keys values get
//   functions   raise_exception(msg), strftime_now(fmt) (local time), namespace(...), range(...)
// Anything else fails at Compile with the construct and its line.
//
// Undefined follows Jinja's default Undefined: falsy, prints as nothing, iterates as empty, has
// length 0, and fails when used in arithmetic or when an attribute of it is read.
//
// Thread-safety: a compiled Template is immutable; Render may run concurrently.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/jinja_lexer.h"
#include "runtime/model/jinja_parser.h"
#include "runtime/model/jinja_value.h"

namespace tandem::jinja {

class Template {
 public:
  // Errors: syntax errors and constructs outside the subset (InvalidArgument, with the line).
  static absl::StatusOr<Template> Compile(std::string_view source, const LexOptions& options = {});

  // Renders with `variables` as the template's globals (on top of the built-in functions).
  // Errors: raise_exception() (InvalidArgument carrying its message), runtime type errors and
  // operations on undefined values (InvalidArgument, with the line).
  absl::StatusOr<std::string> Render(const Object& variables) const;

 private:
  explicit Template(std::vector<Node> nodes)
      : nodes_(std::make_shared<const std::vector<Node>>(std::move(nodes))) {}
  std::shared_ptr<const std::vector<Node>> nodes_;
};

}  // namespace tandem::jinja

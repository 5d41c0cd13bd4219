#pragma once
// JSON Schema to regular expression, for structured outputs (response_format json_schema and
// json_object, vLLM's guided_json and structured_outputs.json). The regex is in ByteDfa's subset
// (byte_dfa.h) and matches JSON texts that validate against the schema; the engine then decodes
// under its automaton like any guided_regex.
//
// What compiles (anything else is InvalidArgument naming the keyword and its JSON pointer):
//   type (one or a list), enum, const, anyOf / oneOf (as alternatives: oneOf's branches must not
//   overlap, which the compiler does not check), allOf of one schema, $ref to "#/$defs/NAME" or
//   "#/definitions/NAME" (not recursive), the annotations (title, description, default,
//   examples, $schema, $id, $comment, deprecated, readOnly, writeOnly), and per type:
//   - object: properties (emitted in the schema's order: pass an ordered_json parsed from the
//     request's text), required, additionalProperties (false,
//     true or a schema: a map when there are no properties; with properties the output carries
//     only those, which validates either way), minProperties 0 / maxProperties unbounded only;
//   - array: items, minItems, maxItems (<= limits.max_repeat);
//   - string: minLength, maxLength (<= limits.max_repeat), format date | time | date-time |
//     uuid | ipv4 | email (a regular subset of each);
//   - integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (64-bit range);
//   - number: no bounds; boolean; null.
// A schema of `true` or `{}` (or a value with no type) is any JSON value whose objects and arrays
// nest at most `max_any_depth` deep below the typed containers around it (DFA states grow about
// 4x per level); json_object is an object of such values (AnyJsonObjectRegex: 3 levels in all).
// const and enum values match with the whitespace pattern between their tokens.
// Whitespace between tokens follows `whitespace` (vLLM's guided_whitespace_pattern), by default
// at most one space.
//
// Thread-safety: pure functions.

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "runtime/grammar/byte_dfa.h"

namespace tandem::grammar {

struct JsonSchemaOptions {
  std::string whitespace = "[ ]?";  // a regex between tokens
  int max_any_depth = 2;            // container nesting inside untyped values
  int max_repeat = 256;             // maxItems, maxLength
  size_t max_regex_bytes = 96 << 10;
  int max_ref_depth = 32;  // nested $ref expansions
};

absl::StatusOr<std::string> JsonSchemaToRegex(const nlohmann::ordered_json& schema,
                                              const JsonSchemaOptions& options = {});

// response_format {"type": "json_object"}: a JSON object whose values are any JSON values.
std::string AnyJsonObjectRegex(const JsonSchemaOptions& options = {});

// RegexEscape (the text as a regex that matches itself) is in byte_dfa.h.

}  // namespace tandem::grammar

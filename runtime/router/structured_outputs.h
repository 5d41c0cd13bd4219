#pragma once
// The structured-output fields of a completions or chat request, turned into the one constraint
// the engine decodes under (SamplingParams::Guided: a regex, a list of choices or a GBNF grammar):
//   guided_regex, guided_choice, guided_json, guided_grammar (vLLM), structured_outputs {regex |
//   choice | json | json_object | grammar, whitespace_pattern} (vLLM), response_format {type:
//   text | json_object | json_schema} (OpenAI), and guided_whitespace_pattern.
// At most one constraint per request (two are a 400 naming the second). JSON Schemas compile
// through runtime/grammar/json_schema.h; every constraint is compiled to its automaton here, so
// a schema or pattern the engine cannot take is a 400 naming the field and the keyword, never an
// error inside the engine.
//
// A schema's properties are emitted in the order the client wrote them, so the schema is parsed
// again from the body text as ordered JSON. That parse is quadratic in an object's key count, so
// a request with a schema may hold at most kMaxSchemaObjectKeys keys in any one object.
//
// Thread-safety: pure functions.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/sampling/sampling_params.h"

namespace tandem::router {

inline constexpr size_t kMaxSchemaObjectKeys = 256;

// `j` is the request parsed from `body`. Leaves `out` empty when no constraint is given.
absl::Status ParseStructuredOutputs(const nlohmann::json& j, absl::string_view body,
                                    SamplingParams::Guided* out);

}  // namespace tandem::router

#pragma once
// Small accessors over a parsed request body (nlohmann::json) shared by the request parsers
// (openai_protocol.cc, structured_outputs.cc, tool_calls.cc): absent and null both mean "not
// given", and type errors are InvalidParam statuses naming the field.
//
// Thread-safety: pure functions.

#include <algorithm>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/router/openai_protocol.h"

namespace tandem::router::json_fields {

inline const nlohmann::json* Field(const nlohmann::json& obj, absl::string_view name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

inline std::string TypeName(const nlohmann::json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

inline absl::Status WrongType(absl::string_view name, absl::string_view want,
                              const nlohmann::json& got) {
  return InvalidParam(name, absl::StrCat("'", name, "' must be ", want, ", got ", TypeName(got)));
}

// Every key of `obj` is one of `keys`, else a 400 "unknown_parameter" naming it: `key` at the
// top level (`where` empty), `where.key` inside.
inline absl::Status OnlyKeys(const nlohmann::json& obj, absl::string_view where,
                             std::initializer_list<absl::string_view> keys) {
  for (const auto& [key, value] : obj.items()) {
    bool known = false;
    for (absl::string_view k : keys) known |= key == k;
    if (known) continue;
    if (where.empty()) {
      return InvalidParam(key, absl::StrCat("unrecognized request argument '", key, "'"),
                          "unknown_parameter");
    }
    return InvalidParam(absl::StrCat(where, ".", key),
                        absl::StrCat("unrecognized field '", key, "' in '", where, "'"),
                        "unknown_parameter");
  }
  return absl::OkStatus();
}

// The largest key count of any object in `v` (an ordered re-parse is quadratic in it).
inline size_t MaxObjectKeys(const nlohmann::json& v) {
  size_t most = v.is_object() ? v.size() : 0;
  if (v.is_object() || v.is_array()) {
    for (const nlohmann::json& child : v) most = std::max(most, MaxObjectKeys(child));
  }
  return most;
}

// Compact JSON text; invalid UTF-8 in strings is replaced, never thrown on.
template <typename Json>
std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace tandem::router::json_fields

#include "runtime/grammar/json_schema.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::grammar {
namespace {

using json = nlohmann::ordered_json;

// One JSON string character: anything but '"', '\\' and controls, or an escape. \u escapes of
// surrogates are left out, so every character the regex counts is one code point (minLength and
// maxLength count code points).
constexpr char kStringChar[] =
    R"((?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})))";
constexpr char kNumber[] = R"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)";
constexpr char kInteger[] = R"(-?(?:0|[1-9][0-9]*))";

// Days by month; February stops at the 28th (a leap-year rule is regular, but long), so every
// generated date exists.
constexpr char kDate[] =
    R"([0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8])))";
constexpr char kTime[] =
    R"((?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]))";
constexpr char kUuid[] =
    R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})";
constexpr char kIpv4Octet[] = R"((?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9]))";
constexpr char kEmail[] = R"([a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)+)";

const absl::flat_hash_set<std::string>& Annotations() {
  static const auto* set = new absl::flat_hash_set<std::string>{
      "title", "description", "default",    "examples", "$schema",
      "$id",   "$comment",    "deprecated", "readOnly", "writeOnly"};
  return *set;
}

std::string Group(const std::string& inner) { return absl::StrCat("(?:", inner, ")"); }

std::string Alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  return Group(absl::StrJoin(alts, "|"));
}

// Decimal integers in [lo, hi] with the same number of digits, as a regex (lo <= hi).
std::string SameLengthRange(const std::string& lo, const std::string& hi) {
  if (lo == hi) return lo;
  size_t i = 0;
  while (lo[i] == hi[i]) ++i;
  const std::string prefix = lo.substr(0, i);
  const size_t rest = lo.size() - i - 1;
  const std::string lo_rest = lo.substr(i + 1);
  const std::string hi_rest = hi.substr(i + 1);
  const auto digits = [](size_t n) {
    return n == 0 ? std::string() : absl::StrCat("[0-9]{", n, "}");
  };
  const auto range = [](char a, char b) {
    return a == b ? std::string(1, a)
                  : absl::StrCat("[", std::string(1, a), "-", std::string(1, b), "]");
  };
  if (lo_rest == std::string(rest, '0') && hi_rest == std::string(rest, '9')) {
    return absl::StrCat(prefix, range(lo[i], hi[i]), digits(rest));
  }
  std::vector<std::string> alts;
  alts.push_back(absl::StrCat(prefix, std::string(1, lo[i]),
                              Group(SameLengthRange(lo_rest, std::string(rest, '9')))));
  if (lo[i] + 1 <= hi[i] - 1) {
    alts.push_back(absl::StrCat(
        prefix, range(static_cast<char>(lo[i] + 1), static_cast<char>(hi[i] - 1)), digits(rest)));
  }
  alts.push_back(absl::StrCat(prefix, std::string(1, hi[i]),
                              Group(SameLengthRange(std::string(rest, '0'), hi_rest))));
  return Group(absl::StrJoin(alts, "|"));
}

std::string Pow10Minus1(size_t digits) { return std::string(digits, '9'); }
std::string Pow10(size_t digits) { return absl::StrCat("1", std::string(digits, '0')); }

// Non-negative integers in [lo, hi] (hi empty: unbounded), no leading zeros.
std::string NonNegativeRange(uint64_t lo, std::optional<uint64_t> hi) {
  const std::string los = absl::StrCat(lo);
  std::vector<std::string> alts;
  const size_t max_len = hi ? absl::StrCat(*hi).size() : los.size();
  for (size_t len = los.size(); len <= max_len; ++len) {
    const std::string a = len == los.size() ? los : (len == 1 ? "0" : Pow10(len - 1));
    const std::string b = hi && len == max_len ? absl::StrCat(*hi) : Pow10Minus1(len);
    alts.push_back(SameLengthRange(a, b));
  }
  if (!hi) alts.push_back(absl::StrCat("[1-9][0-9]{", los.size(), ",}"));
  return Alternatives(alts);
}

// Integers in [lo, hi], either side optional.
std::string IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (!lo && !hi) return kInteger;
  const auto magnitude = [](int64_t v) {
    return v < 0 ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v);
  };
  std::vector<std::string> alts;
  // The negative part, as "-" and a magnitude range [neg_lo, neg_hi].
  if (!lo || *lo < 0) {
    const uint64_t neg_lo = hi && *hi < 0 ? magnitude(*hi) : 1;
    std::optional<uint64_t> neg_hi;
    if (lo) neg_hi = magnitude(*lo);
    alts.push_back(absl::StrCat("-", NonNegativeRange(neg_lo, neg_hi)));
  }
  if (!hi || *hi >= 0) {
    const uint64_t pos_lo = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    std::optional<uint64_t> pos_hi;
    if (hi) pos_hi = static_cast<uint64_t>(*hi);
    alts.push_back(NonNegativeRange(pos_lo, pos_hi));
  }
  return Alternatives(alts);
}

class Compiler {
 public:
  Compiler(const json& root, const JsonSchemaOptions& options)
      : root_(root), options_(options), ws_(Group(options.whitespace)) {}

  absl::StatusOr<std::string> Compile(const json& schema, const std::string& where) {
    if (++nodes_ > 100000) return Error(where, "the schema is too large");
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) return Error(where, "`false` admits no value");
      return AnyValueHere();
    }
    if (!schema.is_object()) return Error(where, "a schema must be an object or a boolean");
    for (const auto& [key, value] : schema.items()) {
      if (!Known(key)) {
        return absl::InvalidArgumentError(
            absl::StrCat("unsupported JSON Schema keyword '", key, "' at ", Pointer(where, key)));
      }
    }
    if (const auto it = schema.find("$ref"); it != schema.end()) return Ref(schema, *it, where);
    if (const auto it = schema.find("allOf"); it != schema.end()) {
      if (!it->is_array() || it->size() != 1 || schema.size() != 1) {
        return Error(Pointer(where, "allOf"),
                     "'allOf' is supported with exactly one schema and nothing beside it");
      }
      return Compile((*it)[0], Pointer(where, "allOf") + "/0");
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (const auto it = schema.find(key); it != schema.end()) {
        return Union(schema, key, *it, where);
      }
    }
    if (const auto it = schema.find("const"); it != schema.end()) return Literal(*it);
    if (const auto it = schema.find("enum"); it != schema.end()) {
      if (!it->is_array() || it->empty()) {
        return Error(Pointer(where, "enum"), "'enum' must be a non-empty array");
      }
      std::vector<std::string> alts;
      for (const json& v : *it) alts.push_back(Literal(v));
      return Alternatives(alts);
    }
    const auto type = schema.find("type");
    if (type == schema.end()) return Untyped(schema, where);
    if (type->is_string()) return Typed(schema, type->get<std::string>(), where);
    if (type->is_array() && !type->empty()) {
      for (const auto& [key, value] : schema.items()) {
        const char* owner = KeywordType(key);
        if (owner != nullptr && std::find(type->begin(), type->end(), json(owner)) == type->end()) {
          return Error(Pointer(where, key),
                       absl::StrCat("'", key, "' applies to none of the types listed"));
        }
      }
      std::vector<std::string> alts;
      for (const json& t : *type) {
        if (!t.is_string()) return Error(Pointer(where, "type"), "'type' must hold strings");
        absl::StatusOr<std::string> r = Typed(schema, t.get<std::string>(), where);
        if (!r.ok()) return r.status();
        alts.push_back(*std::move(r));
      }
      return Alternatives(alts);
    }
    return Error(Pointer(where, "type"), "'type' must be a string or a non-empty array");
  }

  // Exactly `v`, with the whitespace pattern between its tokens.
  std::string Literal(const json& v) const {
    const std::string comma = absl::StrCat(ws_, ",", ws_);
    if (v.is_object()) {
      std::vector<std::string> members;
      for (const auto& [key, value] : v.items()) {
        members.push_back(
            absl::StrCat(RegexEscape(json(key).dump()), ws_, ":", ws_, Literal(value)));
      }
      return absl::StrCat(R"(\{)", ws_, absl::StrJoin(members, comma), ws_, R"(\})");
    }
    if (v.is_array()) {
      std::vector<std::string> items;
      for (const json& item : v) items.push_back(Literal(item));
      return absl::StrCat(R"(\[)", ws_, absl::StrJoin(items, comma), ws_, R"(\])");
    }
    return RegexEscape(v.dump());
  }

  // Any JSON value at the current nesting: containers at most max_any_depth - depth_ deep.
  std::string AnyValueHere() const {
    return AnyValue(std::max(0, options_.max_any_depth - depth_));
  }

  std::string AnyValue(int depth) const {
    std::vector<std::string> alts = {absl::StrCat("\"", kStringChar, "*\""), kNumber, "true",
                                     "false", "null"};
    if (depth > 0) {
      const std::string inner = AnyValue(depth - 1);
      alts.push_back(ObjectOf(inner));
      alts.push_back(absl::StrCat(R"(\[)", ws_, "(?:", inner, "(?:", ws_, ",", ws_, inner, ")*)?",
                                  ws_, R"(\])"));
    }
    return Group(absl::StrJoin(alts, "|"));
  }

  // An object of any keys whose values match `value`.
  std::string ObjectOf(const std::string& value) const {
    const std::string member = absl::StrCat("\"", kStringChar, "*\"", ws_, ":", ws_, value);
    return absl::StrCat(R"(\{)", ws_, "(?:", member, "(?:", ws_, ",", ws_, member, ")*)?", ws_,
                        R"(\})");
  }

 private:
  static absl::Status Error(const std::string& where, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("JSON Schema at ", where, ": ", what));
  }
  static std::string Pointer(const std::string& where, const std::string& key) {
    return absl::StrCat(where, "/", key);
  }

  // The type a type-specific keyword belongs to; nullptr for the others.
  static const char* KeywordType(const std::string& key) {
    for (const char* k :
         {"properties", "required", "additionalProperties", "minProperties", "maxProperties"}) {
      if (key == k) return "object";
    }
    for (const char* k : {"items", "minItems", "maxItems"}) {
      if (key == k) return "array";
    }
    for (const char* k : {"minLength", "maxLength", "format"}) {
      if (key == k) return "string";
    }
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (key == k) return "integer";
    }
    return nullptr;
  }

  static bool Known(const std::string& key) {
    static const auto* known = new absl::flat_hash_set<std::string>{"type",
                                                                    "enum",
                                                                    "const",
                                                                    "anyOf",
                                                                    "oneOf",
                                                                    "allOf",
                                                                    "$ref",
                                                                    "$defs",
                                                                    "definitions",
                                                                    "properties",
                                                                    "required",
                                                                    "additionalProperties",
                                                                    "minProperties",
                                                                    "maxProperties",
                                                                    "items",
                                                                    "minItems",
                                                                    "maxItems",
                                                                    "minLength",
                                                                    "maxLength",
                                                                    "format",
                                                                    "minimum",
                                                                    "maximum",
                                                                    "exclusiveMinimum",
                                                                    "exclusiveMaximum"};
    return known->contains(key) || Annotations().contains(key);
  }

  absl::StatusOr<std::string> Ref(const json& schema, const json& ref, const std::string& where) {
    if (schema.size() != 1) {
      for (const auto& [key, value] : schema.items()) {
        if (key != "$ref" && !Annotations().contains(key) && key != "$defs" &&
            key != "definitions") {
          return Error(where, absl::StrCat("'", key, "' beside '$ref' is not supported"));
        }
      }
    }
    if (!ref.is_string()) return Error(Pointer(where, "$ref"), "'$ref' must be a string");
    const std::string target = ref.get<std::string>();
    std::string section;
    std::string name;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (target.rfind(prefix, 0) == 0) {
        section = std::string(prefix).substr(2, std::string(prefix).size() - 3);
        name = target.substr(std::string(prefix).size());
      }
    }
    if (target == "#") return Error(Pointer(where, "$ref"), "recursive '$ref' is not supported");
    if (section.empty() || name.empty() || name.find('/') != std::string::npos) {
      return Error(Pointer(where, "$ref"),
                   absl::StrCat("'$ref' '", target,
                                "' is not supported (only \"#/$defs/NAME\" and "
                                "\"#/definitions/NAME\")"));
    }
    const auto defs = root_.find(section);
    if (defs == root_.end() || !defs->is_object() || !defs->contains(name)) {
      return Error(Pointer(where, "$ref"), absl::StrCat("'$ref' '", target, "' is not defined"));
    }
    if (std::find(ref_stack_.begin(), ref_stack_.end(), target) != ref_stack_.end()) {
      return Error(Pointer(where, "$ref"),
                   absl::StrCat("recursive '$ref' '", target, "' is not supported"));
    }
    if (static_cast<int>(ref_stack_.size()) >= options_.max_ref_depth) {
      return Error(Pointer(where, "$ref"), "'$ref' nested too deep");
    }
    ref_stack_.push_back(target);
    absl::StatusOr<std::string> r = Compile((*defs)[name], target.substr(1));
    ref_stack_.pop_back();
    return r;
  }

  absl::StatusOr<std::string> Union(const json& schema, const char* key, const json& branches,
                                    const std::string& where) {
    for (const auto& [k, v] : schema.items()) {
      if (k != key && !Annotations().contains(k) && k != "$defs" && k != "definitions") {
        return Error(where, absl::StrCat("'", k, "' beside '", key, "' is not supported"));
      }
    }
    if (!branches.is_array() || branches.empty()) {
      return Error(Pointer(where, key), absl::StrCat("'", key, "' must be a non-empty array"));
    }
    std::vector<std::string> alts;
    for (size_t i = 0; i < branches.size(); ++i) {
      absl::StatusOr<std::string> r =
          Compile(branches[i], absl::StrCat(Pointer(where, key), "/", i));
      if (!r.ok()) return r.status();
      alts.push_back(*std::move(r));
    }
    return Alternatives(alts);
  }

  // No "type": an untyped schema is any value, unless it only makes sense for one type.
  absl::StatusOr<std::string> Untyped(const json& schema, const std::string& where) {
    for (const char* key : {"properties", "required", "additionalProperties"}) {
      if (schema.contains(key)) return Typed(schema, "object", where);
    }
    for (const char* key : {"items", "minItems", "maxItems"}) {
      if (schema.contains(key)) return Typed(schema, "array", where);
    }
    for (const char* key : {"minLength", "maxLength", "format"}) {
      if (schema.contains(key)) return Typed(schema, "string", where);
    }
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (schema.contains(key)) {
        return Error(Pointer(where, key), "a numeric bound needs \"type\": \"integer\"");
      }
    }
    return AnyValueHere();
  }

  // Keywords that belong to other types than `type` are an error, so nothing is ignored.
  absl::Status OnlyKeywords(const json& schema, const std::string& type,
                            std::initializer_list<const char*> allowed, const std::string& where) {
    for (const auto& [key, value] : schema.items()) {
      if (key == "type" || key == "$defs" || key == "definitions" || Annotations().contains(key)) {
        continue;
      }
      bool ok = false;
      for (const char* a : allowed) ok = ok || key == a;
      // A list of types: a keyword applies to the type it belongs to only (Compile checks that
      // one of the listed types takes it).
      const auto t = schema.find("type");
      if (!ok && !(t != schema.end() && t->is_array())) {
        return Error(Pointer(where, key),
                     absl::StrCat("'", key, "' does not apply to type '", type, "'"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int> Count(const json& schema, const char* key, int fallback,
                            const std::string& where) {
    const auto it = schema.find(key);
    if (it == schema.end()) return fallback;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return Error(Pointer(where, key), absl::StrCat("'", key, "' must be a non-negative integer"));
    }
    if (it->get<int64_t>() > options_.max_repeat) {
      return Error(Pointer(where, key),
                   absl::StrCat("'", key, "' above ", options_.max_repeat, " is not supported"));
    }
    return static_cast<int>(it->get<int64_t>());
  }

  // `item` repeated min..max times (max < 0: unbounded), separated by `sep`.
  static std::string Repeat(const std::string& item, const std::string& sep, int min, int max) {
    if (max == 0) return "";
    const std::string more = absl::StrCat("(?:", sep, item, ")");
    const std::string tail = max < 0
                                 ? absl::StrCat(more, "{", std::max(0, min - 1), ",}")
                                 : absl::StrCat(more, "{", std::max(0, min - 1), ",", max - 1, "}");
    const std::string list = absl::StrCat(item, tail);
    return min == 0 ? absl::StrCat("(?:", list, ")?") : list;
  }

  absl::StatusOr<std::string> Typed(const json& schema, const std::string& type,
                                    const std::string& where) {
    if (type == "null") {
      if (absl::Status s = OnlyKeywords(schema, type, {}, where); !s.ok()) return s;
      return std::string("null");
    }
    if (type == "boolean") {
      if (absl::Status s = OnlyKeywords(schema, type, {}, where); !s.ok()) return s;
      return std::string("(?:true|false)");
    }
    if (type == "number") {
      if (absl::Status s = OnlyKeywords(schema, type, {}, where); !s.ok()) return s;
      return std::string(kNumber);
    }
    if (type == "integer") return Integer(schema, where);
    if (type == "string") return String(schema, where);
    if (type == "array") return Array(schema, where);
    if (type == "object") return Object(schema, where);
    return Error(Pointer(where, "type"), absl::StrCat("unknown type '", type, "'"));
  }

  absl::StatusOr<std::string> Integer(const json& schema, const std::string& where) {
    if (absl::Status s =
            OnlyKeywords(schema, "integer",
                         {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}, where);
        !s.ok()) {
      return s;
    }
    std::optional<int64_t> lo;
    std::optional<int64_t> hi;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      const auto it = schema.find(key);
      if (it == schema.end()) continue;
      if (!it->is_number_integer()) {
        return Error(Pointer(where, key),
                     absl::StrCat("'", key, "' must be an integer (a 64-bit one)"));
      }
      const int64_t v = it->get<int64_t>();
      const std::string k = key;
      if (k == "minimum") lo = std::max(lo.value_or(v), v);
      if (k == "maximum") hi = std::min(hi.value_or(v), v);
      if (k == "exclusiveMinimum") {
        if (v == std::numeric_limits<int64_t>::max()) return Error(Pointer(where, key), "empty");
        lo = std::max(lo.value_or(v + 1), v + 1);
      }
      if (k == "exclusiveMaximum") {
        if (v == std::numeric_limits<int64_t>::min()) return Error(Pointer(where, key), "empty");
        hi = std::min(hi.value_or(v - 1), v - 1);
      }
    }
    if (lo && hi && *lo > *hi) return Error(where, "the integer range is empty");
    return IntegerRange(lo, hi);
  }

  absl::StatusOr<std::string> String(const json& schema, const std::string& where) {
    if (absl::Status s =
            OnlyKeywords(schema, "string", {"minLength", "maxLength", "format"}, where);
        !s.ok()) {
      return s;
    }
    if (const auto it = schema.find("format"); it != schema.end()) {
      if (schema.contains("minLength") || schema.contains("maxLength")) {
        return Error(where, "'format' with 'minLength' or 'maxLength' is not supported");
      }
      const std::string format = it->is_string() ? it->get<std::string>() : "";
      std::string body;
      if (format == "date") body = kDate;
      if (format == "time") body = kTime;
      if (format == "date-time") body = absl::StrCat(kDate, "T", kTime);
      if (format == "uuid") body = kUuid;
      if (format == "ipv4") {
        body =
            absl::StrCat(kIpv4Octet, R"(\.)", kIpv4Octet, R"(\.)", kIpv4Octet, R"(\.)", kIpv4Octet);
      }
      if (format == "email") body = kEmail;
      if (body.empty()) {
        return Error(Pointer(where, "format"),
                     absl::StrCat("unsupported string format '", it->dump(),
                                  "' (date, time, date-time, uuid, ipv4 and email are)"));
      }
      return absl::StrCat("\"", body, "\"");
    }
    absl::StatusOr<int> min = Count(schema, "minLength", 0, where);
    if (!min.ok()) return min.status();
    const bool bounded = schema.contains("maxLength");
    absl::StatusOr<int> max = Count(schema, "maxLength", 0, where);
    if (!max.ok()) return max.status();
    if (bounded && *max < *min) return Error(where, "'maxLength' is below 'minLength'");
    const std::string count = bounded ? absl::StrCat("{", *min, ",", *max, "}")
                                      : (*min == 0 ? "*" : absl::StrCat("{", *min, ",}"));
    return absl::StrCat("\"", kStringChar, count, "\"");
  }

  absl::StatusOr<std::string> Array(const json& schema, const std::string& where) {
    if (absl::Status s = OnlyKeywords(schema, "array", {"items", "minItems", "maxItems"}, where);
        !s.ok()) {
      return s;
    }
    std::string item;
    const DepthScope scope(&depth_);
    if (const auto it = schema.find("items"); it != schema.end()) {
      absl::StatusOr<std::string> r = Compile(*it, Pointer(where, "items"));
      if (!r.ok()) return r.status();
      item = *std::move(r);
    } else {
      item = AnyValueHere();
    }
    absl::StatusOr<int> min = Count(schema, "minItems", 0, where);
    if (!min.ok()) return min.status();
    const bool bounded = schema.contains("maxItems");
    absl::StatusOr<int> max = Count(schema, "maxItems", -1, where);
    if (!max.ok()) return max.status();
    if (bounded && *max < *min) return Error(where, "'maxItems' is below 'minItems'");
    return absl::StrCat(R"(\[)", ws_, Repeat(item, absl::StrCat(ws_, ",", ws_), *min, *max), ws_,
                        R"(\])");
  }

  absl::StatusOr<std::string> Object(const json& schema, const std::string& where) {
    if (absl::Status s = OnlyKeywords(
            schema, "object",
            {"properties", "required", "additionalProperties", "minProperties", "maxProperties"},
            where);
        !s.ok()) {
      return s;
    }
    if (const auto it = schema.find("minProperties");
        it != schema.end() && !(it->is_number_integer() && it->get<int64_t>() == 0)) {
      return Error(Pointer(where, "minProperties"),
                   "'minProperties' other than 0 is not supported");
    }
    if (schema.contains("maxProperties")) {
      return Error(Pointer(where, "maxProperties"), "'maxProperties' is not supported");
    }
    absl::flat_hash_set<std::string> required;
    if (const auto it = schema.find("required"); it != schema.end()) {
      if (!it->is_array()) return Error(Pointer(where, "required"), "'required' must be an array");
      for (const json& name : *it) {
        if (!name.is_string()) {
          return Error(Pointer(where, "required"), "'required' must hold strings");
        }
        required.insert(name.get<std::string>());
      }
    }
    struct Member {
      std::string regex;
      bool required;
    };
    std::vector<Member> members;
    const DepthScope scope(&depth_);
    const auto props = schema.find("properties");
    if (props != schema.end()) {
      if (!props->is_object()) {
        return Error(Pointer(where, "properties"), "'properties' must be an object");
      }
      for (const auto& [name, sub] : props->items()) {
        absl::StatusOr<std::string> value =
            Compile(sub, absl::StrCat(Pointer(where, "properties"), "/", name));
        if (!value.ok()) return value.status();
        members.push_back({absl::StrCat(RegexEscape(json(name).dump()), ws_, ":", ws_, *value),
                           required.contains(name)});
      }
    }
    for (const std::string& name : required) {
      if (props == schema.end() || !props->contains(name)) {
        return Error(Pointer(where, "required"),
                     absl::StrCat("required property '", name, "' is not in 'properties'"));
      }
    }
    const auto extra = schema.find("additionalProperties");
    if (members.empty() && extra != schema.end() && !extra->is_boolean()) {
      // A map: any keys, values by the schema.
      absl::StatusOr<std::string> value = Compile(*extra, Pointer(where, "additionalProperties"));
      if (!value.ok()) return value.status();
      return ObjectOf(*value);
    }
    if (members.empty() && (extra == schema.end() || extra->get<bool>()) && props == schema.end()) {
      return ObjectOf(AnyValueHere());
    }
    const std::string comma = absl::StrCat(ws_, ",", ws_);
    return absl::StrCat(R"(\{)", ws_, Members(members, 0, /*first=*/true, comma), ws_, R"(\})");
  }

  // Members i.. in order; required ones always, optional ones maybe; commas between.
  template <typename M>
  static std::string Members(const std::vector<M>& m, size_t i, bool first,
                             const std::string& comma) {
    if (i == m.size()) return "";
    const std::string sep = first ? "" : comma;
    if (m[i].required) return absl::StrCat(sep, m[i].regex, Members(m, i + 1, false, comma));
    if (!first) {
      return absl::StrCat("(?:", sep, m[i].regex, ")?", Members(m, i + 1, false, comma));
    }
    return absl::StrCat("(?:", m[i].regex, Members(m, i + 1, false, comma), "|",
                        Members(m, i + 1, true, comma), ")");
  }

  struct DepthScope {
    explicit DepthScope(int* d) : depth(d) { ++*depth; }
    ~DepthScope() { --*depth; }
    int* depth;
  };

  const json& root_;
  const JsonSchemaOptions& options_;
  int depth_ = 0;  // typed containers around the schema being compiled
  const std::string ws_;
  std::vector<std::string> ref_stack_;
  int nodes_ = 0;
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToRegex(const json& schema,
                                              const JsonSchemaOptions& options) {
  Compiler compiler(schema, options);
  absl::StatusOr<std::string> regex = compiler.Compile(schema, "#");
  if (!regex.ok()) return regex.status();
  if (regex->size() > options.max_regex_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "JSON Schema: its grammar is ", regex->size(), " bytes; at most ", options.max_regex_bytes,
        " (a smaller schema, or fewer optional properties, fits)"));
  }
  return regex;
}

std::string AnyJsonObjectRegex(const JsonSchemaOptions& options) {
  const json empty = json::object();
  Compiler compiler(empty, options);
  return compiler.ObjectOf(compiler.AnyValue(options.max_any_depth));
}

}  // namespace tandem::grammar

#include "runtime/router/structured_outputs.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/grammar/byte_dfa.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/pda.h"
#include "runtime/router/constraint_cache.h"
#include "runtime/router/json_fields.h"
#include "runtime/router/openai_protocol.h"

namespace tandem::router {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

enum class Kind { kRegex, kChoice, kSchema, kJsonObject, kGrammar };

struct Given {
  std::string name;  // the field, as the client wrote it ("structured_outputs.json")
  Kind kind;
  const json* value;
  std::vector<std::string> path;  // kSchema: keys from the body's root to the schema
};

absl::Status Invalid(absl::string_view name, absl::string_view message) {
  return InvalidParam(name, absl::StrCat("'", name, "' ", message));
}

absl::Status Unsupported(absl::string_view name, absl::string_view why) {
  return InvalidParam(name, absl::StrCat("'", name, "' is not supported: ", why),
                      "unsupported_parameter");
}

using json_fields::Field;
using json_fields::MaxObjectKeys;

absl::Status CollectStructuredOutputs(const json& so, std::vector<Given>* given,
                                      const json** whitespace) {
  if (!so.is_object()) return Invalid("structured_outputs", "must be an object");
  for (const auto& [key, value] : so.items()) {
    if (value.is_null()) continue;
    const std::string name = "structured_outputs." + key;
    if (key == "regex") {
      given->push_back({name, Kind::kRegex, &value, {}});
    } else if (key == "choice") {
      given->push_back({name, Kind::kChoice, &value, {}});
    } else if (key == "json") {
      given->push_back({name, Kind::kSchema, &value, {"structured_outputs", "json"}});
    } else if (key == "json_object") {
      if (!value.is_boolean()) return Invalid(name, "must be a boolean");
      if (value.get<bool>()) given->push_back({name, Kind::kJsonObject, &value, {}});
    } else if (key == "whitespace_pattern") {
      *whitespace = &value;
    } else if (key == "grammar") {
      given->push_back({name, Kind::kGrammar, &value, {}});
    } else {
      return Unsupported(name,
                         "regex, choice, json, json_object, grammar and whitespace_pattern are");
    }
  }
  return absl::OkStatus();
}

absl::Status CollectResponseFormat(const json& rf, std::vector<Given>* given) {
  if (!rf.is_object()) return Invalid("response_format", "must be an object");
  const json* type = Field(rf, "type");
  if (type == nullptr || !type->is_string()) {
    return Invalid("response_format",
                   "needs \"type\": \"text\", \"json_object\" or \"json_schema\"");
  }
  const std::string t = type->get<std::string>();
  for (const auto& [key, value] : rf.items()) {
    if (key != "type" && !(key == "json_schema" && t == "json_schema")) {
      return Invalid("response_format",
                     absl::StrCat("does not take '", key, "' with type '", t, "'"));
    }
  }
  if (t == "text") return absl::OkStatus();
  if (t == "json_object") {
    given->push_back({"response_format", Kind::kJsonObject, type, {}});
    return absl::OkStatus();
  }
  if (t != "json_schema") {
    return Invalid("response_format.type",
                   absl::StrCat("must be text, json_object or json_schema, got '", t, "'"));
  }
  const json* js = Field(rf, "json_schema");
  if (js == nullptr || !js->is_object()) {
    return Invalid("response_format.json_schema", "must be an object with a 'schema'");
  }
  for (const auto& [key, value] : js->items()) {
    const std::string name = "response_format.json_schema." + key;
    if (key == "name" || key == "description") {
      if (!value.is_string()) return Invalid(name, "must be a string");
    } else if (key == "strict") {
      // Tandem always decodes under the schema: strict or not, the output validates.
      if (!value.is_null() && !value.is_boolean()) return Invalid(name, "must be a boolean");
    } else if (key != "schema") {
      return Invalid("response_format.json_schema",
                     absl::StrCat("does not take '", key, "' (name, description, schema, strict)"));
    }
  }
  const json* schema = Field(*js, "schema");
  if (schema == nullptr) return Invalid("response_format.json_schema.schema", "is required");
  given->push_back({"response_format.json_schema.schema",
                    Kind::kSchema,
                    schema,
                    {"response_format", "json_schema", "schema"}});
  return absl::OkStatus();
}

// The whitespace regex between JSON tokens: it must compile and match whitespace only.
absl::StatusOr<std::string> WhitespacePattern(const json* v, absl::string_view name) {
  if (v == nullptr) return grammar::JsonSchemaOptions{}.whitespace;
  if (!v->is_string() || v->get<std::string>().empty()) {
    return Invalid(name, "must be a non-empty string");
  }
  const std::string pattern = v->get<std::string>();
  if (pattern.size() > 256) return Invalid(name, "is longer than 256 bytes");
  absl::StatusOr<grammar::ByteDfa> dfa = grammar::ByteDfa::FromRegex(pattern);
  if (!dfa.ok()) return Invalid(name, absl::StrCat(": ", dfa.status().message()));
  for (int s = 0; s < dfa->num_states(); ++s) {
    for (int b = 0; b < 256; ++b) {
      if (dfa->Next(s, static_cast<uint8_t>(b)) == grammar::kDeadState) continue;
      if (b != ' ' && b != '\t' && b != '\n' && b != '\r') {
        return Invalid(name, "must match JSON whitespace only (space, \\t, \\n, \\r)");
      }
    }
  }
  return pattern;
}

// The schema as ordered JSON (so properties keep the client's order).
absl::StatusOr<ordered_json> OrderedSchema(const json& j, absl::string_view body, const Given& g) {
  if (g.value->is_string()) {
    // vLLM takes guided_json as a JSON text too.
    const std::string& text = g.value->get_ref<const std::string&>();
    const json sorted = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (sorted.is_discarded()) return Invalid(g.name, "is a string that is not JSON");
    if (MaxObjectKeys(sorted) > kMaxSchemaObjectKeys) {
      return Invalid(g.name,
                     absl::StrCat("has an object with more than ", kMaxSchemaObjectKeys, " keys"));
    }
    return ordered_json::parse(text);
  }
  if (!g.value->is_object() && !g.value->is_boolean()) {
    return Invalid(g.name, "must be a JSON Schema (an object)");
  }
  if (MaxObjectKeys(j) > kMaxSchemaObjectKeys) {
    return Invalid(g.name, absl::StrCat("comes in a request with an object of more than ",
                                        kMaxSchemaObjectKeys, " keys (the limit with a schema)"));
  }
  const ordered_json root = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  const ordered_json* node = &root;
  for (const std::string& key : g.path) {
    if (!node->is_object() || !node->contains(key)) {
      return absl::InternalError(absl::StrCat("schema path lost at '", key, "'"));
    }
    node = &(*node)[key];
  }
  return *node;
}

}  // namespace

absl::Status ParseStructuredOutputs(const json& j, absl::string_view body,
                                    SamplingParams::Guided* out) {
  std::vector<Given> given;
  if (const json* v = Field(j, "guided_regex"))
    given.push_back({"guided_regex", Kind::kRegex, v, {}});
  if (const json* v = Field(j, "guided_choice")) {
    given.push_back({"guided_choice", Kind::kChoice, v, {}});
  }
  if (const json* v = Field(j, "guided_json")) {
    given.push_back({"guided_json", Kind::kSchema, v, {"guided_json"}});
  }
  if (const json* v = Field(j, "guided_grammar")) {
    given.push_back({"guided_grammar", Kind::kGrammar, v, {}});
  }
  const json* whitespace = Field(j, "guided_whitespace_pattern");
  std::string whitespace_name = "guided_whitespace_pattern";
  if (const json* v = Field(j, "structured_outputs")) {
    const json* so_whitespace = nullptr;
    if (absl::Status s = CollectStructuredOutputs(*v, &given, &so_whitespace); !s.ok()) return s;
    if (so_whitespace != nullptr) {
      if (whitespace != nullptr) {
        return Invalid("structured_outputs.whitespace_pattern",
                       "and 'guided_whitespace_pattern' cannot both be given");
      }
      whitespace = so_whitespace;
      whitespace_name = "structured_outputs.whitespace_pattern";
    }
  }
  if (const json* v = Field(j, "response_format")) {
    if (absl::Status s = CollectResponseFormat(*v, &given); !s.ok()) return s;
  }
  if (given.size() > 1) {
    return InvalidParam(given[1].name, absl::StrCat("'", given[0].name, "' and '", given[1].name,
                                                    "' cannot both be given"));
  }
  const bool json_kind =
      !given.empty() && (given[0].kind == Kind::kSchema || given[0].kind == Kind::kJsonObject);
  if (whitespace != nullptr && !json_kind) {
    return Invalid(whitespace_name,
                   "applies to JSON outputs only (guided_json, a json_schema or "
                   "json_object response_format)");
  }
  if (given.empty()) return absl::OkStatus();
  const Given& g = given[0];
  // What the constraint is, as text (the cache key), and how it compiles to the workers' regex
  // ("" for choices, which go as a list): checked against the automaton limits either way.
  std::string text;
  std::function<absl::StatusOr<std::string>()> compile;
  switch (g.kind) {
    case Kind::kRegex:
      if (!g.value->is_string() || g.value->get<std::string>().empty()) {
        return Invalid(g.name, "must be a non-empty string");
      }
      text = g.value->get<std::string>();
      compile = [&]() -> absl::StatusOr<std::string> { return text; };
      break;
    case Kind::kGrammar:
      if (!g.value->is_string() || g.value->get<std::string>().empty()) {
        return Invalid(g.name, "must be a non-empty string (a GBNF grammar)");
      }
      text = g.value->get<std::string>();
      compile = [&]() -> absl::StatusOr<std::string> {
        // The workers get the grammar itself (a pushdown automaton each); compiling it here
        // checks it, so a bad one is a 400 naming the problem.
        absl::StatusOr<std::unique_ptr<grammar::GrammarPda>> pda =
            grammar::GrammarPda::FromGbnf(text);
        if (!pda.ok()) {
          return InvalidParam(g.name, absl::StrCat("'", g.name, "': ", pda.status().message()));
        }
        return text;
      };
      break;
    case Kind::kChoice:
      if (!g.value->is_array() || g.value->empty()) {
        return Invalid(g.name, "must be a non-empty list of strings");
      }
      if (g.value->size() > static_cast<size_t>(kMaxGuidedChoices)) {
        return InvalidParam(g.name, absl::StrCat("at most ", kMaxGuidedChoices, " choices"));
      }
      for (const json& c : *g.value) {
        if (!c.is_string() || c.get<std::string>().empty()) {
          return Invalid(g.name, "must hold non-empty strings");
        }
        out->choices.push_back(c.get<std::string>());
      }
      text = json_fields::Dump(*g.value);
      compile = [&]() -> absl::StatusOr<std::string> { return std::string(); };
      break;
    case Kind::kSchema:
    case Kind::kJsonObject: {
      absl::StatusOr<std::string> ws = WhitespacePattern(whitespace, whitespace_name);
      if (!ws.ok()) return ws.status();
      grammar::JsonSchemaOptions options;
      options.whitespace = *std::move(ws);
      if (g.kind == Kind::kJsonObject) {
        text = options.whitespace;
        compile = [options]() -> absl::StatusOr<std::string> {
          return grammar::AnyJsonObjectRegex(options);
        };
        break;
      }
      absl::StatusOr<ordered_json> schema = OrderedSchema(j, body, g);
      if (!schema.ok()) return schema.status();
      text = absl::StrCat(options.whitespace, "\n", json_fields::Dump(*schema));
      compile = [&g, options, schema = *std::move(schema)]() -> absl::StatusOr<std::string> {
        absl::StatusOr<std::string> regex = grammar::JsonSchemaToRegex(schema, options);
        if (!regex.ok()) {
          return InvalidParam(g.name, absl::StrCat("'", g.name, "': ", regex.status().message()),
                              "unsupported_parameter");
        }
        return regex;
      };
      break;
    }
  }
  const std::string key = absl::StrCat(g.name, "\n", static_cast<int>(g.kind), "\n", text);
  absl::StatusOr<std::string> regex =
      ConstraintCache::Shared().GetOrCompile(key, [&]() -> absl::StatusOr<std::string> {
        absl::StatusOr<std::string> r = compile();
        if (!r.ok() || g.kind == Kind::kGrammar) return r;
        absl::StatusOr<grammar::ByteDfa> dfa = r->empty()
                                                   ? grammar::ByteDfa::FromChoices(out->choices)
                                                   : grammar::ByteDfa::FromRegex(*r);
        if (!dfa.ok()) {
          return InvalidParam(g.name, absl::StrCat("'", g.name, "': ", dfa.status().message()));
        }
        return r;
      });
  if (!regex.ok()) {
    *out = {};
    return regex.status();
  }
  (g.kind == Kind::kGrammar ? out->grammar : out->regex) = *std::move(regex);
  return absl::OkStatus();
}

}  // namespace tandem::router

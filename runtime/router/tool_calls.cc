#include "runtime/router/tool_calls.h"

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/grammar/byte_dfa.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/router/constraint_cache.h"
#include "runtime/router/json_fields.h"
#include "runtime/router/openai_protocol.h"
#include "runtime/router/structured_outputs.h"

namespace tandem::router {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;
using json_fields::Dump;
using json_fields::Field;
using json_fields::OnlyKeys;
using json_fields::WrongType;

constexpr char kHermesOpen[] = "<tool_call>";
constexpr char kHermesClose[] = "</tool_call>";
constexpr char kPythonTag[] = "<|python_tag|>";
constexpr size_t Len(const char* s) { return absl::string_view(s).size(); }

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// The regex of one function's arguments (its parameters schema; any object when it has none).
absl::StatusOr<std::string> ArgumentsRegex(const ordered_json& function, const std::string& where,
                                           const grammar::JsonSchemaOptions& options) {
  const auto it = function.find("parameters");
  if (it == function.end() || it->is_null()) return grammar::AnyJsonObjectRegex(options);
  absl::StatusOr<std::string> regex = grammar::JsonSchemaToRegex(*it, options);
  if (!regex.ok()) {
    return InvalidParam(where, absl::StrCat("'", where, "': ", regex.status().message()),
                        "unsupported_parameter");
  }
  return regex;
}

// tool_choice "required": a JSON list of {"name": NAME, "parameters": ARGS} calls, as vLLM
// constrains it; one call only without parallel_tool_calls.
std::string RequiredRegex(const std::vector<ToolFunction>& functions,
                          const std::vector<std::string>& arguments, bool parallel,
                          const std::string& ws) {
  std::vector<std::string> alternatives;
  for (size_t i = 0; i < functions.size(); ++i) {
    alternatives.push_back(
        absl::StrCat("(", grammar::RegexEscape("{"), ws, grammar::RegexEscape("\"name\""), ws, ":",
                     ws, grammar::RegexEscape(absl::StrCat("\"", functions[i].name, "\"")), ws, ",",
                     ws, grammar::RegexEscape("\"parameters\""), ws, ":", ws, "(", arguments[i],
                     ")", ws, grammar::RegexEscape("}"), ")"));
  }
  const std::string call = absl::StrCat("(", absl::StrJoin(alternatives, "|"), ")");
  std::string regex = absl::StrCat(grammar::RegexEscape("["), ws, call);
  if (parallel) absl::StrAppend(&regex, "(", ws, ",", ws, call, ")*");
  absl::StrAppend(&regex, ws, grammar::RegexEscape("]"));
  return regex;
}

// The end of the JSON object or list opening at s[pos] (one past its closing bracket), or npos
// when the text ends first. Strings and escapes are skipped; nothing else is checked.
size_t ScanJsonValue(absl::string_view s, size_t pos) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = pos; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return absl::string_view::npos;
}

// How many bytes at the end of `s` could begin `tag` (held back while streaming).
size_t PartialSuffix(absl::string_view s, absl::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (absl::StartsWith(tag, s.substr(s.size() - n))) return n;
  }
  return 0;
}

// What every parser shares: the offered names, call numbering, and content emission that holds
// back trailing whitespace (so whitespace around calls does not become content, while text
// without calls comes out whole).
class ParserBase : public ToolCallParser {
 public:
  explicit ParserBase(const ToolRequest& request) : parallel_(request.parallel) {
    for (const ToolFunction& f : request.functions) names_.push_back(f.name);
  }
  int calls() const override { return calls_; }

 protected:
  bool Offered(const std::string& name) const {
    for (const std::string& n : names_) {
      if (n == name) return true;
    }
    return false;
  }
  // A call may be added (parallel_tool_calls: false allows one).
  bool Room() const { return parallel_ || calls_ == 0; }

  void Content(absl::string_view text, ToolParseOutput* out) {
    if (drop_space_) {
      // The whitespace right after a call, however the text was cut into pieces.
      size_t begin = 0;
      while (begin < text.size() && absl::ascii_isspace(static_cast<unsigned char>(text[begin]))) {
        ++begin;
      }
      text.remove_prefix(begin);
      if (text.empty()) return;
      drop_space_ = false;
    }
    if (text.empty()) return;
    size_t end = text.size();
    while (end > 0 && absl::ascii_isspace(static_cast<unsigned char>(text[end - 1]))) --end;
    if (end == 0) {
      absl::StrAppend(&held_space_, text);
      return;
    }
    absl::StrAppend(&out->content, held_space_);
    absl::StrAppend(&out->content, text.substr(0, end));
    held_space_ = std::string(text.substr(end));
  }
  void Call(const std::string& name, std::string arguments, ToolParseOutput* out) {
    held_space_.clear();
    drop_space_ = true;
    out->calls.push_back({calls_++, NewToolCallId(), name, std::move(arguments)});
  }
  // Finish: trailing whitespace is content only when no call came out.
  void FlushSpace(ToolParseOutput* out) {
    if (calls_ == 0) absl::StrAppend(&out->content, held_space_);
    held_space_.clear();
  }
  // {"name": NAME, ARGS_KEY: {...}} with NAME offered: the name and the arguments' JSON text.
  bool ParseCall(absl::string_view text, std::string* name, std::string* arguments) const {
    const ordered_json j = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return false;
    const auto n = j.find("name");
    if (n == j.end() || !n->is_string() || !Offered(n->get<std::string>())) return false;
    auto a = j.find("arguments");
    if (a == j.end()) a = j.find("parameters");
    if (a == j.end()) return false;
    if (a->is_string()) {
      // Some models write the arguments as a JSON string.
      const ordered_json inner = ordered_json::parse(a->get<std::string>(), nullptr, false);
      if (inner.is_discarded() || !inner.is_object()) return false;
      *arguments = Dump(inner);
    } else if (a->is_object()) {
      *arguments = Dump(*a);
    } else {
      return false;
    }
    *name = n->get<std::string>();
    return true;
  }

 private:
  std::vector<std::string> names_;
  const bool parallel_;
  int calls_ = 0;
  std::string held_space_;
  bool drop_space_ = false;  // the whitespace right after a call is not content
};

class HermesParser final : public ParserBase {
 public:
  using ParserBase::ParserBase;

  ToolParseOutput Feed(absl::string_view text) override {
    absl::StrAppend(&buf_, text);
    ToolParseOutput out;
    Drain(/*final=*/false, &out);
    return out;
  }
  ToolParseOutput Finish() override {
    ToolParseOutput out;
    Drain(/*final=*/true, &out);
    FlushSpace(&out);
    return out;
  }

 private:
  void Drain(bool final, ToolParseOutput* out) {
    while (true) {
      if (!in_call_) {
        const size_t at = buf_.find(kHermesOpen);
        if (at != std::string::npos) {
          Content(absl::string_view(buf_).substr(0, at), out);
          buf_.erase(0, at + Len(kHermesOpen));
          in_call_ = true;
          continue;
        }
        const size_t keep = final ? 0 : PartialSuffix(buf_, kHermesOpen);
        Content(absl::string_view(buf_).substr(0, buf_.size() - keep), out);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      const size_t end = buf_.find(kHermesClose);
      if (end == std::string::npos && !final) return;
      const bool closed = end != std::string::npos;
      const std::string body = closed ? buf_.substr(0, end) : buf_;
      buf_.erase(0, closed ? end + Len(kHermesClose) : buf_.size());
      in_call_ = false;
      std::string name, arguments;
      if (Room() && ParseCall(absl::StripAsciiWhitespace(body), &name, &arguments)) {
        Call(name, std::move(arguments), out);
      } else {
        Content(absl::StrCat(kHermesOpen, body, closed ? kHermesClose : ""), out);
      }
      if (!closed) return;
    }
  }

  std::string buf_;
  bool in_call_ = false;
};

class Llama3JsonParser final : public ParserBase {
 public:
  using ParserBase::ParserBase;

  ToolParseOutput Feed(absl::string_view text) override {
    ToolParseOutput out;
    if (mode_ == Mode::kText) {
      out.content = std::string(text);
      return out;
    }
    absl::StrAppend(&buf_, text);
    if (mode_ == Mode::kUndecided) {
      const absl::string_view s = absl::StripLeadingAsciiWhitespace(buf_);
      if (s.empty()) return out;
      if (absl::StartsWith(s, "{") || absl::StartsWith(s, kPythonTag)) {
        mode_ = Mode::kCalls;
      } else if (!absl::StartsWith(kPythonTag, s)) {
        mode_ = Mode::kText;
        out.content = std::move(buf_);
        buf_.clear();
      }
    }
    return out;
  }

  ToolParseOutput Finish() override {
    ToolParseOutput out;
    if (mode_ == Mode::kText) return out;
    absl::string_view s = absl::StripAsciiWhitespace(buf_);
    if (absl::StartsWith(s, kPythonTag)) s.remove_prefix(Len(kPythonTag));
    // {...} ; {...} ; ...: all must parse, else the whole text is content.
    std::vector<std::pair<std::string, std::string>> calls;
    size_t pos = 0;
    size_t rest = absl::string_view::npos;  // where calls beyond the first start (no parallel)
    bool ok = true;
    while (ok) {
      while (pos < s.size() && absl::ascii_isspace(static_cast<unsigned char>(s[pos]))) ++pos;
      if (pos >= s.size() || s[pos] != '{') {
        ok = false;
        break;
      }
      const size_t end = ScanJsonValue(s, pos);
      std::string name, arguments;
      if (end == absl::string_view::npos ||
          !ParseCall(s.substr(pos, end - pos), &name, &arguments)) {
        ok = false;
        break;
      }
      if (!calls.empty() && rest == absl::string_view::npos) rest = pos;
      calls.emplace_back(std::move(name), std::move(arguments));
      pos = end;
      while (pos < s.size() && absl::ascii_isspace(static_cast<unsigned char>(s[pos]))) ++pos;
      if (pos == s.size()) break;
      if (s[pos] != ';') ok = false;
      ++pos;
    }
    if (!ok || calls.empty()) {
      out.content = std::move(buf_);
      return out;
    }
    for (auto& [name, arguments] : calls) {
      if (!Room()) break;
      Call(name, std::move(arguments), &out);
    }
    if (calls.size() > 1 && !Room())
      out.content = std::string(s.substr(rest));  // no parallel calls
    return out;
  }

 private:
  enum class Mode { kUndecided, kCalls, kText };

  Mode mode_ = Mode::kUndecided;
  std::string buf_;
};

// tool_choice "required": the grammar made the output a JSON list of {"name", "parameters"}
// objects; each call goes out as its object closes.
class RequiredParser final : public ParserBase {
 public:
  using ParserBase::ParserBase;

  ToolParseOutput Feed(absl::string_view text) override {
    absl::StrAppend(&buf_, text);
    ToolParseOutput out;
    while (true) {
      while (pos_ < buf_.size() && (absl::ascii_isspace(static_cast<unsigned char>(buf_[pos_])) ||
                                    buf_[pos_] == '[' || buf_[pos_] == ',' || buf_[pos_] == ']')) {
        ++pos_;
      }
      if (pos_ >= buf_.size() || buf_[pos_] != '{') break;
      const size_t end = ScanJsonValue(buf_, pos_);
      if (end == std::string::npos) break;
      std::string name, arguments;
      if (ParseCall(absl::string_view(buf_).substr(pos_, end - pos_), &name, &arguments)) {
        Call(name, std::move(arguments), &out);
      } else {
        unparsed_.append(buf_, pos_, end - pos_);
      }
      pos_ = end;
    }
    return out;
  }

  ToolParseOutput Finish() override {
    // A list cut short (max_tokens, a stop string): what did not make a call is content.
    ToolParseOutput out;
    out.content = std::move(unparsed_);
    if (calls() == 0) {
      out.content = std::move(buf_);
    } else if (pos_ < buf_.size()) {
      absl::StrAppend(&out.content,
                      absl::StripTrailingAsciiWhitespace(absl::string_view(buf_).substr(pos_)));
    }
    return out;
  }

 private:
  std::string buf_;
  size_t pos_ = 0;  // buf_[0, pos_) is consumed
  std::string unparsed_;
};

// A named function: the grammar made the whole output its arguments, streamed as they come.
class NamedParser final : public ToolCallParser {
 public:
  explicit NamedParser(std::string name) : name_(std::move(name)) {}
  ToolParseOutput Feed(absl::string_view text) override {
    ToolParseOutput out;
    if (text.empty() && started_) return out;
    out.calls.push_back(
        {0, started_ ? "" : NewToolCallId(), started_ ? "" : name_, std::string(text)});
    started_ = true;
    return out;
  }
  ToolParseOutput Finish() override { return Feed(""); }
  int calls() const override { return started_ ? 1 : 0; }

 private:
  const std::string name_;
  bool started_ = false;
};

}  // namespace

absl::Status ParseToolRequest(const json& j, absl::string_view body, ToolRequest* out,
                              SamplingParams::Guided* guided) {
  *out = ToolRequest();
  if (const json* v = Field(j, "parallel_tool_calls"); v != nullptr) {
    if (!v->is_boolean()) return WrongType("parallel_tool_calls", "a boolean", *v);
    out->parallel = v->get<bool>();
  }
  const json* tools = Field(j, "tools");
  const json* choice = Field(j, "tool_choice");
  if (tools != nullptr && !tools->is_array()) return WrongType("tools", "a list", *tools);
  if (tools == nullptr || tools->empty()) {
    if (choice != nullptr && !(choice->is_string() && *choice == "none")) {
      return InvalidParam("tool_choice", "'tool_choice' needs 'tools'");
    }
    if (Field(j, "parallel_tool_calls") != nullptr) {
      return InvalidParam("parallel_tool_calls", "'parallel_tool_calls' needs 'tools'");
    }
    return absl::OkStatus();
  }
  if (tools->size() > static_cast<size_t>(kMaxTools)) {
    return InvalidParam("tools", absl::StrCat("at most ", kMaxTools, " tools"));
  }
  if (json_fields::MaxObjectKeys(j) > kMaxSchemaObjectKeys) {
    return InvalidParam("tools", absl::StrCat("'tools' comes in a request with an object of more "
                                              "than ",
                                              kMaxSchemaObjectKeys, " keys"));
  }
  // Ordered: schemas keep the client's property order, in the prompt and in the grammar.
  const ordered_json root = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.contains("tools")) {
    return absl::InternalError("the request body no longer parses");
  }
  const ordered_json& ordered_tools = root["tools"];
  grammar::JsonSchemaOptions options;
  std::vector<std::string> arguments_regex;
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string where = absl::StrCat("tools[", i, "]");
    if (!t.is_object()) return WrongType(where, "an object", t);
    if (absl::Status s = OnlyKeys(t, where, {"type", "function"}); !s.ok()) return s;
    const json* type = Field(t, "type");
    if (type == nullptr || *type != "function") {
      return InvalidParam(where + ".type", absl::StrCat("'", where, ".type' must be 'function'"));
    }
    const json* f = Field(t, "function");
    if (f == nullptr) return InvalidParam(where + ".function", "'function' is required");
    if (!f->is_object()) return WrongType(where + ".function", "an object", *f);
    const std::string fwhere = where + ".function";
    if (absl::Status s = OnlyKeys(*f, fwhere, {"name", "description", "parameters", "strict"});
        !s.ok()) {
      return s;
    }
    const json* name = Field(*f, "name");
    if (name == nullptr || !name->is_string() || !ValidName(name->get<std::string>())) {
      return InvalidParam(fwhere + ".name", absl::StrCat("'", fwhere,
                                                         ".name' must be 1 to 64 letters, digits, "
                                                         "'_' or '-'"));
    }
    for (const ToolFunction& other : out->functions) {
      if (other.name == *name) {
        return InvalidParam(fwhere + ".name",
                            absl::StrCat("two tools are named '", other.name, "'"));
      }
    }
    if (const json* d = Field(*f, "description"); d != nullptr && !d->is_string()) {
      return WrongType(fwhere + ".description", "a string", *d);
    }
    if (const json* s = Field(*f, "strict"); s != nullptr && !s->is_boolean()) {
      return WrongType(fwhere + ".strict", "a boolean", *s);
    }
    const json* params = Field(*f, "parameters");
    if (params != nullptr && !params->is_object()) {
      return WrongType(fwhere + ".parameters", "a JSON Schema object", *params);
    }
    const ordered_json& of = ordered_tools[i]["function"];
    const std::string pwhere = fwhere + ".parameters";
    absl::StatusOr<std::string> regex = ConstraintCache::Shared().GetOrCompile(
        absl::StrCat("tool parameters\n", pwhere, "\n",
                     of.contains("parameters") ? Dump(of["parameters"]) : ""),
        [&] { return ArgumentsRegex(of, pwhere, options); });
    if (!regex.ok()) return regex.status();
    arguments_regex.push_back(*std::move(regex));
    ToolFunction fn;
    fn.name = name->get<std::string>();
    out->functions.push_back(std::move(fn));
  }
  out->tools_json = Dump(ordered_tools);

  out->choice = ToolChoice::kAuto;
  if (choice != nullptr) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "none") {
        out->choice = ToolChoice::kNone;
      } else if (c == "auto") {
        out->choice = ToolChoice::kAuto;
      } else if (c == "required") {
        out->choice = ToolChoice::kRequired;
      } else {
        return InvalidParam("tool_choice",
                            absl::StrCat("'tool_choice' must be 'none', 'auto', 'required' or "
                                         "{\"type\": \"function\", \"function\": {\"name\"}}, "
                                         "got '",
                                         c, "'"));
      }
    } else if (choice->is_object()) {
      if (absl::Status s = OnlyKeys(*choice, "tool_choice", {"type", "function"}); !s.ok()) {
        return s;
      }
      const json* type = Field(*choice, "type");
      const json* f = Field(*choice, "function");
      const json* name = f != nullptr && f->is_object() ? Field(*f, "name") : nullptr;
      if (type == nullptr || *type != "function" || name == nullptr || !name->is_string()) {
        return InvalidParam("tool_choice",
                            "'tool_choice' as an object must be {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}");
      }
      if (absl::Status s = OnlyKeys(*f, "tool_choice.function", {"name"}); !s.ok()) return s;
      out->choice = ToolChoice::kFunction;
      out->function = name->get<std::string>();
      bool found = false;
      for (const ToolFunction& fn : out->functions) found |= fn.name == out->function;
      if (!found) {
        return InvalidParam(
            "tool_choice.function.name",
            absl::StrCat("'tool_choice' names '", out->function, "', which is not in 'tools'"));
      }
    } else {
      return WrongType("tool_choice", "a string or an object", *choice);
    }
  }

  if (out->choice != ToolChoice::kRequired && out->choice != ToolChoice::kFunction) {
    return absl::OkStatus();
  }
  if (!guided->empty()) {
    return InvalidParam("tool_choice",
                        "a forced 'tool_choice' constrains the output itself: it cannot be "
                        "combined with response_format or guided decoding");
  }
  std::string regex;
  if (out->choice == ToolChoice::kFunction) {
    for (size_t i = 0; i < out->functions.size(); ++i) {
      if (out->functions[i].name == out->function) regex = arguments_regex[i];
    }
  } else {
    regex = RequiredRegex(out->functions, arguments_regex, out->parallel, options.whitespace);
  }
  if (regex.size() > kMaxGuidedBytes) {
    return InvalidParam("tools", absl::StrCat("the tools' schemas compile to ", regex.size(),
                                              " bytes of grammar; at most ", kMaxGuidedBytes));
  }
  absl::StatusOr<std::string> checked = ConstraintCache::Shared().GetOrCompile(
      absl::StrCat("forced tools\n", regex), [&]() -> absl::StatusOr<std::string> {
        absl::StatusOr<grammar::ByteDfa> dfa = grammar::ByteDfa::FromRegex(regex);
        if (!dfa.ok()) {
          return InvalidParam("tools", absl::StrCat("'tools' cannot be forced with tool_choice: ",
                                                    dfa.status().message()));
        }
        return std::string();
      });
  if (!checked.ok()) return checked.status();
  guided->regex = std::move(regex);
  return absl::OkStatus();
}

std::string DetectToolCallParser(absl::string_view template_source) {
  if (absl::StrContains(template_source, kHermesOpen)) return "hermes";
  if (absl::StrContains(template_source, kPythonTag) ||
      absl::StrContains(template_source, "\"parameters\": ")) {
    return "llama3_json";
  }
  return "";
}

absl::StatusOr<std::unique_ptr<ToolCallParser>> CreateToolCallParser(
    const ToolRequest& request, absl::string_view auto_parser) {
  switch (request.choice) {
    case ToolChoice::kFunction:
      return std::make_unique<NamedParser>(request.function);
    case ToolChoice::kRequired:
      return std::make_unique<RequiredParser>(request);
    case ToolChoice::kAuto:
      if (auto_parser == "hermes") return std::make_unique<HermesParser>(request);
      if (auto_parser == "llama3_json") return std::make_unique<Llama3JsonParser>(request);
      if (auto_parser.empty()) {
        return InvalidParam(
            "tool_choice",
            "tool_choice 'auto' (the default with tools) needs to know how this model writes "
            "tool calls, and its chat template shows no known format: start the server with "
            "--tool-call-parser hermes|llama3_json (and a --chat-template that renders tools), "
            "or send tool_choice 'required' or a named function, which the grammar constrains",
            "unsupported_parameter");
      }
      return absl::InvalidArgumentError(absl::StrCat("unknown tool-call parser '", auto_parser,
                                                     "' (", absl::StrJoin(kToolCallParsers, ", "),
                                                     ")"));
    case ToolChoice::kNone:
      break;
  }
  return absl::InvalidArgumentError("tool_choice 'none' parses no calls");
}

std::string NewToolCallId() {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[rng() % (sizeof(kAlphabet) - 1)]);
  return id;
}

void AppendToolCallDeltas(const std::vector<ToolCallDelta>& deltas, std::vector<ToolCall>* calls) {
  for (const ToolCallDelta& d : deltas) {
    if (d.index == static_cast<int>(calls->size())) {
      calls->push_back({d.id, d.name, d.arguments});
    } else if (d.index >= 0 && d.index < static_cast<int>(calls->size())) {
      (*calls)[d.index].arguments += d.arguments;
    }
  }
}

}  // namespace tandem::router

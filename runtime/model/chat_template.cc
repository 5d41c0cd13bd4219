#include "runtime/model/chat_template.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/model/jinja_chat_template.h"

namespace tandem {
namespace {

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path.string()));
  return buf.str();
}

// bos_token / eos_token: a string, an AddedToken-style {"content": ...}, or null / absent.
absl::StatusOr<std::string> SpecialToken(const nlohmann::json& config, const char* key,
                                         const std::string& path) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": \"", key, "\" must be a string or {\"content\": string}"));
}

}  // namespace

absl::StatusOr<ChatTemplateSource> ReadChatTemplateSource(const std::string& dir) {
  const std::filesystem::path config_path = std::filesystem::path(dir) / "tokenizer_config.json";
  const std::string path = config_path.string();
  ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
  nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  ChatTemplateSource out;
  ASSIGN_OR_RETURN(out.bos_token, SpecialToken(config, "bos_token", path));
  ASSIGN_OR_RETURN(out.eos_token, SpecialToken(config, "eos_token", path));

  auto tmpl = config.find("chat_template");
  if (tmpl == config.end() || tmpl->is_null()) {
    const std::filesystem::path jinja_path = std::filesystem::path(dir) / "chat_template.jinja";
    if (std::filesystem::exists(jinja_path)) {
      ASSIGN_OR_RETURN(out.source, ReadFile(jinja_path));
      return out;
    }
    return absl::NotFoundError(absl::StrCat(
        path,
        " has no \"chat_template\" (and there is no chat_template.jinja beside it): this "
        "model has no chat template; use a base-model prompt instead of chat messages"));
  }
  if (tmpl->is_string()) {
    out.source = tmpl->get<std::string>();
    return out;
  }
  if (tmpl->is_array()) {
    std::vector<std::string> names;
    for (const auto& entry : *tmpl) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
          !entry.contains("template") || !entry["template"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": \"chat_template\" list entries must be {\"name\": str, \"template\": str}"));
      }
      names.push_back(entry["name"].get<std::string>());
      if (names.back() == "default") {
        out.source = entry["template"].get<std::string>();
        return out;
      }
    }
    return absl::NotFoundError(absl::StrCat(path,
                                            ": \"chat_template\" list has no \"default\" "
                                            "entry (has: ",
                                            absl::StrJoin(names, ", "), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": \"chat_template\" must be a string or a list of named templates"));
}

absl::StatusOr<std::unique_ptr<JinjaChatTemplate>> JinjaChatTemplate::Create(
    const std::string& source, const std::string& bos_token, const std::string& eos_token) {
  ASSIGN_OR_RETURN(jinja::Template tmpl, jinja::Template::Compile(source));
  return std::unique_ptr<JinjaChatTemplate>(
      new JinjaChatTemplate(source, std::move(tmpl), bos_token, eos_token));
}

namespace {

constexpr int kMaxKwargsDepth = 32;

// `what` names the input in errors ("chat_template_kwargs", "tools", ...).
absl::StatusOr<jinja::Value> ToTemplateValue(const nlohmann::ordered_json& j, int depth,
                                             absl::string_view what) {
  if (depth > kMaxKwargsDepth) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": nested deeper than ", kMaxKwargsDepth));
  }
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return jinja::Value::None();
    case nlohmann::json::value_t::boolean:
      return jinja::Value::Bool(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return jinja::Value::Int(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      if (j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return jinja::Value::Float(j.get<double>());
      }
      return jinja::Value::Int(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return jinja::Value::Float(j.get<double>());
    case nlohmann::json::value_t::string:
      return jinja::Value::String(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      jinja::Array items;
      for (const nlohmann::ordered_json& e : j) {
        ASSIGN_OR_RETURN(jinja::Value v, ToTemplateValue(e, depth + 1, what));
        items.push_back(std::move(v));
      }
      return jinja::Value::MakeArray(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      jinja::Object entries;
      for (const auto& [k, e] : j.items()) {
        ASSIGN_OR_RETURN(jinja::Value v, ToTemplateValue(e, depth + 1, what));
        entries.emplace_back(k, std::move(v));
      }
      return jinja::Value::MakeObject(std::move(entries));
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(what, ": binary values are not allowed"));
  }
}

// A JSON text as a template value; errors name `what`.
absl::StatusOr<jinja::Value> ParseTemplateValue(const std::string& text, absl::string_view what) {
  // Ordered: templates print objects (tojson) in the client's key order, as Python dicts keep it.
  const nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(what, ": not valid JSON"));
  return ToTemplateValue(j, 1, what);
}

jinja::Value MessageValue(const ChatMessage& m, absl::Status* status) {
  jinja::Object entries = {
      {"role", jinja::Value::String(m.role)},
      {"content", jinja::Value::String(m.content)},
  };
  if (!m.tool_calls.empty()) {
    jinja::Array calls;
    for (const ChatToolCall& c : m.tool_calls) {
      absl::StatusOr<jinja::Value> arguments =
          ParseTemplateValue(c.arguments, "tool_calls.function.arguments");
      if (!arguments.ok()) {
        *status = arguments.status();
        return jinja::Value::None();
      }
      calls.push_back(jinja::Value::MakeObject({
          {"id", jinja::Value::String(c.id)},
          {"type", jinja::Value::String("function")},
          {"function", jinja::Value::MakeObject({{"name", jinja::Value::String(c.name)},
                                                 {"arguments", *std::move(arguments)}})},
      }));
    }
    entries.emplace_back("tool_calls", jinja::Value::MakeArray(std::move(calls)));
  }
  if (!m.tool_call_id.empty()) {
    entries.emplace_back("tool_call_id", jinja::Value::String(m.tool_call_id));
  }
  if (!m.name.empty()) entries.emplace_back("name", jinja::Value::String(m.name));
  return jinja::Value::MakeObject(std::move(entries));
}

}  // namespace

absl::StatusOr<std::string> JinjaChatTemplate::Render(std::span<const ChatMessage> messages,
                                                      const ChatRenderOptions& options) const {
  jinja::Object extra;
  if (!options.kwargs_json.empty()) {
    const nlohmann::ordered_json kwargs =
        nlohmann::ordered_json::parse(options.kwargs_json, nullptr, /*allow_exceptions=*/false);
    if (kwargs.is_discarded() || !kwargs.is_object()) {
      return absl::InvalidArgumentError("chat_template_kwargs: must be a JSON object");
    }
    for (const auto& [k, v] : kwargs.items()) {
      ASSIGN_OR_RETURN(jinja::Value value, ToTemplateValue(v, 1, "chat_template_kwargs"));
      extra.emplace_back(k, std::move(value));
    }
  }
  if (!options.tools_json.empty()) {
    ASSIGN_OR_RETURN(jinja::Value tools, ParseTemplateValue(options.tools_json, "tools"));
    if (tools.kind() != jinja::Value::Kind::kArray)
      return absl::InvalidArgumentError("tools: must be a JSON array");
    extra.emplace_back("tools", std::move(tools));
  }
  ASSIGN_OR_RETURN(std::string text,
                   RenderWithVariables(messages, options.add_generation_prompt, extra));
  if (!options.continue_final_message) return text;
  if (messages.empty()) {
    return absl::InvalidArgumentError("continue_final_message: there are no messages");
  }
  // As transformers does: cut after the last occurrence of the final message's trimmed content.
  const absl::string_view final_content = absl::StripAsciiWhitespace(messages.back().content);
  const size_t at = text.rfind(final_content.data(), std::string::npos, final_content.size());
  if (at == std::string::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message: the final message does not appear in the rendered chat (the "
        "template changes it)");
  }
  text.resize(at + final_content.size());
  return text;
}

absl::StatusOr<std::string> JinjaChatTemplate::RenderWithVariables(
    std::span<const ChatMessage> messages, bool add_generation_prompt,
    const jinja::Object& extra) const {
  jinja::Array message_values;
  message_values.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    absl::Status status;
    message_values.push_back(MessageValue(m, &status));
    if (!status.ok()) return status;
  }
  jinja::Object variables = {
      {"messages", jinja::Value::MakeArray(std::move(message_values))},
      {"add_generation_prompt", jinja::Value::Bool(add_generation_prompt)},
      {"tools", jinja::Value::None()},
      {"documents", jinja::Value::None()},
  };
  if (!bos_token_.empty()) variables.emplace_back("bos_token", jinja::Value::String(bos_token_));
  if (!eos_token_.empty()) variables.emplace_back("eos_token", jinja::Value::String(eos_token_));
  variables.insert(variables.end(), extra.begin(), extra.end());
  return template_.Render(variables);
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Compile(const std::string& source,
                                                                    const std::string& bos_token,
                                                                    const std::string& eos_token) {
  ASSIGN_OR_RETURN(std::unique_ptr<JinjaChatTemplate> t,
                   JinjaChatTemplate::Create(source, bos_token, eos_token));
  return std::unique_ptr<ChatTemplate>(std::move(t));
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromModelDir(const std::string& dir) {
  ASSIGN_OR_RETURN(ChatTemplateSource src, ReadChatTemplateSource(dir));
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
      Compile(src.source, src.bos_token, src.eos_token);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat(dir, "/tokenizer_config.json: ", t.status().message()));
  }
  return t;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromFile(const std::string& file,
                                                                     const std::string& model_dir) {
  constexpr uintmax_t kMaxTemplateBytes = 1 << 20;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("--chat-template ", file, ": ", ec.message()));
  if (size > kMaxTemplateBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat-template ", file, ": ", size, " bytes; at most 1 MiB"));
  }
  ASSIGN_OR_RETURN(std::string source, ReadFile(file));
  std::string bos, eos;
  const std::filesystem::path config_path =
      std::filesystem::path(model_dir) / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    const std::string path = config_path.string();
    ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
    nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
    }
    ASSIGN_OR_RETURN(bos, SpecialToken(config, "bos_token", path));
    ASSIGN_OR_RETURN(eos, SpecialToken(config, "eos_token", path));
  }
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = Compile(source, bos, eos);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat("--chat-template ", file, ": ", t.status().message()));
  }
  return t;
}

}  // namespace tandem

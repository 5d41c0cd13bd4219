#include "runtime/router/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/router/api_fields.h"
#include "runtime/router/json_fields.h"
#include "runtime/router/structured_outputs.h"
#include "runtime/router/tool_calls.h"

namespace tandem::router {
namespace {

using json = nlohmann::json;

constexpr absl::string_view kParamPayload = "tandem.openai/param";
constexpr absl::string_view kCodePayload = "tandem.openai/code";

using json_fields::Dump;
using json_fields::Field;
using json_fields::TypeName;
using json_fields::WrongType;

absl::Status GetBool(const json& obj, absl::string_view name, bool* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return WrongType(name, "a boolean", *v);
  *out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status GetString(const json& obj, absl::string_view name, std::string* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return WrongType(name, "a string", *v);
  *out = v->get<std::string>();
  return absl::OkStatus();
}

absl::Status GetDouble(const json& obj, absl::string_view name, std::optional<double>* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return WrongType(name, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d)) return InvalidParam(name, absl::StrCat("'", name, "' must be finite"));
  *out = d;
  return absl::OkStatus();
}

// Integers; integral floats (5.0) are accepted as pydantic does.
absl::Status GetInt64(const json& obj, absl::string_view name, std::optional<int64_t>* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidParam(name, absl::StrCat("'", name, "' is out of range"));
    }
    *out = v->get<int64_t>();
    return absl::OkStatus();
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      *out = static_cast<int64_t>(d);
      return absl::OkStatus();
    }
  }
  return WrongType(name, "an integer", *v);
}

absl::Status GetIntInRange(const json& obj, absl::string_view name, int64_t lo, int64_t hi,
                           std::optional<int>* out) {
  std::optional<int64_t> v;
  if (absl::Status s = GetInt64(obj, name, &v); !s.ok()) return s;
  if (!v.has_value()) return absl::OkStatus();
  if (*v < lo || *v > hi) {
    return InvalidParam(name,
                        absl::StrCat("'", name, "' must be in [", lo, ", ", hi, "], got ", *v));
  }
  *out = static_cast<int>(*v);
  return absl::OkStatus();
}

// `lo_open`: the lower bound is excluded.
absl::Status GetFloatInRange(const json& obj, absl::string_view name, double lo, double hi,
                             bool lo_open, float* out) {
  std::optional<double> v;
  if (absl::Status s = GetDouble(obj, name, &v); !s.ok()) return s;
  if (!v.has_value()) return absl::OkStatus();
  if ((lo_open ? *v <= lo : *v < lo) || *v > hi) {
    return InvalidParam(name, absl::StrCat("'", name, "' must be in ", lo_open ? "(" : "[", lo,
                                           ", ", hi, "], got ", *v));
  }
  *out = static_cast<float>(*v);
  return absl::OkStatus();
}

absl::StatusOr<json> ParseBody(absl::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidParam("", "the request body is not valid JSON");
  if (!j.is_object()) return InvalidParam("", "the request body must be a JSON object");
  return j;
}

// A rejected field's value that is accepted because it is the default and changes nothing.
bool IsAcceptedDefault(absl::string_view name, const json& v) {
  if (name == "spaces_between_special_tokens") return v.is_boolean() && v.get<bool>();
  if (name == "use_beam_search" || name == "store") return v.is_boolean() && !v.get<bool>();
  if (name == "length_penalty") return v.is_number() && v.get<double>() == 1.0;
  if (name == "modalities") return v.is_array() && v.size() == 1 && v[0] == "text";
  return false;
}

// Every field against api_fields.h: unknown ones and rejected ones (other than their accepted
// defaults) are 400s naming the field; the no-ops are type-checked here.
absl::Status CheckFields(const json& j, Endpoint endpoint) {
  const uint8_t bit = endpoint == Endpoint::kChatCompletions ? kChatField : kCompletionsField;
  for (const auto& [key, value] : j.items()) {
    const ApiField* field = FindApiField(bit, key);
    if (field == nullptr) {
      return InvalidParam(key,
                          absl::StrCat("unrecognized request argument '", key,
                                       "' (docs/api.md lists the fields this server takes)"),
                          "unknown_parameter");
    }
    if (value.is_null()) continue;
    if (field->support == FieldSupport::kRejected && !IsAcceptedDefault(key, value)) {
      return InvalidParam(key, absl::StrCat("'", key, "' is not supported: ", field->note),
                          "unsupported_parameter");
    }
  }
  // The no-ops: right type, or 400.
  std::string ignored;
  for (const char* name :
       {"user", "safety_identifier", "prompt_cache_key", "guided_decoding_backend"}) {
    if (absl::Status s = GetString(j, name, &ignored); !s.ok()) return s;
  }
  if (const json* v = Field(j, "metadata"); v != nullptr) {
    if (!v->is_object()) return WrongType("metadata", "an object", *v);
    for (const auto& [k, mv] : v->items()) {
      if (!mv.is_string()) return WrongType("metadata." + k, "a string", mv);
    }
  }
  std::string tier;
  if (absl::Status s = GetString(j, "service_tier", &tier); !s.ok()) return s;
  if (!tier.empty() && tier != "auto" && tier != "default") {
    return InvalidParam("service_tier", absl::StrCat("'service_tier' must be 'auto' or 'default', "
                                                     "got '",
                                                     tier, "'"));
  }
  return absl::OkStatus();
}

// A list of token ids (non-negative 32-bit integers); `name` for the error.
absl::StatusOr<std::vector<int32_t>> TokenIdList(const json& arr, absl::string_view name) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const json& id : arr) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return InvalidParam(name, absl::StrCat("'", name, "' must hold non-negative integers"));
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

absl::Status ParseLogitBias(const json& j, SamplingParams* p) {
  const json* v = Field(j, "logit_bias");
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_object()) return WrongType("logit_bias", "an object of token id to bias", *v);
  if (v->size() > static_cast<size_t>(kMaxLogitBiasEntries)) {
    return InvalidParam("logit_bias", absl::StrCat("'logit_bias' has ", v->size(),
                                                   " entries; at most ", kMaxLogitBiasEntries));
  }
  for (const auto& [key, bias] : v->items()) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(key, &id) || id < 0 || id > std::numeric_limits<int32_t>::max() ||
        absl::StrCat(id) != key) {
      return InvalidParam("logit_bias",
                          absl::StrCat("'logit_bias' keys must be token ids, got '", key, "'"));
    }
    if (!bias.is_number() || !std::isfinite(bias.get<double>()) ||
        std::fabs(bias.get<double>()) > kMaxLogitBias) {
      return InvalidParam("logit_bias", absl::StrCat("'logit_bias' of token ", key,
                                                     " must be a number in [-100, 100]"));
    }
    p->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias.get<double>()));
  }
  std::sort(p->logit_bias.begin(), p->logit_bias.end());
  return absl::OkStatus();
}

absl::Status ParseStop(const json& j, std::vector<std::string>* out) {
  const json* v = Field(j, "stop");
  if (v == nullptr) return absl::OkStatus();
  if (v->is_string()) {
    out->push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > kMaxStopStrings) {
      return InvalidParam("stop", absl::StrCat("at most ", kMaxStopStrings,
                                               " stop strings are supported, got ", v->size()));
    }
    for (const json& s : *v) {
      if (!s.is_string()) return WrongType("stop", "a string or a list of strings", s);
      out->push_back(s.get<std::string>());
    }
  } else {
    return WrongType("stop", "a string or a list of strings", *v);
  }
  for (const std::string& s : *out) {
    if (s.empty()) return InvalidParam("stop", "stop strings must be non-empty");
  }
  return absl::OkStatus();
}

// Everything both endpoints share.
absl::Status ParseCommon(const json& j, absl::string_view body, OpenAiRequest* r) {
  if (absl::Status s = CheckFields(j, r->endpoint); !s.ok()) return s;
  if (const json* v = Field(j, "model"); v != nullptr) {
    if (!v->is_string()) return WrongType("model", "a string", *v);
    r->model = v->get<std::string>();
  }

  std::optional<int> n;
  if (absl::Status s = GetIntInRange(j, "n", 1, kMaxChoices, &n); !s.ok()) return s;
  r->n = n.value_or(1);
  std::optional<int> priority;
  if (absl::Status s = GetIntInRange(j, "priority", std::numeric_limits<int32_t>::min(),
                                     std::numeric_limits<int32_t>::max(), &priority);
      !s.ok()) {
    return s;
  }
  r->priority = priority.value_or(0);
  std::optional<int> best_of;
  if (absl::Status s = GetIntInRange(j, "best_of", 1, kMaxChoices, &best_of); !s.ok()) return s;
  if (best_of.has_value() && *best_of != r->n) {
    return InvalidParam("best_of", "'best_of' other than n is not supported");
  }

  if (absl::Status s = GetBool(j, "stream", &r->stream); !s.ok()) return s;
  if (const json* v = Field(j, "stream_options"); v != nullptr) {
    if (!v->is_object()) return WrongType("stream_options", "an object", *v);
    if (!r->stream) {
      return InvalidParam("stream_options",
                          "'stream_options' is only allowed when 'stream' is true");
    }
    if (absl::Status s = GetBool(*v, "include_usage", &r->include_usage); !s.ok()) {
      return InvalidParam("stream_options.include_usage", s.message());
    }
  }

  if (absl::Status s = GetIntInRange(j, "prompt_logprobs", 0, kMaxLogprobs, &r->prompt_logprobs);
      !s.ok()) {
    return s;
  }
  if (r->prompt_logprobs.has_value() && r->stream) {
    return InvalidParam("prompt_logprobs",
                        "'prompt_logprobs' is not available when 'stream' is true (as in vLLM)");
  }

  SamplingParams& p = r->params;
  p.prompt_logprobs = r->prompt_logprobs;
  if (absl::Status s = GetFloatInRange(j, "temperature", 0, 2, false, &p.temperature); !s.ok()) {
    return s;
  }
  if (absl::Status s = GetFloatInRange(j, "top_p", 0, 1, true, &p.top_p); !s.ok()) return s;
  if (absl::Status s = GetFloatInRange(j, "min_p", 0, 1, false, &p.min_p); !s.ok()) return s;
  if (absl::Status s = GetFloatInRange(j, "presence_penalty", -2, 2, false, &p.presence_penalty);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = GetFloatInRange(j, "frequency_penalty", -2, 2, false, &p.frequency_penalty);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          GetFloatInRange(j, "repetition_penalty", 0, 1e9, true, &p.repetition_penalty);
      !s.ok()) {
    return s;
  }
  std::optional<int> top_k;
  if (absl::Status s = GetIntInRange(j, "top_k", -1, std::numeric_limits<int>::max(), &top_k);
      !s.ok()) {
    return s;
  }
  p.top_k = top_k.value_or(0);
  r->given = {.temperature = Field(j, "temperature") != nullptr,
              .top_p = Field(j, "top_p") != nullptr,
              .top_k = Field(j, "top_k") != nullptr,
              .min_p = Field(j, "min_p") != nullptr,
              .repetition_penalty = Field(j, "repetition_penalty") != nullptr};
  std::optional<int64_t> seed;
  if (absl::Status s = GetInt64(j, "seed", &seed); !s.ok()) return s;
  if (seed.has_value()) p.seed = static_cast<uint64_t>(*seed);
  if (absl::Status s = ParseStop(j, &p.stop); !s.ok()) return s;
  if (const json* v = Field(j, "stop_token_ids"); v != nullptr) {
    if (!v->is_array()) return WrongType("stop_token_ids", "a list of token ids", *v);
    for (const json& id : *v) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return InvalidParam("stop_token_ids", "'stop_token_ids' must be non-negative integers");
      }
      p.stop_token_ids.push_back(id.get<int32_t>());
    }
  }
  if (absl::Status s = GetBool(j, "ignore_eos", &p.ignore_eos); !s.ok()) return s;
  if (absl::Status s = GetBool(j, "skip_special_tokens", &p.skip_special_tokens); !s.ok()) {
    return s;
  }
  std::optional<int> max_tokens;
  if (absl::Status s =
          GetIntInRange(j, "max_tokens", 1, std::numeric_limits<int>::max(), &max_tokens);
      !s.ok()) {
    return s;
  }
  p.max_tokens = max_tokens;
  std::optional<int> min_tokens;
  if (absl::Status s =
          GetIntInRange(j, "min_tokens", 0, std::numeric_limits<int>::max(), &min_tokens);
      !s.ok()) {
    return s;
  }
  p.min_tokens = min_tokens.value_or(0);
  if (absl::Status s = ParseLogitBias(j, &p); !s.ok()) return s;
  if (absl::Status s = ParseStructuredOutputs(j, body, &p.guided); !s.ok()) return s;
  if (const json* v = Field(j, "allowed_token_ids"); v != nullptr) {
    if (!v->is_array()) return WrongType("allowed_token_ids", "a list of token ids", *v);
    if (v->empty()) return InvalidParam("allowed_token_ids", "'allowed_token_ids' is empty");
    absl::StatusOr<std::vector<int32_t>> ids = TokenIdList(*v, "allowed_token_ids");
    if (!ids.ok()) return ids.status();
    p.allowed_token_ids = *std::move(ids);
  }
  if (absl::Status s = GetBool(j, "include_stop_str_in_output", &p.include_stop_str_in_output);
      !s.ok()) {
    return s;
  }
  bool add_special = false;
  if (Field(j, "add_special_tokens") != nullptr) {
    if (absl::Status s = GetBool(j, "add_special_tokens", &add_special); !s.ok()) return s;
    r->add_special_tokens = add_special;
  }
  std::optional<int> truncate;
  if (absl::Status s = GetIntInRange(j, "truncate_prompt_tokens", -1,
                                     std::numeric_limits<int>::max(), &truncate);
      !s.ok()) {
    return s;
  }
  if (truncate.has_value() && *truncate == 0) {
    return InvalidParam("truncate_prompt_tokens",
                        "'truncate_prompt_tokens' must be -1 (the context limit) or >= 1");
  }
  r->truncate_prompt_tokens = truncate;
  return absl::OkStatus();
}

absl::Status ParsePrompt(const json& j, OpenAiRequest* r) {
  const json* v = Field(j, "prompt");
  if (v == nullptr) return InvalidParam("prompt", "'prompt' is required");
  const auto add = [r](const json& p, absl::string_view where) -> absl::Status {
    OpenAiRequest::Prompt prompt;
    if (p.is_string()) {
      prompt.text = p.get<std::string>();
      if (prompt.text.empty()) return InvalidParam("prompt", absl::StrCat(where, " is empty"));
    } else if (p.is_array()) {
      if (p.empty()) return InvalidParam("prompt", absl::StrCat(where, " is empty"));
      absl::StatusOr<std::vector<int32_t>> ids = TokenIdList(p, "prompt");
      if (!ids.ok()) return ids.status();
      prompt.token_ids = *std::move(ids);
    } else {
      return WrongType("prompt", "a string or a list of token ids", p);
    }
    r->prompts.push_back(std::move(prompt));
    return absl::OkStatus();
  };
  if (v->is_string()) return add(*v, "'prompt'");
  if (!v->is_array()) return WrongType("prompt", "a string or a list of token ids", *v);
  if (v->empty()) return InvalidParam("prompt", "'prompt' must not be empty");
  if ((*v)[0].is_number()) return add(*v, "'prompt'");
  // A batch: strings and token-id lists.
  if (v->size() > static_cast<size_t>(kMaxBatchedPrompts)) {
    return InvalidParam("prompt", absl::StrCat("at most ", kMaxBatchedPrompts,
                                               " prompts in one request, got ", v->size()));
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& p = (*v)[i];
    if (!p.is_string() && !p.is_array()) {
      return WrongType("prompt", "a list of strings or of token-id lists", p);
    }
    if (absl::Status s = add(p, absl::StrCat("'prompt[", i, "]'")); !s.ok()) return s;
  }
  if (static_cast<int64_t>(r->prompts.size()) * r->n > kMaxChoicesPerRequest) {
    return InvalidParam(
        "n", absl::StrCat(r->prompts.size(), " prompts with n = ", r->n, " ask for ",
                          r->prompts.size() * r->n, " choices; at most ", kMaxChoicesPerRequest));
  }
  return absl::OkStatus();
}

// A message's fields beyond role and content: name, tool_calls (assistant), tool_call_id (tool,
// required there), and the fields an OpenAI response message carries back when a client appends
// it to the history (refusal, audio, function_call, annotations: accepted when null or empty).
absl::Status ParseMessageExtras(const json& m, const std::string& where, ChatMessage* msg) {
  for (const auto& [key, value] : m.items()) {
    if (key == "role" || key == "content" || key == "name" || key == "tool_calls" ||
        key == "tool_call_id") {
      continue;
    }
    if (key == "refusal" || key == "audio" || key == "function_call" || key == "annotations" ||
        key == "reasoning_content") {
      if (value.is_null() || (value.is_array() && value.empty())) continue;
      return InvalidParam(absl::StrCat(where, ".", key),
                          absl::StrCat("'", where, ".", key,
                                       "' is not supported in the history (null is accepted)"),
                          "unsupported_parameter");
    }
    return InvalidParam(absl::StrCat(where, ".", key),
                        absl::StrCat("unrecognized message field '", key, "' in '", where, "'"),
                        "unknown_parameter");
  }
  if (absl::Status s = GetString(m, "name", &msg->name); !s.ok()) return s;
  if (absl::Status s = GetString(m, "tool_call_id", &msg->tool_call_id); !s.ok()) return s;
  if (msg->role == "tool" && msg->tool_call_id.empty()) {
    return InvalidParam(where + ".tool_call_id", "a tool message needs 'tool_call_id'");
  }
  if (msg->role != "tool" && !msg->tool_call_id.empty()) {
    return InvalidParam(where + ".tool_call_id", "'tool_call_id' belongs to tool messages");
  }
  const json* calls = Field(m, "tool_calls");
  if (calls == nullptr) return absl::OkStatus();
  if (msg->role != "assistant") {
    return InvalidParam(where + ".tool_calls", "'tool_calls' belongs to assistant messages");
  }
  if (!calls->is_array()) return WrongType(where + ".tool_calls", "a list", *calls);
  if (calls->size() > static_cast<size_t>(kMaxTools)) {
    return InvalidParam(where + ".tool_calls", absl::StrCat("at most ", kMaxTools, " calls"));
  }
  for (size_t k = 0; k < calls->size(); ++k) {
    const json& c = (*calls)[k];
    const std::string cwhere = absl::StrCat(where, ".tool_calls[", k, "]");
    if (!c.is_object()) return WrongType(cwhere, "an object", c);
    if (absl::Status s = json_fields::OnlyKeys(c, cwhere, {"id", "type", "function"}); !s.ok()) {
      return s;
    }
    ChatToolCall call;
    if (absl::Status s = GetString(c, "id", &call.id); !s.ok()) return s;
    if (const json* type = Field(c, "type"); type != nullptr && *type != "function") {
      return InvalidParam(cwhere + ".type", absl::StrCat("'", cwhere, ".type' must be 'function'"));
    }
    const json* f = Field(c, "function");
    if (f == nullptr || !f->is_object()) {
      return InvalidParam(cwhere + ".function", "'function' must be an object {name, arguments}");
    }
    const json* name = Field(*f, "name");
    if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
      return InvalidParam(cwhere + ".function.name", "'function.name' must be a non-empty string");
    }
    call.name = name->get<std::string>();
    const json* args = Field(*f, "arguments");
    if (args == nullptr || !args->is_string()) {
      return InvalidParam(cwhere + ".function.arguments",
                          "'function.arguments' must be a string of JSON");
    }
    const json parsed = json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      return InvalidParam(cwhere + ".function.arguments",
                          "'function.arguments' must be the text of a JSON object");
    }
    call.arguments = args->get<std::string>();
    msg->tool_calls.push_back(std::move(call));
  }
  return absl::OkStatus();
}

absl::Status ParseMessages(const json& j, OpenAiRequest* r) {
  const json* v = Field(j, "messages");
  if (v == nullptr) return InvalidParam("messages", "'messages' is required");
  if (!v->is_array()) return WrongType("messages", "a list", *v);
  if (v->empty()) return InvalidParam("messages", "'messages' must not be empty");
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return WrongType(where, "an object", m);
    ChatMessage msg;
    const json* role = Field(m, "role");
    if (role == nullptr) return InvalidParam(where + ".role", "'role' is required");
    if (!role->is_string()) return WrongType(where + ".role", "a string", *role);
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "developer" && msg.role != "user" &&
        msg.role != "assistant" && msg.role != "tool" && msg.role != "ipython") {
      return InvalidParam(where + ".role",
                          absl::StrCat("unknown role '", msg.role,
                                       "' (expected system, developer, user, assistant, tool or "
                                       "ipython)"));
    }
    if (absl::Status s = ParseMessageExtras(m, where, &msg); !s.ok()) return s;
    if (const json* c = Field(m, "content"); c == nullptr) {
      if (msg.role != "assistant") {
        return InvalidParam(where + ".content", "'content' is required");
      }
    } else if (c->is_string()) {
      msg.content = c->get<std::string>();
    } else if (c->is_array()) {
      for (size_t k = 0; k < c->size(); ++k) {
        const json& part = (*c)[k];
        const std::string pwhere = absl::StrCat(where, ".content[", k, "]");
        if (!part.is_object()) return WrongType(pwhere, "an object", part);
        const json* type = Field(part, "type");
        if (type == nullptr || !type->is_string()) {
          return InvalidParam(pwhere + ".type", "'type' must be a string");
        }
        if (*type != "text") {
          return InvalidParam(pwhere + ".type",
                              absl::StrCat("content part type '", type->get<std::string>(),
                                           "' is not supported (only 'text')"));
        }
        const json* text = Field(part, "text");
        if (text == nullptr || !text->is_string()) {
          return InvalidParam(pwhere + ".text", "'text' must be a string");
        }
        msg.content += text->get<std::string>();
      }
    } else {
      return WrongType(where + ".content", "a string or a list of content parts", *c);
    }
    r->messages.push_back(std::move(msg));
  }
  return absl::OkStatus();
}

std::vector<int> Bytes(const std::string& s) {
  std::vector<int> out;
  out.reserve(s.size());
  for (char c : s) out.push_back(static_cast<unsigned char>(c));
  return out;
}

json LogprobsChatJson(const std::vector<LogprobEntry>& entries) {
  json content = json::array();
  for (const LogprobEntry& e : entries) {
    json top = json::array();
    for (const LogprobAlternative& t : e.top) {
      top.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", Bytes(t.token)}});
    }
    content.push_back({{"token", e.token},
                       {"logprob", e.logprob},
                       {"bytes", Bytes(e.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return json{{"content", std::move(content)}};
}

json LogprobsCompletionJson(const std::vector<LogprobEntry>& entries) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.token);
    offsets.push_back(e.text_offset);
    if (e.null) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(e.logprob);
    json alts = json::object();
    for (const LogprobAlternative& t : e.top) {
      // Two alternatives decoding to the same text keep the larger logprob, as in vLLM.
      if (!alts.contains(t.token) || alts[t.token].get<float>() < t.logprob) {
        alts[t.token] = t.logprob;
      }
    }
    top.push_back(alts);
  }
  return json{{"tokens", tokens},
              {"token_logprobs", token_logprobs},
              {"top_logprobs", top},
              {"text_offset", offsets}};
}

json LogprobsJson(const ResponseMeta& meta, const std::vector<LogprobEntry>& entries) {
  if (!meta.logprobs) return nullptr;
  return meta.endpoint == Endpoint::kChatCompletions ? LogprobsChatJson(entries)
                                                     : LogprobsCompletionJson(entries);
}

json PromptLogprobsJson(const PromptLogprobs& positions) {
  json out = json::array();
  for (const auto& position : positions) {
    if (!position.has_value()) {
      out.push_back(nullptr);
      continue;
    }
    json tokens = json::object();
    for (const PromptLogprobToken& t : *position) {
      tokens[absl::StrCat(t.token_id)] = {
          {"logprob", t.logprob}, {"rank", t.rank}, {"decoded_token", t.decoded}};
    }
    out.push_back(std::move(tokens));
  }
  return out;
}

json UsageJson(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json Envelope(const ResponseMeta& meta, bool chunk) {
  const bool chat = meta.endpoint == Endpoint::kChatCompletions;
  return json{
      {"id", meta.id},
      {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
      {"created", meta.created},
      {"model", meta.model},
      {"system_fingerprint", nullptr}};
}

}  // namespace

absl::Status InvalidParam(absl::string_view param, absl::string_view message,
                          absl::string_view code) {
  absl::Status s = absl::InvalidArgumentError(message);
  if (!param.empty()) s.SetPayload(kParamPayload, absl::Cord(param));
  if (!code.empty()) s.SetPayload(kCodePayload, absl::Cord(code));
  return s;
}

ApiError MakeApiError(int http_status, std::string message, std::string param, std::string code) {
  ApiError e;
  e.http_status = http_status;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  if (http_status == 503) {
    e.type = "service_unavailable_error";
  } else if (http_status == 429) {
    e.type = "requests";  // OpenAI's type for rate limits (its SDKs raise RateLimitError)
    if (e.code.empty()) e.code = "rate_limit_exceeded";
  } else if (http_status >= 500) {
    e.type = "server_error";
  } else if (http_status == 404) {
    e.type = "not_found_error";
  } else {
    e.type = "invalid_request_error";
  }
  return e;
}

ApiError ToApiError(const absl::Status& status) {
  int http = 500;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      http = 400;
      break;
    case absl::StatusCode::kNotFound:
      http = 404;
      break;
    case absl::StatusCode::kUnavailable:
      http = 503;
      break;
    case absl::StatusCode::kResourceExhausted:
      http = 429;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      http = 504;  // the request's deadline (--request-timeout-s) passed
      break;
    default:
      http = 500;
      break;
  }
  std::string param, code;
  if (auto p = status.GetPayload(kParamPayload)) param = std::string(*p);
  if (auto c = status.GetPayload(kCodePayload)) code = std::string(*c);
  std::string message(status.message());
  if (message.empty()) message = absl::StatusCodeToString(status.code());
  return MakeApiError(http, std::move(message), std::move(param), std::move(code));
}

std::string ErrorJson(const ApiError& e) {
  json err{{"message", e.message},
           {"type", e.type},
           {"param", e.param.empty() ? json(nullptr) : json(e.param)},
           {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return Dump(json{{"error", err}});
}

absl::StatusOr<OpenAiRequest> ParseCompletionRequest(absl::string_view body) {
  absl::StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return j.status();
  OpenAiRequest r;
  r.endpoint = Endpoint::kCompletions;
  if (absl::Status s = ParseCommon(*j, body, &r); !s.ok()) return s;
  if (absl::Status s = ParsePrompt(*j, &r); !s.ok()) return s;
  if (absl::Status s = GetBool(*j, "echo", &r.echo); !s.ok()) return s;
  std::optional<int> logprobs;
  if (absl::Status s = GetIntInRange(*j, "logprobs", 0, kMaxLogprobs, &logprobs); !s.ok()) {
    return s;
  }
  r.logprobs = logprobs;
  r.params.logprobs = r.logprobs;
  if (r.echo && r.logprobs.has_value()) {
    // The prompt's tokens lead the logprobs: the engine scores them with as many alternatives.
    r.params.prompt_logprobs = std::max(r.params.prompt_logprobs.value_or(0), *r.logprobs);
  }
  r.default_max_tokens = kDefaultCompletionMaxTokens;
  return r;
}

absl::StatusOr<OpenAiRequest> ParseChatCompletionRequest(absl::string_view body) {
  absl::StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return j.status();
  OpenAiRequest r;
  r.endpoint = Endpoint::kChatCompletions;
  if (absl::Status s = ParseCommon(*j, body, &r); !s.ok()) return s;
  if (absl::Status s = ParseMessages(*j, &r); !s.ok()) return s;
  if (absl::Status s = ParseToolRequest(*j, body, &r.tools, &r.params.guided); !s.ok()) return s;
  if (absl::Status s = GetBool(*j, "add_generation_prompt", &r.add_generation_prompt); !s.ok()) {
    return s;
  }
  std::optional<int> max_completion_tokens;
  if (absl::Status s = GetIntInRange(*j, "max_completion_tokens", 1,
                                     std::numeric_limits<int>::max(), &max_completion_tokens);
      !s.ok()) {
    return s;
  }
  if (max_completion_tokens.has_value()) r.params.max_tokens = max_completion_tokens;
  bool logprobs = false;
  if (absl::Status s = GetBool(*j, "logprobs", &logprobs); !s.ok()) return s;
  std::optional<int> top_logprobs;
  if (absl::Status s = GetIntInRange(*j, "top_logprobs", 0, kMaxLogprobs, &top_logprobs); !s.ok()) {
    return s;
  }
  if (top_logprobs.has_value() && !logprobs) {
    return InvalidParam("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
  }
  if (logprobs) r.logprobs = top_logprobs.value_or(0);
  r.params.logprobs = r.logprobs;
  if (absl::Status s = GetBool(*j, "continue_final_message", &r.continue_final_message); !s.ok()) {
    return s;
  }
  if (r.continue_final_message) {
    if (r.add_generation_prompt) {
      return InvalidParam("continue_final_message",
                          "'continue_final_message' needs 'add_generation_prompt': false (the "
                          "final message is continued, no new turn is opened)");
    }
    if (r.messages.back().role != "assistant") {
      return InvalidParam("continue_final_message",
                          "'continue_final_message' needs the last message to be the assistant's");
    }
  }
  if (const json* v = Field(*j, "chat_template_kwargs"); v != nullptr) {
    if (!v->is_object()) return WrongType("chat_template_kwargs", "an object", *v);
    for (const auto& [key, value] : v->items()) {
      for (const char* reserved :
           {"messages", "add_generation_prompt", "tools", "documents", "bos_token", "eos_token"}) {
        if (key == reserved) {
          return InvalidParam("chat_template_kwargs",
                              absl::StrCat("'chat_template_kwargs' may not set '", key,
                                           "': the request's own fields set it"));
        }
      }
    }
    if (!v->empty()) r.chat_template_kwargs = Dump(*v);
  }
  return r;
}

namespace {

absl::Status OnlyFields(const json& j, std::initializer_list<absl::string_view> allowed) {
  return json_fields::OnlyKeys(j, "", allowed);
}

}  // namespace

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body) {
  absl::StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return j.status();
  TokenizeRequest t;
  OpenAiRequest& r = t.request;
  const bool chat = j->contains("messages");
  if (chat == j->contains("prompt")) {
    return InvalidParam("", "give exactly one of 'prompt' and 'messages'");
  }
  if (absl::Status s =
          chat ? OnlyFields(*j, {"model", "messages", "tools", "add_generation_prompt",
                                 "continue_final_message", "chat_template_kwargs",
                                 "add_special_tokens", "return_token_strs"})
               : OnlyFields(*j, {"model", "prompt", "add_special_tokens", "return_token_strs"});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = GetString(*j, "model", &r.model); !s.ok()) return s;
  if (absl::Status s = GetBool(*j, "return_token_strs", &t.return_token_strs); !s.ok()) return s;
  if (Field(*j, "add_special_tokens") != nullptr) {
    bool add = false;
    if (absl::Status s = GetBool(*j, "add_special_tokens", &add); !s.ok()) return s;
    r.add_special_tokens = add;
  }
  if (!chat) {
    r.endpoint = Endpoint::kCompletions;
    const json* v = Field(*j, "prompt");
    if (v == nullptr || !v->is_string()) {
      return InvalidParam("prompt", "'prompt' must be a string");
    }
    r.prompts.push_back({v->get<std::string>(), std::nullopt});
    return t;
  }
  r.endpoint = Endpoint::kChatCompletions;
  if (absl::Status s = ParseMessages(*j, &r); !s.ok()) return s;
  if (absl::Status s = ParseToolRequest(*j, body, &r.tools, &r.params.guided); !s.ok()) return s;
  if (absl::Status s = GetBool(*j, "add_generation_prompt", &r.add_generation_prompt); !s.ok()) {
    return s;
  }
  if (absl::Status s = GetBool(*j, "continue_final_message", &r.continue_final_message); !s.ok()) {
    return s;
  }
  if (r.continue_final_message && r.add_generation_prompt) {
    return InvalidParam("continue_final_message",
                        "'continue_final_message' needs 'add_generation_prompt': false");
  }
  if (const json* v = Field(*j, "chat_template_kwargs"); v != nullptr) {
    if (!v->is_object()) return WrongType("chat_template_kwargs", "an object", *v);
    if (!v->empty()) r.chat_template_kwargs = Dump(*v);
  }
  return t;
}

absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body) {
  absl::StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return j.status();
  if (absl::Status s = OnlyFields(*j, {"model", "tokens"}); !s.ok()) return s;
  DetokenizeRequest d;
  if (absl::Status s = GetString(*j, "model", &d.model); !s.ok()) return s;
  const json* v = Field(*j, "tokens");
  if (v == nullptr || !v->is_array()) return InvalidParam("tokens", "'tokens' must be a list");
  absl::StatusOr<std::vector<int32_t>> ids = TokenIdList(*v, "tokens");
  if (!ids.ok()) return ids.status();
  d.tokens = *std::move(ids);
  return d;
}

std::string RequestDebugJson(const OpenAiRequest& r) {
  const SamplingParams& p = r.params;
  json prompts = json::array();
  for (const OpenAiRequest::Prompt& pr : r.prompts) {
    prompts.push_back(pr.token_ids.has_value() ? json(*pr.token_ids) : json(pr.text));
  }
  json messages = json::array();
  for (const ChatMessage& m : r.messages) {
    json calls = json::array();
    for (const ChatToolCall& c : m.tool_calls) calls.push_back({c.id, c.name, c.arguments});
    messages.push_back({m.role, m.content, calls, m.tool_call_id, m.name});
  }
  json bias = json::array();
  for (const auto& [id, b] : p.logit_bias) bias.push_back({id, b});
  const auto opt = [](const auto& o) { return o.has_value() ? json(*o) : json(nullptr); };
  json j{{"endpoint", r.endpoint == Endpoint::kChatCompletions ? "chat" : "completions"},
         {"model", r.model},
         {"prompts", prompts},
         {"echo", r.echo},
         {"messages", messages},
         {"add_generation_prompt", r.add_generation_prompt},
         {"continue_final_message", r.continue_final_message},
         {"chat_template_kwargs", r.chat_template_kwargs},
         {"tools", r.tools.tools_json},
         {"tool_choice", static_cast<int>(r.tools.choice)},
         {"tool_choice_function", r.tools.function},
         {"parallel_tool_calls", r.tools.parallel},
         {"add_special_tokens", opt(r.add_special_tokens)},
         {"truncate_prompt_tokens", opt(r.truncate_prompt_tokens)},
         {"n", r.n},
         {"priority", r.priority},
         {"stream", r.stream},
         {"include_usage", r.include_usage},
         {"logprobs", opt(r.logprobs)},
         {"default_max_tokens", opt(r.default_max_tokens)},
         {"given",
          {r.given.temperature, r.given.top_p, r.given.top_k, r.given.min_p,
           r.given.repetition_penalty}},
         {"temperature", p.temperature},
         {"top_k", p.top_k},
         {"top_p", p.top_p},
         {"min_p", p.min_p},
         {"seed", opt(p.seed)},
         {"repetition_penalty", p.repetition_penalty},
         {"presence_penalty", p.presence_penalty},
         {"frequency_penalty", p.frequency_penalty},
         {"stop_token_ids", p.stop_token_ids},
         {"stop", p.stop},
         {"max_tokens", opt(p.max_tokens)},
         {"ignore_eos", p.ignore_eos},
         {"params.logprobs", opt(p.logprobs)},
         {"prompt_logprobs", opt(r.prompt_logprobs)},
         {"params.prompt_logprobs", opt(p.prompt_logprobs)},
         {"skip_special_tokens", p.skip_special_tokens},
         {"min_tokens", p.min_tokens},
         {"logit_bias", bias},
         {"allowed_token_ids", p.allowed_token_ids},
         {"include_stop_str_in_output", p.include_stop_str_in_output},
         {"guided_regex", p.guided.regex},
         {"guided_choice", p.guided.choices},
         {"guided_grammar", p.guided.grammar}};
  return Dump(j);
}

std::string ResponseJson(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                         const Usage& usage) {
  json j = Envelope(meta, /*chunk=*/false);
  json arr = json::array();
  for (const ChoiceResult& c : choices) {
    json choice{{"index", c.index},
                {"logprobs", LogprobsJson(meta, c.logprobs)},
                {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)}};
    if (meta.endpoint == Endpoint::kChatCompletions) {
      json message{{"role", "assistant"},
                   {"content", c.content_null ? json(nullptr) : json(c.text)}};
      if (!c.tool_calls.empty()) {
        json calls = json::array();
        for (const ToolCall& t : c.tool_calls) {
          calls.push_back({{"id", t.id},
                           {"type", "function"},
                           {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        }
        message["tool_calls"] = std::move(calls);
      }
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.text;
      if (meta.prompt_logprobs) choice["prompt_logprobs"] = PromptLogprobsJson(c.prompt_logprobs);
    }
    arr.push_back(std::move(choice));
  }
  j["choices"] = std::move(arr);
  if (meta.prompt_logprobs && meta.endpoint == Endpoint::kChatCompletions) {
    j["prompt_logprobs"] =
        choices.empty() ? json(nullptr) : PromptLogprobsJson(choices.front().prompt_logprobs);
  }
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string StreamChunkEvent(const ResponseMeta& meta, const StreamDelta& d, bool usage_null) {
  json j = Envelope(meta, /*chunk=*/true);
  json choice{{"index", d.index},
              {"logprobs", d.logprobs.empty() ? json(nullptr) : LogprobsJson(meta, d.logprobs)},
              {"finish_reason", d.finish_reason ? json(*d.finish_reason) : json(nullptr)}};
  if (meta.endpoint == Endpoint::kChatCompletions) {
    json delta = json::object();
    if (d.role) {
      delta["role"] = "assistant";
      delta["content"] = "";
    }
    if (d.text.has_value()) delta["content"] = *d.text;
    if (!d.tool_calls.empty()) {
      json calls = json::array();
      for (const ToolCallDelta& t : d.tool_calls) {
        json function{{"arguments", t.arguments}};
        json call{{"index", t.index}};
        if (!t.id.empty()) {
          call["id"] = t.id;
          call["type"] = "function";
          function["name"] = t.name;
        }
        call["function"] = std::move(function);
        calls.push_back(std::move(call));
      }
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = d.text.value_or("");
  }
  j["choices"] = json::array({std::move(choice)});
  if (usage_null) j["usage"] = nullptr;
  return absl::StrCat("data: ", Dump(j), "\n\n");
}

std::string UsageChunkEvent(const ResponseMeta& meta, const Usage& usage) {
  json j = Envelope(meta, /*chunk=*/true);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return absl::StrCat("data: ", Dump(j), "\n\n");
}

std::string ErrorEvent(const ApiError& error) {
  return absl::StrCat("data: ", ErrorJson(error), "\n\n");
}

}  // namespace tandem::router

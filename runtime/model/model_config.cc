#include "runtime/model/model_config.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"

namespace tandem {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(const std::string& source, const std::string& field,
                        const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field \"", field, "\" ", why));
}

// True when `field` is present and not null.
bool Has(const Json& j, const std::string& field) {
  auto it = j.find(field);
  return it != j.end() && !it->is_null();
}

absl::StatusOr<int> GetInt(const Json& j, const std::string& field, const std::string& source) {
  if (!Has(j, field)) return FieldError(source, field, "is missing");
  const Json& v = j.at(field);
  if (!v.is_number_integer()) return FieldError(source, field, "must be an integer");
  const int64_t x = v.get<int64_t>();
  if (x < INT32_MIN || x > INT32_MAX) return FieldError(source, field, "is out of range");
  return static_cast<int>(x);
}

absl::StatusOr<int> GetIntOr(const Json& j, const std::string& field, int fallback,
                             const std::string& source) {
  if (!Has(j, field)) return fallback;
  return GetInt(j, field, source);
}

absl::StatusOr<float> GetFloatOr(const Json& j, const std::string& field, float fallback,
                                 const std::string& source) {
  if (!Has(j, field)) return fallback;
  const Json& v = j.at(field);
  if (!v.is_number()) return FieldError(source, field, "must be a number");
  return v.get<float>();
}

absl::StatusOr<bool> GetBoolOr(const Json& j, const std::string& field, bool fallback,
                               const std::string& source) {
  if (!Has(j, field)) return fallback;
  const Json& v = j.at(field);
  if (!v.is_boolean()) return FieldError(source, field, "must be true or false");
  return v.get<bool>();
}

absl::StatusOr<ModelArchitecture> ParseArchitecture(const Json& j, const std::string& source) {
  std::string name;
  if (Has(j, "architectures")) {
    const Json& archs = j.at("architectures");
    if (!archs.is_array() || archs.empty() || !archs[0].is_string()) {
      return FieldError(source, "architectures", "must be a non-empty list of strings");
    }
    name = archs[0].get<std::string>();
  } else if (Has(j, "model_type") && j.at("model_type").is_string()) {
    const std::string model_type = j.at("model_type").get<std::string>();
    if (model_type == "llama") name = "LlamaForCausalLM";
    if (model_type == "qwen2") name = "Qwen2ForCausalLM";
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": unsupported model_type \"",
                                                     model_type, "\" (supported: llama, qwen2)"));
    }
  } else {
    return FieldError(source, "architectures", "is missing (and no model_type)");
  }
  if (name == "LlamaForCausalLM") return ModelArchitecture::kLlama;
  if (name == "Qwen2ForCausalLM") return ModelArchitecture::kQwen2;
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": unsupported architecture \"", name,
                   "\" (supported: LlamaForCausalLM, Qwen2ForCausalLM)"));
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& j, const std::string& source) {
  RopeScaling scaling;
  if (!Has(j, "rope_scaling")) return scaling;
  const Json& rs = j.at("rope_scaling");
  if (!rs.is_object()) return FieldError(source, "rope_scaling", "must be an object or null");
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (Has(rs, key)) {
      if (!rs.at(key).is_string()) {
        return FieldError(source, absl::StrCat("rope_scaling.", key), "must be a string");
      }
      type = rs.at(key).get<std::string>();
      break;
    }
  }
  if (type.empty()) return FieldError(source, "rope_scaling.rope_type", "is missing");
  if (type == "default") return scaling;
  if (type != "llama3") {
    return absl::InvalidArgumentError(absl::StrCat(source, ": unsupported rope_scaling type \"",
                                                   type, "\" (supported: llama3, default)"));
  }
  scaling.kind = RopeScaling::Kind::kLlama3;
  if (!Has(rs, "factor")) return FieldError(source, "rope_scaling.factor", "is missing");
  ASSIGN_OR_RETURN(scaling.factor, GetFloatOr(rs, "factor", 1.0f, source + " rope_scaling"));
  ASSIGN_OR_RETURN(scaling.low_freq_factor,
                   GetFloatOr(rs, "low_freq_factor", 1.0f, source + " rope_scaling"));
  ASSIGN_OR_RETURN(scaling.high_freq_factor,
                   GetFloatOr(rs, "high_freq_factor", 4.0f, source + " rope_scaling"));
  ASSIGN_OR_RETURN(
      scaling.original_max_position_embeddings,
      GetIntOr(rs, "original_max_position_embeddings", 8192, source + " rope_scaling"));
  if (!(scaling.factor > 0.0f) || !(scaling.low_freq_factor > 0.0f) ||
      !(scaling.high_freq_factor > scaling.low_freq_factor) ||
      scaling.original_max_position_embeddings <= 0) {
    return FieldError(source, "rope_scaling",
                      "needs factor > 0, high_freq_factor > low_freq_factor > 0 and "
                      "original_max_position_embeddings > 0");
  }
  return scaling;
}

absl::StatusOr<std::vector<int>> ParseEosIds(const Json& j, const std::string& source) {
  std::vector<int> ids;
  if (!Has(j, "eos_token_id")) return ids;
  const Json& v = j.at("eos_token_id");
  if (v.is_number_integer()) {
    ids.push_back(v.get<int>());
    return ids;
  }
  if (!v.is_array()) return FieldError(source, "eos_token_id", "must be an integer or a list");
  for (const Json& e : v) {
    if (!e.is_number_integer()) {
      return FieldError(source, "eos_token_id", "must contain only integers");
    }
    ids.push_back(e.get<int>());
  }
  return ids;
}

absl::StatusOr<ModelConfig> ParseJson(const Json& j, const std::string& source) {
  if (!j.is_object()) return absl::InvalidArgumentError(source + ": not a JSON object");
  ModelConfig c;
  ASSIGN_OR_RETURN(c.architecture, ParseArchitecture(j, source));
  ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", source));
  ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", source));
  ASSIGN_OR_RETURN(c.intermediate_size, GetInt(j, "intermediate_size", source));
  ASSIGN_OR_RETURN(c.num_layers, GetInt(j, "num_hidden_layers", source));
  ASSIGN_OR_RETURN(c.num_heads, GetInt(j, "num_attention_heads", source));
  for (auto [name, value] : {std::pair<const char*, int>{"vocab_size", c.vocab_size},
                             {"hidden_size", c.hidden_size},
                             {"intermediate_size", c.intermediate_size},
                             {"num_hidden_layers", c.num_layers},
                             {"num_attention_heads", c.num_heads}}) {
    if (value <= 0) return FieldError(source, name, "must be positive");
  }
  ASSIGN_OR_RETURN(c.num_kv_heads, GetIntOr(j, "num_key_value_heads", c.num_heads, source));
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return FieldError(source, "num_key_value_heads",
                      absl::StrCat("must be positive and divide num_attention_heads (", c.num_heads,
                                   "), got ", c.num_kv_heads));
  }
  if (Has(j, "head_dim")) {
    ASSIGN_OR_RETURN(c.head_dim, GetInt(j, "head_dim", source));
    if (c.head_dim <= 0) return FieldError(source, "head_dim", "must be positive");
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return FieldError(source, "hidden_size",
                        "must be divisible by num_attention_heads when head_dim is absent");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) return FieldError(source, "head_dim", "must be even for RoPE");
  ASSIGN_OR_RETURN(c.max_position_embeddings, GetIntOr(j, "max_position_embeddings", 2048, source));
  if (c.max_position_embeddings <= 0) {
    return FieldError(source, "max_position_embeddings", "must be positive");
  }
  ASSIGN_OR_RETURN(c.rms_norm_eps, GetFloatOr(j, "rms_norm_eps", 1e-6f, source));
  if (!(c.rms_norm_eps > 0.0f)) return FieldError(source, "rms_norm_eps", "must be positive");
  ASSIGN_OR_RETURN(c.rope_theta, GetFloatOr(j, "rope_theta", 10000.0f, source));
  if (!(c.rope_theta > 0.0f)) return FieldError(source, "rope_theta", "must be positive");
  ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j, source));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBoolOr(j, "tie_word_embeddings", false, source));
  if (c.architecture == ModelArchitecture::kQwen2) {
    c.attention_bias = true;  // Qwen2 always has q/k/v biases; its configs lack the field.
  } else {
    ASSIGN_OR_RETURN(c.attention_bias, GetBoolOr(j, "attention_bias", false, source));
  }
  if (Has(j, "torch_dtype")) {
    if (!j.at("torch_dtype").is_string()) {
      return FieldError(source, "torch_dtype", "must be a string");
    }
    c.torch_dtype = j.at("torch_dtype").get<std::string>();
  }
  ASSIGN_OR_RETURN(c.bos_token_id, GetIntOr(j, "bos_token_id", -1, source));
  ASSIGN_OR_RETURN(c.eos_token_ids, ParseEosIds(j, source));
  return c;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
  try {
    return ParseJson(j, source);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return ParseModelConfig(text.str(), path);
}

}  // namespace tandem

#pragma once
// The model hyper-parameters Tandem needs, parsed from a Hugging Face `config.json`.
// Supported: LlamaForCausalLM (Llama 2, 3, 3.1 with rope_scaling type "llama3", 3.2 with tied
// embeddings) and Qwen2ForCausalLM (q/k/v biases). Anything else is an error naming the file.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

enum class ModelArchitecture { kLlama, kQwen2 };

// rope_scaling {"rope_type"|"type": "llama3", factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings}. `kind == kNone` when config.json has none.
struct RopeScaling {
  enum class Kind { kNone, kLlama3 };
  Kind kind = Kind::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  ModelArchitecture architecture = ModelArchitecture::kLlama;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;    // num_hidden_layers
  int num_heads = 0;     // num_attention_heads
  int num_kv_heads = 0;  // num_key_value_heads (defaults to num_heads)
  int head_dim = 0;      // head_dim (defaults to hidden_size / num_heads)
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;     // true for Qwen2 (q/k/v have biases)
  std::string torch_dtype;         // informational: "bfloat16", "float16", "float32"
  int bos_token_id = -1;           // -1 when absent
  std::vector<int> eos_token_ids;  // config.json "eos_token_id" (int or list)
  // Not from config.json: the weights' ModelFingerprint (model_fingerprint.h), set when a runner
  // is created from a model directory; "" when unknown (runners built in tests).
  std::string fingerprint;
};

// Parses `<model_dir>/config.json`. Errors name the file and the offending field.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);
// Parses config.json text; `source` names it in error messages.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);

}  // namespace tandem

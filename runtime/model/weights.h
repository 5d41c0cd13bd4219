#pragma once
// Host float32 weights for the CPU reference engine, loaded from a TensorStore with every tensor's
// name and shape checked against the ModelConfig (HF names: model.embed_tokens.weight,
// model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ .bias for q/k/v when attention_bias),
// model.layers.{i}.mlp.{gate,up,down}_proj.weight,
// model.layers.{i}.{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight
// unless tie_word_embeddings). Linear weights keep the HF layout: row-major [out_features,
// in_features].

#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace tandem {

struct LayerWeights {
  std::vector<float> input_norm;          // [hidden]
  std::vector<float> q_proj, q_bias;      // [heads*head_dim, hidden], [heads*head_dim] or empty
  std::vector<float> k_proj, k_bias;      // [kv_heads*head_dim, hidden], [kv_heads*head_dim]
  std::vector<float> v_proj, v_bias;      // [kv_heads*head_dim, hidden], [kv_heads*head_dim]
  std::vector<float> o_proj;              // [hidden, heads*head_dim]
  std::vector<float> post_norm;           // [hidden]
  std::vector<float> gate_proj, up_proj;  // [intermediate, hidden]
  std::vector<float> down_proj;           // [hidden, intermediate]
};

struct ModelWeights {
  std::vector<float> embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> lm_head;     // [vocab, hidden]; empty when tied (use `embed`)
  const std::vector<float>& LmHead() const { return lm_head.empty() ? embed : lm_head; }
};

struct CpuWeightsOptions {
  // Leaves every layer's gate/up/down_proj empty (the MLP runs on a runtime/mlp backend): the
  // checkpoint's MLP tensors are neither read nor checked.
  bool skip_mlp = false;
};

// Loads and converts every weight; errors name the tensor and file (missing, wrong shape).
absl::StatusOr<ModelWeights> LoadCpuWeights(const ModelConfig& config, const TensorStore& store,
                                            const CpuWeightsOptions& options = {});

}  // namespace tandem

#include "runtime/model/weights.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace tandem {
namespace {

absl::Status LoadTensor(const TensorStore& store, const std::string& name,
                        const std::vector<int64_t>& shape, std::vector<float>* out) {
  ASSIGN_OR_RETURN(TensorView view, store.GetWithShape(name, shape));
  TensorStore::ToFloat32(view, out);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> LoadCpuWeights(const ModelConfig& config, const TensorStore& store) {
  if (config.vocab_size <= 0 || config.hidden_size <= 0 || config.intermediate_size <= 0 ||
      config.num_layers <= 0 || config.num_heads <= 0 || config.num_kv_heads <= 0 ||
      config.head_dim <= 0) {
    return absl::InvalidArgumentError("LoadCpuWeights: model config has non-positive sizes");
  }
  const int64_t vocab = config.vocab_size;
  const int64_t hidden = config.hidden_size;
  const int64_t inter = config.intermediate_size;
  const int64_t q_dim = int64_t{config.num_heads} * config.head_dim;
  const int64_t kv_dim = int64_t{config.num_kv_heads} * config.head_dim;

  ModelWeights w;
  RETURN_IF_ERROR(LoadTensor(store, "model.embed_tokens.weight", {vocab, hidden}, &w.embed));
  w.layers.resize(config.num_layers);
  for (int i = 0; i < config.num_layers; ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = absl::StrCat("model.layers.", i, ".");
    RETURN_IF_ERROR(LoadTensor(store, p + "input_layernorm.weight", {hidden}, &l.input_norm));
    RETURN_IF_ERROR(LoadTensor(store, p + "self_attn.q_proj.weight", {q_dim, hidden}, &l.q_proj));
    RETURN_IF_ERROR(LoadTensor(store, p + "self_attn.k_proj.weight", {kv_dim, hidden}, &l.k_proj));
    RETURN_IF_ERROR(LoadTensor(store, p + "self_attn.v_proj.weight", {kv_dim, hidden}, &l.v_proj));
    if (config.attention_bias) {
      RETURN_IF_ERROR(LoadTensor(store, p + "self_attn.q_proj.bias", {q_dim}, &l.q_bias));
      RETURN_IF_ERROR(LoadTensor(store, p + "self_attn.k_proj.bias", {kv_dim}, &l.k_bias));
      RETURN_IF_ERROR(LoadTensor(store, p + "self_attn.v_proj.bias", {kv_dim}, &l.v_bias));
    }
    RETURN_IF_ERROR(LoadTensor(store, p + "self_attn.o_proj.weight", {hidden, q_dim}, &l.o_proj));
    RETURN_IF_ERROR(
        LoadTensor(store, p + "post_attention_layernorm.weight", {hidden}, &l.post_norm));
    RETURN_IF_ERROR(LoadTensor(store, p + "mlp.gate_proj.weight", {inter, hidden}, &l.gate_proj));
    RETURN_IF_ERROR(LoadTensor(store, p + "mlp.up_proj.weight", {inter, hidden}, &l.up_proj));
    RETURN_IF_ERROR(LoadTensor(store, p + "mlp.down_proj.weight", {hidden, inter}, &l.down_proj));
  }
  RETURN_IF_ERROR(LoadTensor(store, "model.norm.weight", {hidden}, &w.final_norm));
  if (!config.tie_word_embeddings) {
    RETURN_IF_ERROR(LoadTensor(store, "lm_head.weight", {vocab, hidden}, &w.lm_head));
  }
  return w;
}

}  // namespace tandem

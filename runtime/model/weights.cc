#include "runtime/model/weights.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace tandem {
namespace {

// Every tensor is checked first (so the first error is deterministic), then converted on a few
// threads: most of the time goes to faulting in the destination pages, which parallelizes well.
class Loader {
 public:
  explicit Loader(const TensorStore& store) : store_(store) {}

  absl::Status Add(const std::string& name, const std::vector<int64_t>& shape,
                   std::vector<float>* out) {
    ASSIGN_OR_RETURN(TensorView view, store_.GetWithShape(name, shape));
    jobs_.emplace_back(std::move(view), out);
    return absl::OkStatus();
  }

  void ConvertAll() {
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i = next.fetch_add(1); i < jobs_.size(); i = next.fetch_add(1)) {
        TensorStore::ToFloat32(jobs_[i].first, jobs_[i].second);
      }
    };
    const size_t threads =
        std::min<size_t>({4, std::max(1u, std::thread::hardware_concurrency()), jobs_.size()});
    std::vector<std::thread> workers;
    for (size_t t = 1; t < threads; ++t) workers.emplace_back(work);
    work();
    for (std::thread& w : workers) w.join();
  }

 private:
  const TensorStore& store_;
  std::vector<std::pair<TensorView, std::vector<float>*>> jobs_;
};

}  // namespace

absl::StatusOr<ModelWeights> LoadCpuWeights(const ModelConfig& config, const TensorStore& store,
                                            const CpuWeightsOptions& options) {
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
  Loader loader(store);
  RETURN_IF_ERROR(loader.Add("model.embed_tokens.weight", {vocab, hidden}, &w.embed));
  w.layers.resize(config.num_layers);
  for (int i = 0; i < config.num_layers; ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = absl::StrCat("model.layers.", i, ".");
    RETURN_IF_ERROR(loader.Add(p + "input_layernorm.weight", {hidden}, &l.input_norm));
    RETURN_IF_ERROR(loader.Add(p + "self_attn.q_proj.weight", {q_dim, hidden}, &l.q_proj));
    RETURN_IF_ERROR(loader.Add(p + "self_attn.k_proj.weight", {kv_dim, hidden}, &l.k_proj));
    RETURN_IF_ERROR(loader.Add(p + "self_attn.v_proj.weight", {kv_dim, hidden}, &l.v_proj));
    if (config.attention_bias) {
      RETURN_IF_ERROR(loader.Add(p + "self_attn.q_proj.bias", {q_dim}, &l.q_bias));
      RETURN_IF_ERROR(loader.Add(p + "self_attn.k_proj.bias", {kv_dim}, &l.k_bias));
      RETURN_IF_ERROR(loader.Add(p + "self_attn.v_proj.bias", {kv_dim}, &l.v_bias));
    }
    RETURN_IF_ERROR(loader.Add(p + "self_attn.o_proj.weight", {hidden, q_dim}, &l.o_proj));
    RETURN_IF_ERROR(loader.Add(p + "post_attention_layernorm.weight", {hidden}, &l.post_norm));
    if (options.skip_mlp) continue;
    RETURN_IF_ERROR(loader.Add(p + "mlp.gate_proj.weight", {inter, hidden}, &l.gate_proj));
    RETURN_IF_ERROR(loader.Add(p + "mlp.up_proj.weight", {inter, hidden}, &l.up_proj));
    RETURN_IF_ERROR(loader.Add(p + "mlp.down_proj.weight", {hidden, inter}, &l.down_proj));
  }
  RETURN_IF_ERROR(loader.Add("model.norm.weight", {hidden}, &w.final_norm));
  if (!config.tie_word_embeddings) {
    RETURN_IF_ERROR(loader.Add("lm_head.weight", {vocab, hidden}, &w.lm_head));
  }
  loader.ConvertAll();
  return w;
}

}  // namespace tandem

#include "runtime/mlp/dense_mlp.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status.h"
#include "runtime/kernels/cpu_ops.h"

namespace tandem::mlp {

int64_t DenseMlpWeights::bytes() const {
  int64_t n = 0;
  for (const DenseMlpLayer& l : layers) {
    n += static_cast<int64_t>((l.gate_up.size() + l.down.size()) * sizeof(float));
  }
  return n;
}

absl::StatusOr<MlpShape> ParseLayerRange(const std::string& spec, const ModelConfig& config) {
  MlpShape shape;
  shape.hidden_size = config.hidden_size;
  shape.intermediate_size = config.intermediate_size;
  shape.end_layer = config.num_layers;
  if (spec.empty() || spec == "all") return shape;
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  int first = 0, end = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &first) ||
      !absl::SimpleAtoi(parts[1], &end)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers \"", spec, "\": expected FIRST:END (layers FIRST..END-1) or all"));
  }
  if (first < 0 || end > config.num_layers || first >= end) {
    return absl::InvalidArgumentError(absl::StrCat("layers ", first, ":", end,
                                                   ": not a non-empty range of the model's ",
                                                   config.num_layers, " layers"));
  }
  shape.first_layer = first;
  shape.end_layer = end;
  return shape;
}

absl::StatusOr<DenseMlpWeights> LoadDenseMlpWeights(const ModelConfig& config,
                                                    const TensorStore& store, MlpShape shape) {
  const int64_t hidden = config.hidden_size, inter = config.intermediate_size;
  if (shape.hidden_size != hidden || shape.intermediate_size != inter || shape.first_layer < 0 ||
      shape.end_layer > config.num_layers || shape.first_layer >= shape.end_layer) {
    return absl::InvalidArgumentError("MLP shape does not match the model's config");
  }
  DenseMlpWeights w;
  w.shape = shape;
  w.layers.resize(static_cast<size_t>(shape.end_layer - shape.first_layer));
  std::vector<float> gate, up;
  for (int l = shape.first_layer; l < shape.end_layer; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".mlp.");
    DenseMlpLayer& layer = w.layers[static_cast<size_t>(l - shape.first_layer)];
    ASSIGN_OR_RETURN(TensorView g, store.GetWithShape(p + "gate_proj.weight", {inter, hidden}));
    ASSIGN_OR_RETURN(TensorView u, store.GetWithShape(p + "up_proj.weight", {inter, hidden}));
    ASSIGN_OR_RETURN(TensorView d, store.GetWithShape(p + "down_proj.weight", {hidden, inter}));
    TensorStore::ToFloat32(g, &gate);
    TensorStore::ToFloat32(u, &up);
    layer.gate_up.reserve(gate.size() + up.size());
    layer.gate_up.insert(layer.gate_up.end(), gate.begin(), gate.end());
    layer.gate_up.insert(layer.gate_up.end(), up.begin(), up.end());
    TensorStore::ToFloat32(d, &layer.down);
  }
  return w;
}

void DenseMlpForward(const DenseMlpLayer& layer, const MlpShape& shape, const float* x, int rows,
                     float* out, std::vector<float>* scratch) {
  const int hidden = shape.hidden_size, inter = shape.intermediate_size;
  const size_t gu_size = static_cast<size_t>(rows) * 2 * inter;
  const size_t act_size = static_cast<size_t>(rows) * inter;
  if (scratch->size() < gu_size + act_size) scratch->resize(gu_size + act_size);
  float* gate_up = scratch->data();
  float* act = gate_up + gu_size;
  cpu::Linear(x, layer.gate_up.data(), nullptr, rows, hidden, 2 * inter, gate_up);
  for (int r = 0; r < rows; ++r) {
    const float* gu = gate_up + static_cast<size_t>(r) * 2 * inter;
    cpu::SiluAndMul(gu, gu + inter, inter, act + static_cast<size_t>(r) * inter);
  }
  cpu::Linear(act, layer.down.data(), nullptr, rows, inter, hidden, out);
}

}  // namespace tandem::mlp

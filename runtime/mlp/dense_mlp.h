#pragma once
// A dense (Llama-style) MLP on the CPU: the weights of a range of layers in host float32, and
// the forward pass the CPU runner's layer loop has always run, shared by the `cpu` backend and
// `tandem mlp-shard` so that every host MLP in Tandem is one routine:
//   gate_up = x . [gate_proj; up_proj]^T   (one GEMM, cpu::Linear: sgemv for one row)
//   act     = silu(gate) * up
//   out     = act . down_proj^T
// Given the same rows in the same call shape it gives the same bits as the runner's local path.
//
// Thread-safety: DenseMlpWeights is immutable after loading; DenseMlpForward writes only its
// arguments (`scratch` is the caller's).

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/mlp/mlp_backend.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace tandem::mlp {

struct DenseMlpLayer {
  std::vector<float> gate_up;  // [2 * intermediate, hidden]: gate rows, then up rows
  std::vector<float> down;     // [hidden, intermediate]
};

struct DenseMlpWeights {
  MlpShape shape;
  std::vector<DenseMlpLayer> layers;  // layers[l - shape.first_layer]
  const DenseMlpLayer& layer(int l) const { return layers[l - shape.first_layer]; }
  int64_t bytes() const;
};

// Parses "A:B" (layers A..B-1), "all" or "" (every layer) against `num_layers`.
// InvalidArgument naming the problem for anything else, or an empty or out-of-range range.
absl::StatusOr<MlpShape> ParseLayerRange(const std::string& spec, const ModelConfig& config);

// The MLP weights of `shape`'s layers (model.layers.{l}.mlp.{gate,up,down}_proj.weight), each
// checked against the config's shape; NotFound / InvalidArgument naming the tensor otherwise.
absl::StatusOr<DenseMlpWeights> LoadDenseMlpWeights(const ModelConfig& config,
                                                    const TensorStore& store, MlpShape shape);

// out[rows, hidden] = the MLP of `layer` over x[rows, hidden]; `out` may be `x` (read only
// before `out` is written). `scratch` grows as needed.
void DenseMlpForward(const DenseMlpLayer& layer, const MlpShape& shape, const float* x, int rows,
                     float* out, std::vector<float>* scratch);

}  // namespace tandem::mlp

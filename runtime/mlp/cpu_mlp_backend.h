#pragma once
// CpuMlpBackend ("cpu"): the MLP weights of a range of layers in host memory, computed with BLAS
// on the calling thread (dense_mlp.h). It is the reference of every other backend and the
// fallback a remote backend keeps when asked to (registry.h): a call gives the same bits as the
// CPU runner's local path for the same rows.
//
// Submit computes at once (the result is ready when it returns); Wait reports it. A Submit past
// its deadline computes nothing and its Wait is DeadlineExceeded.
//
// Thread-compatible (the engine thread).

#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "runtime/mlp/dense_mlp.h"
#include "runtime/mlp/mlp_backend.h"

namespace tandem::mlp {

class CpuMlpBackend final : public MlpBackend {
 public:
  explicit CpuMlpBackend(std::shared_ptr<const DenseMlpWeights> weights)
      : weights_(std::move(weights)) {}

  std::string_view name() const override { return "cpu"; }
  MlpShape shape() const override { return weights_->shape; }
  absl::StatusOr<Handle> Submit(int layer, const float* x, int rows, float* out,
                                absl::Time deadline) override;
  absl::Status Wait(Handle handle) override;
  int64_t resident_weight_bytes() const override { return weights_->bytes(); }
  MlpBackendStats stats() const override { return stats_; }

 private:
  std::shared_ptr<const DenseMlpWeights> weights_;
  std::vector<float> scratch_;
  absl::flat_hash_map<Handle, absl::Status> done_;
  Handle next_ = 1;
  MlpBackendStats stats_;
};

}  // namespace tandem::mlp

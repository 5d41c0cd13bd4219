#include "runtime/mlp/cpu_mlp_backend.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::mlp {

absl::StatusOr<MlpBackend::Handle> CpuMlpBackend::Submit(int layer, const float* x, int rows,
                                                         float* out, absl::Time deadline) {
  const MlpShape& shape = weights_->shape;
  if (!shape.Serves(layer)) {
    return absl::InvalidArgumentError(absl::StrCat("cpu MLP: layer ", layer, " is not in ",
                                                   shape.first_layer, ":", shape.end_layer));
  }
  if (rows < 1) return absl::InvalidArgumentError(absl::StrCat("cpu MLP: ", rows, " rows"));
  const Handle h = next_++;
  ++stats_.calls;
  if (absl::Now() > deadline) {
    done_[h] = absl::DeadlineExceededError(
        absl::StrCat("cpu MLP: layer ", layer, " submitted past its deadline"));
    return h;
  }
  DenseMlpForward(weights_->layer(layer), shape, x, rows, out, &scratch_);
  stats_.rows += rows;
  done_[h] = absl::OkStatus();
  return h;
}

absl::Status CpuMlpBackend::Wait(Handle handle) {
  auto it = done_.find(handle);
  if (it == done_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("cpu MLP: unknown handle ", handle));
  }
  absl::Status status = std::move(it->second);
  done_.erase(it);
  if (!status.ok()) ++stats_.failures;
  return status;
}

}  // namespace tandem::mlp

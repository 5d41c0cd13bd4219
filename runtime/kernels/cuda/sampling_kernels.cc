#include "runtime/kernels/cuda/sampling_kernels.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda/cuda_status.h"

namespace tandem::cuda {
namespace internal {

// Defined in sampling.cu; queues the kernel for arguments LaunchSampling has checked and returns
// cudaGetLastError() after the launch.
cudaError_t LaunchSamplingRaw(const SamplingArgs& args, cudaStream_t stream);

}  // namespace internal

size_t SamplingWorkspaceBytes(int /*rows*/, int /*vocab*/) { return 0; }

absl::Status ValidateSamplingRow(const SamplingRow& row) {
  if (row.greedy != 0) return absl::OkStatus();
  if (!std::isfinite(row.temperature) || row.temperature <= 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat("sampling row: temperature ", row.temperature,
                                                   " must be finite and > 0 (or greedy set)"));
  }
  if (!(row.top_p > 0.0f && row.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling row: top_p ", row.top_p, " is not in (0, 1]"));
  }
  if (!(row.min_p >= 0.0f && row.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling row: min_p ", row.min_p, " is not in [0, 1]"));
  }
  return absl::OkStatus();
}

absl::Status LaunchSampling(const SamplingArgs& a, void* stream) {
  if (a.logits == nullptr || a.params == nullptr || a.tokens == nullptr || a.logprobs == nullptr) {
    return absl::InvalidArgumentError(
        "LaunchSampling: logits, params, tokens and logprobs must not be null");
  }
  if (a.rows < 1 || a.rows > kSamplingMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("LaunchSampling: rows ", a.rows, " is not in [1, ", kSamplingMaxRows, "]"));
  }
  if (a.vocab < 1 || a.vocab > kSamplingMaxVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("LaunchSampling: vocab ", a.vocab, " is not in [1, ", kSamplingMaxVocab, "]"));
  }
  const size_t need = SamplingWorkspaceBytes(a.rows, a.vocab);
  if (a.workspace_bytes < need || (need > 0 && a.workspace == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LaunchSampling: workspace of ", a.workspace_bytes, " bytes, need ", need));
  }
  return CudaStatus(internal::LaunchSamplingRaw(a, static_cast<cudaStream_t>(stream)),
                    "LaunchSampling");
}

}  // namespace tandem::cuda

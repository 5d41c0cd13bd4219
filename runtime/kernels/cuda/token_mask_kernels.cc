#include "runtime/kernels/cuda/token_mask_kernels.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/sampling_kernels.h"

namespace tandem::cuda {
namespace internal {

// Defined in token_mask.cu, for arguments the launchers here have checked.
cudaError_t LaunchApplyTokenMaskRaw(const TokenMaskArgs& args, cudaStream_t stream);
cudaError_t LaunchMaskedLogprobsRaw(const TokenMaskArgs& args, const int32_t* tokens,
                                    float* logprobs, cudaStream_t stream);

}  // namespace internal

namespace {

absl::Status Check(const TokenMaskArgs& a, const char* who) {
  if (a.logits == nullptr || a.allowed == nullptr || a.mask == nullptr || a.lse == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": logits, allowed, mask and lse must not be null"));
  }
  if (a.rows < 1 || a.rows > kSamplingMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": rows ", a.rows, " is not in [1, ", kSamplingMaxRows, "]"));
  }
  if (a.vocab < 1 || a.vocab > kSamplingMaxVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": vocab ", a.vocab, " is not in [1, ", kSamplingMaxVocab, "]"));
  }
  if (a.words < (a.vocab + 63) / 64) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ", a.words, " mask words for a vocabulary of ", a.vocab));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchApplyTokenMask(const TokenMaskArgs& a, void* stream) {
  if (absl::Status s = Check(a, "LaunchApplyTokenMask"); !s.ok()) return s;
  return CudaStatus(internal::LaunchApplyTokenMaskRaw(a, static_cast<cudaStream_t>(stream)),
                    "LaunchApplyTokenMask");
}

absl::Status LaunchMaskedLogprobs(const TokenMaskArgs& a, const int32_t* tokens, float* logprobs,
                                  void* stream) {
  if (absl::Status s = Check(a, "LaunchMaskedLogprobs"); !s.ok()) return s;
  if (tokens == nullptr || logprobs == nullptr) {
    return absl::InvalidArgumentError("LaunchMaskedLogprobs: tokens and logprobs must not be null");
  }
  return CudaStatus(
      internal::LaunchMaskedLogprobsRaw(a, tokens, logprobs, static_cast<cudaStream_t>(stream)),
      "LaunchMaskedLogprobs");
}

}  // namespace tandem::cuda

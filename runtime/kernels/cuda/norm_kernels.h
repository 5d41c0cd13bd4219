#pragma once
// Host launchers for the CUDA normalization kernels. No CUDA types here: `stream` is a cudaStream_t
// passed as void* (Stream::native from runtime/device/device.h; null is the legacy default
// stream), so host code includes this without the CUDA toolkit's headers.
//
// Launchers only queue work: they allocate nothing and do not synchronize. The buffers are
// caller-owned device memory and must stay valid until the stream has run the kernel.
// Failure: a bad argument returns kInvalidArgument before anything is queued; a launch failure
// returns the CUDA error as a status (cuda_status.h) and leaves the outputs unspecified.
// Thread-safety: launchers are reentrant; the stream's owner calls them (device.h contract).

#include "absl/status/status.h"

namespace tandem::cuda {

// Fused residual add + RMSNorm over bf16 rows, accumulated in float32:
//   if residual != null:  residual[r, :] = bf16(x[r, :] + residual[r, :])   (in place)
//                         h = residual[r, :]                                (the rounded sum)
//   else:                 h = x[r, :]
//   out[r, :] = bf16(h / sqrt(mean(h^2) + eps) * weight[:])
// This is the pre-norm transformer step: `residual` carries the residual stream, `x` the last
// sublayer's output, `out` the next sublayer's input.
struct RmsNormArgs {
  const void* x = nullptr;       // bf16 [rows, dim], row-major, dense
  void* residual = nullptr;      // bf16 [rows, dim], read and written; or null for a plain RMSNorm
  const void* weight = nullptr;  // bf16 [dim]
  void* out = nullptr;           // bf16 [rows, dim]; may be the same buffer as `x`
  int rows = 0;                  // >= 0; 0 queues nothing
  int dim = 0;                   // > 0
  float eps = 1e-6f;             // > 0
};
// Other overlaps between the arrays than out == x are not allowed. Rows whose dim is a multiple
// of 8 and whose arrays are 16-byte aligned use 16-byte vector loads; others a scalar path.

absl::Status LaunchRmsNorm(const RmsNormArgs& args, void* stream);

}  // namespace tandem::cuda

#pragma once
// Host launcher of the small-M bf16 GEMV-style matmul used for decode projections (a few rows of
// activations against a large weight matrix, where a GEMM library is latency- and tile-bound):
//   out[m, n] = sum_k x[m, k] * w[n, k]  (+ bias[n])
// or, gated (the SiLU-and-multiply of a gated MLP fused in; w is [2n, k], gate rows then up rows):
//   out[m, j] = silu(sum_k x[m, k] * w[j, k]) * (sum_k x[m, k] * w[n + j, k]),  silu(g) = g / (1 +
//   e^-g)
// in the HF Linear layout (w row-major [n_out, k]). Inputs bf16, accumulation float32, output bf16
// (rounded once, after the bias add) or float32. No CUDA types here: `stream` is a cudaStream_t
// passed as void* (Stream::native from runtime/device/device.h). The launch shape is picked per
// shape (gemv.cu); it never changes the results.
//
// The launcher only queues work: it allocates nothing and does not synchronize, so it is safe to
// capture in a CUDA graph. Buffers are caller-owned device memory and must stay valid until the
// stream has run the kernel. Failure: a bad argument returns kInvalidArgument before anything is
// queued; a launch failure returns the CUDA error as a status (cuda_status.h) and leaves `out`
// unspecified. Thread-safety: reentrant; the stream's owner calls it (device.h contract).

#include "absl/status/status.h"

namespace tandem::cuda {

// Rows of x one launch takes at most (decode batch sizes); larger m belongs to a GEMM library.
constexpr int kGemvMaxRows = 8;

struct GemvArgs {
  const void* x = nullptr;     // bf16 [m, k], dense, 16-byte aligned
  const void* w = nullptr;     // bf16 [n, k] ([2n, k] when gated_silu), dense, 16-byte aligned
  const void* bias = nullptr;  // bf16 [n], or null; must be null when gated_silu
  void* out = nullptr;         // [m, n] dense: bf16, or float32 when out_f32
  bool out_f32 = false;
  bool gated_silu = false;
  int m = 0;  // in [0, kGemvMaxRows]; 0 queues nothing
  int n = 0;  // > 0: output features
  int k = 0;  // > 0, a multiple of 8
};
// out must not overlap x, w or bias.

// True when LaunchGemv takes this shape and these pointers (m in [1, kGemvMaxRows], k a positive
// multiple of 8, x and w 16-byte aligned). Callers pick GEMV or a GEMM library with it.
bool GemvSupports(int m, int k, const void* x, const void* w);

absl::Status LaunchGemv(const GemvArgs& args, void* stream);

}  // namespace tandem::cuda

#pragma once
// Host launcher of the small-M bf16 GEMV-style matmul used for decode projections (a few rows of
// activations against a large weight matrix, where a GEMM library is latency- and tile-bound):
//   out[m, n] = sum_k x[m, k] * w[n, k]  (+ bias[n])
// or, gated (the SiLU-and-multiply of a gated MLP fused in; w is [2n, k], gate rows then up rows):
//   out[m, j] = silu(sum_k x[m, k] * w[j, k]) * (sum_k x[m, k] * w[n + j, k]),  silu(g) = g / (1 +
//   e^-g)
// in the HF Linear layout (w row-major [n_out, k]). Inputs bf16, accumulation float32, output bf16
// (rounded once, after the bias add) or float32. No CUDA types here: `stream` is a cudaStream_t
// passed as void* (Stream::native from runtime/device/device.h).
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

  // Decode-step fusions of the residual stream's RMSNorm (m == 1 only), which remove the
  // standalone norm launches between projections:
  // - norm prologue: x is read as bf16(x[j] * inv_rms[0] * norm_weight[j]) (the standalone
  //   RMSNorm's rounding), inv_rms from an earlier launch's residual epilogue;
  // - residual epilogue (no bias, bf16): instead of writing out, residual[j] =
  //   bf16(bf16(y[j]) + residual[j]) in place, and once every CTA is done inv_rms_out[0] =
  //   1 / sqrt(mean_j(residual[j]^2) + norm_eps) (summed in a fixed order: deterministic).
  const void* norm_weight = nullptr;  // bf16 [k], or null (no prologue)
  const float* inv_rms = nullptr;     // device float [1]; non-null iff norm_weight is
  void* residual = nullptr;           // bf16 [n], or null (no epilogue; then out is written)
  float* inv_rms_out = nullptr;       // device float [1]; non-null iff residual is
  // Epilogue scratch, GemvResidualScratchBytes(n) bytes, zero-filled before its first use (every
  // launch leaves it zeroed).
  void* residual_scratch = nullptr;
  size_t residual_scratch_bytes = 0;
  float norm_eps = 0.0f;
};
// out must not overlap x, w or bias; residual must not overlap x or w.

// Scratch bytes of the residual epilogue for n output features.
size_t GemvResidualScratchBytes(int n);

// True when LaunchGemv takes this shape and these pointers (m in [1, kGemvMaxRows], k a positive
// multiple of 8, x and w 16-byte aligned). Callers pick GEMV or a GEMM library with it.
bool GemvSupports(int m, int k, const void* x, const void* w);

absl::Status LaunchGemv(const GemvArgs& args, void* stream);

}  // namespace tandem::cuda

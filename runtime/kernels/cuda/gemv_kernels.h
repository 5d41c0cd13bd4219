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
// Two fusions for decode steps whose projections all run here: the RMSNorm before the QKV and
// gate/up projections folded into the product (norm_weight), and the residual add after the O and
// down projections folded into the output (add_to_out), which together take the RMSNorm kernels
// off the step. TANDEM_GEMV_UNROLL and TANDEM_GEMV_MIN_CTAS (read once) change the launch shape,
// not the results: A/B switches (gemv_internal.h GemvTuning).
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
  // RMSNorm folded in: when set, x is the raw residual stream and the product takes rmsnorm(x):
  //   out[m, n] = bf16(inv_rms[m] * sum_k w[n, k] * (x[m, k] * norm_weight[k]) + bias[n]),
  //   inv_rms[m] = 1 / sqrt(sum_k x[m, k]^2 / k + norm_eps)
  // (gated: both dot products scaled before the SiLU). The scale applies to the float32 dot
  // product, so the result differs from LaunchRmsNorm followed by LaunchGemv, which rounds the
  // normalized row to bf16 first, by about that rounding. bf16 [k], 16-byte aligned.
  const void* norm_weight = nullptr;
  float norm_eps = 0.0f;  // > 0 with norm_weight
  // Residual epilogue: out[m, n] = bf16(bf16(y) + out[m, n]) in place (y the product plus bias),
  // bit-identical to writing y as bf16 and then LaunchRmsNorm's residual add. bf16 out, not gated.
  bool add_to_out = false;
};
// out must not overlap x, w, bias or norm_weight.

// True when LaunchGemv takes this shape and these pointers (m in [1, kGemvMaxRows], k a positive
// multiple of 8, x and w 16-byte aligned). Callers pick GEMV or a GEMM library with it.
bool GemvSupports(int m, int k, const void* x, const void* w);

absl::Status LaunchGemv(const GemvArgs& args, void* stream);

// The RMSNorm fusion's preconditions (above), shared with the fused QKV projection of
// model_kernels.h: OK when norm_weight is null. `what` names the caller in the message.
absl::Status ValidateGemvNorm(const void* norm_weight, float norm_eps, const char* what);

}  // namespace tandem::cuda

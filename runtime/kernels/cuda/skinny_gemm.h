#pragma once
// Host launcher of the skinny bf16 GEMM for decode batches (a few to 64 rows of activations
// against a large weight matrix), on tensor cores, in the HF Linear layout:
//   out[m, n] = sum_k x[m, k] * w[n, k]  (+ bias[n])
// or, gated (the SiLU-and-multiply of a gated MLP fused in; w is [2n, k], gate rows then up rows):
//   out[m, j] = silu(sum_k x[m, k] * w[j, k]) * (sum_k x[m, k] * w[n + j, k])
// Inputs bf16, accumulation float32, output bf16 (rounded once, after the bias add or the gating)
// or float32. Same numbers contract as the GEMV of gemv_kernels.h; the summation order differs
// from cuBLASLt's and the GEMV's, but is fixed for a given (shape, plan), so repeated launches are
// bit-identical.
//
// Why: at decode batch sizes a projection is a weight stream (64 rows x 4096 of activations is
// 0.5 MB against 32 MB of weights), and a library GEMM of [64, 4096] x [4096, 4096] has too few
// output tiles to keep 132 SMs streaming. This kernel computes out^T = w . x^T (weights as the
// 16-row MMA operand, activations as the 8-column one, so 2-64 rows cost the same weight
// traffic), splits K across CTAs when the output has few tiles (SkinnyGemmPlan), and issues its
// first weight loads before waiting on the previous kernel (programmatic dependent launch).
//
// Split-K: each split writes a float32 partial tile to `partials`; the last CTA of a tile to
// arrive (an atomic counter per tile) sums the splits in split order (deterministic whichever
// CTA arrives last), writes the output and sets the counter back to zero, so the counters stay
// zero between launches. `counters` must therefore be zeroed once when allocated and must not be
// shared by two launches that can run at the same time (one stream, or one workspace per stream).
//
// The launcher only queues work: it allocates nothing and does not synchronize, so it is safe to
// capture in a CUDA graph. Buffers are caller-owned device memory valid until the stream has run
// the kernel. Failure: a bad argument returns kInvalidArgument before anything is queued; a launch
// failure returns the CUDA error as a status and leaves `out` unspecified. Thread-safety:
// reentrant for distinct workspaces; the stream's owner calls it (device.h contract).

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace tandem::cuda {

// Rows of x one launch takes at most; more rows belong to a GEMM library.
constexpr int kSkinnyGemmMaxRows = 64;
// k must be a positive multiple of this (one pipeline stage of the kernel).
constexpr int kSkinnyGemmKStep = 64;

// How a launch is cut: `tiles` output tiles (64 weight rows each; gated: 32 gate + 32 up rows)
// times `splits` K ranges, each `k_per_split` long. Depends only on the shape and the SM count.
struct SkinnyGemmPlan {
  int tiles = 0;
  int splits = 0;
  int k_per_split = 0;
  size_t partial_bytes = 0;  // float32 partials the launch needs (0 when splits == 1)
  size_t counter_bytes = 0;  // one uint32 per tile (0 when splits == 1)
};

// CTAs per SM the split-K plan aims at by default (the kernel fits 3-5 per SM by shared memory).
constexpr int kSkinnyGemmCtasPerSm = 2;

// The plan for a supported shape (see SkinnyGemmSupports; m >= 1). Splits aim at ctas_per_sm CTAs
// per SM (at least 1) and keep at least four k-steps per split; K is split only into equal ranges.
SkinnyGemmPlan PlanSkinnyGemm(int m, int n, int k, bool gated_silu, int num_sms,
                              int ctas_per_sm = kSkinnyGemmCtasPerSm);

// Rope mode: the QKV projection (w [(num_heads + 2 num_kv_heads) head_dim, k], out the bf16 qkv
// rows [m, n]) with RoPE and the KV append of LaunchRopeKvAppend (model_kernels.h) fused into the
// epilogue: each tile holds 32 rotation pairs (i, i + head_dim / 2) of the heads; bit-identical to
// the plain launch followed by LaunchRopeKvAppend (the same bf16 rounding, then the same rotation
// arithmetic). Positions, slots (-1: no append), inv_freq and the layer's k / v cache
// ([slots, num_kv_heads, head_dim] bf16) are device memory.
struct SkinnyRope {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;                       // even
  const int32_t* positions = nullptr;     // [m]
  const float* inv_freq = nullptr;        // [head_dim / 2]
  const int32_t* slot_mapping = nullptr;  // [m]
  void* k_layer = nullptr;
  void* v_layer = nullptr;
};

// The plan of a rope-mode launch of the [m, k] x [n, k]^T QKV projection.
SkinnyGemmPlan PlanSkinnyGemmRope(int m, int n, int k, int num_sms,
                                  int ctas_per_sm = kSkinnyGemmCtasPerSm);

struct SkinnyGemmArgs {
  const void* x = nullptr;     // bf16 [m, k], dense, 16-byte aligned
  const void* w = nullptr;     // bf16 [n, k] ([2n, k] when gated_silu), dense, 16-byte aligned
  const void* bias = nullptr;  // bf16 [n], or null; must be null when gated_silu
  void* out = nullptr;  // [m, n] dense: bf16, or float32 when out_f32; no overlap with inputs
  bool out_f32 = false;
  bool gated_silu = false;
  int m = 0;        // in [0, kSkinnyGemmMaxRows]; 0 queues nothing
  int n = 0;        // > 0: output features
  int k = 0;        // a positive multiple of kSkinnyGemmKStep
  int num_sms = 0;  // > 0: the device's multiprocessor count (the plan depends on it)
  int ctas_per_sm = kSkinnyGemmCtasPerSm;  // >= 1: the plan's aim (a tuning knob)
  // Split-K scratch (see above): at least the plan's partial_bytes and counter_bytes; may be null
  // when the plan has one split.
  void* partials = nullptr;  // 16-byte aligned
  size_t partials_bytes = 0;
  void* counters = nullptr;  // zeroed when allocated; 4-byte aligned
  size_t counters_bytes = 0;
  const SkinnyRope* rope = nullptr;  // rope mode (not with gated_silu or out_f32), or null
};

// True when LaunchSkinnyGemm takes this shape and these pointers: m in [1, kSkinnyGemmMaxRows],
// n > 0, k a positive multiple of kSkinnyGemmKStep, x and w 16-byte aligned.
bool SkinnyGemmSupports(int m, int n, int k, const void* x, const void* w);

absl::Status LaunchSkinnyGemm(const SkinnyGemmArgs& args, void* stream);

// Whether launches on the current device take the wgmma kernel: compute capability 9.0. Other
// devices run the mma.sync kernel.
bool SkinnyGemmUsesWgmma();

namespace internal {
// LaunchSkinnyGemm on the kernel the caller names, for the mma.sync kernel's own test on compute
// capability 9.0: use_wgmma needs SkinnyGemmUsesWgmma() (FailedPrecondition otherwise, before
// anything is queued); false takes the mma.sync kernel on any GPU.
absl::Status LaunchSkinnyGemmWithKernel(const SkinnyGemmArgs& args, bool use_wgmma, void* stream);
}  // namespace internal

}  // namespace tandem::cuda

#pragma once
// Host launcher of the cluster GEMM: decode projections of up to 64 activation rows on Hopper
// (compute capability 9.0 only), in the HF Linear layout:
//   out[m, n] = sum_k x[m, k] * w[n, k]  (+ bias[n])
// x, w, bias bf16; accumulation float32; out bf16 (rounded once, after the bias add) or float32.
// Same numbers contract as the skinny GEMM (skinny_gemm.h); the summation order is fixed for a
// given (shape, plan), so repeated launches are bit-identical.
//
// Why: at decode batch 33-64 cuBLASLt's projections run at 59-75% of the copy bandwidth on the
// H200 (QKV, O, down: their fill and drain), and its kernels cannot start streaming weights while
// the previous kernel drains (they do not wait on a programmatic edge). This kernel (one CTA per
// SM in one wave, TMA loads of 5-12 stages by a producer warp, wgmma, split-K summed across a
// thread block cluster through distributed shared memory) queues its first weight loads before
// its programmatic wait. Design and measurements: cluster_gemm_sm90.cu, bench/RESULTS.md.
//
// The launcher only queues work: no allocation, no synchronization, no scratch, so it is safe to
// capture in a CUDA graph (it encodes two TMA descriptors on the host per call, passed by value).
// Failure: a bad argument or plan returns kInvalidArgument before anything is queued; a launch
// failure returns the CUDA error as a status. Thread-safety: reentrant; the stream's owner calls
// it (device.h contract).

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::cuda {

constexpr int kClusterGemmMaxRows = 64;
constexpr int kClusterGemmKStep = 64;  // k must be a multiple of this (one pipeline stage)

// How a launch is cut: tiles of `tile_rows` weight rows (64, 128, 192 or 256) times `splits` k
// ranges of k_per_split (1, 2, 4 or 8 CTAs per cluster). tiles == 0: no plan.
struct ClusterGemmPlan {
  int tile_rows = 0;
  int tiles = 0;
  int splits = 0;
  int k_per_split = 0;
  bool ok() const { return tiles > 0; }
};

// Clusters of 1, 2, 4 and 8 CTAs (one CTA per SM) a device holds at once.
struct ClusterGemmCapacity {
  int clusters[4] = {0, 0, 0, 0};
  int For(int splits) const;  // clusters of `splits` CTAs (0 for other sizes)
};

// The plan for tile_rows x splits when valid (n > 0, k a multiple of 64 x splits with at least two
// stages per split, tile_rows / splits a multiple of 8); otherwise no plan.
ClusterGemmPlan MakeClusterGemmPlan(int n, int k, int tile_rows, int splits);

// The default plan: among the valid plans whose tiles fit one wave of clusters on `capacity`,
// keep at least `min_fill` of the SMs busy and are at most `max_tile_rows` weight rows wide, the
// one whose CTAs each stream the fewest bytes (weights, plus half the activations and half the
// partial tile sent to the cluster's peers); no plan when none fits (the caller keeps its library
// GEMM). The runner asks for 64-row tiles only (cublas_gemm.h): wider ones measured slower.
ClusterGemmPlan PlanClusterGemm(int n, int k, const ClusterGemmCapacity& capacity,
                                double min_fill = 0.9, int max_tile_rows = 256);

// Whether the current device runs the kernel (compute capability 9.0) and its capacity there
// (cached per device). All zeros elsewhere.
bool ClusterGemmRunsHere();
ClusterGemmCapacity ClusterGemmCapacityHere();

// True when LaunchClusterGemm takes these: m in [1, kClusterGemmMaxRows], n > 0 and a multiple of
// 8, k a positive multiple of kClusterGemmKStep, x, w, out (and bias when given) 16-byte aligned.
bool ClusterGemmSupports(int m, int n, int k, const void* x, const void* w, const void* out,
                         const void* bias);

struct ClusterGemmArgs {
  const void* x = nullptr;     // bf16 [m, k], dense
  const void* w = nullptr;     // bf16 [n, k], dense
  const void* bias = nullptr;  // bf16 [n], or null
  void* out = nullptr;         // [m, n] dense, bf16 or float32 (out_f32); no overlap with inputs
  bool out_f32 = false;
  int m = 0;  // in [0, kClusterGemmMaxRows]; 0 queues nothing
  int n = 0;
  int k = 0;
  // Pipeline stages (64 k each) in shared memory: 0 for as many as fit (5-12 by tile width),
  // else 2 or more (capped there). Fewer stages leave shared memory for the CTAs of the kernels
  // before and after it, which programmatic launch can then run beside it.
  int stages = 0;
  // Diagnostics, normally null: device memory for kClusterGemmTraceWords uint64 per CTA (tiles x
  // splits CTAs, record of CTA (tile t, split s) at s * tiles + t): %globaltimer nanoseconds at
  // entry, after the programmatic wait, when the first stage landed, at the end of the main loop,
  // after the first barrier of the epilogue and at exit; then the SM id and the k steps.
  uint64_t* trace = nullptr;
};

constexpr int kClusterGemmTraceWords = 8;

// Queues the GEMM with `plan` (made for this n and k) on the current device.
absl::Status LaunchClusterGemm(const ClusterGemmArgs& args, const ClusterGemmPlan& plan,
                               void* stream);

}  // namespace tandem::cuda

#pragma once
// bf16 GEMMs of the CUDA model runner through cuBLASLt, in the HF Linear layout:
//   out[m, n] = x[m, k] · w[n, k]^T (+ bias[n])
// x, w, bias bf16; accumulation float32 (CUBLAS_COMPUTE_32F); out bf16 or float32. The bias is
// added in the GEMM epilogue (CUBLASLT_EPILOGUE_BIAS). No CUDA types here: `stream` is a
// cudaStream_t passed as void*.
// Which kernel takes a call is chosen by GemmTuning (cuda_tuning.h), given to Create and fixed
// for the object's life:
// Decode-sized calls (m <= kGemvMaxRows, see UseGemv) go to the hand-written GEMV of
// runtime/kernels/cuda/gemv_kernels.h instead, same numerics contract (float32 accumulation, bias
// added before the one bf16 rounding).
// On compute capability 9.0, calls of 2-32 rows whose k is a multiple of 64 go to the tensor-core
// skinny GEMM of runtime/kernels/cuda/skinny_gemm.h (its wgmma kernel; same numerics contract; on
// the H200 it beat cuBLASLt at 8-32 rows and lost at 64, bench/RESULTS.md); Create then allocates
// its 16 MiB split-K scratch. GemmTuning::skinny turns it off, or on for 2-64 rows on any GPU
// (other GPUs run its mma.sync kernel, slower than cuBLASLt on the H200), and its skinny_* fields
// move the row bounds (the QKV projection with RoPE fused and the gate/up projection with SiLU
// fused have their own) and the CTAs per SM its split-K plan aims at.
// On compute capability 9.0, calls of 33-64 rows whose shape has a plan that fills the SMs in one
// wave (the Llama-3-8B O and down projections) go to the cluster GEMM of
// runtime/kernels/cuda/cluster_gemm.h (same numerics contract; it queues its first weight loads
// before its programmatic wait, which cuBLASLt's kernels do not: 1.9% off the batch-48 and -64
// decode step on the H200, bench/RESULTS.md). GemmTuning's cluster_* fields turn it off, move its
// row range, list the only shapes it takes, and set the share of the SMs a plan must keep busy,
// the widest tile a plan may take and its pipeline depth.
// Algorithms: the first call of each shape with at most 256 rows (decode) or a multiple of 512
// rows (chunk-sized prefill) that is not being captured into a CUDA graph times cuBLASLt's top
// GemmTuning::autotune_candidates (8) candidates on its own operands, each run after flushing the
// L2 cache with a 128 MiB device scratch (allocated on first use, freed with the object) so
// weights stream from HBM as in a step (a few synchronous GEMMs, once per shape, device and
// autotune settings in the process: every instance with those settings then uses that choice, so
// two runners of one process compute identical GEMMs), and keeps the fastest; other shapes take
// the heuristic's first choice.
// autotune_splitk also times split-K variants (2-8 splits, reduced in the workspace, never in
// place) of the candidates that have none; autotune_log logs each tuned shape's choice, its time
// and bandwidth.
//
// Ownership: the object owns its cuBLASLt handle and a cache of matmul descriptors and algorithms
// per shape; the workspace is caller-owned device memory that must outlive the object. Every
// GEMM uses only that workspace and the GEMV none, so calls may be captured into a CUDA graph.
// Thread-safety: one thread at a time (the runner's). Failure: a status with cuBLAS's code and
// message; nothing is queued on an error before the launch.

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/kernels/cuda/cluster_gemm.h"
#include "runtime/kernels/cuda/skinny_gemm.h"
#include "runtime/model/cuda/cuda_tuning.h"

namespace tandem::cuda_runner {

enum class GemmOut { kBf16, kF32 };

class CublasLtGemm {
 public:
  // Creates the handle on the current CUDA device. `workspace` may be null when bytes is 0.
  // InvalidArgument (naming the cuda_tuning.h key) when a field of `tuning` is out of range.
  static absl::StatusOr<std::unique_ptr<CublasLtGemm>> Create(void* workspace,
                                                              size_t workspace_bytes,
                                                              const GemmTuning& tuning);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Queues out = x · w^T (+ bias). m == 0 queues nothing. Pointers 16-byte aligned at least (the
  // algorithms are chosen for 256-byte aligned buffers, which every runner buffer is).
  absl::Status Linear(const void* x, const void* w, const void* bias, int m, int k, int n,
                      void* out, GemmOut out_type, void* stream);

  // Queues out[m, n] = silu(x · w[0:n]^T) * (x · w[n:2n]^T) in bf16 (w is [2n, k], gate rows then
  // up rows) in one kernel, when FusesGatedSilu says one takes the call; otherwise
  // kInvalidArgument (callers run Linear and a separate SiLU-and-multiply then).
  absl::Status LinearGatedSilu(const void* x, const void* w, int m, int k, int n, void* out,
                               void* stream);
  bool FusesGatedSilu(int m, int k, int n, const void* x, const void* w) const;

  // Queues the QKV projection out = x · w^T (+ bias) with RoPE and the KV append of `rope` in the
  // skinny GEMM's epilogue (rope mode of skinny_gemm.h; bit-identical to Linear followed by
  // cuda::LaunchRopeKvAppend) when FusesQkvRope says the skinny GEMM takes the call; otherwise
  // kInvalidArgument.
  absl::Status LinearQkvRope(const void* x, const void* w, const void* bias, int m, int k, int n,
                             const cuda::SkinnyRope& rope, void* out, void* stream);
  bool FusesQkvRope(int m, int k, int n, const void* x, const void* w) const;

  // True when Linear runs this call as a GEMV: one row (the GEMV's measured range, though it takes
  // up to kGemvMaxRows), k a multiple of 8, x and w 16-byte aligned.
  bool UseGemv(int m, int k, const void* x, const void* w) const;

 private:
  // The cluster GEMM's plan when it takes the call (enabled, rows in its range, a
  // supported and listed shape with a plan on this device), else null.
  const cuda::ClusterGemmPlan* ClusterPlan(int m, int n, int k, const void* x, const void* w,
                                           const void* out, const void* bias) const;
  // Whether the skinny GEMM takes the call: enabled, 2 <= m <= its row bound, k % 64 == 0,
  // aligned, and the plan's split-K scratch fits ours.
  bool UseSkinny(int m, int n, int k, const void* x, const void* w, bool gated_silu) const;
  absl::Status LaunchSkinny(const void* x, const void* w, const void* bias, int m, int k, int n,
                            void* out, bool out_f32, bool gated_silu, void* stream,
                            const cuda::SkinnyRope* rope = nullptr);
  // Whether the skinny GEMM's split-K scratch holds this plan.
  bool SkinnyScratchFits(const cuda::SkinnyGemmPlan& plan) const;

  struct Impl;
  explicit CublasLtGemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::cuda_runner

#pragma once
// bf16 GEMMs of the CUDA model runner through cuBLASLt, in the HF Linear layout:
//   out[m, n] = x[m, k] · w[n, k]^T (+ bias[n])
// x, w, bias bf16; accumulation float32 (CUBLAS_COMPUTE_32F); out bf16 or float32. The bias is
// added in the GEMM epilogue (CUBLASLT_EPILOGUE_BIAS). No CUDA types here: `stream` is a
// cudaStream_t passed as void*.
// Decode-sized calls (m <= kGemvMaxRows, see UseGemv) go to the hand-written GEMV of
// runtime/kernels/cuda/gemv_kernels.h instead, same numerics contract (float32 accumulation, bias
// added before the one bf16 rounding); the environment variable TANDEM_DISABLE_GEMV=1, read at
// Create, forces cuBLASLt for every call (A/B measurements).
// Algorithms: the first call of each shape with at most 256 rows (decode) or a multiple of 512
// rows (chunk-sized prefill) that is not being captured into a CUDA graph times cuBLASLt's top 8
// candidates on its own operands, each run after flushing the L2 cache with a 128 MiB device
// scratch (allocated on first use, freed with the object) so weights stream from HBM as in a step
// (a few synchronous GEMMs, once per shape and device in the process: every instance then uses
// that choice, so two runners of one process compute identical GEMMs), and keeps the fastest;
// other shapes take the heuristic's first choice.
// TANDEM_DISABLE_GEMM_AUTOTUNE=1, read at Create, turns the timing off.
//
// Ownership: the object owns its cuBLASLt handle and a cache of matmul descriptors and algorithms
// per shape; the workspace is caller-owned device memory that must outlive the object. Every
// GEMM uses only that workspace and the GEMV none, so calls may be captured into a CUDA graph.
// Thread-safety: one thread at a time (the runner's). Failure: a status with cuBLAS's code and
// message; nothing is queued on an error before the launch.

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"

namespace tandem::cuda_runner {

enum class GemmOut { kBf16, kF32 };

class CublasLtGemm {
 public:
  // Creates the handle on the current CUDA device. `workspace` may be null when bytes is 0.
  static absl::StatusOr<std::unique_ptr<CublasLtGemm>> Create(void* workspace,
                                                              size_t workspace_bytes);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Queues out = x · w^T (+ bias). m == 0 queues nothing. Pointers 16-byte aligned at least (the
  // algorithms are chosen for 256-byte aligned buffers, which every runner buffer is).
  absl::Status Linear(const void* x, const void* w, const void* bias, int m, int k, int n,
                      void* out, GemmOut out_type, void* stream);

  // True when Linear runs this call as a GEMV: GEMV not disabled, m in [1, kGemvMaxRows], k a
  // multiple of 8, x and w 16-byte aligned.
  bool UseGemv(int m, int k, const void* x, const void* w) const;

 private:
  struct Impl;
  explicit CublasLtGemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::cuda_runner

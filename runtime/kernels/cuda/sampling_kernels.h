#pragma once
// Host launcher for token sampling on the GPU: greedy, or temperature / min_p / top_k / top_p and
// one inverse-CDF draw, per row of float32 logits, with the semantics of tandem::Sample
// (runtime/sampling/sampler.h) for rows without penalties. The engine keeps rows that need
// penalties or top-logprob lists on the host.
//
// No CUDA types here: `stream` is a cudaStream_t passed as void* (Stream::native; null is the
// legacy default stream). Pointers in SamplingArgs are device memory.
// The launcher only queues one kernel: it allocates nothing and does not synchronize, so it is
// safe to capture in a CUDA graph. Buffers are caller-owned and must stay valid until the stream
// has run the kernel. The per-row parameters live in device memory and are not read on the host:
// validate each row with ValidateSamplingRow before uploading it (a row that fails it gives an
// unspecified token in [0, vocab)).
// Failure: a bad argument returns kInvalidArgument before anything is queued; a launch failure
// returns the CUDA error as a status (cuda_status.h) and leaves tokens/logprobs unspecified.
// Thread-safety: reentrant; the stream's owner calls it (device.h contract).
//
// Agreement with the CPU sampler (same logits, parameters, seed and step): exact by construction.
// Both sides use runtime/sampling/sampling_math.h: integer weights q = llround(exp(x/T - max/T) *
// 2^40) from a portable exp built from correctly rounded double operations (so q is
// bit-identical), the rank order (q descending, lower id first), min_p / top_k / top_p on integer
// sums (the token crossing top_p stays) and the draw floor(u * total) against integer prefix sums
// in id order, with u = UniformFromSeed(seed, step). Integer sums do not depend on summation order,
// so tree sums here equal the CPU's left-to-right sums, ties included.
// The sampled token's logprob is the raw log-softmax (before temperature), as the CPU reports it.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "runtime/sampling/sample_request.h"

namespace tandem::cuda {

inline constexpr int kSamplingMaxRows = 256;
inline constexpr int kSamplingMaxVocab = 262144;
// Candidate sets up to this size are sorted in shared memory and walked by one thread; larger ones
// use radix selects and block scans (same result, different speed).
inline constexpr int kSamplingExactCandidates = 2048;

// Parameters of one row (runtime/sampling/sample_request.h; build it with MakeSampleRequest):
// plain data, copied to device memory by the caller.
using SamplingRow = ::tandem::SampleRequest;

// Every pointer is device memory.
struct SamplingArgs {
  const float* logits = nullptr;        // [rows, vocab], row-major, dense
  const SamplingRow* params = nullptr;  // [rows]
  int rows = 0;                         // [1, kSamplingMaxRows]
  int vocab = 0;                        // [1, kSamplingMaxVocab]
  int32_t* tokens = nullptr;            // [rows] out: sampled token ids
  float* logprobs = nullptr;            // [rows] out: raw log-softmax of the sampled token
  // At least SamplingWorkspaceBytes(rows, vocab) bytes; may be null when that is 0.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Device scratch the launcher needs. The kernel keeps all its state in shared memory (it
// recomputes probabilities rather than storing them), so this is 0 for every valid shape; callers
// still size the workspace with it so a future kernel can use one without an API change.
size_t SamplingWorkspaceBytes(int rows, int vocab);

// kInvalidArgument naming the field when a row is outside the ranges documented on SamplingRow
// (non-finite values included). Host only; does not touch the GPU.
absl::Status ValidateSamplingRow(const SamplingRow& row);

// Writes tokens[r] and logprobs[r] for every row r, one CTA per row.
absl::Status LaunchSampling(const SamplingArgs& args, void* stream);

}  // namespace tandem::cuda

#pragma once
// One row's request to sample on the runner (model_runner.h, SequenceChunk::sample): the plain
// parameters of tandem::Sample for a request without penalties and without a top-logprob list,
// which need nothing but the row's logits. No dependencies, so model_runner.h stays free of CUDA
// and of the sampler; the GPU sampler reads this struct as raw bytes
// (runtime/kernels/cuda/sampling_kernels.h: cuda::SamplingRow is this type).
//
// Build it with MakeSampleRequest (runtime/sampling/sampler.h) from validated SamplingParams; a
// runner samples it with the semantics of Sample(params, logits, {}, {}, seed, step).
// Value type; thread-compatible.

#include <cstdint>

namespace tandem {

struct SampleRequest {
  uint64_t seed = 0;         // params.seed or the engine's per-request seed
  uint64_t step = 0;         // tokens the request generated so far
  float temperature = 1.0f;  // > 0 unless greedy
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  int32_t top_k = 0;         // <= 0 or >= vocab: off
  int32_t greedy = 0;        // nonzero: argmax, lowest id on ties (the other fields are ignored)
  int32_t reserved = 0;      // keeps the struct 40 bytes with no implicit padding
};
static_assert(sizeof(SampleRequest) == 40, "SampleRequest is copied to the device as raw bytes");

}  // namespace tandem

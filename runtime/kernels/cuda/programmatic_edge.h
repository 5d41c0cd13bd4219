#pragma once
// Programmatic edges into launches we did not write (cuBLASLt's kernels), and the probe that says
// when one is safe.
//
// A kernel captured behind a programmatic edge (cudaGraphDependencyTypeProgrammatic) may start
// while its predecessor still runs: its launch and prologue overlap the predecessor's tail. That is
// correct only for a kernel that waits (griddepcontrol.wait) before it reads what the predecessor
// writes. Our kernels keep that rule (kernel_utils.cuh, PdlWait); a library's kernels are not
// documented either way, and cuBLASLt's Hopper kernels differ: most decode-shaped ones wait, some
// read their inputs early (bench/RESULTS.md, eleventh session). Hence:
//
//  - ProbeWaitsForPredecessor(stream, input, count, output, bytes, launch): `launch` queues work on
//    `stream` that reads `input` (`count` bf16 values) and writes `output` (`bytes`, a multiple of
//    4). The probe captures a writer kernel that lets its dependents start at once and writes a
//    fresh pattern into `input` only after `delay_us`, then `launch` behind a programmatic edge;
//    replays it `trials` times, each time over another stale pattern, and compares every output
//    word with what `launch` writes when queued after the writer has finished. True when every
//    trial matches: a CTA that read before the writer finished would have read the stale pattern.
//    False also when the capture with a programmatic edge fails (cuBLASLt adds a node that cannot
//    take one). Synchronizes `stream`; allocates and frees a scratch copy of `output` and a
//    counter (not for a step path: once per GEMM plan). `input` and `output` are overwritten.
//    Errors: kInvalidArgument for bad arguments or a stream being captured, kInternal for a CUDA
//    failure outside the probed capture.
//  - MakeCaptureDependenciesProgrammatic(stream): when `stream` is being captured and every node
//    the next captured node will depend on is a kernel node, turns those edges programmatic (the
//    next node may start when they trigger, griddepcontrol.launch_dependents, or exit). A no-op
//    when the stream is not capturing or a dependency is not a kernel. Cheap (one query).
//  - QueueLateBf16Pattern: the probe's writer on its own (tests use it to make a predecessor that
//    finishes late): data[i] = a bf16 small integer in [-2, 2] hashed from (i, pattern), written
//    after `delay_us`, the next grid allowed to start at once.
// `stream` is a cudaStream_t passed as void*. Every function needs compute capability 9.0 for
// the edge to have any effect; before it the edge orders like a plain one and the probe passes.

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::cuda {

struct ProbeOptions {
  int trials = 4;
  int delay_us = 50;
};

absl::StatusOr<bool> ProbeWaitsForPredecessor(void* stream, void* input, size_t input_count,
                                              void* output, size_t output_bytes,
                                              absl::FunctionRef<absl::Status()> launch,
                                              const ProbeOptions& options = {});

absl::Status MakeCaptureDependenciesProgrammatic(void* stream);

absl::Status QueueLateBf16Pattern(void* stream, void* data, size_t count, uint32_t pattern,
                                  int delay_us);

}  // namespace tandem::cuda

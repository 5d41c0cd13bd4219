#pragma once
// Calibrating a profile against a live deployment (docs/planning.md, "Calibration").
//
// `tandem profile` times bare forward passes; a served worker shares its host with the router,
// the gRPC threads, the other workers and their traffic, and its steps run slower. Near
// saturation that error grows: the batch a rate needs grows with the step time, so 9% on the
// step is 20-30% on goodput. Decode workers count their decode-only steps
// (tandem_engine_decode_{steps,forward_seconds,sequences,context_tokens}_total); over a window of
// load, each worker's served step time at its mean batch and context is compared with the
// profile's prediction there, and the difference per step (weighted by steps) becomes the
// profile's decode penalty: additive, because what a neighbour slows is a decode step's weight
// reads, the same bytes at every batch (on the 2-core VM the served step was 1.42x the profile's
// at batch 1.3 and 1.02-1.13x at batch 16, both 1-3 ms). It is the correction an SLA planner
// applies from live latencies, kept in the profile file so that a plan says what it was
// calibrated against.
//
// The same window gives the engine's cost per step beyond its forward pass, which the simulator
// adds to every step: the host work inside a step's loop iteration
// (tandem_engine_busy_seconds_total less tandem_engine_forward_seconds_total, over
// tandem_engine_steps_total: admission, scheduling, sampling, stop checks, output callbacks) and
// the gap between iterations while work waited (tandem_engine_gap_seconds_total over
// tandem_engine_backlogged_steps_total: the stats publish, the engine lock, and the time the
// engine thread was off the CPU; on the 2-core VM the engine thread shares the cores with the
// other worker, the router, the KV transfer and the clients).
//
// Prefill is calibrated the same way from workers' prefill-only steps
// (tandem_engine_prefill_{steps,forward_seconds,chunks,tokens,cached_tokens}_total): per worker,
// the profile's cost of a step of its mean chunks-a-step at its mean chunk and cached length
// (the step's fixed cost once, each chunk's cost beyond it, as the simulator prices a step)
// against the served forward passes. The mean chunk stands for every chunk, so a window whose
// chunk lengths vary widely on a curved profile carries that curvature's error; calibrate under
// prompts near the lengths the plan is for.
//
// Metrics text comes from other processes and is untrusted: the parser bounds its input, takes
// only the counters it knows (unlabelled, finite, non-negative) and names what is missing or bad.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planning/profile.h"

namespace tandem::planning {

// One worker's engine counters at one instant (or a window's difference).
struct EngineCounters {
  // Decode-only steps: how many, their forward seconds, summed batch sizes and the tokens
  // already cached of those sequences.
  double steps = 0;
  double forward_seconds = 0;
  double sequences = 0;
  double context_tokens = 0;
  // Every step (decode-only or not): how many, their forward seconds, and the seconds of the
  // engine iterations that ran them (forward plus the host work around it).
  double all_steps = 0;
  double all_forward_seconds = 0;
  double busy_seconds = 0;
  // Steps after which work waited, and the seconds until the next iteration began.
  double backlogged_steps = 0;
  double gap_seconds = 0;
  // Prefill-only steps: how many, their forward seconds, prompt chunks, the chunks' tokens and
  // the tokens cached before each chunk.
  double prefill_steps = 0;
  double prefill_forward_seconds = 0;
  double prefill_chunks = 0;
  double prefill_tokens = 0;
  double prefill_cached_tokens = 0;
  std::string model_name;  // from vllm:* labels when present, else empty
};

// The counters of one Prometheus text exposition (a worker's /metrics). InvalidArgument when a
// counter is missing, repeated, labelled or not a finite non-negative number, or the text is
// larger than 16 MiB.
absl::StatusOr<EngineCounters> ParseEngineCounters(absl::string_view text);

// after - before; InvalidArgument when a counter went backwards (the worker restarted).
absl::StatusOr<EngineCounters> CounterWindow(const EngineCounters& before,
                                             const EngineCounters& after);

struct CalibrationOptions {
  int64_t min_steps = 200;  // decode-only steps, over every worker, for a usable window
  // Prompt chunks of prefill-only steps, over every worker (a prefill worker batches many
  // prompts a step: a window of 24 streams held 9 steps of about 10 chunks each).
  int64_t min_prefill_chunks = 50;
  double max_factor = 4.0;  // a larger disagreement (either way) is a wrong profile, not load
};

// The decode penalty of `profile` from windows of one or more workers (each with at least one
// step; workers without decode-only steps are skipped), and the engine's cost per step beyond
// the forward pass over those workers. FailedPrecondition when the windows hold fewer than
// min_steps steps or a window's model differs from the profile's; OutOfRange when served over
// predicted falls outside [1 / max_factor, max_factor]. The penalty is against the points as
// profiled (factor 1), so calibrating a calibrated profile again replaces it.
absl::StatusOr<DecodeCalibration> CalibrateDecode(const DeviceProfile& profile,
                                                  const std::vector<EngineCounters>& windows,
                                                  const CalibrationOptions& options = {});

// The prefill factor of `profile` from the windows' prefill-only steps (workers without any are
// skipped), and the cost per step beyond the forward pass over the workers that had them. The
// same errors as CalibrateDecode, with min_prefill_chunks.
absl::StatusOr<PrefillCalibration> CalibratePrefill(const DeviceProfile& profile,
                                                    const std::vector<EngineCounters>& windows,
                                                    const CalibrationOptions& options = {});

}  // namespace tandem::planning

#pragma once
// Calibrating a profile against a live deployment (docs/planning.md, "Calibration").
//
// What is calibrated is the served step *interval*: a decode worker kept busy by a steady load
// runs its decode-only steps in the window's wall time times their share of its steps; over the
// profile's prediction for those steps (less the host work the simulator adds on its own), that
// is the decode factor. On the 2-core VM the interval was 34% longer than the forward passes the
// engine timed (the engine thread shares the cores with the prefill worker, the router, the KV
// transfer and the clients; its iterations covered three quarters of the window), and a factor
// from forward passes alone predicted every layout's goodput 36-38% high (bench/RESULTS.md).
// Without a wall time (wall_seconds 0) the forward passes are used, as before.
//
// `tandem profile` times bare forward passes; a served worker shares its host with the router,
// the gRPC threads, the other workers and their traffic, and its steps run some percent slower.
// Near saturation that error grows: the batch a rate needs grows with the step time, so 9% on
// the step is 20-30% on goodput. Decode workers count their decode-only steps
// (tandem_engine_decode_{steps,forward_seconds,sequences,context_tokens}_total); over a window of
// load, each worker's served step time at its mean batch and context is compared with the
// profile's DecodeStepMs there, and the ratio (weighted by steps) becomes the profile's decode
// factor. It is the correction an SLA planner applies from live latencies, kept in the profile
// file so that a plan says what it was calibrated against.
//
// The same window gives the engine's host work per step (tandem_engine_busy_seconds_total less
// tandem_engine_forward_seconds_total, over tandem_engine_steps_total): admission, scheduling,
// sampling, stop checks and output callbacks, which a served step adds to its forward pass and
// bare forward passes never see (on the 2-core VM about 0.1 ms). The simulator adds it to every
// step.
//
// Metrics text comes from other processes and is untrusted: the parser bounds its input, takes
// only the seven counters (unlabelled, finite, non-negative) and names what is missing or bad.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planning/profile.h"

namespace tandem::planning {

// One worker's decode-only step counters at one instant (or a window's difference).
struct DecodeCounters {
  double steps = 0;
  double forward_seconds = 0;
  double sequences = 0;       // summed batch sizes
  double context_tokens = 0;  // summed tokens already cached of those sequences
  // Every step (decode-only or not): how many, their forward seconds, and the seconds of the
  // engine iterations that ran them (forward plus the host work around it).
  double all_steps = 0;
  double all_forward_seconds = 0;
  double busy_seconds = 0;
  // The window's wall time (set by the caller; 0: unknown, and the factor is taken from the
  // forward passes alone).
  double wall_seconds = 0;
  std::string model_name;  // from vllm:* labels when present, else empty
};

// The counters of one Prometheus text exposition (a worker's /metrics). InvalidArgument when a
// counter is missing, repeated, labelled or not a finite non-negative number, or the text is
// larger than 16 MiB.
absl::StatusOr<DecodeCounters> ParseDecodeCounters(absl::string_view text);

// after - before; InvalidArgument when a counter went backwards (the worker restarted).
absl::StatusOr<DecodeCounters> CounterWindow(const DecodeCounters& before,
                                             const DecodeCounters& after);

struct CalibrationOptions {
  int64_t min_steps = 200;  // decode-only steps, over every worker, for a usable window
  double max_factor = 4.0;  // a larger disagreement (either way) is a wrong profile, not load
};

// The decode factor of `profile` from windows of one or more workers (each with at least one
// step; workers without steps are skipped). FailedPrecondition when the windows hold fewer than
// min_steps steps or a window's model differs from the profile's; OutOfRange when the factor
// falls outside [1 / max_factor, max_factor]. The factor is against the points as profiled, so
// calibrating a calibrated profile again replaces its factor.
absl::StatusOr<DecodeCalibration> CalibrateDecode(const DeviceProfile& profile,
                                                  const std::vector<DecodeCounters>& windows,
                                                  const CalibrationOptions& options = {});

}  // namespace tandem::planning

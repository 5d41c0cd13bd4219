#pragma once
// DeviceProfile: what one worker's device can do, as `tandem profile` measured it and `tandem
// plan` reads it (docs/planning.md): prefill latency against prompt length (with and without a
// prefix-cache hit), decode step time against batch size and context, KV capacity, and KV
// transfer time against prompt length on one backend.
//
// The JSON file is untrusted input (a planner reads files from anywhere): ProfileFromJson checks
// every field (types, ranges, sorted distinct grid points, finite positive times) and names the
// first bad one; unknown keys are errors too.
//
// A calibration (planning/calibration.h) scales the decode lookups by its decode factor and the
// prefill lookups by its prefill factor; the points stay as measured.
//
// Between grid points the lookups interpolate linearly; past the last point they extrapolate
// from the last two (prefill grows with length, decode with batch and context), never below the
// smallest measured time.
//
// Thread-safety: values.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::planning {

inline constexpr int kProfileVersion = 1;

struct PrefillPoint {
  int tokens = 0;         // prompt length
  int cached_tokens = 0;  // of which a prefix-cache hit (not computed)
  double ms = 0;          // median forward time of the uncached part
};

// Several prompts prefilled in one step (a prefill worker batches every queued prompt): `prompts`
// prompts of `tokens` tokens each, nothing cached.
struct PrefillBatchPoint {
  int prompts = 0;  // >= 2
  int tokens = 0;
  double ms = 0;  // median forward time of the step
};

struct DecodePoint {
  int batch = 0;    // sequences decoding one token each
  int context = 0;  // tokens already in each sequence's KV cache
  double ms = 0;    // median step time
};

struct TransferPoint {
  int tokens = 0;  // prompt length whose KV moved
  int64_t bytes = 0;
  double ms = 0;  // median, post to landed
};

// What a live deployment's decode steps said of the profile (planning/calibration.h). A decode
// step the profile predicts is factor x its measured time + penalty_ms. Calibration sets the
// penalty (served less profiled, per step) and leaves the factor at 1: what a neighbour costs a
// decode step is its weight reads slowed down, the same bytes at every batch (docs/planning.md).
// Profiles calibrated before the penalty existed carry a factor instead.
struct DecodeCalibration {
  double factor = 1.0;
  double penalty_ms = 0;          // may be negative (served faster than profiled)
  double served_step_ms = 0;      // the window's mean served decode forward pass
  double served_interval_ms = 0;  // that plus the cost beyond it (step_overhead_ms; 0: unknown)
  double profiled_step_ms = 0;    // what the profile predicted for those steps, before `factor`
  double batch = 0;               // the window's mean batch and context
  double context = 0;
  // The engine's cost per served step beyond its forward pass (calibration.h): host work inside
  // the step's iteration plus the gap before the next one while work waited. The simulator adds
  // it to every decode and aggregated step; 0 when not calibrated.
  double step_overhead_ms = 0;
  double gap_ms = 0;  // of which the gap between iterations
  int64_t steps = 0;  // decode-only steps in the window, over every worker
  int workers = 0;    // workers that contributed steps
  std::string date;   // UTC, ISO 8601
};

// The same for prefill-only steps: factor multiplies every prefill time the profile predicts.
struct PrefillCalibration {
  double factor = 1.0;
  double served_step_ms = 0;    // the window's mean served prefill forward pass
  double profiled_step_ms = 0;  // what the profile predicted for those steps, before `factor`
  double chunks_per_step = 0;   // the window's mean prompt chunks a step
  double chunk_tokens = 0;      // their mean tokens
  double cached_tokens = 0;     // and mean tokens cached before them
  double step_overhead_ms = 0;  // as DecodeCalibration's, for prefill workers' steps
  int64_t steps = 0;
  int workers = 0;
  std::string date;
};

struct DeviceProfile {
  int version = kProfileVersion;
  std::string model;   // the model directory's name
  std::string device;  // "cpu", "cuda:0"
  std::string host;    // where it was measured (free text)
  std::string date;    // UTC, ISO 8601
  int block_size = 16;
  int64_t kv_capacity_tokens = 0;     // KV cache blocks * block size
  int64_t kv_bytes_per_token = 0;     // all layers, K and V
  int max_num_batched_tokens = 0;     // the engine's step token budget the prefill points used
  std::string transfer_backend;       // "" when no transfer was measured
  int neighbours = 0;                 // runners measuring beside this one (profiler.h)
  std::vector<PrefillPoint> prefill;  // cached_tokens 0 first, by tokens; then hits
  std::vector<PrefillBatchPoint> prefill_batches;  // by prompts; optional in the file
  std::vector<DecodePoint> decode;                 // by (batch, context)
  std::vector<TransferPoint> transfer;             // by tokens
  DecodeCalibration calibration;                   // optional in the file ("calibration")
  PrefillCalibration prefill_calibration;          // optional ("prefill_calibration")

  // Forward time of a prefill chunk of `tokens` uncached tokens after `cached` already in the
  // cache: a whole prompt's cost beyond its first `cached` positions, plus the step's fixed
  // cost (the hit points are measured to check this; docs/planning.md). Times
  // prefill_calibration.factor.
  double PrefillMs(int tokens, int cached = 0) const;
  // The fixed cost of a prefill step (the intercept of the first two uncached points), times
  // prefill_calibration.factor.
  double PrefillFixedMs() const;
  // The same two from the measured points alone.
  double MeasuredPrefillMs(int tokens, int cached = 0) const;
  double MeasuredPrefillFixedMs() const;
  // A step of `prompts` prompt chunks costs the fixed cost plus this times the sum of the chunks'
  // own costs (beyond the fixed cost): 1 for one prompt, and for more what the batched points
  // measured against that sum (wider GEMMs use the device better), interpolated linearly in
  // `prompts` (fractional for a mean) and held past the last point. 1 without batched points.
  // The points are at one prompt length; the efficiency is taken to hold at every length.
  double PrefillBatchEfficiency(double prompts) const;
  // One decode step of `batch` sequences at mean context `context`: calibration.factor times the
  // measured points' time plus calibration.penalty_ms, never below a tenth of the measured time.
  double DecodeStepMs(int batch, int context) const;
  // The same from the measured points alone (what a calibration compares served steps with).
  double MeasuredDecodeStepMs(int batch, int context) const;
  // Moving a `tokens`-token prompt's KV; 0 when no transfer was measured.
  double TransferMs(int tokens) const;
};

std::string ProfileToJson(const DeviceProfile& profile);
absl::StatusOr<DeviceProfile> ProfileFromJson(absl::string_view text);
// ProfileFromJson of a file (at most 16 MiB): NotFound when it cannot be read, InvalidArgument
// naming the file and the problem otherwise.
absl::StatusOr<DeviceProfile> LoadProfile(const std::string& path);

}  // namespace tandem::planning

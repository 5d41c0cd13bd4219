#include "planning/calibration.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem::planning {
namespace {

constexpr size_t kMaxText = 16 << 20;
constexpr absl::string_view kModelLabel = "model_name=\"";

struct Field {
  absl::string_view name;
  double EngineCounters::*member;
};
constexpr std::array<Field, 14> kFields = {{
    {"tandem_engine_decode_steps_total", &EngineCounters::steps},
    {"tandem_engine_decode_forward_seconds_total", &EngineCounters::forward_seconds},
    {"tandem_engine_decode_sequences_total", &EngineCounters::sequences},
    {"tandem_engine_decode_context_tokens_total", &EngineCounters::context_tokens},
    {"tandem_engine_steps_total", &EngineCounters::all_steps},
    {"tandem_engine_forward_seconds_total", &EngineCounters::all_forward_seconds},
    {"tandem_engine_busy_seconds_total", &EngineCounters::busy_seconds},
    {"tandem_engine_backlogged_steps_total", &EngineCounters::backlogged_steps},
    {"tandem_engine_gap_seconds_total", &EngineCounters::gap_seconds},
    {"tandem_engine_prefill_steps_total", &EngineCounters::prefill_steps},
    {"tandem_engine_prefill_forward_seconds_total", &EngineCounters::prefill_forward_seconds},
    {"tandem_engine_prefill_chunks_total", &EngineCounters::prefill_chunks},
    {"tandem_engine_prefill_tokens_total", &EngineCounters::prefill_tokens},
    {"tandem_engine_prefill_cached_tokens_total", &EngineCounters::prefill_cached_tokens},
}};

// The cost per step beyond the forward pass over `windows` (those `counts` says to include):
// host work inside an iteration, over every step, plus the gap after a backlogged step. Returns
// {overhead, gap} in ms.
template <typename Counts>
std::pair<double, double> StepOverheadMs(const std::vector<EngineCounters>& windows,
                                         Counts counts) {
  double host_seconds = 0, steps = 0, gap_seconds = 0, backlogged = 0;
  for (const EngineCounters& w : windows) {
    if (!counts(w)) continue;
    if (w.all_steps >= 1 && w.busy_seconds >= w.all_forward_seconds) {
      host_seconds += w.busy_seconds - w.all_forward_seconds;
      steps += w.all_steps;
    }
    if (w.backlogged_steps >= 1 && w.backlogged_steps <= w.all_steps) {
      gap_seconds += w.gap_seconds;
      backlogged += w.backlogged_steps;
    }
  }
  const double gap = backlogged > 0 ? gap_seconds * 1000.0 / backlogged : 0;
  return {(steps > 0 ? host_seconds * 1000.0 / steps : 0) + gap, gap};
}

absl::Status CheckModel(const DeviceProfile& profile, const EngineCounters& w) {
  if (!w.model_name.empty() && w.model_name != profile.model) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a worker serves model '", w.model_name, "', the profile is of '", profile.model, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Factor(absl::string_view what, double served_ms, double predicted_ms,
                              const CalibrationOptions& options) {
  const double ratio = served_ms / predicted_ms;
  if (!std::isfinite(ratio) || ratio > options.max_factor || ratio < 1 / options.max_factor) {
    return absl::OutOfRangeError(absl::StrCat(
        "served ", what, " steps take ", ratio,
        "x the profile's prediction: a different model, device or engine settings than "
        "profiled?"));
  }
  return ratio;
}

std::string Now() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

}  // namespace

absl::StatusOr<EngineCounters> ParseEngineCounters(absl::string_view text) {
  if (text.size() > kMaxText) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics: ", text.size(), " bytes, more than ", kMaxText));
  }
  EngineCounters c;
  std::array<bool, kFields.size()> seen = {};
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    if (c.model_name.empty() && absl::StartsWith(line, "vllm:")) {
      const size_t at = line.find(kModelLabel);
      if (at != absl::string_view::npos) {
        const absl::string_view rest = line.substr(at + kModelLabel.size());
        c.model_name = std::string(rest.substr(0, rest.find('"')));
      }
      continue;
    }
    for (size_t i = 0; i < kFields.size(); ++i) {
      const Field& f = kFields[i];
      if (!absl::StartsWith(line, f.name)) continue;
      const absl::string_view after = line.substr(f.name.size());
      if (after.empty() || (after.front() != ' ' && after.front() != '{')) continue;  // longer
      if (after.front() == '{') {
        return absl::InvalidArgumentError(absl::StrCat("metrics: ", f.name, " has labels"));
      }
      if (seen[i]) return absl::InvalidArgumentError(absl::StrCat("metrics: ", f.name, " twice"));
      // "name value [timestamp]"
      const std::vector<absl::string_view> parts =
          absl::StrSplit(absl::StripAsciiWhitespace(after), ' ', absl::SkipEmpty());
      double v = 0;
      if (parts.empty() || parts.size() > 2 || !absl::SimpleAtod(parts[0], &v) ||
          !std::isfinite(v) || v < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("metrics: ", f.name, " is not a finite non-negative number"));
      }
      c.*(f.member) = v;
      seen[i] = true;
    }
  }
  for (size_t i = 0; i < kFields.size(); ++i) {
    if (!seen[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics: no ", kFields[i].name,
                       " (not a Tandem worker's /metrics, or one older than calibration)"));
    }
  }
  return c;
}

absl::StatusOr<EngineCounters> CounterWindow(const EngineCounters& before,
                                             const EngineCounters& after) {
  EngineCounters w;
  w.model_name = after.model_name;
  for (const Field& f : kFields) {
    const double d = after.*(f.member) - before.*(f.member);
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics: ", f.name, " went backwards (the worker restarted?)"));
    }
    w.*(f.member) = d;
  }
  return w;
}

absl::StatusOr<DecodeCalibration> CalibrateDecode(const DeviceProfile& profile,
                                                  const std::vector<EngineCounters>& windows,
                                                  const CalibrationOptions& options) {
  DecodeCalibration c;
  double served_ms = 0, predicted_ms = 0, sequences = 0, context = 0;
  const auto decoded = [](const EngineCounters& w) {
    return w.steps >= 1 && w.sequences >= w.steps;
  };
  for (const EngineCounters& w : windows) {
    if (absl::Status s = CheckModel(profile, w); !s.ok()) return s;
    if (!decoded(w)) continue;
    const double batch = w.sequences / w.steps;
    const double ctx = w.context_tokens / w.sequences;
    // What the measured points, uncalibrated, predict for this worker's steps.
    const double step = profile.MeasuredDecodeStepMs(static_cast<int>(std::lround(batch)),
                                                     static_cast<int>(std::lround(ctx)));
    predicted_ms += w.steps * step;
    served_ms += w.forward_seconds * 1000.0;
    c.steps += static_cast<int64_t>(w.steps);
    sequences += w.sequences;
    context += w.context_tokens;
    ++c.workers;
  }
  if (c.steps < options.min_steps || predicted_ms <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the window holds ", c.steps, " decode-only steps, fewer than ",
                     options.min_steps, ": put decode load on the workers for longer"));
  }
  // The ratio is checked (a wrong profile, not load, beyond max_factor), but the correction is
  // additive: a neighbour slows a decode step's weight reads, the same bytes at every batch, so
  // a penalty per step measured at one batch carries to the others where a ratio would not (at
  // batch 1.3 the 2-core VM's served steps were 1.42x the profile's, at batch 16 1.02-1.13x,
  // both about 1-3 ms more; bench/RESULTS.md).
  absl::StatusOr<double> ratio = Factor("decode", served_ms, predicted_ms, options);
  if (!ratio.ok()) return ratio.status();
  c.factor = 1.0;
  c.penalty_ms = (served_ms - predicted_ms) / static_cast<double>(c.steps);
  std::tie(c.step_overhead_ms, c.gap_ms) = StepOverheadMs(windows, decoded);
  c.served_step_ms = served_ms / static_cast<double>(c.steps);
  c.served_interval_ms = c.served_step_ms + c.step_overhead_ms;
  c.profiled_step_ms = predicted_ms / static_cast<double>(c.steps);
  c.batch = sequences / static_cast<double>(c.steps);
  c.context = context / sequences;
  c.date = Now();
  return c;
}

absl::StatusOr<PrefillCalibration> CalibratePrefill(const DeviceProfile& profile,
                                                    const std::vector<EngineCounters>& windows,
                                                    const CalibrationOptions& options) {
  PrefillCalibration c;
  double served_ms = 0, predicted_ms = 0, chunks = 0, tokens = 0, cached = 0;
  const auto prefilled = [](const EngineCounters& w) {
    return w.prefill_steps >= 1 && w.prefill_chunks >= w.prefill_steps &&
           w.prefill_tokens >= w.prefill_chunks;
  };
  const double fixed = profile.MeasuredPrefillFixedMs();
  for (const EngineCounters& w : windows) {
    if (absl::Status s = CheckModel(profile, w); !s.ok()) return s;
    if (!prefilled(w)) continue;
    const double per_step = w.prefill_chunks / w.prefill_steps;
    const int chunk = static_cast<int>(std::lround(w.prefill_tokens / w.prefill_chunks));
    const int before = static_cast<int>(std::lround(w.prefill_cached_tokens / w.prefill_chunks));
    // As the simulator prices a step: the fixed cost once, each chunk's cost beyond it, scaled by
    // the batching efficiency of that many chunks.
    const double step = fixed + profile.PrefillBatchEfficiency(per_step) * per_step *
                                    std::max(0.0, profile.MeasuredPrefillMs(chunk, before) - fixed);
    predicted_ms += w.prefill_steps * step;
    served_ms += w.prefill_forward_seconds * 1000.0;
    c.steps += static_cast<int64_t>(w.prefill_steps);
    chunks += w.prefill_chunks;
    tokens += w.prefill_tokens;
    cached += w.prefill_cached_tokens;
    ++c.workers;
  }
  if (chunks < static_cast<double>(options.min_prefill_chunks) || predicted_ms <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the window holds ", chunks, " prompt chunks in ", c.steps,
                     " prefill-only steps, fewer than ", options.min_prefill_chunks,
                     ": put prompt load on the prefill workers for longer"));
  }
  absl::StatusOr<double> factor = Factor("prefill", served_ms, predicted_ms, options);
  if (!factor.ok()) return factor.status();
  c.factor = *factor;
  c.step_overhead_ms = StepOverheadMs(windows, prefilled).first;
  c.served_step_ms = served_ms / static_cast<double>(c.steps);
  c.profiled_step_ms = predicted_ms / static_cast<double>(c.steps);
  c.chunks_per_step = chunks / static_cast<double>(c.steps);
  c.chunk_tokens = tokens / chunks;
  c.cached_tokens = cached / chunks;
  c.date = Now();
  return c;
}

}  // namespace tandem::planning

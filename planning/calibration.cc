#include "planning/calibration.h"

#include <algorithm>
#include <array>
#include <cmath>
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
  double DecodeCounters::*member;
};
constexpr std::array<Field, 7> kFields = {{
    {"tandem_engine_decode_steps_total", &DecodeCounters::steps},
    {"tandem_engine_decode_forward_seconds_total", &DecodeCounters::forward_seconds},
    {"tandem_engine_decode_sequences_total", &DecodeCounters::sequences},
    {"tandem_engine_decode_context_tokens_total", &DecodeCounters::context_tokens},
    {"tandem_engine_steps_total", &DecodeCounters::all_steps},
    {"tandem_engine_forward_seconds_total", &DecodeCounters::all_forward_seconds},
    {"tandem_engine_busy_seconds_total", &DecodeCounters::busy_seconds},
}};

}  // namespace

absl::StatusOr<DecodeCounters> ParseDecodeCounters(absl::string_view text) {
  if (text.size() > kMaxText) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics: ", text.size(), " bytes, more than ", kMaxText));
  }
  DecodeCounters c;
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
                       " (not a Tandem decode or aggregated worker's /metrics, or one older "
                       "than calibration)"));
    }
  }
  return c;
}

absl::StatusOr<DecodeCounters> CounterWindow(const DecodeCounters& before,
                                             const DecodeCounters& after) {
  DecodeCounters w;
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
                                                  const std::vector<DecodeCounters>& windows,
                                                  const CalibrationOptions& options) {
  DecodeCalibration c;
  double served_ms = 0, predicted_ms = 0, sequences = 0, context = 0;
  double host_seconds = 0, all_steps = 0;
  double interval_ms = 0;  // wall time of the decode-only steps, where every window has one
  bool have_wall = !windows.empty();
  for (const DecodeCounters& w : windows) {
    if (!w.model_name.empty() && w.model_name != profile.model) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a worker serves model '", w.model_name, "', the profile is of '", profile.model, "'"));
    }
    if (w.steps < 1 || w.sequences < w.steps) continue;
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
    // Host work per step, over every step of the window (busy covers the forward pass).
    if (w.all_steps >= w.steps && w.busy_seconds >= w.all_forward_seconds) {
      host_seconds += w.busy_seconds - w.all_forward_seconds;
      all_steps += w.all_steps;
    }
    // The decode-only steps' share of the window's wall time: their served interval.
    if (w.wall_seconds > 0 && w.all_steps >= w.steps) {
      interval_ms += w.wall_seconds * 1000.0 * (w.steps / w.all_steps);
    } else {
      have_wall = false;
    }
    ++c.workers;
  }
  if (c.steps < options.min_steps || predicted_ms <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the window holds ", c.steps, " decode-only steps, fewer than ",
                     options.min_steps, ": put decode load on the workers for longer"));
  }
  const double overhead_ms = all_steps > 0 ? host_seconds * 1000.0 / all_steps : 0;
  // The simulator adds the host work to each step itself: the factor covers the rest.
  const double served_basis =
      have_wall ? std::max(interval_ms - overhead_ms * static_cast<double>(c.steps), served_ms)
                : served_ms;
  const double ratio = served_basis / predicted_ms;
  if (!std::isfinite(ratio) || ratio > options.max_factor || ratio < 1 / options.max_factor) {
    return absl::OutOfRangeError(absl::StrCat(
        "served decode steps take ", ratio,
        "x the profile's prediction: a different model, device or engine settings than "
        "profiled?"));
  }
  c.factor = ratio;
  c.served_step_ms = served_ms / static_cast<double>(c.steps);
  c.profiled_step_ms = predicted_ms / static_cast<double>(c.steps);
  c.batch = sequences / static_cast<double>(c.steps);
  c.context = context / sequences;
  c.step_overhead_ms = overhead_ms;
  c.served_interval_ms = have_wall ? interval_ms / static_cast<double>(c.steps) : 0;
  c.date = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  return c;
}

}  // namespace tandem::planning

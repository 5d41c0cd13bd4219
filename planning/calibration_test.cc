// Calibration: the /metrics parser (untrusted text), counter windows, the decode and prefill
// calibrations against a profile whose answer is known, and the calibrated profile's file round
// trip.
#include "planning/calibration.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planning/profile.h"

namespace tandem::planning {
namespace {

using ::testing::HasSubstr;

// Decode: 2 ms + 0.1 ms per sequence + 0.001 ms per context token (linear, so the profile's
// interpolation is exact at any point).
DeviceProfile Linear() {
  DeviceProfile p;
  p.model = "target";
  p.device = "cpu";
  p.kv_capacity_tokens = 1 << 20;
  p.kv_bytes_per_token = 1024;
  p.max_num_batched_tokens = 512;
  for (int t : {16, 1024}) p.prefill.push_back({t, 0, 1 + 0.01 * t});
  for (int b : {1, 64}) {
    for (int c : {0, 1024}) p.decode.push_back({b, c, 2 + 0.1 * b + 0.001 * c});
  }
  return p;
}

double LinearStepMs(int batch, int context) { return 2 + 0.1 * batch + 0.001 * context; }

std::string Exposition(double steps, double seconds, double sequences, double context) {
  return "# HELP tandem_engine_decode_steps_total Engine steps that only decoded\n"
         "# TYPE tandem_engine_decode_steps_total counter\n"
         "tandem_engine_decode_steps_total " +
         std::to_string(steps) + "\n" +
         "tandem_engine_decode_steps_total_bogus_suffix 99\n"
         "tandem_engine_decode_forward_seconds_total " +
         std::to_string(seconds) + "\n" + "tandem_engine_decode_sequences_total " +
         std::to_string(sequences) + "\n" + "tandem_engine_decode_context_tokens_total " +
         std::to_string(context) + "\n" + "tandem_engine_steps_total " + std::to_string(steps + 2) +
         "\n" + "tandem_engine_forward_seconds_total " + std::to_string(seconds + 0.25) + "\n" +
         "tandem_engine_busy_seconds_total " + std::to_string(seconds + 0.25 + 0.12) + "\n" +
         "tandem_engine_backlogged_steps_total " + std::to_string(steps) + "\n" +
         "tandem_engine_gap_seconds_total 0.03\n"
         "tandem_engine_prefill_steps_total 2\n"
         "tandem_engine_prefill_forward_seconds_total 0.25\n"
         "tandem_engine_prefill_chunks_total 3\n"
         "tandem_engine_prefill_tokens_total 300\n"
         "tandem_engine_prefill_cached_tokens_total 64\n"
         "vllm:num_requests_running{model_name=\"target\"} 3\n";
}

// A worker's window: `steps` steps of `batch` sequences at `context`, each served `factor` times
// the profile's step.
EngineCounters Window(double steps, int batch, int context, double factor) {
  EngineCounters w;
  w.steps = steps;
  w.sequences = steps * batch;
  w.context_tokens = w.sequences * context;
  w.forward_seconds = steps * factor * LinearStepMs(batch, context) / 1000.0;
  // Every step a decode step, each with 1.5 ms of host work around its forward pass.
  w.all_steps = steps;
  w.all_forward_seconds = w.forward_seconds;
  w.busy_seconds = w.forward_seconds + steps * 1.5 / 1000.0;
  return w;
}

// A prefill worker's window: `steps` steps of `chunks` prompt chunks of `tokens` tokens after
// `cached` cached ones, served `factor` times the profile's step, 2 ms of host work a step and
// a 4 ms gap after half of them.
EngineCounters PrefillWindow(double steps, int chunks, int tokens, int cached, double factor) {
  const DeviceProfile p = Linear();
  const double fixed = p.MeasuredPrefillFixedMs();
  const double step = fixed + chunks * (p.MeasuredPrefillMs(tokens, cached) - fixed);
  EngineCounters w;
  w.prefill_steps = steps;
  w.prefill_chunks = steps * chunks;
  w.prefill_tokens = w.prefill_chunks * tokens;
  w.prefill_cached_tokens = w.prefill_chunks * cached;
  w.prefill_forward_seconds = steps * factor * step / 1000.0;
  w.all_steps = steps;
  w.all_forward_seconds = w.prefill_forward_seconds;
  w.busy_seconds = w.all_forward_seconds + steps * 2 / 1000.0;
  w.backlogged_steps = steps / 2;
  w.gap_seconds = w.backlogged_steps * 4 / 1000.0;
  return w;
}

TEST(CalibrationTest, ParsesTheEngineCountersOfAWorker) {
  absl::StatusOr<EngineCounters> c = ParseEngineCounters(Exposition(10, 0.5, 200, 32000));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->steps, 10);
  EXPECT_EQ(c->forward_seconds, 0.5);
  EXPECT_EQ(c->sequences, 200);
  EXPECT_EQ(c->context_tokens, 32000);
  EXPECT_EQ(c->all_steps, 12);
  EXPECT_EQ(c->all_forward_seconds, 0.75);
  EXPECT_NEAR(c->busy_seconds, 0.87, 1e-9);
  EXPECT_EQ(c->backlogged_steps, 10);
  EXPECT_EQ(c->gap_seconds, 0.03);
  EXPECT_EQ(c->prefill_steps, 2);
  EXPECT_EQ(c->prefill_forward_seconds, 0.25);
  EXPECT_EQ(c->prefill_chunks, 3);
  EXPECT_EQ(c->prefill_tokens, 300);
  EXPECT_EQ(c->prefill_cached_tokens, 64);
  EXPECT_EQ(c->model_name, "target");
}

TEST(CalibrationTest, BadMetricsTextIsANamedError) {
  const std::string good = Exposition(10, 0.5, 200, 32000);
  const auto error = [](const std::string& text) {
    absl::StatusOr<EngineCounters> c = ParseEngineCounters(text);
    return c.ok() ? std::string("accepted") : std::string(c.status().message());
  };
  EXPECT_THAT(error("tandem_engine_steps_total 4\n"),
              HasSubstr("no tandem_engine_decode_steps_total"));
  {
    // A worker older than the busy counter: named.
    std::string old_worker = good;
    old_worker.erase(old_worker.find("tandem_engine_busy_seconds_total"));
    EXPECT_THAT(error(old_worker), HasSubstr("no tandem_engine_busy_seconds_total"));
    // Or than the prefill and gap counters.
    old_worker = good;
    old_worker.erase(old_worker.find("tandem_engine_prefill_cached_tokens_total"),
                     std::string("tandem_engine_prefill_cached_tokens_total 64\n").size());
    EXPECT_THAT(error(old_worker), HasSubstr("no tandem_engine_prefill_cached_tokens_total"));
  }
  EXPECT_THAT(error(good + "tandem_engine_decode_steps_total 11\n"), HasSubstr("twice"));
  EXPECT_THAT(error(good + "tandem_engine_decode_sequences_total{x=\"1\"} 1\n"),
              HasSubstr("has labels"));
  for (const char* v : {"-1", "nan", "inf", "abc", "1 2 3"}) {
    std::string text = good;
    const std::string line = "tandem_engine_decode_forward_seconds_total 0.500000";
    text.replace(text.find(line), line.size(),
                 std::string("tandem_engine_decode_forward_seconds_total ") + v);
    EXPECT_THAT(error(text), HasSubstr("not a finite non-negative number")) << v;
  }
  EXPECT_THAT(error(std::string((16 << 20) + 1, '#')), HasSubstr("more than"));
  // A timestamp after the value is Prometheus' format and fine.
  std::string stamped = good;
  stamped.replace(stamped.find("200.000000"), 10, "200 1733550000000");
  EXPECT_EQ(error(stamped).find("accepted"), 0u) << error(stamped);
}

TEST(CalibrationTest, ACounterGoingBackwardsIsARestart) {
  EngineCounters before = Window(100, 8, 100, 1), after = Window(50, 8, 100, 1);
  absl::StatusOr<EngineCounters> w = CounterWindow(before, after);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("went backwards"));
  w = CounterWindow(after, before);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->steps, 50);
}

TEST(CalibrationTest, TheDecodePenaltyIsServedLessProfiledPerStep) {
  const DeviceProfile p = Linear();
  // Two workers at different batches, one served 1.1x the profile over 300 steps, one 2 ms a
  // step slower over 100: the penalty is their mean difference per step.
  EngineCounters slow = Window(100, 32, 500, 1.0);
  slow.forward_seconds += 100 * 2.0 / 1000.0;
  absl::StatusOr<DecodeCalibration> c =
      CalibrateDecode(p, {Window(300, 8, 200, 1.1), slow, EngineCounters{}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->factor, 1.0);
  EXPECT_NEAR(c->penalty_ms, (300 * 0.1 * LinearStepMs(8, 200) + 100 * 2.0) / 400, 1e-9);
  EXPECT_EQ(c->steps, 400);
  EXPECT_EQ(c->workers, 2);  // the idle one contributes nothing
  EXPECT_NEAR(c->batch, (300 * 8 + 100 * 32) / 400.0, 1e-9);
  EXPECT_NEAR(c->served_step_ms - c->profiled_step_ms, c->penalty_ms, 1e-9);
  EXPECT_NEAR(c->step_overhead_ms, 1.5, 1e-9);  // busy less forward, per step

  // The calibrated profile adds the penalty to every batch's step (the same bytes of weights
  // slowed at every batch); calibrating it again replaces the penalty.
  DeviceProfile calibrated = p;
  calibrated.calibration = *c;
  for (int b : {1, 16, 64}) {
    EXPECT_NEAR(calibrated.DecodeStepMs(b, 300), LinearStepMs(b, 300) + c->penalty_ms, 1e-9);
  }
  absl::StatusOr<DecodeCalibration> again =
      CalibrateDecode(calibrated, {Window(400, 16, 300, 1.21)});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NEAR(again->penalty_ms, 0.21 * LinearStepMs(16, 300), 1e-9);
  EXPECT_NEAR(again->profiled_step_ms, LinearStepMs(16, 300), 1e-9);  // before any penalty
  // Served faster than profiled: a negative penalty, never below a tenth of a step.
  calibrated.calibration.penalty_ms = -100;
  EXPECT_NEAR(calibrated.DecodeStepMs(1, 0), 0.1 * LinearStepMs(1, 0), 1e-9);
  // A profile calibrated with a factor (before the penalty) still scales by it.
  calibrated.calibration.penalty_ms = 0;
  calibrated.calibration.factor = 1.5;
  EXPECT_NEAR(calibrated.DecodeStepMs(8, 100), 1.5 * LinearStepMs(8, 100), 1e-9);
}

TEST(CalibrationTest, TheGapBetweenBackloggedStepsIsPartOfTheStepOverhead) {
  const DeviceProfile p = Linear();
  // Forward passes 1.0x the profile, 1.5 ms of host work in each iteration, and after 600 of
  // the 900 steps the engine went on with work waiting, 9 ms later on average (off the CPU).
  EngineCounters w = Window(900, 16, 300, 1.0);
  w.backlogged_steps = 600;
  w.gap_seconds = 600 * 9 / 1000.0;
  absl::StatusOr<DecodeCalibration> c = CalibrateDecode(p, {w});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->penalty_ms, 0, 1e-9);
  EXPECT_NEAR(c->gap_ms, 9, 1e-9);
  EXPECT_NEAR(c->step_overhead_ms, 1.5 + 9, 1e-9);
  const double step_ms = LinearStepMs(16, 300);
  EXPECT_NEAR(c->served_interval_ms, step_ms + 10.5, 1e-9);
  // A prefill worker in the same windows changes neither the decode factor nor its overhead.
  c = CalibrateDecode(p, {w, PrefillWindow(100, 2, 128, 0, 1.3)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->penalty_ms, 0, 1e-9);
  EXPECT_NEAR(c->step_overhead_ms, 10.5, 1e-9);
  EXPECT_EQ(c->workers, 1);
  // More backlogged steps than steps (a forged or broken exposition) add no gap.
  w.backlogged_steps = 5000;
  c = CalibrateDecode(p, {w});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->step_overhead_ms, 1.5, 1e-9);
}

TEST(CalibrationTest, ThePrefillFactorIsServedOverTheProfilesStepAtTheMeanChunk) {
  const DeviceProfile p = Linear();
  // Two prefill workers, one at two 128-token chunks a step, one at one 300-token chunk after
  // 200 cached, both served 1.4x: the factor is 1.4. A decode worker beside them is skipped.
  absl::StatusOr<PrefillCalibration> c =
      CalibratePrefill(p, {PrefillWindow(60, 2, 128, 0, 1.4), PrefillWindow(40, 1, 300, 200, 1.4),
                           Window(500, 8, 100, 1)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->factor, 1.4, 1e-9);
  EXPECT_EQ(c->steps, 100);
  EXPECT_EQ(c->workers, 2);
  EXPECT_NEAR(c->chunks_per_step, (60 * 2 + 40) / 100.0, 1e-9);
  EXPECT_NEAR(c->chunk_tokens, (120 * 128 + 40 * 300) / 160.0, 1e-9);
  EXPECT_NEAR(c->cached_tokens, 40 * 200 / 160.0, 1e-9);
  EXPECT_NEAR(c->served_step_ms / c->profiled_step_ms, 1.4, 1e-9);
  EXPECT_NEAR(c->step_overhead_ms, 2 + 4, 1e-9);  // host work, plus the mean gap
  // The calibrated profile's prefill lookups carry the factor; the measured ones do not.
  DeviceProfile calibrated = p;
  calibrated.prefill_calibration = *c;
  EXPECT_NEAR(calibrated.PrefillMs(300, 200), 1.4 * p.PrefillMs(300, 200), 1e-9);
  EXPECT_NEAR(calibrated.PrefillFixedMs(), 1.4 * p.PrefillFixedMs(), 1e-9);
  EXPECT_NEAR(calibrated.MeasuredPrefillMs(300, 200), p.PrefillMs(300, 200), 1e-9);
  // Calibrating again replaces the factor.
  absl::StatusOr<PrefillCalibration> again =
      CalibratePrefill(calibrated, {PrefillWindow(80, 1, 64, 0, 0.9)});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NEAR(again->factor, 0.9, 1e-9);
  // Too few prefill steps, or a wildly different served step, are errors.
  EXPECT_EQ(CalibratePrefill(p, {PrefillWindow(49, 1, 64, 0, 1)}).status().code(),
            absl::StatusCode::kFailedPrecondition);                         // 49 chunks
  EXPECT_TRUE(CalibratePrefill(p, {PrefillWindow(5, 10, 64, 0, 1)}).ok());  // 50 in 5 steps
  EXPECT_EQ(CalibratePrefill(p, {Window(500, 8, 100, 1)}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CalibratePrefill(p, {PrefillWindow(80, 1, 64, 0, 4.5)}).status().code(),
            absl::StatusCode::kOutOfRange);
  EngineCounters broken = PrefillWindow(80, 1, 64, 0, 1);
  broken.prefill_tokens = 1;  // fewer tokens than chunks: skipped, not divided into
  EXPECT_EQ(CalibratePrefill(p, {broken}).status().code(), absl::StatusCode::kFailedPrecondition);
}

// With batched prefill points, a window of several chunks a step is priced with their
// efficiency: served at 1.2x that price is a factor of 1.2.
TEST(CalibrationTest, ThePrefillPriceOfAWindowUsesTheBatchingEfficiency) {
  DeviceProfile p = Linear();
  const double fixed = p.MeasuredPrefillFixedMs();
  const double one = p.MeasuredPrefillMs(128) - fixed;
  p.prefill_batches = {{4, 128, fixed + 4 * 0.7 * one}};
  const double step = fixed + 0.7 * 4 * one;
  EngineCounters w;
  w.prefill_steps = 30;
  w.prefill_chunks = 120;
  w.prefill_tokens = 120 * 128;
  w.prefill_forward_seconds = 30 * 1.2 * step / 1000.0;
  w.all_steps = 30;
  w.all_forward_seconds = w.prefill_forward_seconds;
  w.busy_seconds = w.all_forward_seconds;
  absl::StatusOr<PrefillCalibration> c = CalibratePrefill(p, {w});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->factor, 1.2, 1e-9);
  EXPECT_NEAR(c->profiled_step_ms, step, 1e-9);
}

TEST(CalibrationTest, WindowsThatCannotCalibrateAreErrors) {
  const DeviceProfile p = Linear();
  absl::StatusOr<DecodeCalibration> c = CalibrateDecode(p, {Window(150, 8, 100, 1)});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("150 decode-only steps"));
  c = CalibrateDecode(p, {Window(1000, 8, 100, 5.0)});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kOutOfRange);
  c = CalibrateDecode(p, {Window(1000, 8, 100, 0.2)});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kOutOfRange);
  EngineCounters other = Window(1000, 8, 100, 1);
  other.model_name = "llama";
  c = CalibrateDecode(p, {other});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("'llama'"));
}

TEST(CalibrationTest, CalibratedProfilesRoundTripAndBadCalibrationsAreRefused) {
  DeviceProfile p = Linear();
  absl::StatusOr<DecodeCalibration> c = CalibrateDecode(p, {Window(400, 8, 100, 1.25)});
  ASSERT_TRUE(c.ok()) << c.status();
  p.calibration = *c;
  absl::StatusOr<DeviceProfile> back = ProfileFromJson(ProfileToJson(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ProfileToJson(*back), ProfileToJson(p));
  EXPECT_NEAR(back->DecodeStepMs(8, 100), 1.25 * LinearStepMs(8, 100), 1e-9);
  EXPECT_NEAR(back->calibration.penalty_ms, 0.25 * LinearStepMs(8, 100), 1e-9);
  // An uncalibrated profile writes no calibration and reads back with factor 1.
  EXPECT_EQ(ProfileToJson(Linear()).find("calibration"), std::string::npos);

  const auto error = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(ProfileToJson(p));
    edit(j["calibration"]);
    absl::StatusOr<DeviceProfile> q = ProfileFromJson(j.dump());
    return q.ok() ? std::string("accepted") : std::string(q.status().message());
  };
  EXPECT_THAT(error([](auto& j) { j["factor"] = -1; }), HasSubstr("'factor'"));
  EXPECT_THAT(error([](auto& j) { j["factor"] = 1001; }), HasSubstr("'factor'"));
  EXPECT_THAT(error([](auto& j) { j["factor"] = "1.1"; }), HasSubstr("'factor'"));
  EXPECT_THAT(error([](auto& j) { j["penalty_ms"] = "2"; }), HasSubstr("'penalty_ms'"));
  EXPECT_THAT(error([](auto& j) { j["penalty_ms"] = 1e9; }), HasSubstr("'penalty_ms'"));
  EXPECT_EQ(error([](auto& j) { j["penalty_ms"] = -3.5; }), "accepted");
  EXPECT_EQ(error([](auto& j) { j.erase("penalty_ms"); }), "accepted");  // calibrated before it
  EXPECT_THAT(error([](auto& j) { j["steps"] = 0; }), HasSubstr("'steps'"));
  EXPECT_THAT(error([](auto& j) { j["context"] = -3; }), HasSubstr("'context'"));
  EXPECT_THAT(error([](auto& j) { j["extra"] = 1; }), HasSubstr("unknown field 'extra'"));
  EXPECT_THAT(error([](auto& j) { j["step_overhead_ms"] = -1; }), HasSubstr("'step_overhead_ms'"));
  EXPECT_THAT(error([](auto& j) { j["served_interval_ms"] = "x"; }),
              HasSubstr("'served_interval_ms'"));
  // Calibrated before the overhead was measured: it reads as 0.
  EXPECT_EQ(error([](auto& j) { j.erase("step_overhead_ms"); }), "accepted");
  EXPECT_EQ(error([](auto& j) { j.erase("gap_ms"); }), "accepted");
  EXPECT_THAT(error([](auto& j) { j.erase("date"); }), HasSubstr("'date'"));
}

TEST(CalibrationTest, PrefillCalibrationsRoundTripAndBadOnesAreRefused) {
  DeviceProfile p = Linear();
  absl::StatusOr<PrefillCalibration> c = CalibratePrefill(p, {PrefillWindow(80, 2, 64, 0, 1.3)});
  ASSERT_TRUE(c.ok()) << c.status();
  p.prefill_calibration = *c;
  absl::StatusOr<DeviceProfile> back = ProfileFromJson(ProfileToJson(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ProfileToJson(*back), ProfileToJson(p));
  EXPECT_NEAR(back->PrefillMs(64), 1.3 * Linear().PrefillMs(64), 1e-9);
  EXPECT_EQ(back->calibration.steps, 0);  // decode stays uncalibrated
  EXPECT_EQ(ProfileToJson(Linear()).find("prefill_calibration"), std::string::npos);

  const auto error = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(ProfileToJson(p));
    edit(j["prefill_calibration"]);
    absl::StatusOr<DeviceProfile> q = ProfileFromJson(j.dump());
    return q.ok() ? std::string("accepted") : std::string(q.status().message());
  };
  EXPECT_THAT(error([](auto& j) { j["factor"] = 0; }), HasSubstr("prefill_calibration"));
  EXPECT_THAT(error([](auto& j) { j["factor"] = 1e9; }), HasSubstr("'factor'"));
  EXPECT_THAT(error([](auto& j) { j["chunk_tokens"] = -5; }), HasSubstr("'chunk_tokens'"));
  EXPECT_THAT(error([](auto& j) { j["cached_tokens"] = "none"; }), HasSubstr("'cached_tokens'"));
  EXPECT_THAT(error([](auto& j) { j.erase("step_overhead_ms"); }), HasSubstr("'step_overhead_ms'"));
  EXPECT_THAT(error([](auto& j) { j["workers"] = 0; }), HasSubstr("'workers'"));
  EXPECT_THAT(error([](auto& j) { j["batch"] = 3; }), HasSubstr("unknown field 'batch'"));
  EXPECT_THAT(error([](auto& j) { j = 7; }), HasSubstr("prefill_calibration"));
}

}  // namespace
}  // namespace tandem::planning

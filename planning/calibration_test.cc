// Calibration: the /metrics parser (untrusted text), counter windows, the decode factor against a
// profile whose answer is known, and the calibrated profile's file round trip.
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
         "vllm:num_requests_running{model_name=\"target\"} 3\n";
}

// A worker's window: `steps` steps of `batch` sequences at `context`, each served `factor` times
// the profile's step.
DecodeCounters Window(double steps, int batch, int context, double factor) {
  DecodeCounters w;
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

TEST(CalibrationTest, ParsesTheDecodeCountersOfAWorker) {
  absl::StatusOr<DecodeCounters> c = ParseDecodeCounters(Exposition(10, 0.5, 200, 32000));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->steps, 10);
  EXPECT_EQ(c->forward_seconds, 0.5);
  EXPECT_EQ(c->sequences, 200);
  EXPECT_EQ(c->context_tokens, 32000);
  EXPECT_EQ(c->all_steps, 12);
  EXPECT_EQ(c->all_forward_seconds, 0.75);
  EXPECT_NEAR(c->busy_seconds, 0.87, 1e-9);
  EXPECT_EQ(c->model_name, "target");
}

TEST(CalibrationTest, BadMetricsTextIsANamedError) {
  const std::string good = Exposition(10, 0.5, 200, 32000);
  const auto error = [](const std::string& text) {
    absl::StatusOr<DecodeCounters> c = ParseDecodeCounters(text);
    return c.ok() ? std::string("accepted") : std::string(c.status().message());
  };
  EXPECT_THAT(error("tandem_engine_steps_total 4\n"),
              HasSubstr("no tandem_engine_decode_steps_total"));
  {
    // A worker older than the busy counter: named.
    std::string old_worker = good;
    old_worker.erase(old_worker.find("tandem_engine_busy_seconds_total"));
    EXPECT_THAT(error(old_worker), HasSubstr("no tandem_engine_busy_seconds_total"));
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
  DecodeCounters before = Window(100, 8, 100, 1), after = Window(50, 8, 100, 1);
  absl::StatusOr<DecodeCounters> w = CounterWindow(before, after);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("went backwards"));
  w = CounterWindow(after, before);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->steps, 50);
}

TEST(CalibrationTest, TheFactorIsServedOverProfiledWeightedBySteps) {
  const DeviceProfile p = Linear();
  // Two workers at different batches, both served 1.1x the profile: the factor is 1.1 whatever
  // their share of the steps.
  absl::StatusOr<DecodeCalibration> c =
      CalibrateDecode(p, {Window(300, 8, 200, 1.1), Window(100, 32, 500, 1.1), DecodeCounters{}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->factor, 1.1, 1e-9);
  EXPECT_EQ(c->steps, 400);
  EXPECT_EQ(c->workers, 2);  // the idle one contributes nothing
  EXPECT_NEAR(c->batch, (300 * 8 + 100 * 32) / 400.0, 1e-9);
  EXPECT_NEAR(c->served_step_ms / c->profiled_step_ms, 1.1, 1e-9);
  EXPECT_NEAR(c->step_overhead_ms, 1.5, 1e-9);  // busy less forward, per step
  // One worker 1.2x over 100 steps, one 1.0x over 100 steps at the same point: 1.1.
  c = CalibrateDecode(p, {Window(100, 16, 300, 1.2), Window(100, 16, 300, 1.0)},
                      CalibrationOptions{.min_steps = 200});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->factor, 1.1, 1e-9);

  // The calibrated profile predicts the served steps; calibrating it again replaces the factor.
  DeviceProfile calibrated = p;
  calibrated.calibration = *c;
  EXPECT_NEAR(calibrated.DecodeStepMs(16, 300), 1.1 * LinearStepMs(16, 300), 1e-9);
  absl::StatusOr<DecodeCalibration> again =
      CalibrateDecode(calibrated, {Window(400, 16, 300, 1.21)});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NEAR(again->factor, 1.21, 1e-9);
  EXPECT_NEAR(again->profiled_step_ms, LinearStepMs(16, 300), 1e-9);  // before any factor
}

TEST(CalibrationTest, WithAWallTimeTheFactorIsTheServedStepInterval) {
  const DeviceProfile p = Linear();
  // Forward passes 1.0x the profile, but the worker's decode steps took 1.6x their forward
  // time of wall clock (the engine lost time outside its steps), and 10% of its steps were not
  // decode-only.
  DecodeCounters w = Window(900, 16, 300, 1.0);
  w.all_steps = 1000;
  const double step_ms = LinearStepMs(16, 300);
  w.wall_seconds = 1000 * 1.6 * step_ms / 1000.0;
  absl::StatusOr<DecodeCalibration> c = CalibrateDecode(p, {w});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->served_interval_ms, 1.6 * step_ms, 1e-9);
  // factor * profile + host work = the interval.
  EXPECT_NEAR(c->factor * step_ms + c->step_overhead_ms, 1.6 * step_ms, 1e-6);
  EXPECT_NEAR(c->step_overhead_ms, 1.35, 1e-9);  // 900 steps of 1.5 ms over 1,000 steps
  EXPECT_NEAR(c->served_step_ms, step_ms, 1e-9);
  // An interval shorter than the forward passes (a window clock gone wrong) is not believed.
  w.wall_seconds = 0.1;
  c = CalibrateDecode(p, {w});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->factor, 1.0, 1e-9);
  // Without a wall time: the forward passes, as before.
  w.wall_seconds = 0;
  c = CalibrateDecode(p, {w});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->factor, 1.0, 1e-9);
  EXPECT_EQ(c->served_interval_ms, 0);
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
  DecodeCounters other = Window(1000, 8, 100, 1);
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
  EXPECT_THAT(error([](auto& j) { j["steps"] = 0; }), HasSubstr("'steps'"));
  EXPECT_THAT(error([](auto& j) { j["context"] = -3; }), HasSubstr("'context'"));
  EXPECT_THAT(error([](auto& j) { j["extra"] = 1; }), HasSubstr("unknown field 'extra'"));
  EXPECT_THAT(error([](auto& j) { j["step_overhead_ms"] = -1; }), HasSubstr("'step_overhead_ms'"));
  EXPECT_THAT(error([](auto& j) { j["served_interval_ms"] = "x"; }),
              HasSubstr("'served_interval_ms'"));
  // Calibrated before the overhead was measured: it reads as 0.
  EXPECT_EQ(error([](auto& j) { j.erase("step_overhead_ms"); }), "accepted");
  EXPECT_THAT(error([](auto& j) { j.erase("date"); }), HasSubstr("'date'"));
}

}  // namespace
}  // namespace tandem::planning

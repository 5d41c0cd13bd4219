// The planning model: profile files (round trip, every field checked), the lookups, the
// simulator against queueing theory (M/D/1's mean wait, the decode batch bounded by KV capacity),
// and the planner's choices on workloads whose answer is known.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planning/online_planner.h"
#include "planning/planner.h"
#include "planning/profile.h"
#include "planning/simulator.h"

namespace tandem::planning {
namespace {

using ::testing::HasSubstr;

// Prefill: 1 ms + 0.01 ms per token; decode: 2 ms + 0.1 ms per sequence + 0.001 ms per context
// token; transfer: 0.002 ms per token.
DeviceProfile Linear(int64_t capacity = 1 << 20) {
  DeviceProfile p;
  p.model = std::string("linear");
  p.device = std::string("cpu");
  p.block_size = 16;
  p.kv_capacity_tokens = capacity;
  p.kv_bytes_per_token = 1024;
  p.max_num_batched_tokens = 512;
  for (int t : {16, 128, 1024}) p.prefill.push_back({t, 0, 1 + 0.01 * t});
  for (int b : {1, 8, 64}) {
    for (int c : {0, 1024}) p.decode.push_back({b, c, 2 + 0.1 * b + 0.001 * c});
  }
  p.transfer_backend = "loopback";
  for (int t : {16, 1024}) p.transfer.push_back({t, t * 1024, 0.002 * t});
  return p;
}

TEST(ProfileTest, JsonRoundTripsAndLookupsInterpolate) {
  const DeviceProfile p = Linear();
  absl::StatusOr<DeviceProfile> back = ProfileFromJson(ProfileToJson(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ProfileToJson(*back), ProfileToJson(p));
  EXPECT_NEAR(back->PrefillMs(512), 1 + 5.12, 1e-9);
  EXPECT_NEAR(back->PrefillMs(2048), 1 + 20.48, 1e-9);  // extrapolated from the last segment
  EXPECT_NEAR(back->PrefillMs(1), 1.16, 1e-9);          // never below the smallest point
  EXPECT_NEAR(back->PrefillMs(256, 256), 1 + 0.01 * 256, 1e-9);  // the fixed cost stays
  EXPECT_NEAR(back->DecodeStepMs(4, 512), 2 + 0.4 + 0.512, 1e-9);
  EXPECT_NEAR(back->DecodeStepMs(128, 2048), 2 + 12.8 + 2.048, 1e-9);
  EXPECT_NEAR(back->TransferMs(512), 1.024, 1e-9);
}

TEST(ProfileTest, BadFilesAreNamedErrors) {
  const auto error = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(ProfileToJson(Linear()));
    edit(j);
    absl::StatusOr<DeviceProfile> p = ProfileFromJson(j.dump());
    return p.ok() ? std::string("accepted") : std::string(p.status().message());
  };
  EXPECT_THAT(std::string(ProfileFromJson("{").status().message()), HasSubstr("not valid JSON"));
  EXPECT_THAT(error([](auto& j) { j["extra"] = 1; }), HasSubstr("unknown field 'extra'"));
  EXPECT_THAT(error([](auto& j) { j["version"] = 2; }), HasSubstr("'version'"));
  EXPECT_THAT(error([](auto& j) { j.erase("model"); }), HasSubstr("'model' is missing"));
  EXPECT_THAT(error([](auto& j) { j["kv_capacity_tokens"] = -5; }), HasSubstr("outside"));
  EXPECT_THAT(error([](auto& j) { j["prefill"][1]["ms"] = -1; }), HasSubstr("prefill[1]"));
  EXPECT_THAT(error([](auto& j) { j["prefill"][1]["ms"] = "fast"; }), HasSubstr("'ms'"));
  EXPECT_THAT(error([](auto& j) { std::swap(j["prefill"][0], j["prefill"][1]); }),
              HasSubstr("sorted"));
  EXPECT_THAT(error([](auto& j) {
                j["prefill"].erase(1);
                j["prefill"].erase(1);
              }),
              HasSubstr("at least two"));
  EXPECT_THAT(error([](auto& j) { j["decode"].erase(3); }), HasSubstr("full grid"));
  EXPECT_THAT(error([](auto& j) { j["decode"][2]["context"] = 5; }), HasSubstr("decode[2]"));
  EXPECT_THAT(error([](auto& j) { j["transfer_backend"] = ""; }), HasSubstr("transfer_backend"));
  EXPECT_THAT(error([](auto& j) { j["prefill"][0]["tokens"] = 1.5; }), HasSubstr("integer"));
  EXPECT_EQ(error([](auto&) {}), "accepted");
  // From a file: missing is NotFound, a bad one names the file.
  EXPECT_EQ(LoadProfile(::testing::TempDir() + "/no-such-profile.json").status().code(),
            absl::StatusCode::kNotFound);
  const std::string bad = ::testing::TempDir() + "/bad-profile.json";
  std::FILE* f = std::fopen(bad.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("{\"version\": 1}", f);
  std::fclose(f);
  EXPECT_THAT(std::string(LoadProfile(bad).status().message()), HasSubstr(bad + ": profile:"));
}

// One prefill worker, fixed-length prompts, one step each: an M/D/1 queue. Its mean wait is
// rho * S / (2 (1 - rho)); the simulated TTFT minus service and transfer must match it.
TEST(SimulatorTest, OnePrefillWorkerIsAnMD1Queue) {
  DeviceProfile p = Linear();
  const double service = p.PrefillMs(256);  // 3.56 ms
  for (double rho : {0.3, 0.6, 0.8}) {
    Workload w;
    w.requests = {{256, 1}};
    w.rate = rho / service * 1000.0;
    SimOptions options;
    options.num_requests = 40000;
    EngineLimits one_prompt_per_step;
    one_prompt_per_step.prefill_max_num_batched_tokens = 256;
    const SimResult r = Simulate(p, p, {1, 1, 0}, w, one_prompt_per_step, options);
    double sum = 0;
    for (const RequestOutcome& o : r.requests) sum += o.ttft_ms;
    const double wait = sum / r.requests.size() - service - p.TransferMs(256);
    const double md1 = rho * service / (2 * (1 - rho));
    EXPECT_NEAR(wait, md1, 0.06 * md1 + 0.02) << "rho " << rho;
  }
}

// A prefill worker batches waiting prompts up to its own step budget (8192 by default, as the
// workers'); a step costs its fixed cost once plus each prompt's share, and every prompt in it
// gets its first token at the step's end.
TEST(SimulatorTest, PrefillStepsBatchPromptsAndChargeEachItsOwnAttention) {
  const DeviceProfile p = Linear();
  Workload w;
  w.requests = {{256, 1}};
  w.rate = 1e6;  // 4 at once: the first finds the worker idle, the other 3 share a step
  SimOptions options;
  options.num_requests = 4;
  options.warmup_fraction = 0;
  const SimResult r = Simulate(p, p, {1, 1, 0}, w, {}, options);
  ASSERT_EQ(r.requests.size(), 4u);
  const double alone = p.PrefillMs(256);
  const double step = p.PrefillFixedMs() + 3 * (p.PrefillMs(256) - p.PrefillFixedMs());
  EXPECT_NEAR(r.requests[0].ttft_ms, alone + p.TransferMs(256), 0.01);
  for (int i = 1; i < 4; ++i) {
    EXPECT_NEAR(r.requests[i].ttft_ms, alone + step + p.TransferMs(256), 0.01) << i;
  }
  EngineLimits one_at_a_time;
  one_at_a_time.prefill_max_num_batched_tokens = 256;
  const SimResult s = Simulate(p, p, {1, 1, 0}, w, one_at_a_time, options);
  EXPECT_NEAR(s.requests[0].ttft_ms, alone + p.TransferMs(256), 0.01);
  EXPECT_NEAR(s.requests[3].ttft_ms, 4 * alone + p.TransferMs(256), 0.01);
}

// With batched prefill points, a step of several prompts costs the fixed cost plus the
// efficiency-scaled sum; one prompt alone is unchanged. Efficiencies interpolate in the prompt
// count and hold past the last point; the file round-trips them.
TEST(SimulatorTest, BatchedPrefillPointsPriceStepsOfSeveralPrompts) {
  DeviceProfile p = Linear();
  const double fixed = p.PrefillFixedMs();
  const double one = p.PrefillMs(128) - fixed;
  p.prefill_batches = {{2, 128, fixed + 2 * 0.9 * one}, {4, 128, fixed + 4 * 0.6 * one}};
  EXPECT_EQ(p.PrefillBatchEfficiency(1), 1.0);
  EXPECT_NEAR(p.PrefillBatchEfficiency(2), 0.9, 1e-9);
  EXPECT_NEAR(p.PrefillBatchEfficiency(3), 0.75, 1e-9);
  EXPECT_NEAR(p.PrefillBatchEfficiency(1.5), 0.95, 1e-9);
  EXPECT_NEAR(p.PrefillBatchEfficiency(16), 0.6, 1e-9);
  absl::StatusOr<DeviceProfile> back = ProfileFromJson(ProfileToJson(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ProfileToJson(*back), ProfileToJson(p));

  Workload w;
  w.requests = {{256, 1}};
  w.rate = 1e6;  // 4 at once: the first alone, the other 3 in one step
  SimOptions options;
  options.num_requests = 4;
  options.warmup_fraction = 0;
  const SimResult r = Simulate(p, p, {1, 1, 0}, w, {}, options);
  ASSERT_EQ(r.requests.size(), 4u);
  const double alone = p.PrefillMs(256);
  const double step = fixed + 0.75 * 3 * (p.PrefillMs(256) - fixed);
  EXPECT_NEAR(r.requests[0].ttft_ms, alone + p.TransferMs(256), 0.01);
  EXPECT_NEAR(r.requests[3].ttft_ms, alone + step + p.TransferMs(256), 0.01);

  // Bad points are named.
  nlohmann::json j = nlohmann::json::parse(ProfileToJson(p));
  j["prefill_batches"][0]["prompts"] = 1;
  EXPECT_THAT(std::string(ProfileFromJson(j.dump()).status().message()),
              HasSubstr("prefill_batches[0]"));
  j = nlohmann::json::parse(ProfileToJson(p));
  std::swap(j["prefill_batches"][0], j["prefill_batches"][1]);
  EXPECT_THAT(std::string(ProfileFromJson(j.dump()).status().message()), HasSubstr("sorted"));
}

// The decode batch is bounded by the KV capacity: with room for 4 sequences, 16 arrive at once
// and TPOT is that of batch 4, not 16; more capacity gives a bigger batch and a longer TPOT.
TEST(SimulatorTest, KvCapacityBoundsTheDecodeBatch) {
  Workload w;
  w.requests = {{100, 101}};  // 201 tokens reserved each
  w.rate = 1e6;               // all at once
  SimOptions options;
  options.num_requests = 16;
  options.warmup_fraction = 0;
  const SimResult small = Simulate(Linear(), Linear(4 * 201), {1, 1, 0}, w, {}, options);
  const SimResult large = Simulate(Linear(), Linear(), {1, 1, 0}, w, {}, options);
  ASSERT_EQ(small.requests.size(), 16u);
  const double batch4 = Linear().DecodeStepMs(4, 150);
  for (const RequestOutcome& o : small.requests) {
    EXPECT_LT(o.tpot_ms, batch4 * 1.05);
    EXPECT_GT(o.tpot_ms, Linear().DecodeStepMs(1, 100) * 0.99);
  }
  EXPECT_GT(Percentile({large.requests.front().tpot_ms}, 50), batch4);
  // A request that can never fit fails rather than waiting forever.
  w.requests = {{1000, 1000}};
  const SimResult never = Simulate(Linear(), Linear(1000), {1, 1, 0}, w, {}, options);
  ASSERT_FALSE(never.requests.empty());
  EXPECT_TRUE(std::isinf(never.requests.front().ttft_ms));
}

// The calibrated host work per step lengthens every step: a lone request's TPOT is the decode
// step plus it, on decode workers and on aggregated replicas alike.
TEST(SimulatorTest, TheHostWorkPerStepIsAddedToEveryStep) {
  Workload w;
  w.requests = {{100, 50}};
  w.rate = 0.01;  // one at a time
  SimOptions options;
  options.num_requests = 4;
  options.warmup_fraction = 0;
  DeviceProfile with = Linear();
  with.calibration.step_overhead_ms = 3;
  for (const Layout layout : {Layout{1, 1, 0}, Layout{0, 0, 1}}) {
    const SimResult bare = Simulate(Linear(), Linear(), layout, w, {}, options);
    const SimResult loaded = Simulate(with, with, layout, w, {}, options);
    ASSERT_EQ(bare.requests.size(), loaded.requests.size());
    for (size_t i = 0; i < bare.requests.size(); ++i) {
      EXPECT_NEAR(loaded.requests[i].tpot_ms - bare.requests[i].tpot_ms, 3, 1e-6);
      // The prompt's step pays it once too (its prefill step, or the replica's step).
      EXPECT_NEAR(loaded.requests[i].ttft_ms - bare.requests[i].ttft_ms, 3, 1e-6);
    }
  }
}

// Aggregated replicas pay for prompts with decode time: every step that carries a prompt chunk
// also carries the decoding sequences, which disaggregated decode workers never wait for.
TEST(SimulatorTest, AggregatedPrefillInterferesWithDecode) {
  Workload w;
  w.requests = {{2048, 64}};
  w.rate = 12;
  const DeviceProfile p = Linear();
  const SimResult agg = Simulate(p, p, {0, 0, 2}, w, {});
  const SimResult dis = Simulate(p, p, {1, 1, 0}, w, {});
  std::vector<double> a, d;
  for (const auto& o : agg.requests) a.push_back(o.tpot_ms);
  for (const auto& o : dis.requests) d.push_back(o.tpot_ms);
  std::printf("TPOT p90: aggregated %.2f ms, disaggregated %.2f ms\n", Percentile(a, 90),
              Percentile(d, 90));
  // Without interference two replicas (half the batch each) would decode faster than one worker.
  EXPECT_GT(Percentile(a, 90), 1.1 * Percentile(d, 90));
}

// Prefill-heavy work wants more prefill workers; decode-heavy work more decode workers.
TEST(PlannerTest, TheRatioFollowsThePhaseThatSaturates) {
  PlanInput in;
  in.prefill = in.decode = Linear();
  in.slo = {200, 10, 90};
  in.device_budget = 4;
  in.sim.num_requests = 300;
  in.workload.requests = {{1024, 2}};  // prefill-heavy
  absl::StatusOr<Plan> heavy_prefill = MakePlan(in);
  ASSERT_TRUE(heavy_prefill.ok()) << heavy_prefill.status();
  const Candidate& hp = heavy_prefill->candidates[heavy_prefill->best_disaggregated];
  in.workload.requests = {{16, 512}};  // decode-heavy
  absl::StatusOr<Plan> heavy_decode = MakePlan(in);
  ASSERT_TRUE(heavy_decode.ok()) << heavy_decode.status();
  const Candidate& hd = heavy_decode->candidates[heavy_decode->best_disaggregated];
  EXPECT_GT(hp.layout.prefill, hp.layout.decode);
  EXPECT_GT(hd.layout.decode, hd.layout.prefill);
  // The goodput found is the edge: at it the objective holds, well above it it does not.
  EXPECT_GE(hp.at_goodput.attainment, 0.9);
  EXPECT_LT(Predict(in, hd.layout, hd.goodput * 1.3).attainment, 0.9);
}

TEST(PlannerTest, ARequestedRateGetsTheSmallestLayoutThatSustainsIt) {
  PlanInput in;
  in.prefill = in.decode = Linear();
  in.slo = {200, 10, 90};
  in.device_budget = 4;
  in.sim.num_requests = 300;
  in.workload.requests = {{512, 64}};
  absl::StatusOr<Plan> plan = MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The most a two-device layout serves, and a rate just past it.
  double two = 0;
  for (const Candidate& c : plan->candidates) {
    if (c.layout.devices() == 2) two = std::max(two, c.goodput);
  }
  ASSERT_GT(two, 0);
  in.workload.rate = two * 1.2;
  plan = MakePlan(in);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(plan->rate_sustained);
  const Candidate& chosen = plan->candidates[plan->recommended];
  EXPECT_EQ(chosen.layout.devices(), 3);
  EXPECT_GE(chosen.goodput, in.workload.rate);
  EXPECT_GE(chosen.at_rate.attainment, 0.9);
  for (const Candidate& c : plan->candidates) {
    if (c.layout.devices() == 3 && c.goodput >= in.workload.rate) {
      EXPECT_LE(c.goodput_per_device, chosen.goodput_per_device);
    }
  }
  // Past what the budget allows: the most goodput per device there is, flagged.
  in.workload.rate = 1e4;
  plan = MakePlan(in);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->rate_sustained);
  EXPECT_EQ(plan->recommended,
            std::max(plan->best_disaggregated, plan->best_aggregated, [&](int a, int b) {
              return plan->candidates[a].goodput_per_device <
                     plan->candidates[b].goodput_per_device;
            }));
}

// The router's planner: the last minute's finished requests are the workload; its answer is the
// smallest layout that sustains their rate, as the offline search finds it.
TEST(OnlinePlannerTest, RecommendsTheSmallestSustainingLayoutForTheTrafficSeen) {
  OnlinePlannerOptions options;
  options.slo = {200, 10, 90};
  options.max_workers = 6;
  options.sim.num_requests = 300;
  OnlinePlanner planner(Linear(), Linear(), options);
  const absl::Time now = absl::FromUnixSeconds(1000000);
  EXPECT_FALSE(planner.Recommend(now).has_value());  // nothing seen yet
  // 150 requests/s for the last minute (more than max_samples keeps), and older ones outside it.
  for (int i = 0; i < 600; ++i) {
    planner.Record(512, 64, now - absl::Seconds(120) + absl::Seconds(i) / 10);
  }
  for (int i = 0; i < 9000; ++i) {
    planner.Record(512, 64, now - absl::Seconds(60) + absl::Seconds(i + 1) / 150);
  }
  planner.Record(0, 5, now);  // ignored
  std::optional<Recommendation> rec = planner.Recommend(now);
  ASSERT_TRUE(rec.has_value());
  EXPECT_NEAR(rec->rate, 150, 0.5);
  EXPECT_GT(rec->layout.devices(), 2);  // the smallest layouts cannot take this
  PlanInput in;
  in.prefill = in.decode = Linear();
  in.slo = options.slo;
  in.sim = options.sim;
  in.workload.requests = {{512, 64}};
  in.workload.rate = rec->rate;
  const double target = 0.9;
  EXPECT_TRUE(rec->sustained);
  EXPECT_GE(Predict(in, rec->layout, rec->rate).attainment, target);
  for (int p = 1; p < rec->layout.devices() - 1; ++p) {
    for (int d = 1; p + d < rec->layout.devices(); ++d) {
      EXPECT_LT(Predict(in, {p, d, 0}, rec->rate).attainment, target)
          << p << "P+" << d << "D is smaller and sustains it too";
    }
  }
  // A quiet minute later, nothing is in the window.
  EXPECT_FALSE(planner.Recommend(now + absl::Seconds(120)).has_value());
}

TEST(PlannerTest, BadInputsAndThePatch) {
  PlanInput in;
  in.prefill = in.decode = Linear();
  EXPECT_THAT(std::string(MakePlan(in).status().message()), HasSubstr("no requests"));
  in.workload.requests = {{10, 10}};
  in.device_budget = 0;
  EXPECT_THAT(std::string(MakePlan(in).status().message()), HasSubstr("budget"));
  in.device_budget = 2;
  in.slo.tpot_ms = 0;
  EXPECT_THAT(std::string(MakePlan(in).status().message()), HasSubstr("slo"));
  EXPECT_EQ(ReplicaPatch({2, 3, 0}, "p", "d"),
            "# tandem plan: 2 prefill + 3 decode\napiVersion: apps/v1\nkind: "
            "Deployment\nmetadata:\n  name: p\nspec:\n  replicas: 2\n---\napiVersion: "
            "apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  replicas: 3\n");
  EXPECT_THAT(ReplicaPatch({0, 0, 4}, "p", "d"), HasSubstr("name: p\nspec:\n  replicas: 0"));
}

}  // namespace
}  // namespace tandem::planning

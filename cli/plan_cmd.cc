// `tandem plan`: the prefill and decode worker counts that serve a workload best under SLOs, from
// device profiles (`tandem profile`), by simulating every layout a device budget allows
// (planning/planner.h, docs/planning.md).
//   tandem plan --profile FILE [--decode-profile FILE]
//               (--input-len N --output-len N [--range-ratio R] | --mix IN:OUT[:W],... |
//                --from-bench RESULT.json)
//               [--rate R] [--ttft-ms T] [--tpot-ms T] [--percentile P] [--devices N]
//               [--max-num-seqs N] [--max-num-batched-tokens N] [--requests N] [--seed S]
//               [--json] [--patch FILE] [--prefill-deployment NAME] [--decode-deployment NAME]
// Prints a table of every layout (goodput, goodput per device, predicted percentiles at the
// rate), the recommendation, the aggregated alternative and a kustomize replica patch; --json
// prints the same as one object. Exit status: 0 ok, 1 unreadable input, 2 usage error.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "nlohmann/json.hpp"
#include "planning/planner.h"

namespace tandem::cli {
namespace {

using json = nlohmann::json;

struct PlanFlags {
  std::string profile, decode_profile;
  int input_len = 0, output_len = 0;
  double range_ratio = 0;
  std::string mix, from_bench;
  double rate = 0;
  double ttft_ms = 400, tpot_ms = 25, percentile = 90;
  int devices = 2;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 0;
  int prefill_max_num_batched_tokens = 8192;
  int requests = 5000;  // a tail-bound goodput needs them (docs/planning.md)
  uint64_t seed = 1;
  bool json_output = false;
  std::string patch;
  std::string prefill_deployment = "tandem-prefill";
  std::string decode_deployment = "tandem-decode";
};

struct Failure {
  int code;
  std::string message;
};

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > limit) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": larger than ", limit, " bytes"));
  }
  return text;
}

// (input, output) samples: from a bench result, a mix, or uniform lengths around a mean.
absl::StatusOr<std::vector<std::pair<int, int>>> Samples(const PlanFlags& f) {
  const int sources =
      (f.input_len > 0 || f.output_len > 0) + !f.mix.empty() + !f.from_bench.empty();
  if (sources != 1) {
    return absl::InvalidArgumentError(
        "give the workload one way: --input-len and --output-len, --mix, or --from-bench");
  }
  std::vector<std::pair<int, int>> out;
  constexpr int kMaxLen = 1 << 20;
  if (!f.from_bench.empty()) {
    absl::StatusOr<std::string> text = ReadFile(f.from_bench, 256 << 20);
    if (!text.ok()) return text.status();
    const json j = json::parse(*text, nullptr, false);
    if (j.is_discarded()) return absl::InvalidArgumentError(f.from_bench + ": not JSON");
    std::vector<const json*> runs;
    if (j.is_object() && j.contains("runs") && j["runs"].is_array()) {
      for (const json& r : j["runs"]) runs.push_back(&r);
    } else {
      runs.push_back(&j);
    }
    for (const json* r : runs) {
      if (!r->is_object() || !r->contains("input_lens") || !r->contains("output_lens") ||
          !(*r)["input_lens"].is_array() || !(*r)["output_lens"].is_array() ||
          (*r)["input_lens"].size() != (*r)["output_lens"].size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.from_bench,
                         ": a tandem bench --json result with input_lens and output_lens of "
                         "equal length is expected"));
      }
      for (size_t i = 0; i < (*r)["input_lens"].size(); ++i) {
        const json& a = (*r)["input_lens"][i];
        const json& b = (*r)["output_lens"][i];
        if (!a.is_number_integer() || !b.is_number_integer()) {
          return absl::InvalidArgumentError(f.from_bench + ": lengths must be integers");
        }
        const int in = a.get<int>(), o = b.get<int>();
        if (in >= 1 && o >= 1 && in <= kMaxLen && o <= kMaxLen) out.push_back({in, o});
      }
    }
    if (out.empty()) return absl::InvalidArgumentError(f.from_bench + ": no completed request");
    return out;
  }
  if (!f.mix.empty()) {
    for (absl::string_view part : absl::StrSplit(f.mix, ',')) {
      std::vector<std::string> v = absl::StrSplit(part, ':');
      int in = 0, o = 0, w = 1;
      if ((v.size() != 2 && v.size() != 3) || !absl::SimpleAtoi(v[0], &in) ||
          !absl::SimpleAtoi(v[1], &o) || (v.size() == 3 && !absl::SimpleAtoi(v[2], &w)) || in < 1 ||
          o < 1 || in > kMaxLen || o > kMaxLen || w < 1 || w > 1000) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--mix: '", part, "' is not IN:OUT or IN:OUT:WEIGHT (lengths >= 1, weight 1..1000)"));
      }
      for (int k = 0; k < w; ++k) out.push_back({in, o});
    }
    return out;
  }
  if (f.input_len < 1 || f.output_len < 1 || f.input_len > kMaxLen || f.output_len > kMaxLen) {
    return absl::InvalidArgumentError("--input-len and --output-len: both needed, >= 1");
  }
  if (f.range_ratio < 0 || f.range_ratio >= 1) {
    return absl::InvalidArgumentError("--range-ratio: must be in [0, 1)");
  }
  // As tandem bench draws them: uniform in [len * (1 - r), len * (1 + r)].
  std::mt19937_64 rng(f.seed);
  const auto draw = [&](int len) {
    const int lo = std::max(1, static_cast<int>(std::floor(len * (1 - f.range_ratio))));
    const int hi = std::max(lo, static_cast<int>(std::ceil(len * (1 + f.range_ratio))));
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  for (int i = 0; i < 1024; ++i) out.push_back({draw(f.input_len), draw(f.output_len)});
  return out;
}

std::string Name(const planning::Layout& l) {
  return l.disaggregated() ? absl::StrCat(l.prefill, "P+", l.decode, "D")
                           : absl::StrCat(l.aggregated, " aggregated");
}

std::string Devices(int n) { return absl::StrCat(n, n == 1 ? " device" : " devices"); }

json PredictionJson(const planning::Prediction& p) {
  return {{"rate", p.rate},
          {"attainment", p.attainment},
          {"ttft_p50_ms", p.ttft_p50},
          {"ttft_p90_ms", p.ttft_p90},
          {"ttft_p99_ms", p.ttft_p99},
          {"tpot_p50_ms", p.tpot_p50},
          {"tpot_p90_ms", p.tpot_p90},
          {"tpot_p99_ms", p.tpot_p99}};
}

int Run(const PlanFlags& f) {
  const auto fail = [](int code, const std::string& message) {
    std::cerr << "tandem plan: " << message << "\n";
    return code;
  };
  absl::StatusOr<planning::DeviceProfile> prefill = planning::LoadProfile(f.profile);
  if (!prefill.ok())
    return fail(prefill.status().code() == absl::StatusCode::kNotFound ? 1 : 2,
                std::string(prefill.status().message()));
  absl::StatusOr<planning::DeviceProfile> decode =
      f.decode_profile.empty() ? prefill : planning::LoadProfile(f.decode_profile);
  if (!decode.ok()) return fail(2, std::string(decode.status().message()));
  absl::StatusOr<std::vector<std::pair<int, int>>> samples = Samples(f);
  if (!samples.ok()) return fail(2, std::string(samples.status().message()));

  planning::PlanInput in;
  in.prefill = *prefill;
  in.decode = *decode;
  in.workload.requests = *samples;
  in.workload.rate = f.rate;
  in.slo = {f.ttft_ms, f.tpot_ms, f.percentile};
  in.device_budget = f.devices;
  in.limits.max_num_seqs = f.max_num_seqs;
  in.limits.max_num_batched_tokens =
      f.max_num_batched_tokens > 0 ? f.max_num_batched_tokens : prefill->max_num_batched_tokens;
  in.limits.prefill_max_num_batched_tokens = f.prefill_max_num_batched_tokens;
  in.sim.num_requests = f.requests;
  in.sim.seed = f.seed;
  absl::StatusOr<planning::Plan> plan = planning::MakePlan(in);
  if (!plan.ok()) return fail(2, std::string(plan.status().message()));
  const planning::Candidate& rec = plan->candidates[plan->recommended];
  const std::string patch =
      planning::ReplicaPatch(rec.layout, f.prefill_deployment, f.decode_deployment);
  if (!f.patch.empty()) {
    std::ofstream out(f.patch);
    out << patch;
    if (!out.good()) return fail(1, "cannot write " + f.patch);
  }
  const bool has_rate = f.rate > 0;
  if (f.json_output) {
    json j;
    j["slo"] = {{"ttft_ms", f.ttft_ms}, {"tpot_ms", f.tpot_ms}, {"percentile", f.percentile}};
    j["devices"] = f.devices;
    j["rate"] = f.rate;
    j["candidates"] = json::array();
    for (const planning::Candidate& c : plan->candidates) {
      json x = {{"layout", Name(c.layout)},
                {"prefill", c.layout.prefill},
                {"decode", c.layout.decode},
                {"aggregated", c.layout.aggregated},
                {"devices", c.layout.devices()},
                {"goodput", c.goodput},
                {"goodput_per_device", c.goodput_per_device},
                {"at_goodput", PredictionJson(c.at_goodput)}};
      if (has_rate) x["at_rate"] = PredictionJson(c.at_rate);
      j["candidates"].push_back(std::move(x));
    }
    j["recommended"] = Name(rec.layout);
    j["rate_sustained"] = plan->rate_sustained;
    j["best_disaggregated"] = Name(plan->candidates[plan->best_disaggregated].layout);
    j["best_aggregated"] = Name(plan->candidates[plan->best_aggregated].layout);
    j["disaggregation_gain"] = plan->disaggregation_gain;
    j["patch"] = patch;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::vector<double> ins, outs;
  for (const auto& [a, b] : *samples) {
    ins.push_back(a);
    outs.push_back(b);
  }
  std::cout << absl::StrFormat(
      "workload: %d samples, input p50 %.0f p90 %.0f tokens, output p50 %.0f p90 %.0f tokens%s\n"
      "SLO: TTFT <= %.0f ms and TPOT <= %.1f ms for %.0f%% of requests; budget %d devices\n\n",
      static_cast<int>(samples->size()), planning::Percentile(ins, 50),
      planning::Percentile(ins, 90), planning::Percentile(outs, 50), planning::Percentile(outs, 90),
      has_rate ? absl::StrFormat(", %.3g requests/s", f.rate) : std::string(), f.ttft_ms, f.tpot_ms,
      f.percentile, f.devices);
  std::cout << absl::StrFormat("%-14s %7s %14s %11s", "layout", "devices", "goodput req/s",
                               "per device");
  if (has_rate) {
    std::cout << absl::StrFormat(" %15s %15s %10s", "TTFT p90 at rate", "TPOT p90 at rate",
                                 "met at rate");
  }
  std::cout << "\n";
  for (size_t i = 0; i < plan->candidates.size(); ++i) {
    const planning::Candidate& c = plan->candidates[i];
    std::cout << absl::StrFormat("%-14s %7d %14.3f %11.3f", Name(c.layout), c.layout.devices(),
                                 c.goodput, c.goodput_per_device);
    if (has_rate) {
      std::cout << absl::StrFormat(" %13.1f ms %13.2f ms %9.1f%%", c.at_rate.ttft_p90,
                                   c.at_rate.tpot_p90, 100 * c.at_rate.attainment);
    }
    std::cout << (static_cast<int>(i) == plan->recommended ? "  <- recommended" : "") << "\n";
  }
  const planning::Prediction& at = has_rate ? rec.at_rate : rec.at_goodput;
  std::cout << absl::StrFormat(
      "\nrecommended: %s (%s), goodput %.3f requests/s (%.3f per device)%s\n"
      "  predicted at %.3g requests/s: TTFT p50/p90/p99 %.1f/%.1f/%.1f ms, TPOT p50/p90/p99 "
      "%.2f/%.2f/%.2f ms, %.1f%% meet both\n",
      Name(rec.layout), Devices(rec.layout.devices()), rec.goodput, rec.goodput_per_device,
      has_rate ? (plan->rate_sustained ? ", sustains the rate"
                                       : ", DOES NOT sustain the rate: no layout within the "
                                         "budget does")
               : "",
      at.rate, at.ttft_p50, at.ttft_p90, at.ttft_p99, at.tpot_p50, at.tpot_p90, at.tpot_p99,
      100 * at.attainment);
  const planning::Candidate& agg = plan->candidates[plan->best_aggregated];
  const planning::Candidate& dis = plan->candidates[plan->best_disaggregated];
  std::cout << absl::StrFormat(
      "aggregated alternative: %s, %.3f requests/s per device; best disaggregated %s, %.3f per "
      "device: disaggregation %s (x%.2f)\n",
      Name(agg.layout), agg.goodput_per_device, Name(dis.layout), dis.goodput_per_device,
      plan->disaggregation_gain > 1 ? "pays" : "does not pay for this workload",
      plan->disaggregation_gain);
  std::cout << "\nkustomize replica patch (patchesStrategicMerge"
            << (f.patch.empty() ? "" : absl::StrCat(", written to ", f.patch)) << "):\n"
            << patch;
  return 0;
}

}  // namespace

void AddPlanCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Choose prefill and decode worker counts for a workload and SLOs from profiles");
  cmd->add_option("--profile", flags->profile, "Profile of the prefill workers (tandem profile)")
      ->required();
  cmd->add_option("--decode-profile", flags->decode_profile,
                  "Profile of the decode workers (default: --profile)");
  cmd->add_option("--input-len", flags->input_len, "Prompt length in tokens")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--output-len", flags->output_len, "Output length in tokens")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--range-ratio", flags->range_ratio,
                  "Lengths uniform in [len*(1-r), len*(1+r)], as tandem bench draws them");
  cmd->add_option("--mix", flags->mix, "Request shapes IN:OUT[:WEIGHT],... (a mixed workload)");
  cmd->add_option("--from-bench", flags->from_bench,
                  "A tandem bench --json result: its requests' input and output lengths");
  cmd->add_option("--rate", flags->rate, "Requests/s to sustain (default: none, best per device)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--ttft-ms", flags->ttft_ms, "TTFT objective")->capture_default_str();
  cmd->add_option("--tpot-ms", flags->tpot_ms, "TPOT objective")->capture_default_str();
  cmd->add_option("--percentile", flags->percentile, "Percent of requests meeting both")
      ->capture_default_str();
  cmd->add_option("--devices", flags->devices, "Device budget (workers in all)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", flags->max_num_seqs, "Decode batch limit, as the workers'")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", flags->max_num_batched_tokens,
                  "Step token budget of decode workers and aggregated replicas (default: the "
                  "profile's)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-max-num-batched-tokens", flags->prefill_max_num_batched_tokens,
                  "Step token budget of prefill workers, as theirs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--requests", flags->requests, "Simulated requests per evaluation")
      ->check(CLI::Range(50, 100000))
      ->capture_default_str();
  cmd->add_option("--seed", flags->seed)->capture_default_str();
  cmd->add_flag("--json", flags->json_output, "Print the plan as JSON");
  cmd->add_option("--patch", flags->patch, "Write the kustomize replica patch here");
  cmd->add_option("--prefill-deployment", flags->prefill_deployment,
                  "Name of the prefill Deployment in the patch")
      ->capture_default_str();
  cmd->add_option("--decode-deployment", flags->decode_deployment,
                  "Name of the decode Deployment in the patch")
      ->capture_default_str();
  cmd->callback([flags, exit_code] { *exit_code = Run(*flags); });
}

}  // namespace tandem::cli

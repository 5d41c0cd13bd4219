#include "bench/serving/report.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace tandem::bench {
namespace {

using json = nlohmann::json;

std::string Rate(double rate) { return std::isinf(rate) ? "inf" : absl::StrFormat("%g", rate); }

void Line(std::string* out, absl::string_view label, double v) {
  absl::StrAppendFormat(out, "%-40s%-10.2f\n", label, v);
}
void Line(std::string* out, absl::string_view label, int64_t v) {
  absl::StrAppendFormat(out, "%-40s%-10d\n", label, v);
}
void Title(std::string* out, absl::string_view title, char fill) {
  const int width = 50;
  const int pad = width - static_cast<int>(title.size());
  const int left = pad / 2;
  out->append(std::string(std::max(left, 0), fill));
  out->append(title.data(), title.size());
  out->append(std::string(std::max(pad - left, 0), fill));
  out->push_back('\n');
}

void Block(std::string* out, absl::string_view title, absl::string_view name,
           const Distribution& d) {
  Title(out, title, '-');
  Line(out, absl::StrCat("Mean ", name, " (ms):"), d.mean);
  Line(out, absl::StrCat("Median ", name, " (ms):"), d.median);
  Line(out, absl::StrCat("P90 ", name, " (ms):"), d.p90);
  Line(out, absl::StrCat("P99 ", name, " (ms):"), d.p99);
}

void PutDistribution(json& j, absl::string_view name, const Distribution& d) {
  j[absl::StrCat("mean_", name, "_ms")] = d.mean;
  j[absl::StrCat("median_", name, "_ms")] = d.median;
  j[absl::StrCat("std_", name, "_ms")] = d.std;
  j[absl::StrCat("p90_", name, "_ms")] = d.p90;
  j[absl::StrCat("p99_", name, "_ms")] = d.p99;
}

}  // namespace

std::string FormatSummary(const RunInfo& info, const Summary& s) {
  std::string out;
  Title(
      &out,
      info.interrupted ? " Serving Benchmark Result (interrupted) " : " Serving Benchmark Result ",
      '=');
  absl::StrAppendFormat(&out, "%-40s%s\n", "Endpoint:", info.url);
  absl::StrAppendFormat(&out, "%-40s%s\n", "Model:", info.model);
  absl::StrAppendFormat(&out, "%-40s%s (%s)\n", "Request rate (req/s):", Rate(info.request_rate),
                        info.arrival);
  absl::StrAppendFormat(&out, "%-40s%s\n", "Max concurrency:",
                        info.max_concurrency > 0 ? absl::StrCat(info.max_concurrency) : "none");
  Line(&out, "Successful requests:", int64_t{s.completed});
  Line(&out, "Failed requests:", int64_t{s.failed});
  if (s.cancelled > 0) Line(&out, "Cancelled requests:", int64_t{s.cancelled});
  Line(&out, "Benchmark duration (s):", s.duration_s);
  Line(&out, "Total input tokens:", s.total_input_tokens);
  Line(&out, "Total generated tokens:", s.total_output_tokens);
  Line(&out, "Request throughput (req/s):", s.request_throughput);
  if (!info.slo.empty()) Line(&out, "Request goodput (req/s):", s.request_goodput);
  Line(&out, "Input token throughput (tok/s):", s.input_throughput);
  Line(&out, "Output token throughput (tok/s):", s.output_throughput);
  Line(&out, "Total token throughput (tok/s):", s.total_token_throughput);
  Line(&out, "Peak output throughput (tok/s):", s.max_output_tokens_per_s);
  Line(&out, "Peak concurrent requests:", int64_t{info.max_concurrent});
  Block(&out, "Time to First Token", "TTFT", s.ttft_ms);
  Block(&out, "Time per Output Token (excl. 1st token)", "TPOT", s.tpot_ms);
  Block(&out, "Inter-token Latency", "ITL", s.itl_ms);
  Block(&out, "End-to-end Latency", "E2EL", s.e2el_ms);
  if (!s.errors_by_kind.empty()) {
    Title(&out, "Errors", '-');
    for (const auto& [kind, n] : s.errors_by_kind) {
      Line(&out, absl::StrCat(kind, ":"), int64_t{n});
    }
    for (const auto& [code, n] : s.http_status_counts) {
      Line(&out, absl::StrCat("  HTTP ", code, ":"), int64_t{n});
    }
  }
  out.append(std::string(50, '='));
  out.push_back('\n');
  return out;
}

std::string SweepHeader() {
  return absl::StrFormat("%8s %9s %9s %10s %12s %12s %11s %7s\n", "rate", "completed", "req/s",
                         "out tok/s", "p90 TTFT ms", "p90 TPOT ms", "goodput r/s", "errors");
}

std::string SweepLine(const RunInfo& info, const Summary& s) {
  return absl::StrFormat("%8s %9d %9.2f %10.1f %12.2f %12.2f %11.2f %7d\n", Rate(info.request_rate),
                         s.completed, s.request_throughput, s.output_throughput, s.ttft_ms.p90,
                         s.tpot_ms.p90, s.request_goodput, s.failed);
}

std::string ResultJson(const RunInfo& info, const Summary& s,
                       const std::vector<RequestRecord>& records) {
  json j;
  j["date"] = info.date;
  j["backend"] = info.backend;
  j["model_id"] = info.model;
  j["base_url"] = info.url;
  j["request_rate"] = std::isinf(info.request_rate) ? json("inf") : json(info.request_rate);
  j["arrival"] = info.arrival;
  j["burstiness"] = 1.0;
  j["max_concurrency"] = info.max_concurrency > 0 ? json(info.max_concurrency) : json(nullptr);
  j["num_prompts"] = info.num_prompts;
  j["duration_limit_s"] = info.duration_limit_s;
  j["seed"] = info.seed;
  j["interrupted"] = info.interrupted;
  json slo = json::object();
  if (info.slo.ttft_ms) slo["ttft"] = *info.slo.ttft_ms;
  if (info.slo.tpot_ms) slo["tpot"] = *info.slo.tpot_ms;
  if (info.slo.e2el_ms) slo["e2el"] = *info.slo.e2el_ms;
  j["goodput_slo_ms"] = slo;

  j["duration"] = s.duration_s;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["cancelled"] = s.cancelled;
  j["total_input_tokens"] = s.total_input_tokens;
  j["total_output_tokens"] = s.total_output_tokens;
  j["request_throughput"] = s.request_throughput;
  j["request_goodput"] = s.request_goodput;
  j["good_completed"] = s.good_completed;
  j["input_throughput"] = s.input_throughput;
  j["output_throughput"] = s.output_throughput;
  j["total_token_throughput"] = s.total_token_throughput;
  j["max_output_tokens_per_s"] = s.max_output_tokens_per_s;
  j["max_concurrent_requests"] = info.max_concurrent;
  PutDistribution(j, "ttft", s.ttft_ms);
  PutDistribution(j, "tpot", s.tpot_ms);
  PutDistribution(j, "itl", s.itl_ms);
  PutDistribution(j, "e2el", s.e2el_ms);
  j["errors_by_kind"] = s.errors_by_kind;
  json statuses = json::object();
  for (const auto& [code, n] : s.http_status_counts) statuses[absl::StrCat(code)] = n;
  j["http_status_counts"] = statuses;

  // Per-request records, in send order, as parallel arrays (vLLM's layout).
  json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(),
       itls = json::array(), e2els = json::array(), start_times = json::array(),
       errors = json::array(), error_kinds = json::array(), statuses_arr = json::array(),
       usage = json::array();
  for (const RequestRecord& r : records) {
    input_lens.push_back(r.prompt_tokens);
    output_lens.push_back(r.completion_tokens);
    ttfts.push_back(r.ttft_s);
    itls.push_back(r.itls_s);
    e2els.push_back(r.e2e_s);
    start_times.push_back(r.start_s);
    errors.push_back(r.error_message);
    error_kinds.push_back(r.ok() ? std::string() : std::string(ErrorKindName(r.error)));
    statuses_arr.push_back(r.http_status);
    usage.push_back(r.usage_reported);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["e2els"] = std::move(e2els);
  j["start_times"] = std::move(start_times);
  j["errors"] = std::move(errors);
  j["error_kinds"] = std::move(error_kinds);
  j["http_statuses"] = std::move(statuses_arr);
  j["usage_reported"] = std::move(usage);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string SweepJson(const std::vector<std::string>& run_jsons) {
  return absl::StrCat("{\"runs\":[", absl::StrJoin(run_jsons, ","), "]}");
}

}  // namespace tandem::bench

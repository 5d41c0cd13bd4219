#include "bench/serving/report.h"

#include <cmath>

#include "bench/serving/plot.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::bench {
namespace {

using json = nlohmann::json;
using ::testing::ContainsRegex;

std::vector<RequestRecord> Records() {
  RequestRecord a;
  a.start_s = 0;
  a.ttft_s = 0.1;
  a.itls_s = {0.05, 0.05};
  a.e2e_s = 0.2;
  a.prompt_tokens = 12;
  a.completion_tokens = 3;
  a.usage_reported = true;
  a.http_status = 200;
  RequestRecord b;
  b.start_s = 0.5;
  b.e2e_s = 0.01;
  b.http_status = 500;
  b.error = ErrorKind::kHttpStatus;
  b.error_message = "HTTP 500: boom";
  return {a, b};
}

TEST(ReportTest, JsonUsesVllmFieldNames) {
  std::vector<RequestRecord> rs = Records();
  RunInfo info;
  info.backend = "openai-chat";
  info.model = "m";
  info.request_rate = INFINITY;
  info.num_prompts = 2;
  info.slo.ttft_ms = 500;
  Summary s = Summarize(rs, 1.0, info.slo);
  json j = json::parse(ResultJson(info, s, rs));
  for (const char* key : {"duration",
                          "completed",
                          "total_input_tokens",
                          "total_output_tokens",
                          "request_throughput",
                          "request_goodput",
                          "output_throughput",
                          "total_token_throughput",
                          "input_lens",
                          "output_lens",
                          "ttfts",
                          "itls",
                          "errors",
                          "mean_ttft_ms",
                          "median_ttft_ms",
                          "std_ttft_ms",
                          "p99_ttft_ms",
                          "mean_tpot_ms",
                          "median_tpot_ms",
                          "p99_tpot_ms",
                          "mean_itl_ms",
                          "median_itl_ms",
                          "p99_itl_ms",
                          "mean_e2el_ms",
                          "median_e2el_ms",
                          "p99_e2el_ms",
                          "max_concurrency",
                          "request_rate",
                          "model_id",
                          "backend",
                          "num_prompts"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["completed"], 1);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["total_input_tokens"], 12);
  EXPECT_EQ(j["total_output_tokens"], 3);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_DOUBLE_EQ(j["mean_ttft_ms"].get<double>(), 100.0);
  EXPECT_DOUBLE_EQ(j["mean_tpot_ms"].get<double>(), 50.0);  // (0.2 - 0.1) / 2 tokens
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), 1.0);
  // Per-request arrays are in send order and in seconds, failed requests included.
  ASSERT_EQ(j["ttfts"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["ttfts"][0].get<double>(), 0.1);
  EXPECT_EQ(j["itls"][0].size(), 2u);
  EXPECT_EQ(j["errors"][1], "HTTP 500: boom");
  EXPECT_EQ(j["error_kinds"][1], "http_status");
  EXPECT_EQ(j["errors_by_kind"]["http_status"], 1);
  EXPECT_EQ(j["http_status_counts"]["500"], 1);
}

TEST(ReportTest, TextSummaryAndSweepLine) {
  std::vector<RequestRecord> rs = Records();
  RunInfo info;
  info.request_rate = 4;
  info.arrival = "poisson";
  Summary s = Summarize(rs, 2.0, Slo{});
  std::string text = FormatSummary(info, s);
  EXPECT_THAT(text, ContainsRegex("\nSuccessful requests: +1 "));
  EXPECT_THAT(text, ContainsRegex("\nFailed requests: +1 "));
  EXPECT_THAT(text, ContainsRegex("\nhttp_status: +1 "));
  EXPECT_THAT(text, ContainsRegex("\n  HTTP 500: +1 "));
  EXPECT_THAT(text, ContainsRegex("\nMean TTFT \\(ms\\): +100\\.00 "));
  EXPECT_THAT(text, ContainsRegex("\nMean TPOT \\(ms\\): +50\\.00 "));
  std::string line = SweepLine(info, s);
  EXPECT_NE(line.find("0.50"), std::string::npos) << line;  // 1 request / 2 s
  EXPECT_EQ(SweepJson({"{}", "{}"}), "{\"runs\":[{},{}]}");
}

TEST(PlotTest, SelfContainedSvg) {
  std::string svg = RenderSvg(Records(), "run <1>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("run &lt;1&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("http://", svg.find("xmlns") + 40), std::string::npos);  // no remote refs
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  // Empty input still renders.
  EXPECT_NE(RenderSvg({}, "empty").find("no samples"), std::string::npos);
}

}  // namespace
}  // namespace tandem::bench

// `tandem bench` end to end against fake_openai_server (bench/serving/fake_openai_server.cc):
// request counts and token totals (checked against the server's own counters), latency from a
// slow endpoint, every failure mode counted by kind (never a crash or hang), Ctrl-C, sweeps,
// datasets, plots and --duration.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/serving/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/bench/subprocess.h"

namespace tandem::bench {
namespace {

using json = nlohmann::json;
using testing::ReadAll;
using testing::Subprocess;

std::string BuildDir() { return TANDEM_BUILD_DIR; }
// A per-test scratch path (parameterized test names contain '/').
std::string Tmp(const std::string& name) {
  std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(test.begin(), test.end(), '/', '_');
  return absl::StrCat(::testing::TempDir(), "/", test, "_", getpid(), "_", name);
}

// fake_openai_server on a free port.
class FakeServer {
 public:
  explicit FakeServer(std::vector<std::string> args) {
    std::vector<std::string> argv = {BuildDir() + "/bench/serving/fake_openai_server", "--port",
                                     "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    proc_ = std::make_unique<Subprocess>(argv, Tmp("server"));
    if (!proc_->WaitForOutput("listening on ", 10)) return;
    std::string out = proc_->stdout_text();
    absl::string_view rest = absl::string_view(out).substr(out.find("listening on ") + 13);
    rest = rest.substr(0, rest.find('\n'));
    port_ = std::string(rest);
  }
  bool ok() const { return !port_.empty(); }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_, "/v1"); }
  // A value from the server's /metrics (sum over matching labelled lines).
  double Metric(const std::string& name, const std::string& label_filter = "") const {
    absl::StatusOr<std::string> text = HttpGet("127.0.0.1", port_, "/metrics", 5);
    EXPECT_TRUE(text.ok()) << text.status();
    double sum = 0;
    for (absl::string_view line : absl::StrSplit(text.value_or(""), '\n')) {
      if (!absl::StartsWith(line, name) || line.size() <= name.size()) continue;
      if (line[name.size()] != ' ' && line[name.size()] != '{') continue;
      if (!label_filter.empty() && line.find(label_filter) == absl::string_view::npos) continue;
      double v = 0;
      if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) sum += v;
    }
    return sum;
  }

 private:
  std::unique_ptr<Subprocess> proc_;
  std::string port_;
};

struct BenchRun {
  int code = -1;
  std::string out, err;
  json result;
};

BenchRun RunBench(std::vector<std::string> args, double timeout_s = 60) {
  std::vector<std::string> argv = {BuildDir() + "/tandem", "bench", "--no-progress"};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string json_path = Tmp("result.json");
  std::filesystem::remove(json_path);
  bool wants_json = false;
  for (const std::string& a : args) wants_json |= a == "--json";
  if (!wants_json) {
    argv.push_back("--json");
    argv.push_back(json_path);
  }
  Subprocess proc(argv, Tmp("bench"));
  BenchRun run;
  run.code = proc.Wait(timeout_s);
  run.out = proc.stdout_text();
  run.err = proc.stderr_text();
  if (!wants_json && std::filesystem::exists(json_path)) {
    run.result = json::parse(ReadAll(json_path), nullptr, false);
  }
  return run;
}

TEST(BenchCliTest, CountsAndTokenTotalsMatchTheServer) {
  FakeServer server({});
  ASSERT_TRUE(server.ok());
  for (const std::string endpoint : {"chat", "completions"}) {
    BenchRun run = RunBench({"--url", server.url(), "--endpoint", endpoint, "--num-prompts", "50",
                             "--input-len", "20", "--output-len", "12", "--max-concurrency", "8",
                             "--seed", "3"});
    ASSERT_EQ(run.code, 0) << run.err;
    const json& r = run.result;
    ASSERT_TRUE(r.is_object()) << run.out;
    EXPECT_EQ(r["model_id"], "fake-model");  // no --model: taken from GET /v1/models
    EXPECT_EQ(r["completed"], 50);
    EXPECT_EQ(r["failed"], 0);
    // The server counts prompt words itself; synthetic prompts are --input-len words.
    EXPECT_EQ(r["total_input_tokens"], 50 * 20);
    EXPECT_EQ(r["total_output_tokens"], 50 * 12);
    ASSERT_EQ(r["itls"].size(), 50u);
    for (const json& itl : r["itls"]) EXPECT_EQ(itl.size(), 11u);  // 12 one-token chunks
    for (const json& n : r["output_lens"]) EXPECT_EQ(n, 12);
    EXPECT_LE(r["max_concurrent_requests"].get<int>(), 8);
    EXPECT_THAT(run.out, ::testing::ContainsRegex("\nSuccessful requests: +50 "));
  }
  EXPECT_EQ(server.Metric("tandem_requests_total", "/v1/chat/completions"), 50);
  EXPECT_EQ(server.Metric("tandem_requests_total", "/v1/completions"), 50);
  EXPECT_EQ(server.Metric("tandem_prompt_tokens_total"), 2 * 50 * 20);
  EXPECT_EQ(server.Metric("tandem_generation_tokens_total"), 2 * 50 * 12);
}

TEST(BenchCliTest, SlowEndpointShowsAsLatencyNotErrors) {
  FakeServer server({"--ttft-ms", "200", "--itl-ms", "30"});
  ASSERT_TRUE(server.ok());
  BenchRun run = RunBench({"--url", server.url(), "--model", "fake-model", "--num-prompts", "6",
                           "--input-len", "4", "--output-len", "5", "--slo", "ttft=100"});
  ASSERT_EQ(run.code, 0) << run.err;
  const json& r = run.result;
  EXPECT_EQ(r["completed"], 6);
  EXPECT_GE(r["mean_ttft_ms"].get<double>(), 200);
  EXPECT_LT(r["mean_ttft_ms"].get<double>(), 1000);
  EXPECT_GE(r["median_itl_ms"].get<double>(), 30);
  EXPECT_GE(r["mean_tpot_ms"].get<double>(), 30);
  EXPECT_GE(r["mean_e2el_ms"].get<double>(), 200 + 4 * 30);
  EXPECT_EQ(r["good_completed"], 0);  // every TTFT misses the 100 ms objective
  EXPECT_EQ(r["request_goodput"], 0.0);
}

struct FailureCase {
  std::string mode;
  std::string kind;
};

class BenchFailureTest : public ::testing::TestWithParam<FailureCase> {};

TEST_P(BenchFailureTest, CountedByKindNeverCrashOrHang) {
  const FailureCase& c = GetParam();
  FakeServer server({"--fail", c.mode, "--fail-every", "2", "--itl-ms", "5"});
  ASSERT_TRUE(server.ok());
  BenchRun run = RunBench(
      {"--url", server.url(), "--model", "fake-model", "--num-prompts", "10", "--input-len", "4",
       "--output-len", "6", "--max-concurrency", "2", "--request-timeout", "1.5"},
      /*timeout_s=*/60);
  ASSERT_EQ(run.code, 0) << run.err;
  const json& r = run.result;
  EXPECT_EQ(r["completed"], 5) << run.out;
  EXPECT_EQ(r["failed"], 5) << run.out;
  EXPECT_EQ(r["errors_by_kind"][c.kind], 5) << run.out;
  EXPECT_NE(run.out.find(c.kind + ":"), std::string::npos) << run.out;
  if (c.mode == "http500") {
    EXPECT_EQ(r["http_status_counts"]["500"], 5);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, BenchFailureTest,
                         ::testing::Values(FailureCase{"http500", "http_status"},
                                           FailureCase{"reset", "reset"},
                                           FailureCase{"malformed", "malformed"},
                                           FailureCase{"error-event", "stream_error"},
                                           FailureCase{"truncate", "truncated"},
                                           FailureCase{"stall", "timeout"}),
                         [](const ::testing::TestParamInfo<FailureCase>& info) {
                           std::string name = info.param.mode;
                           std::erase(name, '-');
                           return name;
                         });

TEST(BenchCliTest, RefusedConnectionsAreConnectErrors) {
  // Nothing listens on port 1 (privileged, unused).
  BenchRun run = RunBench({"--url", "http://127.0.0.1:1/v1", "--model", "m", "--num-prompts", "5",
                           "--input-len", "3", "--output-len", "3"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(run.result["completed"], 0);
  EXPECT_EQ(run.result["errors_by_kind"]["connect"], 5);
}

TEST(BenchCliTest, SigintStopsAndStillPrintsSummary) {
  FakeServer server({"--itl-ms", "50"});
  ASSERT_TRUE(server.ok());
  const std::string json_path = Tmp("interrupted.json");
  Subprocess proc({BuildDir() + "/tandem", "bench", "--url", server.url(), "--model", "fake-model",
                   "--num-prompts", "1000", "--input-len", "4", "--output-len", "5",
                   "--max-concurrency", "4", "--json", json_path},
                  Tmp("bench"));
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  proc.Signal(SIGINT);
  const int code = proc.Wait(15);
  EXPECT_EQ(code, 130) << proc.stderr_text();
  const std::string out = proc.stdout_text();
  EXPECT_NE(out.find("Serving Benchmark Result (interrupted)"), std::string::npos) << out;
  json r = json::parse(ReadAll(json_path), nullptr, false);
  ASSERT_TRUE(r.is_object());
  EXPECT_TRUE(r["interrupted"].get<bool>());
  EXPECT_GT(r["completed"].get<int>(), 4);
  EXPECT_LT(r["completed"].get<int>(), 1000);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_LE(r["cancelled"].get<int>(), 4);
}

TEST(BenchCliTest, SweepPrintsOneLinePerRateAndPlots) {
  FakeServer server({});
  ASSERT_TRUE(server.ok());
  const std::string plot = Tmp("plot.svg");
  BenchRun run = RunBench({"--url", server.url(), "--model", "fake-model", "--num-prompts", "8",
                           "--input-len", "4", "--output-len", "4", "--rates", "50,inf", "--plot",
                           plot, "--slo", "ttft=1000,tpot=1000"});
  ASSERT_EQ(run.code, 0) << run.err;
  std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << run.out;
  EXPECT_NE(lines[0].find("p90 TTFT"), std::string::npos);
  EXPECT_EQ(lines[1].find("      50"), 0u) << lines[1];
  EXPECT_EQ(lines[2].find("     inf"), 0u) << lines[2];
  ASSERT_EQ(run.result["runs"].size(), 2u);
  EXPECT_EQ(run.result["runs"][1]["completed"], 8);
  EXPECT_EQ(run.result["runs"][1]["good_completed"], 8);
  for (const char* tag : {"-rate50.svg", "-rateinf.svg"}) {
    std::string svg = ReadAll(plot.substr(0, plot.size() - 4) + tag);
    EXPECT_EQ(svg.rfind("<svg", 0), 0u) << tag;
  }
}

TEST(BenchCliTest, DatasetPromptsAndLengths) {
  FakeServer server({});
  ASSERT_TRUE(server.ok());
  const std::string path = Tmp("data.jsonl");
  {
    std::ofstream f(path);
    f << R"({"prompt": "a b c", "output_len": 2})"
      << "\n"
      << R"({"prompt": "d e f g h", "output_len": 7})"
      << "\n";
  }
  BenchRun run = RunBench({"--url", server.url(), "--model", "fake-model", "--dataset", path,
                           "--num-prompts", "4", "--endpoint", "completions"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(run.result["completed"], 4);
  EXPECT_EQ(run.result["total_input_tokens"], 2 * (3 + 5));
  EXPECT_EQ(run.result["total_output_tokens"], 2 * (2 + 7));
}

TEST(BenchCliTest, DurationBoundsTheRun) {
  FakeServer server({});
  ASSERT_TRUE(server.ok());
  BenchRun run = RunBench({"--url", server.url(), "--model", "fake-model", "--duration", "1.5",
                           "--request-rate", "20", "--arrival", "constant", "--input-len", "3",
                           "--output-len", "3"});
  ASSERT_EQ(run.code, 0) << run.err;
  // Constant spacing of 50 ms over [0, 1.5 s): 30 sends.
  EXPECT_EQ(run.result["completed"], 30);
}

TEST(BenchCliTest, BurstWithDurationIsAClosedLoop) {
  FakeServer server({"--itl-ms", "20"});
  ASSERT_TRUE(server.ok());
  BenchRun run = RunBench({"--url", server.url(), "--model", "fake-model", "--duration", "1",
                           "--max-concurrency", "4", "--input-len", "3", "--output-len", "5"});
  ASSERT_EQ(run.code, 0) << run.err;
  // Each request takes about 4 x 20 ms; 4 in flight for 1 s gives about 50 requests.
  EXPECT_EQ(run.result["max_concurrent_requests"], 4);
  EXPECT_GE(run.result["completed"].get<int>(), 12);
  EXPECT_LE(run.result["completed"].get<int>(), 60);
  EXPECT_EQ(run.result["failed"], 0);
  // Without a concurrency bound a timed burst would be unbounded.
  run = RunBench({"--url", server.url(), "--model", "fake-model", "--duration", "1"});
  EXPECT_EQ(run.code, 2) << run.err;
}

TEST(BenchCliTest, BadFlagsAreUsageErrors) {
  BenchRun run = RunBench({"--url", "ftp://x", "--model", "m"});
  EXPECT_EQ(run.code, 2);
  run = RunBench({"--request-rate", "-1", "--model", "m"});
  EXPECT_EQ(run.code, 2);
  run = RunBench({"--slo", "ttft", "--model", "m"});
  EXPECT_EQ(run.code, 2);
}

}  // namespace
}  // namespace tandem::bench

// `tandem bench` against a real `tandem serve` stack (router + prefill + decode processes on the
// default model): the request count and token totals the client reports must agree with the
// router's own /metrics (tandem_requests_total, tandem_prompt_tokens_total,
// tandem_generation_tokens_total).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/serving/client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/bench/subprocess.h"

namespace tandem::bench {
namespace {

using json = nlohmann::json;
using testing::ReadAll;
using testing::Subprocess;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Sum of a Prometheus counter over the lines whose labels contain every `filters` entry.
double Metric(const std::string& text, const std::string& name,
              const std::vector<std::string>& filters = {}) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, name) || line.size() <= name.size()) continue;
    if (line[name.size()] != ' ' && line[name.size()] != '{') continue;
    bool match = true;
    for (const std::string& f : filters) match &= absl::StrContains(line, f);
    if (!match) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) sum += v;
  }
  return sum;
}

TEST(BenchServeE2eTest, ClientTotalsAgreeWithServerMetrics) {
  const std::string build = TANDEM_BUILD_DIR;
  const std::string tmp = absl::StrCat(::testing::TempDir(), "/bench_e2e_", getpid());
  std::filesystem::create_directories(tmp);
  const int port = FreePort();
  Subprocess serve({build + "/tandem", "serve", "--port", std::to_string(port)},
                   tmp + "/bench_e2e_serve");
  ASSERT_TRUE(serve.WaitForOutput("Tandem is serving", 300))
      << "tandem serve did not become ready\nstdout:\n"
      << serve.stdout_text() << "\nstderr:\n"
      << serve.stderr_text();
  const std::string url = absl::StrCat("http://127.0.0.1:", port, "/v1");

  absl::StatusOr<std::string> before = HttpGet("127.0.0.1", std::to_string(port), "/metrics", 10);
  ASSERT_TRUE(before.ok()) << before.status();

  const std::string json_path = tmp + "/bench_e2e.json";
  Subprocess bench({build + "/tandem", "bench", "--no-progress", "--url", url, "--num-prompts", "6",
                    "--input-len", "12", "--output-len", "6", "--max-concurrency", "3",
                    "--request-timeout", "120", "--json", json_path},
                   tmp + "/bench_e2e_bench");
  ASSERT_EQ(bench.Wait(300), 0) << bench.stderr_text() << bench.stdout_text();
  json r = json::parse(ReadAll(json_path), nullptr, false);
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["completed"], 6) << bench.stdout_text();
  EXPECT_EQ(r["failed"], 0) << bench.stdout_text();
  for (const json& usage : r["usage_reported"]) EXPECT_TRUE(usage.get<bool>());

  absl::StatusOr<std::string> after = HttpGet("127.0.0.1", std::to_string(port), "/metrics", 10);
  ASSERT_TRUE(after.ok()) << after.status();
  const std::vector<std::string> chat_ok = {"endpoint=\"/v1/chat/completions\"", "code=\"200\""};
  EXPECT_EQ(Metric(*after, "tandem_requests_total", chat_ok) -
                Metric(*before, "tandem_requests_total", chat_ok),
            r["completed"].get<double>())
      << *after;
  EXPECT_EQ(
      Metric(*after, "tandem_prompt_tokens_total") - Metric(*before, "tandem_prompt_tokens_total"),
      r["total_input_tokens"].get<double>())
      << *after;
  EXPECT_EQ(Metric(*after, "tandem_generation_tokens_total") -
                Metric(*before, "tandem_generation_tokens_total"),
            r["total_output_tokens"].get<double>())
      << *after;
  EXPECT_GT(r["total_output_tokens"].get<int>(), 0);

  // With the served model's tokenizer, synthetic prompts have an exact length: the server's
  // count for a completion prompt is that length, plus the BOS token it may add.
  const std::string out = serve.stdout_text();
  const size_t at = out.find("Tandem is serving ") + 18;
  const std::string model_dir = out.substr(at, out.find(" at http", at) - at);
  const std::string tok_json = tmp + "/bench_e2e_tok.json";
  Subprocess exact({build + "/tandem", "bench", "--no-progress", "--url", url, "--endpoint",
                    "completions", "--tokenizer", model_dir, "--num-prompts", "4", "--input-len",
                    "20", "--output-len", "3", "--request-timeout", "120", "--json", tok_json},
                   tmp + "/bench_e2e_tok");
  ASSERT_EQ(exact.Wait(300), 0) << exact.stderr_text() << exact.stdout_text();
  json t = json::parse(ReadAll(tok_json), nullptr, false);
  ASSERT_TRUE(t.is_object());
  EXPECT_EQ(t["completed"], 4) << exact.stdout_text();
  for (const json& n : t["input_lens"]) {
    EXPECT_TRUE(n == 20 || n == 21) << "server counted " << n << " prompt tokens";
  }

  serve.Signal(SIGINT);
  EXPECT_EQ(serve.Wait(60), 0) << serve.stderr_text();
}

}  // namespace
}  // namespace tandem::bench

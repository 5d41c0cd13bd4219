#include "runtime/metrics/metrics.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace tandem::metrics {
namespace {

TEST(Metrics, RouterAndWorkerMetricsSerializeWithTheirNames) {
  prometheus::Registry router_registry;
  RouterMetrics router(router_registry);
  router.ttft.Observe(0.042);
  router.requests.Add({{"endpoint", "/v1/completions"}, {"code", "200"}}).Increment();
  std::string text = Serialize(router_registry);
  EXPECT_NE(text.find("tandem_time_to_first_token_seconds_bucket{le=\"0.06\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tandem_requests_total{code=\"200\",endpoint=\"/v1/completions\"} 1"),
            std::string::npos)
      << text;

  prometheus::Registry worker_registry;
  WorkerMetrics worker(worker_registry);
  worker.kv_transfer.CountTransfer("cuda_ipc", 4096, 16, 1024, absl::Milliseconds(4),
                                   absl::Milliseconds(1));
  worker.kv_transfer.CountTransfer("ucx", 100, 1, 0, absl::ZeroDuration(), absl::ZeroDuration());
  worker.kv_transfer.CountFailure("ucx", "deadline");
  worker.kv_transfer.CountFailure("ucx", "deadline");
  worker.kv_blocks_used.Set(3);
  text = Serialize(worker_registry);
  EXPECT_NE(text.find("tandem_kv_transfer_bytes_total{backend=\"cuda_ipc\"} 4096"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tandem_kv_transfer_ops_total{backend=\"cuda_ipc\"} 16"), std::string::npos);
  EXPECT_NE(text.find("tandem_kv_transfer_failures_total{backend=\"ucx\",stage=\"deadline\"} 2"),
            std::string::npos)
      << text;
  // 4096 bytes in 4 ms = 1.024 MB/s; 3 of the 4 ms were under compute.
  EXPECT_NE(text.find("tandem_kv_transfer_bandwidth_bytes_per_second_sum{backend=\"cuda_ipc\"} "
                      "1024000"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tandem_kv_transfer_hidden_ratio_sum{backend=\"cuda_ipc\"} 0.75"),
            std::string::npos)
      << text;
  // A transfer with no timing (the receiving side) observes no latency.
  EXPECT_NE(text.find("tandem_kv_transfer_latency_seconds_count{backend=\"ucx\"} 0"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tandem_kv_blocks_used 3"), std::string::npos) << text;
  EXPECT_EQ(worker.kv_transfer.bytes(), 4196);
  EXPECT_EQ(worker.kv_transfer.transfers(), 2);
  EXPECT_EQ(worker.kv_transfer.failures(), 2);
  EXPECT_EQ(worker.kv_transfer.streamed_bytes(), 1024);
}

TEST(Metrics, BucketsAreStrictlyIncreasing) {
  for (const auto& buckets : {TtftBuckets(), InterTokenBuckets(), E2eBuckets(), TransferBuckets(),
                              BandwidthBuckets(), RatioBuckets()}) {
    EXPECT_TRUE(std::is_sorted(buckets.begin(), buckets.end()));
    EXPECT_EQ(std::adjacent_find(buckets.begin(), buckets.end()), buckets.end());
  }
}

// promtool's own lint (`promtool check metrics`, Debian's prometheus package, which quickstart
// installs) over every router and worker metric with a series in each labelled family.
std::string Promtool(const std::string& text, int* exit_code) {
  const std::string path = ::testing::TempDir() + "/metrics.txt";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  FILE* p = popen(("promtool check metrics < '" + path + "' 2>&1").c_str(), "r");
  std::string out;
  char buf[512];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  *exit_code = pclose(p);
  return out;
}

TEST(Metrics, PromtoolFindsNoProblem) {
  ASSERT_EQ(std::system("command -v promtool > /dev/null"), 0)
      << "promtool is needed (Debian package prometheus; ./quickstart installs it)";
  prometheus::Registry router_registry;
  RouterMetrics router(router_registry);
  router.requests.Add({{"endpoint", "/v1/completions"}, {"code", "200"}}).Increment();
  router.worker_running.Add({{"worker", "w:1"}, {"role", "decode"}}).Set(1);
  router.worker_waiting.Add({{"worker", "w:1"}, {"role", "decode"}}).Set(1);
  router.worker_kv_blocks_used.Add({{"worker", "w:1"}, {"role", "decode"}}).Set(1);
  router.worker_kv_blocks_capacity.Add({{"worker", "w:1"}, {"role", "decode"}}).Set(1);
  router.worker_healthy.Add({{"worker", "w:1"}, {"role", "decode"}}).Set(1);
  router.pool_saturation.Add({{"pool", "decode"}}).Set(0.5);
  router.pool_replicas.Add({{"pool", "decode"}}).Set(1);
  router.pool_recommended_replicas.Add({{"pool", "decode"}}).Set(1);
  prometheus::Registry worker_registry;
  WorkerMetrics worker(worker_registry, "target");
  worker.kv_transfer.CountTransfer("ucx", 100, 1, 0, absl::Milliseconds(1), absl::ZeroDuration());
  worker.kv_transfer.CountFailure("ucx", "deadline");
  worker.kv_transfer_fallbacks.Add({{"backend", "ucx"}, {"reason", "UNAVAILABLE"}}).Increment();
  worker.kv_fences.Add({{"result", "lease"}}).Increment();
  for (const std::string& text : {Serialize(router_registry), Serialize(worker_registry)}) {
    int code = 0;
    const std::string output = Promtool(text, &code);
    // The one complaint allowed: the vLLM-compatible names contain ':' (vLLM's own names, kept
    // verbatim so dashboards and autoscalers written for vLLM read them).
    std::string problems;
    for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
      if (absl::StartsWith(line, "vllm:") &&
          absl::EndsWith(line, " metric names should not contain ':'")) {
        continue;
      }
      absl::StrAppend(&problems, line, "\n");
    }
    EXPECT_EQ(problems, "") << text;
    if (output.empty()) {
      EXPECT_EQ(code, 0);
    }
  }
  const std::string text = Serialize(worker_registry);
  EXPECT_NE(text.find("vllm:num_requests_waiting{model_name=\"target\"}"), std::string::npos);
  EXPECT_NE(text.find("vllm:kv_cache_usage_perc{model_name=\"target\"}"), std::string::npos);
}

}  // namespace
}  // namespace tandem::metrics

#include "runtime/metrics/metrics.h"

#include <algorithm>

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
  worker.kv_transfer_bytes.Increment(4096);
  worker.kv_blocks_used.Set(3);
  text = Serialize(worker_registry);
  EXPECT_NE(text.find("tandem_kv_transfer_bytes_total 4096"), std::string::npos) << text;
  EXPECT_NE(text.find("tandem_kv_blocks_used 3"), std::string::npos) << text;
}

TEST(Metrics, BucketsAreStrictlyIncreasing) {
  for (const auto& buckets :
       {TtftBuckets(), InterTokenBuckets(), E2eBuckets(), TransferBuckets()}) {
    EXPECT_TRUE(std::is_sorted(buckets.begin(), buckets.end()));
    EXPECT_EQ(std::adjacent_find(buckets.begin(), buckets.end()), buckets.end());
  }
}

}  // namespace
}  // namespace tandem::metrics

#include "bench/serving/stats.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::bench {
namespace {

RequestRecord Ok(double ttft, double e2e, int out, std::vector<double> itls = {}) {
  RequestRecord r;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.completion_tokens = out;
  r.prompt_tokens = 10;
  r.itls_s = std::move(itls);
  return r;
}

TEST(PercentileTest, MatchesLinearInterpolationByHand) {
  // numpy.percentile([1, 2, 3, 4, 10], p): rank = p/100 * 4.
  const std::vector<double> v = {1, 2, 3, 4, 10};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 3);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 4 + 0.6 * 6);   // rank 3.6
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 4 + 0.96 * 6);  // rank 3.96
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 10);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
}

TEST(DescribeTest, MeanMedianStdOfHandSet) {
  Distribution d = Describe({4, 1, 3, 2});  // unsorted on purpose
  EXPECT_EQ(d.count, 4u);
  EXPECT_DOUBLE_EQ(d.mean, 2.5);
  EXPECT_DOUBLE_EQ(d.median, 2.5);
  EXPECT_DOUBLE_EQ(d.std, std::sqrt(1.25));  // population std of 1..4
  EXPECT_DOUBLE_EQ(d.p90, 3 + 0.7);          // rank 2.7
  EXPECT_DOUBLE_EQ(d.min, 1);
  EXPECT_DOUBLE_EQ(d.max, 4);
  Distribution empty = Describe({});
  EXPECT_EQ(empty.count, 0u);
  EXPECT_EQ(empty.mean, 0);
}

TEST(TpotTest, ExcludesFirstToken) {
  EXPECT_DOUBLE_EQ(*Tpot(Ok(0.1, 1.1, 11)), 0.1);
  EXPECT_FALSE(Tpot(Ok(0.1, 0.1, 1)).has_value());
}

TEST(SloTest, Parses) {
  absl::StatusOr<Slo> slo = ParseSlo("ttft=200,tpot=50");
  ASSERT_TRUE(slo.ok()) << slo.status();
  EXPECT_EQ(*slo->ttft_ms, 200);
  EXPECT_EQ(*slo->tpot_ms, 50);
  EXPECT_FALSE(slo->e2el_ms.has_value());
  EXPECT_TRUE(ParseSlo("e2el:1000").ok());
  EXPECT_FALSE(ParseSlo("ttft=abc").ok());
  EXPECT_FALSE(ParseSlo("latency=5").ok());
  EXPECT_FALSE(ParseSlo("ttft=-1").ok());
  EXPECT_FALSE(ParseSlo("").ok());
}

TEST(SummarizeTest, GoodputCountsOnlyRequestsMeetingEverySlo) {
  std::vector<RequestRecord> rs = {
      Ok(0.100, 1.100, 11),  // ttft 100 ms, tpot 100 ms
      Ok(0.300, 0.800, 11),  // ttft 300 ms (violates ttft), tpot 50 ms
      Ok(0.050, 2.050, 11),  // ttft 50 ms, tpot 200 ms (violates tpot)
      Ok(0.150, 0.150, 1),   // one token: no TPOT, meets ttft
  };
  RequestRecord failed;
  failed.error = ErrorKind::kTimeout;
  rs.push_back(failed);
  RequestRecord cancelled;
  cancelled.error = ErrorKind::kCancelled;
  rs.push_back(cancelled);

  Slo slo;
  slo.ttft_ms = 200;
  slo.tpot_ms = 150;
  Summary s = Summarize(rs, 2.0, slo);
  EXPECT_EQ(s.completed, 4);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.cancelled, 1);
  EXPECT_EQ(s.good_completed, 2);
  EXPECT_DOUBLE_EQ(s.request_goodput, 1.0);
  EXPECT_DOUBLE_EQ(s.request_throughput, 2.0);
  EXPECT_EQ(s.total_output_tokens, 34);
  EXPECT_EQ(s.total_input_tokens, 40);
  EXPECT_DOUBLE_EQ(s.output_throughput, 17.0);
  EXPECT_EQ(s.errors_by_kind.at("timeout"), 1);
  EXPECT_EQ(s.tpot_ms.count, 3u);
  EXPECT_DOUBLE_EQ(s.ttft_ms.mean, (100 + 300 + 50 + 150) / 4.0);

  Summary no_slo = Summarize(rs, 2.0, Slo{});
  EXPECT_EQ(no_slo.good_completed, 4);
}

TEST(SummarizeTest, ItlPooledOverRequests) {
  std::vector<RequestRecord> rs = {Ok(0.1, 0.4, 3, {0.1, 0.2}), Ok(0.1, 0.4, 2, {0.3})};
  Summary s = Summarize(rs, 1.0, Slo{});
  EXPECT_EQ(s.itl_ms.count, 3u);
  EXPECT_NEAR(s.itl_ms.mean, 200, 1e-9);
  EXPECT_NEAR(s.itl_ms.median, 200, 1e-9);
}

TEST(OutputTokensPerSecondTest, SpreadsTokensOverChunks) {
  RequestRecord r = Ok(0.5, 2.0, 4, {0.5, 0.5, 0.5});  // chunks at 0.5, 1.0, 1.5, 2.0
  std::vector<double> bins = OutputTokensPerSecond({r}, 1.0);
  ASSERT_EQ(bins.size(), 3u);
  EXPECT_DOUBLE_EQ(bins[0], 1);
  EXPECT_DOUBLE_EQ(bins[1], 2);
  EXPECT_DOUBLE_EQ(bins[2], 1);
}

}  // namespace
}  // namespace tandem::bench

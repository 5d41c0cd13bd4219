#include "runtime/router/discovery.h"

#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using Addresses = std::vector<std::string>;

TEST(DiscoveryTest, ParsesHostPort) {
  auto hp = ParseHostPort("decode-0.tandem:7001");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "decode-0.tandem");
  EXPECT_EQ(hp->port, 7001);
  hp = ParseHostPort("[::1]:80");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "::1");
  EXPECT_EQ(hp->port, 80);
  for (const char* bad : {"", "host", "host:", ":80", "host:0", "host:65536", "host:8x", "::1:80",
                          "[::1]80", "[::1"}) {
    EXPECT_EQ(ParseHostPort(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(JoinHostPort("::1", 80), "[::1]:80");
  EXPECT_EQ(JoinHostPort("10.0.0.1", 80), "10.0.0.1:80");
}

TEST(DiscoveryTest, ParsesWorkerLists) {
  auto list = ParseWorkerList(" a:1, b:2,,a:1 ,[::1]:3");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*list, (Addresses{"a:1", "b:2", "[::1]:3"}));
  EXPECT_TRUE(ParseWorkerList("")->empty());
  EXPECT_FALSE(ParseWorkerList("a:1,b").ok());
}

// A resolver whose answers the test sets, counting calls.
class FakeResolver {
 public:
  void Set(const std::string& host, absl::StatusOr<Addresses> answer) {
    absl::MutexLock lock(&mu_);
    answers_.insert_or_assign(host, std::move(answer));
  }
  Resolver resolver() {
    return [this](const std::string& host, absl::Duration) -> absl::StatusOr<Addresses> {
      absl::MutexLock lock(&mu_);
      ++calls_;
      auto it = answers_.find(host);
      if (it == answers_.end()) return absl::NotFoundError(host);
      return it->second;
    };
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, absl::StatusOr<Addresses>> answers_;
  int calls_ = 0;
};

TEST(DiscoveryTest, MergesStaticAndDnsAndReportsChanges) {
  FakeResolver dns;
  dns.Set("decode.svc", Addresses{"10.0.0.2", "10.0.0.1"});
  std::vector<Addresses> updates;
  Discovery::Options options;
  options.static_workers = {"static:9"};
  options.dns_names = {"decode.svc:7000"};
  options.resolver = dns.resolver();
  auto discovery = Discovery::Create(options, [&](const Addresses& a) { updates.push_back(a); });
  ASSERT_TRUE(discovery.ok()) << discovery.status();

  EXPECT_EQ((*discovery)->RefreshNow(), (Addresses{"10.0.0.1:7000", "10.0.0.2:7000", "static:9"}));
  ASSERT_EQ(updates.size(), 1u);
  // Same answer: no update.
  (*discovery)->RefreshNow();
  EXPECT_EQ(updates.size(), 1u);
  // A pod goes away and another appears.
  dns.Set("decode.svc", Addresses{"10.0.0.3", "10.0.0.1"});
  (*discovery)->RefreshNow();
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates.back(), (Addresses{"10.0.0.1:7000", "10.0.0.3:7000", "static:9"}));
}

TEST(DiscoveryTest, TransientFailureKeepsAddressesNotFoundRemovesThem) {
  FakeResolver dns;
  dns.Set("p.svc", Addresses{"10.1.0.1"});
  Addresses last;
  Discovery::Options options;
  options.dns_names = {"p.svc:1"};
  options.resolver = dns.resolver();
  auto discovery = *Discovery::Create(options, [&](const Addresses& a) { last = a; });
  EXPECT_EQ(discovery->RefreshNow(), Addresses{"10.1.0.1:1"});
  dns.Set("p.svc", absl::DeadlineExceededError("slow DNS"));
  EXPECT_EQ(discovery->RefreshNow(), Addresses{"10.1.0.1:1"});
  dns.Set("p.svc", absl::UnavailableError("SERVFAIL"));
  EXPECT_EQ(discovery->RefreshNow(), Addresses{"10.1.0.1:1"});
  dns.Set("p.svc", absl::NotFoundError("NXDOMAIN"));
  EXPECT_TRUE(discovery->RefreshNow().empty());
  EXPECT_TRUE(last.empty());
}

TEST(DiscoveryTest, FirstRoundAlwaysDeliversEvenWhenEmpty) {
  FakeResolver dns;
  int updates = 0;
  Discovery::Options options;
  options.dns_names = {"none.svc:1"};
  options.resolver = dns.resolver();
  auto discovery = *Discovery::Create(options, [&](const Addresses&) { ++updates; });
  discovery->RefreshNow();
  EXPECT_EQ(updates, 1);
}

TEST(DiscoveryTest, BackgroundThreadReResolves) {
  FakeResolver dns;
  dns.Set("d.svc", Addresses{"10.2.0.1"});
  absl::Mutex mu;
  Addresses last;
  Discovery::Options options;
  options.dns_names = {"d.svc:5"};
  options.refresh = absl::Milliseconds(5);
  options.resolver = dns.resolver();
  auto discovery = *Discovery::Create(options, [&](const Addresses& a) {
    absl::MutexLock lock(&mu);
    last = a;
  });
  discovery->Start();
  dns.Set("d.svc", Addresses{"10.2.0.1", "10.2.0.9"});
  const Addresses want = {"10.2.0.1:5", "10.2.0.9:5"};
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  bool seen = false;
  while (!seen && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
    absl::MutexLock lock(&mu);
    seen = last == want;
  }
  EXPECT_TRUE(seen);
  discovery->Stop();
  const int calls = dns.calls();
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(dns.calls(), calls) << "resolved after Stop";
}

TEST(DiscoveryTest, RejectsMalformedConfiguration) {
  Discovery::Options options;
  options.static_workers = {"nope"};
  EXPECT_EQ(Discovery::Create(options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.static_workers = {};
  options.dns_names = {"svc"};
  EXPECT_EQ(Discovery::Create(options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DiscoveryTest, SystemResolverResolvesLocalhostAndRejectsUnknownNames) {
  Resolver resolve = SystemResolver();
  auto local = resolve("localhost", absl::Seconds(5));
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_FALSE(local->empty());
  auto numeric = resolve("127.0.0.1", absl::Seconds(5));
  ASSERT_TRUE(numeric.ok()) << numeric.status();
  EXPECT_EQ(*numeric, Addresses{"127.0.0.1"});
  // .invalid is reserved (RFC 6761): never resolves. Without network the answer may be a failure
  // other than NotFound; either way it is an error.
  EXPECT_FALSE(resolve("no-such-host.invalid", absl::Seconds(5)).ok());
}

}  // namespace
}  // namespace tandem::router

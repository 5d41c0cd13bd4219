#include "runtime/router/access_policy.h"

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

HttpRequest Request(std::string method, std::string path, std::string host,
                    std::string authorization = "", std::string content_type = "application/json") {
  HttpRequest r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.target = r.path;
  if (!host.empty()) r.headers.emplace_back("Host", std::move(host));
  if (!authorization.empty()) r.headers.emplace_back("Authorization", std::move(authorization));
  if (!content_type.empty()) r.headers.emplace_back("Content-Type", std::move(content_type));
  return r;
}

AccessPolicy Make(AccessOptions options) {
  absl::StatusOr<AccessPolicy> p = AccessPolicy::Create(std::move(options));
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

int Status(const AccessPolicy& p, const HttpRequest& r) {
  std::optional<ApiError> e = p.Check(r);
  return e.has_value() ? e->http_status : 200;
}

TEST(AccessPolicyTest, LoopbackBindAcceptsOnlyLoopbackHostsAgainstDnsRebinding) {
  const AccessPolicy p = Make({.bind_host = "127.0.0.1"});
  for (const char* host : {"localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000",
                           "LOCALHOST:1", "app.localhost"}) {
    EXPECT_EQ(Status(p, Request("GET", "/v1/models", host)), 200) << host;
  }
  for (const char* host : {"evil.example", "evil.example:8000", "127.0.0.1.evil.example", ""}) {
    EXPECT_EQ(Status(p, Request("GET", "/v1/models", host)), 421) << host;
  }
}

TEST(AccessPolicyTest, OtherBindsAcceptAnyHostUnlessListed) {
  EXPECT_EQ(Status(Make({.bind_host = "0.0.0.0"}), Request("GET", "/health", "router.svc")), 200);
  const AccessPolicy listed =
      Make({.allowed_hosts = {"router.svc", "[fd00::1]"}, .bind_host = "0.0.0.0"});
  EXPECT_EQ(Status(listed, Request("GET", "/health", "router.svc:8000")), 200);
  EXPECT_EQ(Status(listed, Request("GET", "/health", "[fd00::1]:8000")), 200);
  EXPECT_EQ(Status(listed, Request("GET", "/health", "other.svc")), 421);
  EXPECT_EQ(Status(Make({.allowed_hosts = {"*"}, .bind_host = "127.0.0.1"}),
                   Request("GET", "/health", "anything")),
            200);
}

TEST(AccessPolicyTest, ApiKeysGuardTheApiButNotProbes) {
  const AccessPolicy p = Make({.api_keys = {"k1", "secret-2"}, .bind_host = "127.0.0.1"});
  EXPECT_EQ(Status(p, Request("GET", "/v1/models", "localhost")), 401);
  EXPECT_EQ(Status(p, Request("GET", "/v1/models", "localhost", "Bearer wrong")), 401);
  EXPECT_EQ(Status(p, Request("GET", "/v1/models", "localhost", "Bearer secret")), 401)
      << "a prefix of a key is not the key";
  EXPECT_EQ(Status(p, Request("GET", "/v1/models", "localhost", "Basic secret-2")), 401);
  EXPECT_EQ(Status(p, Request("GET", "/v1/models", "localhost", "Bearer secret-2")), 200);
  EXPECT_EQ(Status(p, Request("POST", "/v1/completions", "localhost", "Bearer k1")), 200);
  EXPECT_EQ(Status(p, Request("GET", "/health", "localhost")), 200);
  EXPECT_EQ(Status(p, Request("GET", "/metrics", "localhost")), 200);
  EXPECT_EQ(Status(p, Request("GET", "/version", "localhost")), 200);
  // The tokenizer routes cost CPU like the API does: keyed too.
  EXPECT_EQ(Status(p, Request("POST", "/tokenize", "localhost")), 401);
  EXPECT_EQ(Status(p, Request("POST", "/detokenize", "localhost")), 401);
  EXPECT_EQ(Status(p, Request("POST", "/tokenize", "localhost", "Bearer k1")), 200);
  const std::optional<ApiError> e = p.Check(Request("GET", "/v1/models", "localhost"));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "invalid_api_key");
  EXPECT_EQ(e->type, "invalid_request_error");
}

TEST(AccessPolicyTest, PostsMustBeJson) {
  const AccessPolicy p = Make({.bind_host = "127.0.0.1"});
  EXPECT_EQ(Status(p, Request("POST", "/v1/completions", "localhost", "", "application/json")),
            200);
  EXPECT_EQ(Status(p, Request("POST", "/v1/completions", "localhost", "",
                              "Application/JSON; charset=utf-8")),
            200);
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded",
                           "multipart/form-data; boundary=x", "application/jsonx", ""}) {
    EXPECT_EQ(Status(p, Request("POST", "/v1/completions", "localhost", "", type)), 415) << type;
  }
  EXPECT_EQ(Status(p, Request("GET", "/v1/models", "localhost", "", "")), 200);
}

TEST(AccessPolicyTest, CorsOnlyForListedOriginsAndPreflightNeedsNoKey) {
  const AccessPolicy off = Make({.bind_host = "127.0.0.1"});
  HttpRequest pre = Request("OPTIONS", "/v1/completions", "localhost", "", "");
  pre.headers.emplace_back("Origin", "https://app.example");
  pre.headers.emplace_back("Access-Control-Request-Method", "POST");
  std::optional<HttpResponse> r = off.Preflight(pre);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 403) << "no CORS without an allow-list";
  EXPECT_TRUE(off.ResponseHeaders(pre).empty());

  const AccessPolicy on =
      Make({.api_keys = {"k"}, .bind_host = "127.0.0.1", .cors_origins = {"https://app.example"}});
  r = on.Preflight(pre);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 204);
  const auto header = [](const HttpResponse& resp, const std::string& name) {
    for (const auto& [k, v] : resp.headers) {
      if (k == name) return v;
    }
    return std::string();
  };
  EXPECT_EQ(header(*r, "Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_NE(header(*r, "Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  HttpRequest other = pre;
  for (auto& [k, v] : other.headers) {
    if (k == "Origin") v = "https://evil.example";
  }
  r = on.Preflight(other);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 403);
  EXPECT_TRUE(on.ResponseHeaders(other).empty());
  EXPECT_FALSE(on.Preflight(Request("GET", "/v1/models", "localhost")).has_value());
  HttpRequest get = Request("GET", "/v1/models", "localhost", "Bearer k");
  get.headers.emplace_back("Origin", "https://app.example");
  EXPECT_EQ(on.ResponseHeaders(get).size(), 2u);
  // A rebinding page cannot preflight either.
  HttpRequest rebound = pre;
  for (auto& [k, v] : rebound.headers) {
    if (k == "Host") v = "evil.example";
  }
  r = on.Preflight(rebound);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 421);
}

TEST(AccessPolicyTest, BadOptionsAndKeyFiles) {
  EXPECT_FALSE(AccessPolicy::Create({.api_keys = {""}}).ok());
  EXPECT_FALSE(AccessPolicy::Create({.api_keys = {"two words"}}).ok());
  EXPECT_FALSE(AccessPolicy::Create({.allowed_hosts = {"host:8000"}}).ok());
  const std::string path = ::testing::TempDir() + "/keys.txt";
  {
    std::ofstream out(path);
    out << "# router keys\n\n  alpha  \nbeta\n";
  }
  absl::StatusOr<std::vector<std::string>> keys = ReadApiKeyFile(path);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys, (std::vector<std::string>{"alpha", "beta"}));
  {
    std::ofstream out(path);
    out << "# nothing\n";
  }
  EXPECT_FALSE(ReadApiKeyFile(path).ok());
  EXPECT_FALSE(ReadApiKeyFile(path + ".missing").ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tandem::router

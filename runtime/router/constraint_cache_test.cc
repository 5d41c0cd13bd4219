#include "runtime/router/constraint_cache.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/router/openai_protocol.h"

namespace tandem::router {
namespace {

TEST(ConstraintCacheTest, CompilesOnceAndCachesErrorsToo) {
  ConstraintCache cache(8, 1 << 20);
  int compiles = 0;
  auto ok = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return std::string("regex");
  };
  EXPECT_EQ(*cache.GetOrCompile("a", ok), "regex");
  EXPECT_EQ(*cache.GetOrCompile("a", ok), "regex");
  EXPECT_EQ(compiles, 1);
  auto bad = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return InvalidParam("guided_json", "no");
  };
  EXPECT_FALSE(cache.GetOrCompile("b", bad).ok());
  const absl::StatusOr<std::string> again = cache.GetOrCompile("b", bad);
  EXPECT_EQ(compiles, 2);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(ToApiError(again.status()).param, "guided_json");  // the payloads survive
  const ConstraintCache::Stats s = cache.stats();
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(s.entries, 2u);
}

TEST(ConstraintCacheTest, EvictsTheLeastRecentlyUsedByCountAndBytes) {
  ConstraintCache cache(3, 1 << 20);
  int compiles = 0;
  auto value = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return std::string("v");
  };
  for (const char* k : {"a", "b", "c"}) ASSERT_TRUE(cache.GetOrCompile(k, value).ok());
  ASSERT_TRUE(cache.GetOrCompile("a", value).ok());  // a is recent again
  ASSERT_TRUE(cache.GetOrCompile("d", value).ok());  // evicts b
  EXPECT_EQ(compiles, 4);
  ASSERT_TRUE(cache.GetOrCompile("a", value).ok());
  EXPECT_EQ(compiles, 4);
  ASSERT_TRUE(cache.GetOrCompile("b", value).ok());
  EXPECT_EQ(compiles, 5);
  EXPECT_EQ(cache.stats().entries, 3u);

  ConstraintCache small(100, 8 << 10);
  auto big = []() -> absl::StatusOr<std::string> { return std::string(600, 'x'); };
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(small.GetOrCompile(absl::StrCat("k", i), big).ok());
  EXPECT_LE(small.stats().bytes, size_t{8 << 10});
  // A result bigger than an eighth of the budget is returned, not kept.
  auto huge = []() -> absl::StatusOr<std::string> { return std::string(2000, 'y'); };
  EXPECT_EQ(small.GetOrCompile("huge", huge)->size(), 2000u);
  const int64_t misses = small.stats().misses;
  EXPECT_EQ(small.GetOrCompile("huge", huge)->size(), 2000u);
  EXPECT_EQ(small.stats().misses, misses + 1);
}

TEST(ConstraintCacheTest, ConcurrentLookupsAgree) {
  ConstraintCache cache(16, 1 << 20);
  std::atomic<int> compiles{0};
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        const std::string key = absl::StrCat("k", (i + t) % 32);
        absl::StatusOr<std::string> v =
            cache.GetOrCompile(key, [&]() -> absl::StatusOr<std::string> {
              ++compiles;
              return key + "!";
            });
        if (!v.ok() || *v != key + "!") ++wrong;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(cache.stats().entries, 16u);
  // (Whether the threads hit depends on their interleaving: 32 keys cycle through 16 entries.)
  const int64_t hits = cache.stats().hits;
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(*cache.GetOrCompile("again", [] { return absl::StatusOr<std::string>("v"); }), "v");
  }
  EXPECT_EQ(cache.stats().hits, hits + 1);
}

// The request parsers go through the shared cache: the second identical schema is a lookup.
TEST(ConstraintCacheTest, RepeatedSchemasAreLookups) {
  const std::string body = R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema":
      {"type": "object", "properties": {"cache_test_field": {"type": "integer"}}}}}})";
  const ConstraintCache::Stats before = ConstraintCache::Shared().stats();
  absl::StatusOr<OpenAiRequest> a = ParseChatCompletionRequest(body);
  absl::StatusOr<OpenAiRequest> b = ParseChatCompletionRequest(body);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->params.guided.regex, b->params.guided.regex);
  const ConstraintCache::Stats after = ConstraintCache::Shared().stats();
  EXPECT_EQ(after.misses - before.misses, 1);
  EXPECT_EQ(after.hits - before.hits, 1);
}

}  // namespace
}  // namespace tandem::router

#include "bench/serving/sse_parser.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::bench {
namespace {

std::vector<std::string> FeedPieces(const std::vector<std::string_view>& pieces) {
  SseParser parser;
  std::vector<std::string> events;
  for (std::string_view p : pieces) {
    EXPECT_TRUE(parser.Feed(p, [&](std::string_view d) {
      events.emplace_back(d);
      return true;
    }));
  }
  return events;
}

// A stream with every line-ending style, comments, ignored fields and a multi-line event.
constexpr std::string_view kStream =
    ": keep-alive comment\r\n"
    "data: {\"a\":1}\r\n\r\n"
    "event: message\n"
    "id: 7\n"
    "data:{\"b\":2}\n\n"
    "data: line1\r"
    "data: line2\r\r"
    "retry: 100\n\n"
    "data\n\n"
    "data: [DONE]\n\n";

const std::vector<std::string> kExpected = {"{\"a\":1}", "{\"b\":2}", "line1\nline2", "", "[DONE]"};

TEST(SseParserTest, WholeStream) { EXPECT_EQ(FeedPieces({kStream}), kExpected); }

TEST(SseParserTest, SplitAtEveryByteBoundary) {
  for (size_t cut = 0; cut <= kStream.size(); ++cut) {
    EXPECT_EQ(FeedPieces({kStream.substr(0, cut), kStream.substr(cut)}), kExpected)
        << "cut at " << cut;
  }
}

TEST(SseParserTest, OneByteAtATime) {
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < kStream.size(); ++i) bytes.push_back(kStream.substr(i, 1));
  EXPECT_EQ(FeedPieces(bytes), kExpected);
}

TEST(SseParserTest, CrLfSplitAcrossPiecesIsOneLineEnd) {
  // "\r" ends one piece, "\n" starts the next: one line end, not an empty line (no early event).
  SseParser parser;
  std::vector<std::string> events;
  auto sink = [&](std::string_view d) {
    events.emplace_back(d);
    return true;
  };
  parser.Feed("data: a\r", sink);
  parser.Feed("\ndata: b\r\n\r\n", sink);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], "a\nb");
  EXPECT_TRUE(parser.idle());
}

TEST(SseParserTest, IncompleteEventIsNotDelivered) {
  SseParser parser;
  int n = 0;
  parser.Feed("data: partial\n", [&](std::string_view) { return ++n, true; });
  EXPECT_EQ(n, 0);
  EXPECT_FALSE(parser.idle());
}

TEST(SseParserTest, LineLimitFails) {
  SseParser parser(16);
  auto sink = [](std::string_view) { return true; };
  EXPECT_TRUE(parser.Feed("data: 0123456", sink));
  EXPECT_FALSE(parser.Feed("789abcdef", sink));
  EXPECT_TRUE(parser.failed());
  EXPECT_FALSE(parser.Feed("\n\n", sink));
}

TEST(SseParserTest, CallbackCanStopParsing) {
  SseParser parser;
  std::vector<std::string> events;
  parser.Feed("data: 1\n\ndata: 2\n\n", [&](std::string_view d) {
    events.emplace_back(d);
    return false;
  });
  EXPECT_EQ(events, std::vector<std::string>{"1"});
}

}  // namespace
}  // namespace tandem::bench

#include "runtime/engine/stop_strings.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(StopStringBufferTest, NoStopsPassesEverythingThrough) {
  StopStringBuffer b({});
  EXPECT_EQ(b.Append("hello"), "hello");
  EXPECT_EQ(b.Flush(), "");
}

TEST(StopStringBufferTest, WithholdsPossiblePrefixThenReleases) {
  StopStringBuffer b({"STOP"});
  EXPECT_EQ(b.Append("abc S"), "abc ");
  EXPECT_EQ(b.Append("T"), "");
  EXPECT_EQ(b.Append("x"), "STx");  // "STx" can no longer become "STOP"
  EXPECT_FALSE(b.stopped());
  EXPECT_EQ(b.Append("ST"), "");
  EXPECT_EQ(b.Flush(), "ST");  // end of stream releases the withheld text
}

TEST(StopStringBufferTest, MatchAcrossDeltasDropsStopAndRest) {
  StopStringBuffer b({"STOP", "\n\n"});
  EXPECT_EQ(b.Append("one ST"), "one ");
  EXPECT_EQ(b.Append("OP and more"), "");
  EXPECT_TRUE(b.stopped());
  EXPECT_EQ(b.Append("later"), "");
  EXPECT_EQ(b.Flush(), "");
}

TEST(StopStringBufferTest, EarliestOfSeveralStopsWins) {
  StopStringBuffer b({"cd", "b"});
  EXPECT_EQ(b.Append("abcd"), "a");
  EXPECT_TRUE(b.stopped());
}

TEST(StopStringBufferTest, OverlappingPrefixKeepsLongestCandidate) {
  StopStringBuffer b({"aab"});
  EXPECT_EQ(b.Append("a"), "");
  EXPECT_EQ(b.Append("a"), "");
  EXPECT_EQ(b.Append("a"), "a");  // "aaa": the last "aa" may still start "aab"
  EXPECT_EQ(b.Append("b"), "");
  EXPECT_TRUE(b.stopped());
}

TEST(StopStringBufferTest, IncludeStopKeepsTheMatchedStopString) {
  StopStringBuffer b({"STOP", "\n\n"}, /*include_stop=*/true);
  EXPECT_EQ(b.Append("one ST"), "one ");
  EXPECT_EQ(b.Append("OP and more"), "STOP");
  EXPECT_TRUE(b.stopped());
  EXPECT_EQ(b.Flush(), "");
}

TEST(StopStringBufferTest, IncludeStopTakesTheEarliestAndThenLongestMatch) {
  StopStringBuffer b({"b", "bc", "cd"}, /*include_stop=*/true);
  EXPECT_EQ(b.Append("abcd"), "abc");
}

}  // namespace
}  // namespace tandem

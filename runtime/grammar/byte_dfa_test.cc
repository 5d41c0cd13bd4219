// The byte automaton against std::regex (ECMAScript full match) on random patterns and strings,
// plus the constructs std::regex does not judge for us: UTF-8, choices, refusals and limits.
#include "runtime/grammar/byte_dfa.h"

#include <random>
#include <regex>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::grammar {
namespace {

using ::testing::HasSubstr;

// A random pattern over the alphabet {a, b, c}.
std::string RandomPattern(std::mt19937& rng, int depth) {
  const int pick = depth <= 0 ? rng() % 4 : rng() % 11;
  switch (pick) {
    case 0:
      return std::string(1, "abc"[rng() % 3]);
    case 1:
      return "[ab]";
    case 2:
      return "[^a]";
    case 3:
      return ".";
    case 4:
      return RandomPattern(rng, depth - 1) + RandomPattern(rng, depth - 1);
    case 5:
      return "(" + RandomPattern(rng, depth - 1) + "|" + RandomPattern(rng, depth - 1) + ")";
    case 6:
      return "(" + RandomPattern(rng, depth - 1) + ")*";
    case 7:
      return "(?:" + RandomPattern(rng, depth - 1) + ")+";
    case 8:
      return "(" + RandomPattern(rng, depth - 1) + ")?";
    case 9: {
      const int m = rng() % 3, n = m + rng() % 3;
      return "(" + RandomPattern(rng, depth - 1) + "){" + std::to_string(m) + "," +
             std::to_string(n) + "}";
    }
    default:
      return "[a-b]c";
  }
}

TEST(ByteDfaTest, AgreesWithStdRegexOnRandomPatterns) {
  std::mt19937 rng(20261203);
  int matched = 0, checked = 0;
  for (int p = 0; p < 300; ++p) {
    const std::string pattern = RandomPattern(rng, 4);
    absl::StatusOr<ByteDfa> dfa = ByteDfa::FromRegex(pattern);
    ASSERT_TRUE(dfa.ok()) << pattern << ": " << dfa.status();
    const std::regex reference(pattern, std::regex::ECMAScript);
    for (int s = 0; s < 60; ++s) {
      std::string text;
      const int len = rng() % 7;
      for (int k = 0; k < len; ++k) text += "abcd"[rng() % 4];
      const bool want = std::regex_match(text, reference);
      EXPECT_EQ(dfa->Matches(text), want) << "/" << pattern << "/ on \"" << text << "\"";
      matched += want;
      ++checked;
    }
  }
  EXPECT_GT(matched, checked / 20);  // the sample holds matches, not only misses
}

TEST(ByteDfaTest, PrefixesStayAliveAndDeadEndsAreCut) {
  absl::StatusOr<ByteDfa> dfa = ByteDfa::FromRegex(R"(\d{3}-\d{4})");
  ASSERT_TRUE(dfa.ok()) << dfa.status();
  EXPECT_TRUE(dfa->Matches("555-1234"));
  EXPECT_FALSE(dfa->Matches("555-123"));
  const int mid = dfa->Walk(dfa->start(), "555-");
  ASSERT_NE(mid, kDeadState);
  EXPECT_FALSE(dfa->accepting(mid));
  EXPECT_TRUE(dfa->can_continue(mid));
  EXPECT_EQ(dfa->Walk(dfa->start(), "55a"), kDeadState);
  const int end = dfa->Walk(dfa->start(), "555-1234");
  EXPECT_TRUE(dfa->accepting(end));
  EXPECT_FALSE(dfa->can_continue(end));
}

TEST(ByteDfaTest, Utf8DotsEscapesAndAnchors) {
  absl::StatusOr<ByteDfa> dot = ByteDfa::FromRegex("^.$");
  ASSERT_TRUE(dot.ok());
  EXPECT_TRUE(dot->Matches("a"));
  EXPECT_TRUE(dot->Matches("é"));
  EXPECT_TRUE(dot->Matches("😀"));
  EXPECT_FALSE(dot->Matches("ab"));
  EXPECT_FALSE(dot->Matches("\n"));
  absl::StatusOr<ByteDfa> word = ByteDfa::FromRegex(R"(\w+\s\S\.\x41[^0-9]ü)");
  ASSERT_TRUE(word.ok()) << word.status();
  EXPECT_TRUE(word->Matches("ab_9 ?.Aéü"));
  EXPECT_FALSE(word->Matches("ab_9 ?.A5ü"));
}

TEST(ByteDfaTest, NonAsciiIsWellFormedUtf8Only) {
  absl::StatusOr<ByteDfa> dot = ByteDfa::FromRegex(".");
  absl::StatusOr<ByteDfa> negated = ByteDfa::FromRegex("[^a]");
  ASSERT_TRUE(dot.ok() && negated.ok());
  // Every code point from U+0080 to U+10FFFF but the surrogates, encoded by hand.
  for (uint32_t cp = 0x80; cp <= 0x10FFFF; cp += (cp < 0x10000 ? 1 : 97)) {
    std::string u;
    if (cp < 0x800) {
      u = {static_cast<char>(0xC0 | cp >> 6), static_cast<char>(0x80 | (cp & 0x3F))};
    } else if (cp < 0x10000) {
      u = {static_cast<char>(0xE0 | cp >> 12), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
           static_cast<char>(0x80 | (cp & 0x3F))};
    } else {
      u = {static_cast<char>(0xF0 | cp >> 18), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
           static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    const bool surrogate = cp >= 0xD800 && cp <= 0xDFFF;
    ASSERT_EQ(dot->Matches(u), !surrogate) << std::hex << cp;
    ASSERT_EQ(negated->Matches(u), !surrogate) << std::hex << cp;
  }
  for (const char* bad :
       {"\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xe0\x9f\xbf", "\xed\xa0\x80", "\xf0\x80\x80\x80",
        "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\x80", "\xc3"}) {
    EXPECT_FALSE(dot->Matches(bad)) << "overlong, surrogate, past U+10FFFF or cut";
  }
}

TEST(ByteDfaTest, ChoicesMatchExactlyOneOfThem) {
  absl::StatusOr<ByteDfa> dfa = ByteDfa::FromChoices({"yes", "no", "yesterday"});
  ASSERT_TRUE(dfa.ok());
  EXPECT_TRUE(dfa->Matches("yes"));
  EXPECT_TRUE(dfa->Matches("yesterday"));
  EXPECT_TRUE(dfa->Matches("no"));
  EXPECT_FALSE(dfa->Matches("ye"));
  EXPECT_FALSE(dfa->Matches("nope"));
  const int yes = dfa->Walk(dfa->start(), "yes");
  EXPECT_TRUE(dfa->accepting(yes) && dfa->can_continue(yes));
  EXPECT_FALSE(ByteDfa::FromChoices({}).ok());
  EXPECT_FALSE(ByteDfa::FromChoices({"a", ""}).ok());
}

TEST(ByteDfaTest, UnsupportedConstructsAreRefusedWithTheirPlace) {
  for (const char* bad : {"(?=a)b", "(a)\\1", "(?<n>a)", "a\\b", "a**+", "(a", "a)", "[a", "a{3,2}",
                          "*a", "a^b", "[é]", "\\q", "a{999}"}) {
    absl::StatusOr<ByteDfa> dfa = ByteDfa::FromRegex(bad);
    EXPECT_FALSE(dfa.ok()) << bad;
    EXPECT_THAT(dfa.status().message(), HasSubstr("regex:")) << bad;
  }
  EXPECT_THAT(ByteDfa::FromRegex("(?=a)b").status().message(), HasSubstr("offset 1"));
}

TEST(ByteDfaTest, MinimizationMergesEquivalentStatesOnly) {
  // Known minimal sizes (dead state not counted): the last-4th-letter language has 2^4 states.
  EXPECT_EQ(ByteDfa::FromRegex("(a|b)*a(a|b){3}")->num_states(), 16);
  EXPECT_EQ(ByteDfa::FromRegex("(abc|abc|ab(c))")->num_states(), 4);
  // A list of A costs about what A costs, not twice as much.
  const std::string item = "\\{\"k\": (\"[a-z]*\"|[0-9]+|\\[([0-9]+(, [0-9]+)*)?\\])\\}";
  const int one = ByteDfa::FromRegex(item)->num_states();
  const int list = ByteDfa::FromRegex("\\[" + item + "(, " + item + ")*\\]")->num_states();
  EXPECT_LE(list, one + 3);
  // The same language as the unminimized automaton, with no more states.
  std::mt19937 rng(20261204);
  ByteDfaLimits raw;
  raw.minimize = false;
  for (int p = 0; p < 200; ++p) {
    const std::string pattern = RandomPattern(rng, 4);
    absl::StatusOr<ByteDfa> min = ByteDfa::FromRegex(pattern);
    absl::StatusOr<ByteDfa> full = ByteDfa::FromRegex(pattern, raw);
    ASSERT_TRUE(min.ok() && full.ok()) << pattern;
    EXPECT_LE(min->num_states(), full->num_states()) << pattern;
    for (int s = 0; s < 100; ++s) {
      std::string text;
      const int len = rng() % 9;
      for (int k = 0; k < len; ++k) text += "abcd"[rng() % 4];
      ASSERT_EQ(min->Matches(text), full->Matches(text)) << "/" << pattern << "/ on " << text;
      // Prefix liveness agrees too (the masks depend on it).
      const int a = min->Walk(min->start(), text), b = full->Walk(full->start(), text);
      ASSERT_EQ(a == kDeadState, b == kDeadState) << "/" << pattern << "/ on " << text;
    }
  }
}

TEST(ByteDfaTest, LimitsBoundStatesAndPatternSize) {
  // (a|b)*a(a|b){n}: the classic exponential DFA.
  ByteDfaLimits limits;
  limits.max_states = 64;
  absl::StatusOr<ByteDfa> big = ByteDfa::FromRegex("(a|b)*a(a|b){10}", limits);
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(big.status().message(), HasSubstr("automaton states"));
  EXPECT_TRUE(ByteDfa::FromRegex("(a|b)*a(a|b){4}", limits).ok());
  EXPECT_FALSE(ByteDfa::FromRegex(std::string(20000, 'a')).ok());
}

}  // namespace
}  // namespace tandem::grammar

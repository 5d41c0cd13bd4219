#include "runtime/grammar/gbnf.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/grammar/byte_dfa.h"

namespace tandem::grammar {
namespace {

using ::testing::HasSubstr;

ByteDfa Compile(const std::string& grammar, GbnfOptions options = {}) {
  absl::StatusOr<GbnfRegex> r = GbnfToRegex(grammar, options);
  EXPECT_TRUE(r.ok()) << r.status() << "\n" << grammar;
  if (!r.ok()) return *ByteDfa::FromRegex("x");
  absl::StatusOr<ByteDfa> dfa = ByteDfa::FromRegex(r->regex);
  EXPECT_TRUE(dfa.ok()) << dfa.status();
  return dfa.ok() ? *std::move(dfa) : *ByteDfa::FromRegex("x");
}

void ExpectLanguage(const std::string& grammar, const std::vector<std::string>& in,
                    const std::vector<std::string>& out) {
  const ByteDfa dfa = Compile(grammar);
  for (const std::string& s : in) EXPECT_TRUE(dfa.Matches(s)) << "'" << s << "' in\n" << grammar;
  for (const std::string& s : out) {
    EXPECT_FALSE(dfa.Matches(s)) << "'" << s << "' not in\n" << grammar;
  }
}

std::string Error(const std::string& grammar, GbnfOptions options = {}) {
  absl::StatusOr<GbnfRegex> r = GbnfToRegex(grammar, options);
  EXPECT_FALSE(r.ok()) << grammar;
  return r.ok() ? "" : std::string(r.status().message());
}

TEST(GbnfTest, LiteralsAlternativesAndSequences) {
  ExpectLanguage(R"(root ::= "yes" | "no" | "maybe" " " "later")", {"yes", "no", "maybe later"},
                 {"", "ye", "yesno", "maybe", "maybelater"});
  // Rules, and an empty alternative.
  ExpectLanguage("root ::= greeting name\ngreeting ::= \"hi \" | \"hello \"\nname ::= \"bob\" |",
                 {"hi bob", "hello ", "hi "}, {"hi", "hey bob"});
  // Single quotes and escapes (the grammar text's \\n is a newline to match).
  ExpectLanguage(R"(root ::= 'a\'b' "\n" "\t" "\x41" "\u00e9" "\"")", {"a'b\n\tAé\""}, {"a'b"});
}

TEST(GbnfTest, ClassesAnyAndQuantifiers) {
  ExpectLanguage(R"(root ::= [a-c] [0-9]+ [^x]? "."*)", {"a1", "c12.", "b0y..", "a9\n"},
                 {"d1", "a", "ax", "a1x."});
  ExpectLanguage(R"(root ::= [a-z]{2} [0-9]{1,3} "-"{2,})", {"ab1--", "zz123---"},
                 {"a1--", "ab1234--", "ab1-"});
  ExpectLanguage(R"(root ::= . .)", {"ab", "\n\n", "é€"}, {"a", "abc"});
  // Non-ASCII members become UTF-8 alternatives.
  ExpectLanguage(R"(root ::= [αβγa-b]+)", {"α", "aβγb"}, {"δ", ""});
  ExpectLanguage("root ::= [\\]\\-\\\\]+", {"]-\\"}, {"a"});
}

TEST(GbnfTest, CommentsNestingAndContinuationLines) {
  ExpectLanguage(R"(# a comment line
root ::= ( # inside parentheses lines may break
    "a"
  | "b" )  "!"   # trailing comment
    | "c"

)",
                 {"a!", "b!", "c"}, {"a", "c!"});
}

TEST(GbnfTest, RecursionIsExpandedToABoundedDepth) {
  const std::string parens = "root ::= \"(\" root \")\" | \"x\"";
  GbnfOptions options;
  options.max_recursion_depth = 3;
  absl::StatusOr<GbnfRegex> r = GbnfToRegex(parens, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->recursion_depth, 3);
  const ByteDfa dfa = *ByteDfa::FromRegex(r->regex);
  EXPECT_TRUE(dfa.Matches("x"));
  EXPECT_TRUE(dfa.Matches("((x))"));
  EXPECT_FALSE(dfa.Matches("(((x)))"));  // deeper than 3 expansions of root: not produced
  EXPECT_FALSE(dfa.Matches("((x)"));     // never a non-sentence
  // A non-recursive grammar reports depth 0.
  EXPECT_EQ(GbnfToRegex(R"(root ::= "a")")->recursion_depth, 0);
}

// llama.cpp's grammars/json.gbnf: every output it accepts is JSON; nesting is bounded.
TEST(GbnfTest, TheJsonGrammarCompilesAndAcceptsJson) {
  const std::string json = R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)";
  absl::StatusOr<GbnfRegex> r = GbnfToRegex(json);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->recursion_depth, 2);
  const ByteDfa dfa = *ByteDfa::FromRegex(r->regex);
  std::printf("json.gbnf: recursion depth %d, %zu regex bytes, %d states\n", r->recursion_depth,
              r->regex.size(), dfa.num_states());
  for (const char* ok : {R"({})", R"({"a": 1})", R"({"a": [1, 2.5, "x\n", true, null]})",
                         "{\"a\": {\"b\": \"\\u00e9\"}}"}) {
    EXPECT_TRUE(dfa.Matches(ok)) << ok << " at depth " << r->recursion_depth;
  }
  for (const char* bad : {R"({a: 1})", R"({"a": 01x})", R"([1])", R"({"a": "x)"}) {
    EXPECT_FALSE(dfa.Matches(bad)) << bad;
  }
}

TEST(GbnfTest, BadGrammarsAreNamedErrors) {
  EXPECT_THAT(Error(R"(start ::= "a")"), HasSubstr("no 'root' rule"));
  EXPECT_THAT(Error("root ::= a\n"), HasSubstr("rule 'a' is not defined"));
  EXPECT_THAT(Error("root ::= \"a\"\nroot ::= \"b\""), HasSubstr("defined twice"));
  EXPECT_THAT(Error(R"(root ::= "abc)"), HasSubstr("1:10: unterminated literal"));
  EXPECT_THAT(Error(R"(root ::= [abc)"), HasSubstr("unterminated class"));
  EXPECT_THAT(Error(R"(root ::= ("a")"), HasSubstr("unclosed '('"));
  EXPECT_THAT(Error(R"(root ::= "a"{3,1})"), HasSubstr("n < m"));
  EXPECT_THAT(Error(R"(root ::= "a"{300})"), HasSubstr("above 256"));
  EXPECT_THAT(Error(R"(root ::= "\q")"), HasSubstr("unknown escape"));
  EXPECT_THAT(Error(R"(root ::= "\uD800")"), HasSubstr("Unicode scalar"));
  EXPECT_THAT(Error(R"(root = "a")"), HasSubstr("expected '::='"));
  EXPECT_THAT(Error("root ::= \"a\" b ::= \"c\""), HasSubstr("own line"));
  EXPECT_THAT(Error(R"(root ::= [^é])"), HasSubstr("negated class with non-ASCII"));
  EXPECT_THAT(Error(R"(root ::= [一-龥])"), HasSubstr("more than 256 non-ASCII"));
  EXPECT_THAT(Error("root ::= \"a\" root"), HasSubstr("can never finish"));
  EXPECT_THAT(Error(std::string(200, '(')), HasSubstr("expected a rule name"));
  EXPECT_THAT(Error("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')')),
              HasSubstr("nested too deep"));
  GbnfOptions small;
  small.max_grammar_bytes = 8;
  EXPECT_THAT(Error(R"(root ::= "abcdef")", small), HasSubstr("at most 8"));
  // A grammar whose automaton is too large at every depth says so.
  GbnfOptions tight;
  tight.max_regex_bytes = 64;
  EXPECT_THAT(Error("root ::= x x\nx ::= \"abcdefghijklmnopqrstuvwxyz0123456789\"", tight),
              HasSubstr("bytes of automaton regex"));
}

}  // namespace
}  // namespace tandem::grammar

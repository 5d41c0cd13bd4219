#include "runtime/grammar/gbnf.h"

#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/utf8.h"
#include "runtime/grammar/pda.h"
#include "runtime/grammar/vocab_trie.h"

// GBNF parsing and the pushdown automaton (pda.h) it compiles to: languages, deep recursion, the
// errors, and the automaton against an independent recognizer (a memoized backtracking matcher
// over the parsed rules) on random strings.

namespace tandem::grammar {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<GrammarPda> Compile(const std::string& grammar, PdaLimits limits = {}) {
  absl::StatusOr<std::unique_ptr<GrammarPda>> pda = GrammarPda::FromGbnf(grammar, limits);
  EXPECT_TRUE(pda.ok()) << pda.status() << "\n" << grammar;
  if (!pda.ok()) return *GrammarPda::FromGbnf("root ::= \"x\"");
  return *std::move(pda);
}

void ExpectLanguage(const std::string& grammar, const std::vector<std::string>& in,
                    const std::vector<std::string>& out) {
  const std::unique_ptr<GrammarPda> pda = Compile(grammar);
  for (const std::string& s : in) EXPECT_TRUE(pda->Matches(s)) << "'" << s << "' in\n" << grammar;
  for (const std::string& s : out) {
    EXPECT_FALSE(pda->Matches(s)) << "'" << s << "' not in\n" << grammar;
  }
}

std::string Error(const std::string& grammar, GbnfOptions options = {}, PdaLimits limits = {}) {
  absl::StatusOr<GbnfGrammar> g = ParseGbnf(grammar, options);
  if (!g.ok()) return std::string(g.status().message());
  absl::StatusOr<std::unique_ptr<GrammarPda>> pda = GrammarPda::Compile(*g, limits);
  EXPECT_FALSE(pda.ok()) << grammar;
  return pda.ok() ? "" : std::string(pda.status().message());
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

// Recursion nests as deep as the input goes: no depth is fixed at compile time.
TEST(GbnfTest, RecursionNestsAsDeepAsTheInput) {
  const std::unique_ptr<GrammarPda> pda = Compile("root ::= \"(\" root \")\" | \"x\"");
  for (int depth : {0, 1, 5, 50, 500}) {
    const std::string s = std::string(depth, '(') + "x" + std::string(depth, ')');
    EXPECT_TRUE(pda->Matches(s)) << depth;
    EXPECT_FALSE(pda->Matches(s + ")")) << depth;
    EXPECT_FALSE(pda->Matches(std::string(depth + 1, '(') + "x" + std::string(depth, ')')));
  }
  // Mid-way, the stack is as deep as the nesting, and only ')' or more '(' / 'x' can follow.
  const int s = pda->Walk(pda->start(), "((((((((((");
  ASSERT_NE(s, kDeadState);
  EXPECT_EQ(pda->StacksAndDepth(s).second, 11);
  EXPECT_FALSE(pda->accepting(s));
  EXPECT_EQ(pda->Walk(s, ")"), kDeadState);
  // Past the configured depth, nothing deeper is offered.
  PdaLimits shallow;
  shallow.max_depth = 8;
  const std::unique_ptr<GrammarPda> capped = Compile("root ::= \"(\" root \")\" | \"x\"", shallow);
  EXPECT_TRUE(capped->Matches("(((((((x)))))))"));
  EXPECT_FALSE(capped->Matches("((((((((x))))))))"));
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
  const std::unique_ptr<GrammarPda> pda = Compile(json);
  std::string deep = "1";
  for (int i = 0; i < 40; ++i) deep = i % 2 ? "{\"k\": " + deep + "}" : "[" + deep + ", \"s\"]";
  for (const std::string& ok :
       std::vector<std::string>{R"({})", R"({"a": 1})", R"({"a": [1, 2.5, "x\n", true, null]})",
                                "{\"a\": {\"b\": \"\\u00e9\"}}", "{\"d\": " + deep + "}"}) {
    EXPECT_TRUE(pda->Matches(ok)) << ok;
  }
  for (const char* bad : {R"({a: 1})", R"({"a": 01x})", R"([1])", R"({"a": "x)", R"({"a": [1})"}) {
    EXPECT_FALSE(pda->Matches(bad)) << bad;
  }
  std::printf("json.gbnf: %d rule DFA states, %d configurations after the checks\n",
              pda->num_dfa_states(), pda->num_configs());
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
  EXPECT_THAT(Error("root ::= root \"a\" | \"b\""), HasSubstr("'root' is left-recursive"));
  EXPECT_THAT(Error("root ::= e\ne ::= t | e \"+\" t\nt ::= \"1\""),
              HasSubstr("'e' is left-recursive"));
  EXPECT_THAT(Error("root ::= n root \"x\" | \"y\"\nn ::= \"\"?"),
              HasSubstr("left-recursive"));  // through a rule that can be empty
  EXPECT_THAT(Error(std::string(200, '(')), HasSubstr("expected a rule name"));
  EXPECT_THAT(Error("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')')),
              HasSubstr("nested too deep"));
  GbnfOptions small;
  small.max_grammar_bytes = 8;
  EXPECT_THAT(Error(R"(root ::= "abcdef")", small), HasSubstr("at most 8"));
  PdaLimits tight;
  tight.max_nfa_states = 64;
  EXPECT_THAT(Error(R"(root ::= [a-z]{100})", {}, tight), HasSubstr("more than 64"));
  // Nested repeats whose subset construction blows up (a fuzzed grammar took over 12 s under
  // the fuzzer's limits): refused by the subset construction's work budget.
  PdaLimits budget;
  budget.max_subset_work = 1 << 16;
  EXPECT_THAT(Error("root ::= [a-z' ] [*^x]{8,}++++++++ \"x\"", {}, budget),
              HasSubstr("too large to compile"));
}

// An independent recognizer: every way each node can match from a position (memoized), straight
// from the parsed rules.
class Reference {
 public:
  explicit Reference(const GbnfGrammar& g) : g_(g) {}
  bool Matches(const std::string& s) {
    s_ = s;
    memo_.clear();
    const std::set<size_t> ends = Ends(g_.rules[g_.root].second, 0);
    return ends.contains(s.size());
  }

 private:
  std::set<size_t> Ends(const GbnfNode& n, size_t at) {
    const auto key = std::make_pair(&n, at);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    memo_[key] = {};  // a re-entry at the same place adds nothing (no left recursion here)
    std::set<size_t> out;
    switch (n.kind) {
      case GbnfNode::Kind::kLiteral:
        if (s_.compare(at, n.text.size(), n.text) == 0) out.insert(at + n.text.size());
        break;
      case GbnfNode::Kind::kAny:
      case GbnfNode::Kind::kClass: {
        uint32_t cp = 0;
        const size_t len = DecodeOne(at, &cp);
        if (len == 0) break;
        bool member = n.kind == GbnfNode::Kind::kAny;
        for (const auto& [lo, hi] : n.ranges) member = member || (lo <= cp && cp <= hi);
        if (n.kind == GbnfNode::Kind::kClass && n.negated) member = !member;
        if (member) out.insert(at + len);
        break;
      }
      case GbnfNode::Kind::kRef:
        out = Ends(g_.rules[n.rule].second, at);
        break;
      case GbnfNode::Kind::kSeq: {
        out = {at};
        for (const GbnfNode& k : n.kids) {
          std::set<size_t> next;
          for (size_t p : out) {
            for (size_t e : Ends(k, p)) next.insert(e);
          }
          out = std::move(next);
        }
        break;
      }
      case GbnfNode::Kind::kAlt:
        for (const GbnfNode& k : n.kids) {
          for (size_t e : Ends(k, at)) out.insert(e);
        }
        break;
      case GbnfNode::Kind::kRepeat: {
        std::set<size_t> frontier = {at};
        for (int i = 0; n.max < 0 || i <= n.max; ++i) {
          if (i >= n.min) out.insert(frontier.begin(), frontier.end());
          if (n.max >= 0 && i == n.max) break;
          std::set<size_t> next;
          for (size_t p : frontier) {
            for (size_t e : Ends(n.kids[0], p)) {
              if (e > p || i < n.min) next.insert(e);
            }
          }
          if (next.empty() || (n.max < 0 && i > static_cast<int>(s_.size()) + n.min)) break;
          frontier = std::move(next);
        }
        break;
      }
    }
    memo_[key] = out;
    return out;
  }
  // The UTF-8 character at `at` (its length, 0 if none or invalid).
  size_t DecodeOne(size_t at, uint32_t* cp) const {
    if (at >= s_.size()) return 0;
    const unsigned char c = s_[at];
    const size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (len == 0 || at + len > s_.size()) return 0;
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < len; ++k) {
      const unsigned char d = s_[at + k];
      if ((d & 0xC0) != 0x80) return 0;
      v = (v << 6) | (d & 0x3F);
    }
    std::string again;
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    AppendUtf8(v, &again);
    if (again != s_.substr(at, len)) return 0;  // an overlong form
    *cp = v;
    return len;
  }

  const GbnfGrammar& g_;
  std::string s_;
  std::map<std::pair<const GbnfNode*, size_t>, std::set<size_t>> memo_;
};

// Random strings over each grammar's alphabet: the automaton and the recognizer agree, and the
// automaton's prefix states are dead exactly when no sampled string extends them.
TEST(GbnfTest, AutomatonAgreesWithAnIndependentRecognizer) {
  const std::vector<std::pair<std::string, std::string>> grammars = {
      {"root ::= \"(\" root \")\" | \"x\"", "()x"},
      {"root ::= e\ne ::= t (\"+\" t)*\nt ::= f (\"*\" f)*\nf ::= \"1\" | \"(\" e \")\"", "1+*()"},
      {"root ::= (\"a\" | \"ab\")* \"b\"", "ab"},  // ambiguous: several stacks at once
      {"root ::= s\ns ::= \"[\" (s (\",\" s)*)? \"]\" | [0-9]{1,2}", "[],0"},
      {"root ::= a b\na ::= \"x\"? \"y\"*\nb ::= \"y\" a | \"z\"", "xyz"},
      {"root ::= [^ab] root? | \"a\"", "abc"},
      {"root ::= x{2,3} \"!\"\nx ::= \"(\" x? \")\"", "()!"},
  };
  std::mt19937 rng(7);
  for (const auto& [text, alphabet] : grammars) {
    SCOPED_TRACE(text);
    absl::StatusOr<GbnfGrammar> g = ParseGbnf(text);
    ASSERT_TRUE(g.ok()) << g.status();
    absl::StatusOr<std::unique_ptr<GrammarPda>> pda = GrammarPda::Compile(*g);
    ASSERT_TRUE(pda.ok()) << pda.status();
    Reference ref(*g);
    int matched = 0;
    for (int trial = 0; trial < 3000; ++trial) {
      std::string s;
      const int len = static_cast<int>(rng() % 13);
      if (trial % 2 == 0) {
        for (int i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
      } else {
        // A walk the automaton keeps live, so that many strings are (near) sentences.
        int state = (*pda)->start();
        for (int i = 0; i < len; ++i) {
          std::string live;
          for (char c : alphabet) {
            if ((*pda)->Walk(state, std::string(1, c)) != kDeadState) live += c;
          }
          if (live.empty()) break;
          const char c = live[rng() % live.size()];
          s += c;
          state = (*pda)->Walk(state, std::string(1, c));
        }
      }
      const bool want = ref.Matches(s);
      matched += want;
      ASSERT_EQ((*pda)->Matches(s), want) << "'" << s << "'";
      // A live prefix of a match is never dead.
      if (want) {
        for (size_t k = 0; k <= s.size(); ++k) {
          ASSERT_NE((*pda)->Walk((*pda)->start(), s.substr(0, k)), kDeadState) << s << " " << k;
        }
      }
    }
    EXPECT_GT(matched, 100) << "the random strings hardly ever match: a weak test";
  }
}

// Token masks over a pushdown automaton: exactly the tokens whose bytes keep a match possible
// (checked token by token with Walk), at several configurations of a recursive grammar.
TEST(GbnfTest, TokenMasksAreThoseWhoseBytesStayLive) {
  const std::unique_ptr<GrammarPda> pda =
      Compile("root ::= \"[\" (v (\",\" v)*)? \"]\"\nv ::= root | [0-9]+");
  std::vector<std::string> vocab = {"[",  "]",  ",", "[[",    "]]", "],",  ",[", "1",
                                    "12", "1]", "x", "[1,2]", "",   "]]]", "0,"};
  VocabTrie trie(vocab);
  for (const char* prefix : {"", "[", "[[", "[1", "[[1,[2", "[[],"}) {
    const int s = pda->Walk(pda->start(), prefix);
    ASSERT_NE(s, kDeadState) << prefix;
    TokenBitmask mask(static_cast<int>(vocab.size()));
    pda->AllowedTokens(s, trie, &mask);
    for (size_t id = 0; id < vocab.size(); ++id) {
      const bool live = !vocab[id].empty() && pda->Walk(s, vocab[id]) != kDeadState;
      EXPECT_EQ(mask.Test(static_cast<int>(id)), live)
          << "'" << prefix << "' + '" << vocab[id] << "'";
    }
  }
}

}  // namespace
}  // namespace tandem::grammar

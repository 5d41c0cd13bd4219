// Unit tests of the chat-template Jinja interpreter. Expected strings are what Python Jinja2 (the
// engine transformers uses, with trim_blocks and lstrip_blocks) renders for the same template.

#include <ctime>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/jinja_template.h"

namespace tandem::jinja {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<std::string> Render(const std::string& source, const Object& vars = {},
                                   const LexOptions& options = {}) {
  absl::StatusOr<Template> t = Template::Compile(source, options);
  if (!t.ok()) return t.status();
  return t->Render(vars);
}

std::string R(const std::string& source, const Object& vars = {}, const LexOptions& options = {}) {
  absl::StatusOr<std::string> out = Render(source, vars, options);
  EXPECT_TRUE(out.ok()) << source << ": " << out.status();
  return out.ok() ? *out : "<error>";
}

Value Json(const char* text) { return FromJson(nlohmann::ordered_json::parse(text)); }

// --- whitespace control ---------------------------------------------------------------------

TEST(JinjaWhitespace, DashStripsAllWhitespaceOnItsSide) {
  EXPECT_EQ(R("a \n {%- if true %}b{% endif -%} \n c"), "abc");
  EXPECT_EQ(R("a \n {{- 'b' -}} \n c"), "abc");
  EXPECT_EQ(R("a \n {#- comment -#} \n c"), "ac");
}

TEST(JinjaWhitespace, TrimBlocksDropsOneNewlineAfterBlockTags) {
  EXPECT_EQ(R("{% if true %}\nX\n{% endif %}\nY"), "X\nY");
  EXPECT_EQ(R("{# c #}\n\nY"), "\nY");
  // Not after expression tags.
  EXPECT_EQ(R("{{ 'X' }}\nY"), "X\nY");
}

TEST(JinjaWhitespace, LstripBlocksOnlyAtLineStart) {
  EXPECT_EQ(R("  {% if true %}X{% endif %}"), "X");
  EXPECT_EQ(R("a\n    {% if true %}X\n    {% endif %}b"), "a\nX\nb");
  EXPECT_EQ(R("a  {% if true %}X{% endif %}"), "a  X");
  EXPECT_EQ(R("  {{ 'X' }}"), "  X");                   // never before {{
  EXPECT_EQ(R("  {%+ if true %}X{% endif %}"), "  X");  // {%+ opts out
  // The line start survives a trim_blocks-eaten newline.
  EXPECT_EQ(R("{% if true %}\n  {% if true %}X{% endif %}{% endif %}"), "X");
}

TEST(JinjaWhitespace, OptionsOffKeepEverything) {
  LexOptions raw;
  raw.trim_blocks = false;
  raw.lstrip_blocks = false;
  raw.keep_trailing_newline = true;
  EXPECT_EQ(R("  {% if true %}\nX{% endif %}\n", {}, raw), "  \nX\n");
}

TEST(JinjaWhitespace, OneTrailingNewlineOfTheSourceIsDropped) {
  EXPECT_EQ(R("x\n"), "x");
  EXPECT_EQ(R("x\n\n"), "x\n");
}

// --- statements -----------------------------------------------------------------------------

TEST(JinjaStatements, IfElifElse) {
  const std::string t = "{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(R(t, {{"n", Value::Int(1)}}), "one");
  EXPECT_EQ(R(t, {{"n", Value::Int(2)}}), "two");
  EXPECT_EQ(R(t, {{"n", Value::Int(5)}}), "many");
}

TEST(JinjaStatements, ForLoopVariables) {
  EXPECT_EQ(R("{% for x in ['a', 'b', 'c'] %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}"
              "{{ loop.last }}{{ loop.length }}{{ loop.revindex0 }}{{ x }},{% endfor %}"),
            "01TrueFalse32a,12FalseFalse31b,23FalseTrue30c,");
}

TEST(JinjaStatements, ForElseAndUndefinedIterable) {
  EXPECT_EQ(R("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in missing %}a{% else %}none{% endfor %}"), "none");
}

TEST(JinjaStatements, ForTupleTargetsOverItems) {
  EXPECT_EQ(R("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}",
              {{"d", Json(R"({"b": 1, "a": [2]})")}}),
            "b=1;a=[2];");
  EXPECT_EQ(R("{% for k in d %}{{ k }}{% endfor %}", {{"d", Json(R"({"x": 1, "y": 2})")}}), "xy");
}

TEST(JinjaStatements, SetInsideLoopDoesNotLeakButNamespaceDoes) {
  EXPECT_EQ(R("{% set x = 1 %}{% for i in [1, 2] %}{% set x = 5 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(
      R("{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}"
        "{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}"),
      "6 123");
  // `if` opens no scope.
  EXPECT_EQ(R("{% if true %}{% set y = 'in' %}{% endif %}{{ y }}"), "in");
}

TEST(JinjaStatements, SetOverridesAGlobal) {
  EXPECT_EQ(R("{% set messages = messages[1:] %}{{ messages | length }}",
              {{"messages", Json("[1, 2, 3]")}}),
            "2");
}

// --- expressions ----------------------------------------------------------------------------

TEST(JinjaExpressions, Literals) {
  EXPECT_EQ(R(R"({{ "tab\tq\"uote\\" }}|{{ 'it\'s' }}|{{ '\u00e9\x41' }})"),
            "tab\tq\"uote\\|it's|éA");
  EXPECT_EQ(R("{{ true }} {{ True }} {{ none }} {{ None }} {{ false }}"),
            "True True None None False");
  EXPECT_EQ(R("{{ 42 }} {{ 1.0 }} {{ 2.50 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 0.1 + 0.2 }}"),
            "42 1.0 2.5 1e+20 1.5e-07 0.30000000000000004");
  EXPECT_EQ(R(R"({{ ['a', "b'c", 1, none, {'k': true}, (1, 2)] }})"),
            R"(['a', "b'c", 1, None, {'k': True}, [1, 2]])");
  EXPECT_EQ(R("{{ 'a' 'b' }}"), "ab");
}

TEST(JinjaExpressions, AttributeItemAndSlice) {
  Object vars = {{"m", Json(R"({"role": "user", "content": "hi"})")}, {"l", Json("[1, 2, 3, 4]")}};
  EXPECT_EQ(R("{{ m.role }}{{ m['content'] }}{{ m.missing }}", vars), "userhi");
  EXPECT_EQ(R("{{ l[0] }}{{ l[-1] }}{{ l[9] }}", vars), "14");
  EXPECT_EQ(R("{{ l[1:] }}{{ l[:2] }}{{ l[::-1] }}{{ l[::2] }}{{ l[-2:] }}", vars),
            "[2, 3, 4][1, 2][4, 3, 2, 1][1, 3][3, 4]");
  EXPECT_EQ(R("{{ 'héllo'[1:3] }}{{ 'héllo'[-1] }}"),
            "él"
            "o");
}

TEST(JinjaExpressions, ArithmeticFollowsPython) {
  EXPECT_EQ(R("{{ 1 + 2 * 3 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }}"),
            "7 1 2 3 -4 3.5");
  EXPECT_EQ(R("{{ 2 ** 10 }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ 1 + 1.5 }}"),
            "1024 abab [1, 2] 2.5");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ none ~ missing }}"), "a1None");
}

TEST(JinjaExpressions, ComparisonsAndLogic) {
  EXPECT_EQ(R("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 'b' >= 'a' }}"),
            "True False True True True");
  EXPECT_EQ(
      R("{{ 'ab' in 'cabd' }} {{ 1 not in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'x' in missing }}"),
      "True False True False");
  EXPECT_EQ(R("{{ 0 or 'b' }} {{ 'a' and 'b' }} {{ not 0 }} {{ [] or none }}"), "b b True None");
  EXPECT_EQ(R("{{ 'x' if false else 'y' }}{{ 'z' if false }}{{ 'w' if 1 }}"), "yw");
}

TEST(JinjaExpressions, FiltersAndTestsBindTighterThanOperators) {
  EXPECT_EQ(R("{{ 'a' + ' b ' | trim + 'c' }}"), "abc");
  EXPECT_EQ(R("{{ not [1] | length == 1 }}"), "False");
  EXPECT_EQ(R("{{ not x is defined }} {{ [1, 2] | length - 1 }}"), "True 1");
}

// --- filters --------------------------------------------------------------------------------

TEST(JinjaFilters, TrimUsesPythonWhitespace) {
  EXPECT_EQ(R("[{{ '  a b \n\t' | trim }}]"), "[a b]");
  EXPECT_EQ(R("[{{ '\u3000x\u00a0\u2003' | trim }}]"), "[x]");
  EXPECT_EQ(R("[{{ 'xxaxx' | trim('x') }}]"), "[a]");
}

TEST(JinjaFilters, LengthCountsCodePoints) {
  EXPECT_EQ(R("{{ 'héllo🦙' | length }} {{ [1, 2] | length }} {{ {'a': 1} | count }} "
              "{{ missing | length }}"),
            "6 2 1 0");
}

TEST(JinjaFilters, ToJsonLikeTransformers) {
  EXPECT_EQ(R(R"({{ {'a': [1, 'x"y\n', none, true, 1.5], 'é': {}} | tojson }})"),
            R"({"a": [1, "x\"y\n", null, true, 1.5], "é": {}})");
  EXPECT_EQ(R("{{ {'a': [1, 2], 'b': {}, 'c': []} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {},\n  \"c\": []\n}");
  EXPECT_EQ(R("{{ t | tojson }}", {{"t", Json(R"({"z": 1, "a": 2})")}}), R"({"z": 1, "a": 2})");
}

TEST(JinjaFilters, StringCaseDefaultJoin) {
  EXPECT_EQ(R("{{ 'aB' | upper }}{{ 'aB' | lower }}{{ 1 | string + 'x' }}"), "ABab1x");
  EXPECT_EQ(R("[{{ missing | default('d') }}|{{ '' | default('d') }}|{{ '' | default('d', true) }}"
              "|{{ none | d('n') }}]"),
            "[d||d|None]");
  EXPECT_EQ(R("{{ ['a', 'b', 1] | join(', ') }}|{{ 'abc' | join('-') }}"), "a, b, 1|a-b-c");
}

TEST(JinjaFilters, RejectSelectFirstLast) {
  EXPECT_EQ(R("{{ ['a', 'code_interpreter', 'b'] | reject('equalto', 'code_interpreter') | "
              "join(',') }}"),
            "a,b");
  EXPECT_EQ(R("{{ [1, 2, 3, 4] | select('odd') | list }} {{ [0, 1, ''] | select | list }}"),
            "[1, 3] [1]");
  EXPECT_EQ(R("{{ [1, 2] | first }}{{ [1, 2] | last }}"), "12");
}

// --- tests ----------------------------------------------------------------------------------

TEST(JinjaTests, TypeAndValueTests) {
  Object vars = {{"s", Value::String("x")},
                 {"d", Json("{}")},
                 {"n", Value::None()},
                 {"l", Json("[1]")},
                 {"b", Value::Bool(false)}};
  EXPECT_EQ(R("{{ s is defined }}{{ missing is defined }}{{ missing is not defined }}"
              "{{ missing is undefined }}",
              vars),
            "TrueFalseTrueTrue");
  EXPECT_EQ(R("{{ n is none }}{{ s is not none }}{{ s is string }}{{ d is mapping }}"
              "{{ l is mapping }}{{ l is iterable }}{{ 1 is number }}",
              vars),
            "TrueTrueTrueTrueFalseTrueTrue");
  EXPECT_EQ(
      R("{{ b is false }}{{ b is true }}{{ 0 is false }}{{ 3 is odd }}{{ 'a' is equalto 'a' }}"
        "{{ 1 is eq(2) }}",
        vars),
      "TrueFalseFalseTrueTrueFalse");
}

// --- methods --------------------------------------------------------------------------------

TEST(JinjaMethods, StringMethodsFollowPython) {
  EXPECT_EQ(R("[{{ '  x  '.strip() }}|{{ '\n x\n'.lstrip('\n') }}|{{ 'ab\n\n'.rstrip('\n') }}]"),
            "[x| x\n|ab]");
  EXPECT_EQ(R("{{ 'r</think>\n\na'.split('</think>')[-1].lstrip('\n') }}|{{ ' a  b '.split() }}|"
              "{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}"),
            "a|['a', 'b']|['a', 'b', '', 'c']|['a', 'b c']");
  EXPECT_EQ(
      R("{{ '<a>'.startswith('<') }}{{ '<a>'.endswith(('x', '>')) }}{{ 'ab'.startswith('b') }}"),
      "TrueTrueFalse");
  EXPECT_EQ(R("{{ 'aXa'.replace('a', 'b') }}{{ 'hi there'.title() }}{{ 'hI'.capitalize() }}"),
            "bXbHi ThereHi");
}

TEST(JinjaMethods, DictMethods) {
  Object vars = {{"d", Json(R"({"a": 1, "b": 2})")}};
  EXPECT_EQ(R("{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}{{ d.keys() }}"
              "{{ d.get('a') }}{{ d.get('z', 'dflt') }}{{ d.get('z') }}",
              vars),
            "a1b2['a', 'b']1dfltNone");
}

// --- functions ------------------------------------------------------------------------------

TEST(JinjaFunctions, RaiseExceptionCarriesTheMessage) {
  absl::StatusOr<std::string> out =
      Render("{% if x %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}",
             {{"x", Value::Bool(true)}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("Conversation roles must alternate"));
}

TEST(JinjaFunctions, StrftimeNowUsesLocalTime) {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char want[64];
  std::strftime(want, sizeof(want), "%d %b %Y", &local);
  EXPECT_EQ(R("{% if strftime_now is defined %}{{ strftime_now('%d %b %Y') }}{% endif %}"),
            std::string(want));
}

TEST(JinjaFunctions, Range) {
  EXPECT_EQ(R("{{ range(3) }}{{ range(1, 7, 2) }}{{ range(3, 0, -1) }}"),
            "[0, 1, 2][1, 3, 5][3, 2, 1]");
}

// --- undefined ------------------------------------------------------------------------------

TEST(JinjaUndefined, DefaultUndefinedSemantics) {
  EXPECT_EQ(R("[{{ missing }}]{% if missing %}x{% endif %}{% if not missing %}y{% endif %}"),
            "[]y");
  EXPECT_EQ(R("[{{ d.nokey }}]", {{"d", Json("{}")}}), "[]");
  for (const char* bad :
       {"{{ missing.attr }}", "{{ missing['k'] }}", "{{ 'a' + missing }}", "{{ missing + 1 }}",
        "{{ d.nokey.deeper }}", "{{ missing.strip() }}", "{{ missing < 1 }}"}) {
    absl::StatusOr<std::string> out = Render(bad, {{"d", Json("{}")}});
    ASSERT_FALSE(out.ok()) << bad;
    EXPECT_THAT(out.status().message(), HasSubstr("is undefined")) << bad;
  }
}

// --- errors ---------------------------------------------------------------------------------

TEST(JinjaErrors, OutsideTheSubsetFailsAtCompileWithConstructAndLine) {
  struct Case {
    const char* source;
    const char* construct;
  };
  const Case cases[] = {
      {"a\nb\n{{ x | wordwrap }}", "filter 'wordwrap'"},
      {"{% macro f() %}x{% endmacro %}", "'{% macro %}'"},
      {"{% if x is divisibleby 3 %}{% endif %}", "test 'divisibleby'"},
      {"{{ lipsum() }}", "function 'lipsum()'"},
      {"{{ 'x'.format(1) }}", "method '.format()'"},
      {"{% for x in y if x %}{% endfor %}", "for ... if"},
      {"{% set x %}body{% endset %}", "block '{% set %}"},
      {"{% include 'other.j2' %}", "'{% include %}'"},
      {"{% generation %}x{% endgeneration %}", "'{% generation %}'"},
      {"{% frobnicate %}", "unknown statement"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Template> t = Template::Compile(c.source);
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.source;
    EXPECT_THAT(t.status().message(), HasSubstr(c.construct)) << c.source;
  }
  absl::StatusOr<Template> t = Template::Compile("a\nb\n{{ x | wordwrap }}");
  EXPECT_THAT(t.status().message(), HasSubstr("line 3"));
}

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  struct Case {
    const char* source;
    const char* message;
  };
  const Case cases[] = {
      {"{{ x", "line 1: unclosed '{{'"},
      {"ok\n{% if x %}\nno end", "expected '{% elif %}' or '{% else %}' or '{% endif %}'"},
      {"{% endfor %}", "unexpected '{% endfor %}'"},
      {"{{ 'abc }}", "unterminated string"},
      {"\n\n{{ x ! y }}", "line 3: unexpected character '!'"},
      {"{{ (1, 2 }}", "unbalanced"},
      {"{{ x | }}", "expected a name"},
      {"{# never closed", "unterminated comment"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Template> t = Template::Compile(c.source);
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_THAT(t.status().message(), HasSubstr(c.message)) << c.source;
  }
}

TEST(JinjaErrors, DeepNestingIsRejectedNotACrash) {
  std::string deep = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  absl::StatusOr<Template> t = Template::Compile(deep);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("nested too deeply"));
  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_FALSE(Template::Compile(nots + "1 }}").ok());
  std::string ifs;
  for (int i = 0; i < 100000; ++i) ifs += "{% if true %}";
  EXPECT_FALSE(Template::Compile(ifs).ok());
  for (const char* link : {"1 + ", "x.", "1 ~ ", "1 < ", "1 and ", "1 * "}) {
    std::string chain = "{{ ";
    for (int i = 0; i < 100000; ++i) chain += link;
    absl::StatusOr<Template> deep_chain = Template::Compile(chain + "1 }}");
    ASSERT_FALSE(deep_chain.ok()) << link;
    EXPECT_THAT(deep_chain.status().message(), HasSubstr("nested too deeply")) << link;
  }
  std::string filters = "{{ x ";
  for (int i = 0; i < 100000; ++i) filters += "| trim ";
  EXPECT_THAT(Template::Compile(filters + "}}").status().message(), HasSubstr("nested too deeply"));
  // Realistic nesting is fine.
  EXPECT_EQ(R("{{ ((((1)))) + [[[2]]][0][0][0] }}"), "3");
}

TEST(JinjaErrors, RuntimeTypeErrorsNameTheLine) {
  absl::StatusOr<std::string> out = Render("x\n{{ 'a' + 1 }}");
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(out.status().message(),
              HasSubstr("unsupported operand type(s) for +: 'str' and 'int'"));
  EXPECT_FALSE(Render("{% for x in 3 %}{% endfor %}").ok());
  EXPECT_FALSE(Render("{{ 1 // 0 }}").ok());
  EXPECT_THAT(Render("{{ 9223372036854775807 + 1 }}").status().message(),
              HasSubstr("integer overflow"));
  EXPECT_THAT(Render("{{ 3 ** 100 }}").status().message(), HasSubstr("integer overflow"));
  EXPECT_EQ(R("{{ 1 ** 1000000000000 }} {{ (-1) ** 3 }} {{ 0 ** 0 }} {{ 2 ** 62 }}"),
            "1 -1 1 4611686018427387904");
  EXPECT_THAT(Render("{{ 'abc' * 100000000 }}").status().message(), HasSubstr("too large"));
  EXPECT_FALSE(Render("{% set x = 1 %}{% set x.a = 2 %}").ok());
}

// --- values ---------------------------------------------------------------------------------

TEST(JinjaValue, ToJsonEscapesLikePythonJsonDumps) {
  Value v = Value::String(std::string("a\"\\\n\t\x01\x7f") + "é\u2028");
  absl::StatusOr<std::string> json = v.ToJson();
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(*json,
            "\"a\\\"\\\\\\n\\t\\u0001\x7f"
            "é\u2028\"");
  EXPECT_FALSE(Value::Undefined("x").ToJson().ok());
}

}  // namespace
}  // namespace tandem::jinja

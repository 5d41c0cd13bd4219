#include "runtime/router/tool_calls.h"

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/grammar/byte_dfa.h"
#include "runtime/router/openai_protocol.h"

namespace tandem::router {
namespace {

constexpr char kWeatherTools[] = R"("tools": [
  {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "enum": ["Paris", "Tokyo"]},
      "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "noop"}}])";

std::string Chat(const std::string& extra) {
  return absl::StrCat(R"({"messages": [{"role": "user", "content": "hi"}], )", extra, "}");
}

absl::StatusOr<OpenAiRequest> Parse(const std::string& extra) {
  return ParseChatCompletionRequest(Chat(extra));
}

ApiError Error(const std::string& extra) {
  absl::StatusOr<OpenAiRequest> r = Parse(extra);
  EXPECT_FALSE(r.ok()) << extra;
  return r.ok() ? ApiError{} : ToApiError(r.status());
}

bool Accepts(const std::string& regex, const std::string& text) {
  absl::StatusOr<grammar::ByteDfa> dfa = grammar::ByteDfa::FromRegex(regex);
  EXPECT_TRUE(dfa.ok()) << dfa.status();
  return dfa.ok() && dfa->Matches(text);
}

TEST(ToolRequestTest, ToolsDefaultToAutoAndKeepTheClientsKeyOrder) {
  absl::StatusOr<OpenAiRequest> r = Parse(kWeatherTools);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tools.choice, ToolChoice::kAuto);
  ASSERT_EQ(r->tools.functions.size(), 2u);
  EXPECT_EQ(r->tools.functions[0].name, "get_weather");
  EXPECT_TRUE(r->params.guided.empty());  // auto is not constrained
  // "type" before "function", "city" before "days": as written, not sorted.
  EXPECT_LT(r->tools.tools_json.find("\"type\""), r->tools.tools_json.find("\"function\""));
  EXPECT_LT(r->tools.tools_json.find("\"city\""), r->tools.tools_json.find("\"days\""));
  EXPECT_NE(r->tools.tools_json.find("\"description\":\"Weather now\""), std::string::npos);
}

TEST(ToolRequestTest, NamedFunctionConstrainsTheOutputToItsArguments) {
  absl::StatusOr<OpenAiRequest> r = Parse(absl::StrCat(
      kWeatherTools,
      R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tools.choice, ToolChoice::kFunction);
  EXPECT_EQ(r->tools.function, "get_weather");
  EXPECT_TRUE(Accepts(r->params.guided.regex, R"({"city": "Paris", "days": 3})"));
  EXPECT_FALSE(Accepts(r->params.guided.regex, R"({"city": "Rome", "days": 3})"));
  EXPECT_FALSE(Accepts(r->params.guided.regex, R"({"city": "Paris", "days": 9})"));
  EXPECT_FALSE(Accepts(r->params.guided.regex, R"({"city": "Paris"})"));
}

TEST(ToolRequestTest, RequiredConstrainsTheOutputToAListOfCalls) {
  absl::StatusOr<OpenAiRequest> r =
      Parse(absl::StrCat(kWeatherTools, R"(, "tool_choice": "required")"));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string& regex = r->params.guided.regex;
  EXPECT_TRUE(
      Accepts(regex, R"([{"name": "get_weather", "parameters": {"city": "Tokyo", "days": 1}}])"));
  EXPECT_TRUE(Accepts(
      regex,
      R"([{"name": "noop", "parameters": {}}, {"name": "noop", "parameters": {"x": [1]}}])"));
  EXPECT_FALSE(Accepts(regex, "[]"));
  EXPECT_FALSE(Accepts(regex, R"([{"name": "other", "parameters": {}}])"));
  EXPECT_FALSE(Accepts(regex, R"([{"name": "get_weather", "parameters": {"city": "Tokyo"}}])"));

  absl::StatusOr<OpenAiRequest> one = Parse(
      absl::StrCat(kWeatherTools, R"(, "tool_choice": "required", "parallel_tool_calls": false)"));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(Accepts(one->params.guided.regex, R"([{"name": "noop", "parameters": {}}])"));
  EXPECT_FALSE(
      Accepts(one->params.guided.regex,
              R"([{"name": "noop", "parameters": {}}, {"name": "noop", "parameters": {}}])"));
}

TEST(ToolRequestTest, NoneAndNoToolsLeaveTheOutputAlone) {
  absl::StatusOr<OpenAiRequest> none =
      Parse(absl::StrCat(kWeatherTools, R"(, "tool_choice": "none")"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->tools.choice, ToolChoice::kNone);
  EXPECT_FALSE(none->tools.parses_output());
  EXPECT_FALSE(none->tools.tools_json.empty());  // still rendered
  absl::StatusOr<OpenAiRequest> empty = Parse(R"("tools": [], "tool_choice": "none")");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->tools.functions.empty());
  EXPECT_TRUE(empty->tools.tools_json.empty());
}

TEST(ToolRequestTest, BadToolsAreNamedErrors) {
  struct Case {
    std::string extra;
    std::string param;
  };
  const std::vector<Case> cases = {
      {R"("tools": {})", "tools"},
      {R"("tools": [1])", "tools[0]"},
      {R"("tools": [{"type": "retrieval"}])", "tools[0].type"},
      {R"("tools": [{"type": "function"}])", "tools[0].function"},
      {R"("tools": [{"type": "function", "function": {"name": "has space"}}])",
       "tools[0].function.name"},
      {R"("tools": [{"type": "function", "function": {"name": ""}}])", "tools[0].function.name"},
      {absl::StrCat(R"("tools": [{"type": "function", "function": {"name": ")",
                    std::string(65, 'a'), R"("}}])"),
       "tools[0].function.name"},
      {R"("tools": [{"type": "function", "function": {"name": "a"}},
                    {"type": "function", "function": {"name": "a"}}])",
       "tools[1].function.name"},
      {R"("tools": [{"type": "function", "function": {"name": "a", "params": {}}}])",
       "tools[0].function.params"},
      {R"("tools": [{"type": "function", "function": {"name": "a", "parameters": []}}])",
       "tools[0].function.parameters"},
      {R"("tools": [{"type": "function", "function": {"name": "a",
           "parameters": {"type": "object", "patternProperties": {"x": {}}}}}])",
       "tools[0].function.parameters"},
      {R"("tools": [{"type": "function", "function": {"name": "a", "strict": "yes"}}])",
       "tools[0].function.strict"},
      {R"("tool_choice": "auto")", "tool_choice"},
      {R"("parallel_tool_calls": true)", "parallel_tool_calls"},
      {absl::StrCat(kWeatherTools, R"(, "tool_choice": "sometimes")"), "tool_choice"},
      {absl::StrCat(kWeatherTools,
                    R"(, "tool_choice": {"type": "function", "function": {"name": "x"}})"),
       "tool_choice.function.name"},
      {absl::StrCat(kWeatherTools, R"(, "tool_choice": {"type": "function"})"), "tool_choice"},
      {absl::StrCat(kWeatherTools, R"(, "parallel_tool_calls": 1)"), "parallel_tool_calls"},
      {absl::StrCat(kWeatherTools,
                    R"(, "tool_choice": "required", "response_format": {"type": "json_object"})"),
       "tool_choice"},
  };
  for (const Case& c : cases) {
    ApiError e = Error(c.extra);
    EXPECT_EQ(e.http_status, 400) << c.extra;
    EXPECT_EQ(e.param, c.param) << c.extra << ": " << e.message;
  }
  // The unsupported keyword is named.
  ApiError e = Error(R"("tools": [{"type": "function", "function": {"name": "a",
      "parameters": {"type": "object", "patternProperties": {"x": {}}}}}])");
  EXPECT_NE(e.message.find("patternProperties"), std::string::npos) << e.message;
  EXPECT_EQ(e.code, "unsupported_parameter");
}

TEST(ToolRequestTest, HistoryCarriesToolCallsAndResults) {
  absl::StatusOr<OpenAiRequest> r = ParseChatCompletionRequest(R"({"messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "refusal": null, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 1}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[1].content, "");
  ASSERT_EQ(r->messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r->messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r->messages[2].tool_call_id, "call_1");

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"role": "tool", "content": "x"})", "messages[0].tool_call_id"},
      {R"({"role": "user", "content": "x", "tool_calls": []})", "messages[0].tool_calls"},
      {R"({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
          "arguments": "not json"}}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
          "arguments": {"a": 1}}}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]})",
       "messages[0].tool_calls[0].function.name"},
      {R"({"role": "user", "content": "x", "weight": 1})", "messages[0].weight"},
      {R"({"role": "assistant", "content": "x", "refusal": "no"})", "messages[0].refusal"},
  };
  for (const auto& [message, param] : bad) {
    absl::StatusOr<OpenAiRequest> b =
        ParseChatCompletionRequest(absl::StrCat(R"({"messages": [)", message, "]}"));
    ASSERT_FALSE(b.ok()) << message;
    EXPECT_EQ(ToApiError(b.status()).param, param) << message << ": " << b.status();
  }
}

// ---- Output parsers ----

ToolRequest Request(ToolChoice choice, bool parallel = true) {
  absl::StatusOr<OpenAiRequest> r = Parse(kWeatherTools);
  EXPECT_TRUE(r.ok());
  ToolRequest t = r->tools;
  t.choice = choice;
  t.function = "get_weather";
  t.parallel = parallel;
  return t;
}

struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
};

// Feeds `text` in pieces cut at `cuts` (byte offsets), then finishes.
Parsed Run(ToolCallParser& parser, const std::string& text, const std::vector<size_t>& cuts) {
  Parsed p;
  std::vector<ToolCallDelta> deltas;
  size_t at = 0;
  auto take = [&](ToolParseOutput out) {
    p.content += out.content;
    AppendToolCallDeltas(out.calls, &p.calls);
  };
  for (size_t cut : cuts) {
    take(parser.Feed(text.substr(at, cut - at)));
    at = cut;
  }
  take(parser.Feed(text.substr(at)));
  take(parser.Finish());
  return p;
}

Parsed RunWhole(const ToolRequest& request, const std::string& parser_name,
                const std::string& text) {
  auto parser = CreateToolCallParser(request, parser_name);
  EXPECT_TRUE(parser.ok()) << parser.status();
  return Run(**parser, text, {});
}

// Every split into pieces gives what the whole text gives (streaming changes nothing).
void ExpectSplitsAgree(const ToolRequest& request, const std::string& parser_name,
                       const std::string& text) {
  const Parsed whole = RunWhole(request, parser_name, text);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i) {
      if (rng() % 4 == 0) cuts.push_back(i);
    }
    if (trial == 0) {
      cuts.clear();
      for (size_t i = 1; i < text.size(); ++i) cuts.push_back(i);  // byte by byte
    }
    auto parser = CreateToolCallParser(request, parser_name);
    ASSERT_TRUE(parser.ok());
    const Parsed split = Run(**parser, text, cuts);
    ASSERT_EQ(split.content, whole.content) << text;
    ASSERT_EQ(split.calls.size(), whole.calls.size()) << text;
    for (size_t k = 0; k < split.calls.size(); ++k) {
      EXPECT_EQ(split.calls[k].name, whole.calls[k].name);
      EXPECT_EQ(split.calls[k].arguments, whole.calls[k].arguments);
    }
  }
}

TEST(HermesParserTest, CallsLeaveTheTextAndContentStays) {
  const ToolRequest req = Request(ToolChoice::kAuto);
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"noop\", \"arguments\": "
      "{}}\n</tool_call>";
  const Parsed p = RunWhole(req, "hermes", text);
  EXPECT_EQ(p.content, "Let me check.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris","days":2})");
  EXPECT_EQ(p.calls[1].name, "noop");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_TRUE(absl::StartsWith(p.calls[0].id, "call_"));
  EXPECT_EQ(p.calls[0].id.size(), 29u);
  EXPECT_NE(p.calls[0].id, p.calls[1].id);
  ExpectSplitsAgree(req, "hermes", text);
}

// Text after a call: its leading whitespace goes, however the pieces cut it (the fuzzer found
// "\n" arriving alone dropped where "\n<t..." in one piece kept it).
TEST(HermesParserTest, WhitespaceAfterACallGoesWhateverThePieces) {
  const ToolRequest req = Request(ToolChoice::kAuto);
  const std::string text =
      "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Pari|d\"}}\n</tool_call>\n<t\": {\"city\": \"Paris\"}}\n</tool_call>";
  const Parsed p = RunWhole(req, "hermes", text);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "Checking.<t\": {\"city\": \"Paris\"}}\n</tool_call>");
  ExpectSplitsAgree(req, "hermes", text);
}

TEST(HermesParserTest, WhatIsNotAValidCallIsContentWordForWord) {
  const ToolRequest req = Request(ToolChoice::kAuto);
  for (const std::string& text : {
           std::string("plain answer with a < sign and <tool_ but no call  \n"),
           std::string("<tool_call>{not json}</tool_call> after"),
           std::string("<tool_call>{\"name\": \"unknown_fn\", \"arguments\": {}}</tool_call>"),
           std::string("<tool_call>{\"name\": \"noop\", \"arguments\": [1]}</tool_call>"),
           std::string("text then <tool_call>{\"name\": \"noop\", \"argu"),  // cut short
           std::string(""),
           std::string("  \n "),
       }) {
    const Parsed p = RunWhole(req, "hermes", text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
    ExpectSplitsAgree(req, "hermes", text);
  }
}

TEST(HermesParserTest, AnUnclosedCallThatParsesIsACall) {
  const Parsed p = RunWhole(Request(ToolChoice::kAuto), "hermes",
                            "<tool_call>\n{\"name\": \"noop\", \"arguments\": \"{\\\"a\\\": 1}\"}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"a":1})");  // arguments given as a JSON string
  EXPECT_EQ(p.content, "");
}

TEST(HermesParserTest, WithoutParallelCallsOnlyTheFirstIsACall) {
  const std::string second = "<tool_call>{\"name\": \"noop\", \"arguments\": {}}</tool_call>";
  const Parsed p =
      RunWhole(Request(ToolChoice::kAuto, /*parallel=*/false), "hermes",
               "<tool_call>{\"name\": \"noop\", \"arguments\": {}}</tool_call>" + second);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, second);
}

TEST(Llama3JsonParserTest, ObjectsSeparatedBySemicolonsAreCalls) {
  const ToolRequest req = Request(ToolChoice::kAuto);
  for (const std::string& text : {
           std::string("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Tokyo\", "
                       "\"days\": 1}}"),
           std::string("<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": "
                       "\"Tokyo\", \"days\": 1}}; {\"name\": \"noop\", \"parameters\": {}}"),
       }) {
    const Parsed p = RunWhole(req, "llama3_json", text);
    ASSERT_GE(p.calls.size(), 1u) << text;
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, R"({"city":"Tokyo","days":1})");
    EXPECT_EQ(p.content, "");
    ExpectSplitsAgree(req, "llama3_json", text);
  }
  for (const std::string& text : {
           std::string("The weather is fine {\"name\": \"noop\", \"parameters\": {}}"),
           std::string("{\"name\": \"noop\", \"parameters\": {}} trailing words"),
           std::string("{\"name\": \"nope\", \"parameters\": {}}"),
           std::string("{\"a\": 1}"),
           std::string("<|python_tag|>print(1)"),
       }) {
    const Parsed p = RunWhole(req, "llama3_json", text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
    ExpectSplitsAgree(req, "llama3_json", text);
  }
}

TEST(RequiredParserTest, EachCallOfTheListComesOutAsItCloses) {
  const ToolRequest req = Request(ToolChoice::kRequired);
  auto parser = CreateToolCallParser(req, "");
  ASSERT_TRUE(parser.ok());
  ToolParseOutput a = (*parser)->Feed(R"([{"name": "noop", "parameters": {"s": "}]"}}, )");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, R"({"s":"}]"})");
  ToolParseOutput b = (*parser)->Feed(R"({"name": "get_weather", "parameters": {"city": "Paris",)");
  EXPECT_TRUE(b.calls.empty());
  ToolParseOutput c = (*parser)->Feed(R"( "days": 7}}])");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].index, 1);
  ToolParseOutput end = (*parser)->Finish();
  EXPECT_EQ(end.content, "");
  EXPECT_EQ((*parser)->calls(), 2);
  // Cut short by max_tokens: the calls that closed stay calls, the rest is content.
  const Parsed cut = RunWhole(req, "", R"([{"name": "noop", "parameters": {}}, {"name": "no)");
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.content, R"({"name": "no)");
  const Parsed nothing = RunWhole(req, "", R"([{"na)");
  EXPECT_TRUE(nothing.calls.empty());
  EXPECT_EQ(nothing.content, R"([{"na)");
}

TEST(NamedParserTest, TheWholeOutputStreamsAsTheArguments) {
  const ToolRequest req = Request(ToolChoice::kFunction);
  auto parser = CreateToolCallParser(req, "");
  ASSERT_TRUE(parser.ok());
  ToolParseOutput a = (*parser)->Feed("{\"city\"");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_FALSE(a.calls[0].id.empty());
  ToolParseOutput b = (*parser)->Feed(": \"Paris\", \"days\": 1}");
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_TRUE(b.calls[0].id.empty());
  EXPECT_TRUE((*parser)->Finish().calls.empty());
  const Parsed p = RunWhole(req, "", R"({"city": "Paris", "days": 1})");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "Paris", "days": 1})");
  EXPECT_EQ(p.content, "");
  // Even an empty output is one call (with empty arguments; the finish reason says why).
  EXPECT_EQ(RunWhole(req, "", "").calls.size(), 1u);
}

TEST(ToolParserRegistryTest, AutoNeedsAKnownParser) {
  const ToolRequest req = Request(ToolChoice::kAuto);
  absl::StatusOr<std::unique_ptr<ToolCallParser>> none = CreateToolCallParser(req, "");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(ToApiError(none.status()).param, "tool_choice");
  EXPECT_NE(none.status().message().find("--tool-call-parser"), std::string::npos);
  EXPECT_FALSE(CreateToolCallParser(req, "mistral").ok());
  for (absl::string_view name : kToolCallParsers) {
    EXPECT_TRUE(CreateToolCallParser(req, std::string(name)).ok()) << name;
  }
}

std::string TemplateOf(const std::string& model) {
  std::ifstream in(absl::StrCat(TANDEM_SOURCE_DIR, "/tests/reference/chat_template/models/", model,
                                "/tokenizer_config.json"));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  return j.is_object() && j.contains("chat_template") && j["chat_template"].is_string()
             ? j["chat_template"].get<std::string>()
             : "";
}

TEST(ToolParserRegistryTest, DetectsTheFormatFromRealTemplates) {
  EXPECT_EQ(DetectToolCallParser(TemplateOf("qwen2_5")), "hermes");
  EXPECT_EQ(DetectToolCallParser(TemplateOf("qwen3")), "hermes");
  EXPECT_EQ(DetectToolCallParser(TemplateOf("llama3_1")), "llama3_json");
  EXPECT_EQ(DetectToolCallParser(TemplateOf("llama3_2")), "llama3_json");
  ASSERT_FALSE(TemplateOf("llama3").empty());
  EXPECT_EQ(DetectToolCallParser(TemplateOf("llama3")), "");  // Llama 3.0 has no tools
}

}  // namespace
}  // namespace tandem::router

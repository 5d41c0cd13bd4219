#include "runtime/router/structured_outputs.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/grammar/byte_dfa.h"
#include "runtime/grammar/pda.h"
#include "runtime/router/openai_protocol.h"

namespace tandem::router {
namespace {

// A chat request body with `extra` (JSON members, text) appended.
std::string Chat(const std::string& extra) {
  return absl::StrCat(R"({"messages": [{"role": "user", "content": "hi"}], )", extra, "}");
}

absl::StatusOr<SamplingParams::Guided> Guided(const std::string& extra) {
  absl::StatusOr<OpenAiRequest> r = ParseChatCompletionRequest(Chat(extra));
  if (!r.ok()) return r.status();
  return r->params.guided;
}

bool Accepts(const SamplingParams::Guided& g, const std::string& text) {
  if (!g.grammar.empty()) {
    absl::StatusOr<std::unique_ptr<grammar::GrammarPda>> pda =
        grammar::GrammarPda::FromGbnf(g.grammar);
    return pda.ok() && (*pda)->Matches(text);
  }
  absl::StatusOr<grammar::ByteDfa> dfa = grammar::ByteDfa::FromRegex(g.regex);
  return dfa.ok() && dfa->Matches(text);
}

ApiError Error(const std::string& extra) {
  absl::StatusOr<OpenAiRequest> r = ParseChatCompletionRequest(Chat(extra));
  EXPECT_FALSE(r.ok()) << extra;
  return r.ok() ? ApiError{} : ToApiError(r.status());
}

TEST(StructuredOutputsTest, GrammarsCompileToTheConstraint) {
  for (const char* field : {R"("guided_grammar": )", R"("structured_outputs": {"grammar": )"}) {
    const std::string grammar =
        nlohmann::json("root ::= answer \" \" [0-9]+\nanswer ::= \"yes\" | \"no\"").dump();
    const std::string close = std::string(field).find('{') != std::string::npos ? "}" : "";
    absl::StatusOr<SamplingParams::Guided> g = Guided(absl::StrCat(field, grammar, close));
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(g->regex.empty());  // the workers get the grammar itself
    EXPECT_TRUE(Accepts(*g, "yes 42"));
    EXPECT_TRUE(Accepts(*g, "no 7"));
    EXPECT_FALSE(Accepts(*g, "maybe 1"));
    EXPECT_FALSE(Accepts(*g, "yes"));
  }
}

TEST(StructuredOutputsTest, JsonSchemaKeepsTheClientsPropertyOrder) {
  absl::StatusOr<SamplingParams::Guided> g = Guided(R"("response_format": {"type": "json_schema",
      "json_schema": {"name": "w", "strict": true, "schema": {"type": "object",
      "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "boolean"}},
      "required": ["zeta", "alpha"], "additionalProperties": false}}})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, R"({"zeta": 1, "alpha": true})"));
  EXPECT_FALSE(Accepts(*g, R"({"alpha": true, "zeta": 1})")) << "schema order, not sorted";
}

TEST(StructuredOutputsTest, EveryJsonSpelling) {
  for (const std::string& extra :
       {std::string(R"("guided_json": {"type": "array", "items": {"type": "null"}})"),
        std::string(R"("guided_json": "{\"type\": \"array\", \"items\": {\"type\": \"null\"}}")"),
        std::string(
            R"("structured_outputs": {"json": {"type": "array", "items": {"type": "null"}}})")}) {
    absl::StatusOr<SamplingParams::Guided> g = Guided(extra);
    ASSERT_TRUE(g.ok()) << extra << ": " << g.status();
    EXPECT_TRUE(Accepts(*g, "[null, null]")) << extra;
    EXPECT_FALSE(Accepts(*g, "[1]")) << extra;
  }
  for (const std::string& extra : {std::string(R"("response_format": {"type": "json_object"})"),
                                   std::string(R"("structured_outputs": {"json_object": true})")}) {
    absl::StatusOr<SamplingParams::Guided> g = Guided(extra);
    ASSERT_TRUE(g.ok()) << extra << ": " << g.status();
    EXPECT_TRUE(Accepts(*g, R"({"a": [1, "b"]})")) << extra;
    EXPECT_FALSE(Accepts(*g, R"([1])")) << extra;
  }
  absl::StatusOr<SamplingParams::Guided> text = Guided(R"("response_format": {"type": "text"})");
  ASSERT_TRUE(text.ok());
  EXPECT_TRUE(text->empty());
}

TEST(StructuredOutputsTest, WhitespacePattern) {
  absl::StatusOr<SamplingParams::Guided> g =
      Guided(R"("guided_json": {"type": "array"}, "guided_whitespace_pattern": "[\n ]*")");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, "[\n  1,\n  2\n]"));
  EXPECT_EQ(Error(R"("guided_json": {}, "guided_whitespace_pattern": "[ a]")").param,
            "guided_whitespace_pattern");
  EXPECT_EQ(Error(R"("guided_regex": "a", "guided_whitespace_pattern": " ")").param,
            "guided_whitespace_pattern");
}

TEST(StructuredOutputsTest, ErrorsNameTheFieldAndKeyword) {
  ApiError e = Error(R"("guided_json": {"type": "string", "pattern": "^a"})");
  EXPECT_EQ(e.param, "guided_json");
  EXPECT_EQ(e.code, "unsupported_parameter");
  EXPECT_NE(e.message.find("'pattern'"), std::string::npos) << e.message;
  e = Error(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})");
  EXPECT_EQ(e.param, "response_format.json_schema.schema");
  e = Error(R"("response_format": {"type": "yaml"})");
  EXPECT_EQ(e.param, "response_format.type");
  e = Error(R"("response_format": {"type": "json_object", "schema": {}})");
  EXPECT_EQ(e.param, "response_format");
  e = Error(R"("guided_regex": "a", "response_format": {"type": "json_object"})");
  EXPECT_EQ(e.param, "response_format");
  EXPECT_NE(e.message.find("cannot both"), std::string::npos);
  e = Error(R"("structured_outputs": {"grammar": "root ::= undefined"})");
  EXPECT_EQ(e.param, "structured_outputs.grammar");
  EXPECT_NE(e.message.find("'undefined' is not defined"), std::string::npos) << e.message;
  e = Error(R"("guided_grammar": "root ::= \"a")");
  EXPECT_EQ(e.param, "guided_grammar");
  EXPECT_NE(e.message.find("1:10"), std::string::npos) << e.message;
  e = Error(R"("guided_grammar": 3)");
  EXPECT_EQ(e.param, "guided_grammar");
  e = Error(R"("guided_grammar": "root ::= \"a\"", "guided_regex": "a")");
  EXPECT_NE(e.message.find("cannot both"), std::string::npos);
  e = Error(R"("guided_json": "{not json")");
  EXPECT_EQ(e.param, "guided_json");
  e = Error(R"("guided_json": 5)");
  EXPECT_EQ(e.param, "guided_json");
}

TEST(StructuredOutputsTest, SchemaRequestsBoundTheirObjectsKeys) {
  std::string props;
  for (size_t i = 0; i <= kMaxSchemaObjectKeys; ++i) {
    absl::StrAppend(&props, i ? ", " : "", "\"p", i, "\": {\"type\": \"null\"}");
  }
  const ApiError e =
      Error(absl::StrCat(R"("guided_json": {"type": "object", "properties": {)", props, "}}"));
  EXPECT_EQ(e.param, "guided_json");
  EXPECT_NE(e.message.find("256"), std::string::npos) << e.message;
}

}  // namespace
}  // namespace tandem::router

#include "runtime/grammar/json_schema.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/grammar/byte_dfa.h"

namespace tandem::grammar {
namespace {

using json = nlohmann::ordered_json;

ByteDfa Compile(const json& schema) {
  absl::StatusOr<std::string> regex = JsonSchemaToRegex(schema);
  EXPECT_TRUE(regex.ok()) << regex.status();
  absl::StatusOr<ByteDfa> dfa = ByteDfa::FromRegex(regex.ok() ? *regex : "x");
  EXPECT_TRUE(dfa.ok()) << dfa.status();
  return dfa.ok() ? *std::move(dfa) : *ByteDfa::FromRegex("x");
}

TEST(JsonSchemaTest, IntegerRangesAcceptExactlyTheirMembers) {
  const int64_t bounds[] = {-1000, -101, -100, -99, -10, -9, -1, 0, 1, 9, 10, 99, 100, 101, 999};
  for (const int64_t lo : bounds) {
    for (const int64_t hi : bounds) {
      if (lo > hi) continue;
      const ByteDfa dfa = Compile({{"type", "integer"}, {"minimum", lo}, {"maximum", hi}});
      for (int64_t v = -1100; v <= 1100; ++v) {
        ASSERT_EQ(dfa.Matches(absl::StrCat(v)), lo <= v && v <= hi)
            << "[" << lo << ", " << hi << "] at " << v;
      }
      EXPECT_FALSE(dfa.Matches("-0"));
      EXPECT_FALSE(dfa.Matches("01"));
    }
  }
}

TEST(JsonSchemaTest, OneSidedAndExclusiveBounds) {
  const ByteDfa ge = Compile({{"type", "integer"}, {"exclusiveMinimum", -43}});
  const ByteDfa le = Compile({{"type", "integer"}, {"maximum", 57}});
  for (int64_t v = -5000; v <= 5000; ++v) {
    ASSERT_EQ(ge.Matches(absl::StrCat(v)), v >= -42) << v;
    ASSERT_EQ(le.Matches(absl::StrCat(v)), v <= 57) << v;
  }
  EXPECT_TRUE(ge.Matches("123456789012345678"));
  EXPECT_FALSE(le.Matches("123456789012345678"));
  EXPECT_TRUE(le.Matches("-123456789012345678"));
  const ByteDfa extremes = Compile({{"type", "integer"},
                                    {"minimum", std::numeric_limits<int64_t>::min()},
                                    {"maximum", std::numeric_limits<int64_t>::max()}});
  EXPECT_TRUE(extremes.Matches("-9223372036854775808"));
  EXPECT_FALSE(extremes.Matches("-9223372036854775809"));
  EXPECT_TRUE(extremes.Matches("9223372036854775807"));
  EXPECT_FALSE(extremes.Matches("9223372036854775808"));
}

TEST(JsonSchemaTest, ObjectsKeepOrderRequiredAndCommas) {
  const ByteDfa dfa = Compile(json::parse(R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
      "required": ["b"]})"));
  EXPECT_TRUE(dfa.Matches(R"({"b":"x"})"));
  EXPECT_TRUE(dfa.Matches(R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(dfa.Matches(R"({ "b": "", "c": false })"));
  EXPECT_FALSE(dfa.Matches(R"({})")) << "b is required";
  EXPECT_FALSE(dfa.Matches(R"({"a":1})"));
  EXPECT_FALSE(dfa.Matches(R"({,"b":"x"})"));
  EXPECT_FALSE(dfa.Matches(R"({"b":"x",})"));
  EXPECT_FALSE(dfa.Matches(R"({"b":"x","d":1})")) << "no property outside the schema";
  EXPECT_FALSE(dfa.Matches(R"({"b":"x"}  )"));
}

TEST(JsonSchemaTest, StringsEscapesAndLengths) {
  const ByteDfa dfa = Compile({{"type", "string"}, {"minLength", 2}, {"maxLength", 3}});
  EXPECT_TRUE(dfa.Matches(R"("ab")"));
  EXPECT_TRUE(dfa.Matches(R"("a\"b")"));
  EXPECT_TRUE(dfa.Matches("\"\xc3\xa9\xc3\xa9\""));
  EXPECT_TRUE(dfa.Matches(R"("\u00e9x")"));
  EXPECT_FALSE(dfa.Matches(R"("a")"));
  EXPECT_FALSE(dfa.Matches(R"("abcd")"));
  EXPECT_FALSE(dfa.Matches("\"a\nb\"")) << "raw control characters are not JSON";
  EXPECT_FALSE(dfa.Matches(R"("a\qb")"));
  EXPECT_FALSE(dfa.Matches(R"("\ud800x")")) << "a lone surrogate escape";
}

TEST(JsonSchemaTest, ArraysMinAndMaxItems) {
  const ByteDfa dfa = Compile(
      json::parse(R"({"type": "array", "items": {"type": "null"}, "minItems": 1, "maxItems": 2})"));
  EXPECT_FALSE(dfa.Matches("[]"));
  EXPECT_TRUE(dfa.Matches("[null]"));
  EXPECT_TRUE(dfa.Matches("[null, null]"));
  EXPECT_FALSE(dfa.Matches("[null,null,null]"));
  const ByteDfa empty_ok = Compile(json::parse(R"({"type": "array", "maxItems": 0})"));
  EXPECT_TRUE(empty_ok.Matches("[]"));
  EXPECT_FALSE(empty_ok.Matches("[1]"));
}

TEST(JsonSchemaTest, EnumConstAndRefs) {
  const ByteDfa dfa = Compile(json::parse(R"({
      "$defs": {"color": {"enum": ["red", "gr.en", 1.5, null]}},
      "type": "object", "properties": {"c": {"$ref": "#/$defs/color"}, "k": {"const": [1, "a"]}},
      "required": ["c", "k"]})"));
  EXPECT_TRUE(dfa.Matches(R"({"c":"gr.en","k":[1,"a"]})"));
  EXPECT_TRUE(dfa.Matches(R"({"c":null,"k":[1,"a"]})"));
  EXPECT_FALSE(dfa.Matches(R"({"c":"grXen","k":[1,"a"]})")) << "the '.' is escaped";
  EXPECT_FALSE(dfa.Matches(R"({"c":"red","k":[1,"b"]})"));
}

TEST(JsonSchemaTest, JsonObjectIsAnyObject) {
  absl::StatusOr<ByteDfa> dfa = ByteDfa::FromRegex(AnyJsonObjectRegex());
  ASSERT_TRUE(dfa.ok()) << dfa.status();
  EXPECT_TRUE(dfa->Matches(R"({})"));
  EXPECT_TRUE(dfa->Matches(R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_TRUE(dfa->Matches(R"({"a": {"b": {"c": 1}}})"));
  EXPECT_FALSE(dfa->Matches(R"([1])")) << "json_object is an object";
  EXPECT_FALSE(dfa->Matches(R"({"a": 1,})"));
  EXPECT_FALSE(dfa->Matches(R"({"a": {"b": {"c": {"d": 1}}}})")) << "nested past the depth limit";
}

TEST(JsonSchemaTest, TypeFollowsFromTheKeywordsWhenLeftOut) {
  const ByteDfa object = Compile(json::parse(R"({"properties": {"a": {"type": "null"}},
                                                 "required": ["a"]})"));
  EXPECT_TRUE(object.Matches(R"({"a": null})"));
  const ByteDfa array = Compile(json::parse(R"({"items": {"type": "null"}, "maxItems": 1})"));
  EXPECT_TRUE(array.Matches("[null]"));
  EXPECT_FALSE(array.Matches("[null,null]"));
  const ByteDfa text = Compile(json::parse(R"({"maxLength": 2})"));
  EXPECT_TRUE(text.Matches(R"("ab")"));
  EXPECT_FALSE(text.Matches(R"("abc")"));
}

TEST(JsonSchemaTest, WhitespacePatternIsTheCallers) {
  JsonSchemaOptions options;
  options.whitespace = "[ \\n]{0,2}";
  absl::StatusOr<std::string> regex =
      JsonSchemaToRegex(json::parse(R"({"type": "array", "items": {"type": "integer"}})"), options);
  ASSERT_TRUE(regex.ok());
  absl::StatusOr<ByteDfa> dfa = ByteDfa::FromRegex(*regex);
  ASSERT_TRUE(dfa.ok());
  EXPECT_TRUE(dfa->Matches("[\n 1,\n 2\n]"));
  EXPECT_FALSE(dfa->Matches("[1,   2]"));
}

TEST(JsonSchemaTest, UnsupportedKeywordsNameThemselvesAndWhere) {
  const auto error = [](const char* schema) {
    absl::StatusOr<std::string> r = JsonSchemaToRegex(json::parse(schema));
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  EXPECT_EQ(error(R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}})"),
            "unsupported JSON Schema keyword 'pattern' at #/properties/a/pattern");
  EXPECT_NE(error(R"({"$ref": "#"})").find("recursive"), std::string::npos);
  EXPECT_NE(error(R"({"$ref": "#/$defs/missing"})").find("not defined"), std::string::npos);
  EXPECT_NE(error(R"({"$ref": "http://example.com/s"})").find("not supported"), std::string::npos);
  EXPECT_NE(error(R"({"type": "string", "minimum": 1})").find("'minimum' does not apply"),
            std::string::npos);
  EXPECT_NE(error(R"({"type": "wat"})").find("unknown type"), std::string::npos);
  EXPECT_NE(error(R"(false)").find("admits no value"), std::string::npos);
  EXPECT_NE(error(R"({"type": "array", "maxItems": 257})").find("above 256"), std::string::npos);
  EXPECT_NE(error(R"({"anyOf": []})").find("non-empty"), std::string::npos);
  EXPECT_NE(error(R"({"type": ["string", "null"], "minimum": 3})").find("none of the types"),
            std::string::npos);
  EXPECT_EQ(error(R"({"type": ["integer", "null"], "minimum": 3})"), "ok");
}

TEST(JsonSchemaTest, FiftyPropertySchemaFitsTheAutomatonLimits) {
  json props = json::object();
  json required = json::array();
  for (int i = 0; i < 50; ++i) {
    const std::string name = absl::StrCat("field_", i);
    static const char* types[] = {"string", "integer", "boolean", "number"};
    props[name] = {{"type", types[i % 4]}};
    if (i % 2 == 0) required.push_back(name);
  }
  const ByteDfa dfa = Compile({{"type", "object"}, {"properties", props}, {"required", required}});
  EXPECT_GT(dfa.num_states(), 50);
}

}  // namespace
}  // namespace tandem::grammar

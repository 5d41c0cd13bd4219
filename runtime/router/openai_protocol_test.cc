// Parsing, validation and serialization of the OpenAI schema. Expected shapes follow the OpenAI
// API reference (field names, nesting), not our own output.
#include "runtime/router/openai_protocol.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::router {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ApiError CompletionError(const json& body) {
  auto r = ParseCompletionRequest(body.dump());
  EXPECT_FALSE(r.ok()) << body.dump();
  return ToApiError(r.status());
}

ApiError ChatError(const json& body) {
  auto r = ParseChatCompletionRequest(body.dump());
  EXPECT_FALSE(r.ok()) << body.dump();
  return ToApiError(r.status());
}

const json kChatBase = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};

json Chat(const json& extra) {
  json j = kChatBase;
  j.update(extra);
  return j;
}

json Completion(const json& extra) {
  json j = {{"prompt", "hello"}};
  j.update(extra);
  return j;
}

TEST(OpenAiProtocolTest, ParsesCompletionWithEverySamplingField) {
  auto r = ParseCompletionRequest(Completion({{"model", "m"},
                                              {"max_tokens", 7},
                                              {"temperature", 0.5},
                                              {"top_p", 0.9},
                                              {"top_k", 40},
                                              {"min_p", 0.05},
                                              {"seed", 42},
                                              {"stop", {"a", "b"}},
                                              {"n", 3},
                                              {"logprobs", 2},
                                              {"presence_penalty", 0.5},
                                              {"frequency_penalty", -0.5},
                                              {"repetition_penalty", 1.2},
                                              {"ignore_eos", true},
                                              {"user", "someone"},
                                              {"stream", true},
                                              {"stream_options", {{"include_usage", true}}}})
                                      .dump());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->endpoint, Endpoint::kCompletions);
  EXPECT_EQ(r->model, "m");
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_EQ(r->prompts[0].text, "hello");
  EXPECT_FALSE(r->prompts[0].token_ids.has_value());
  EXPECT_EQ(r->params.max_tokens, 7);
  EXPECT_FLOAT_EQ(r->params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r->params.top_p, 0.9f);
  EXPECT_EQ(r->params.top_k, 40);
  EXPECT_FLOAT_EQ(r->params.min_p, 0.05f);
  EXPECT_EQ(r->params.seed, 42u);
  EXPECT_THAT(r->params.stop, ElementsAre("a", "b"));
  EXPECT_EQ(r->n, 3);
  EXPECT_EQ(r->logprobs, 2);
  EXPECT_EQ(r->params.logprobs, 2);
  EXPECT_FLOAT_EQ(r->params.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r->params.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r->params.repetition_penalty, 1.2f);
  EXPECT_TRUE(r->params.ignore_eos);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->default_max_tokens, 16);
}

TEST(OpenAiProtocolTest, CompletionDefaults) {
  auto r = ParseCompletionRequest(R"({"prompt": "x"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->n, 1);
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->params.max_tokens.has_value());
  EXPECT_FALSE(r->logprobs.has_value());
  EXPECT_FLOAT_EQ(r->params.temperature, 1.0f);
  EXPECT_FALSE(r->params.seed.has_value());
}

TEST(OpenAiProtocolTest, PromptForms) {
  auto ids = ParseCompletionRequest(R"({"prompt": [1, 2, 3]})");
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->prompts.size(), 1u);
  EXPECT_THAT(*ids->prompts[0].token_ids, ElementsAre(1, 2, 3));
  auto one_string = ParseCompletionRequest(R"({"prompt": ["abc"]})");
  ASSERT_TRUE(one_string.ok());
  ASSERT_EQ(one_string->prompts.size(), 1u);
  EXPECT_EQ(one_string->prompts[0].text, "abc");
  auto one_list = ParseCompletionRequest(R"({"prompt": [[4, 5]]})");
  ASSERT_TRUE(one_list.ok());
  EXPECT_THAT(*one_list->prompts[0].token_ids, ElementsAre(4, 5));
  // A batch: strings and token-id lists, in order.
  auto batch = ParseCompletionRequest(R"({"prompt": ["a", [7, 8], "b"]})");
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->prompts.size(), 3u);
  EXPECT_EQ(batch->prompts[0].text, "a");
  EXPECT_THAT(*batch->prompts[1].token_ids, ElementsAre(7, 8));
  EXPECT_EQ(batch->prompts[2].text, "b");
  EXPECT_EQ(CompletionError({{"prompt", json::array({"a", json::array()})}}).param, "prompt");
  EXPECT_EQ(CompletionError({{"prompt", json::array({"a", 5})}}).param, "prompt");
  json many = json::array();
  for (int i = 0; i <= kMaxBatchedPrompts; ++i) many.push_back("p");
  EXPECT_THAT(CompletionError({{"prompt", many}}).message, HasSubstr("at most"));
  EXPECT_EQ(CompletionError({{"prompt", ""}}).param, "prompt");
  EXPECT_EQ(CompletionError({{"prompt", json::array()}}).param, "prompt");
  EXPECT_EQ(CompletionError({{"prompt", {1, -2}}}).param, "prompt");
  EXPECT_EQ(CompletionError({{"prompt", {1, "x"}}}).param, "prompt");
  EXPECT_EQ(CompletionError({{"prompt", 5}}).param, "prompt");
  EXPECT_EQ(CompletionError({{"prompt", nullptr}}).param, "prompt");
  EXPECT_EQ(CompletionError(json::object()).param, "prompt");
}

TEST(OpenAiProtocolTest, ChatMessagesAndContentParts) {
  auto r = ParseChatCompletionRequest(json{
      {"messages",
       {{{"role", "system"}, {"content", "be brief"}},
        {{"role", "user"},
         {"content", {{{"type", "text"}, {"text", "hel"}}, {{"type", "text"}, {"text", "lo"}}}}},
        {{"role", "assistant"}, {"content", nullptr}}}},
      {"max_tokens", 5},
      {"max_completion_tokens", 9},
      {"logprobs", true},
      {"top_logprobs", 3}}.dump());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "hello");
  EXPECT_EQ(r->messages[2].content, "");
  EXPECT_EQ(r->params.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_EQ(r->logprobs, 3);
  EXPECT_FALSE(r->default_max_tokens.has_value());
  EXPECT_TRUE(r->add_generation_prompt);

  auto plain = ParseChatCompletionRequest(Chat({{"logprobs", true}}).dump());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->logprobs, 0);
  auto none = ParseChatCompletionRequest(Chat({{"logprobs", false}}).dump());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->logprobs.has_value());
  EXPECT_FALSE(none->params.logprobs.has_value());
}

TEST(OpenAiProtocolTest, ChatErrorsNameTheParam) {
  EXPECT_EQ(ChatError(json::object()).param, "messages");
  EXPECT_EQ(ChatError({{"messages", json::array()}}).param, "messages");
  EXPECT_EQ(ChatError({{"messages", "hi"}}).param, "messages");
  EXPECT_EQ(ChatError({{"messages", {{{"content", "x"}}}}}).param, "messages[0].role");
  EXPECT_EQ(ChatError({{"messages", {{{"role", 3}, {"content", "x"}}}}}).param, "messages[0].role");
  EXPECT_EQ(ChatError({{"messages", {{{"role", "user"}}}}}).param, "messages[0].content");
  EXPECT_EQ(ChatError({{"messages", {{{"role", "user"}, {"content", 5}}}}}).param,
            "messages[0].content");
  EXPECT_EQ(
      ChatError(
          {{"messages",
            {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}})
          .param,
      "messages[0].content[0].type");
  EXPECT_EQ(ChatError(Chat({{"top_logprobs", 2}})).param, "top_logprobs");
  EXPECT_EQ(ChatError(Chat({{"logprobs", true}, {"top_logprobs", 21}})).param, "top_logprobs");
  EXPECT_EQ(ChatError(Chat({{"logprobs", 1}})).param, "logprobs");
  EXPECT_EQ(ChatError(Chat({{"max_completion_tokens", 0}})).param, "max_completion_tokens");
  EXPECT_EQ(ChatError(Chat({{"tools", {{{"type", "function"}}}}})).param, "tools[0].function");
}

struct RangeCase {
  const char* field;
  json value;
};

TEST(OpenAiProtocolTest, PriorityIsParsedForBothEndpoints) {
  auto chat = ParseChatCompletionRequest(Chat({{"priority", -5}}).dump());
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->priority, -5);
  auto completion = ParseCompletionRequest(Completion({{"priority", 2147483647}}).dump());
  ASSERT_TRUE(completion.ok()) << completion.status();
  EXPECT_EQ(completion->priority, 2147483647);
  auto none = ParseCompletionRequest(Completion(json::object()).dump());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->priority, 0);
}

TEST(OpenAiProtocolTest, OutOfRangeAndWrongTypesAre400WithParam) {
  const std::vector<RangeCase> cases = {
      {"temperature", 2.01},
      {"temperature", -0.1},
      {"temperature", "hot"},
      {"top_p", 0},
      {"top_p", 1.5},
      {"top_k", -2},
      {"top_k", 1.5},
      {"min_p", 1.5},
      {"n", 0},
      {"n", 129},
      {"n", "2"},
      {"logprobs", 21},
      {"logprobs", -1},
      {"presence_penalty", 2.5},
      {"frequency_penalty", -2.5},
      {"repetition_penalty", 0},
      {"repetition_penalty", -1},
      {"max_tokens", 0},
      {"max_tokens", "10"},
      {"seed", "x"},
      {"priority", 1.5},
      {"priority", "high"},
      {"priority", 2147483648.0},
      {"priority", -2147483649.0},
      {"stop", 5},
      {"stop", {"ok", 3}},
      {"stop", {""}},
      {"stream", "yes"},
      {"ignore_eos", 1},
      {"echo", "true"},
      {"logit_bias", {{"one", 2}}},
      {"logit_bias", {{"01", 2}}},
      {"logit_bias", {{"1", 101}}},
      {"logit_bias", {{"1", "x"}}},
      {"logit_bias", {1, 2}},
      {"min_tokens", -1},
      {"allowed_token_ids", json::array()},
      {"allowed_token_ids", {1, -1}},
      {"truncate_prompt_tokens", 0},
      {"truncate_prompt_tokens", -2},
      {"add_special_tokens", "yes"},
      {"include_stop_str_in_output", 1},
      {"service_tier", "flex"},
      {"best_of", 3},
      {"suffix", "x"},
      {"user", 5},
      {"model", 7},
      {"stream_options", {{"include_usage", true}}},
  };
  for (const RangeCase& c : cases) {
    const ApiError e = CompletionError(Completion({{c.field, c.value}}));
    EXPECT_EQ(e.http_status, 400) << c.field << "=" << c.value.dump();
    EXPECT_EQ(e.type, "invalid_request_error") << c.field;
    EXPECT_EQ(e.param, c.field) << c.field << "=" << c.value.dump() << ": " << e.message;
  }
  json too_many = json::array();
  for (int i = 0; i <= kMaxStopStrings; ++i) too_many.push_back(absl::StrCat("s", i));
  EXPECT_EQ(CompletionError(Completion({{"stop", too_many}})).param, "stop");
  EXPECT_EQ(CompletionError(Completion({{"prompt_logprobs", -1}})).param, "prompt_logprobs");
  EXPECT_EQ(CompletionError(Completion({{"prompt_logprobs", 2}, {"stream", true}})).param,
            "prompt_logprobs");
}

// echo with logprobs scores the prompt with as many alternatives; prompt_logprobs keeps its own
// count (the larger one is computed).
TEST(OpenAiProtocolTest, EchoWithLogprobsScoresThePrompt) {
  absl::StatusOr<OpenAiRequest> r =
      ParseCompletionRequest(Completion({{"echo", true}, {"logprobs", 3}}).dump());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.prompt_logprobs, 3);
  EXPECT_FALSE(r->prompt_logprobs.has_value());
  r = ParseCompletionRequest(
      Completion({{"echo", true}, {"logprobs", 1}, {"prompt_logprobs", 4}}).dump());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.prompt_logprobs, 4);
  EXPECT_EQ(r->prompt_logprobs, 4);
  r = ParseCompletionRequest(Completion({{"echo", true}}).dump());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->params.prompt_logprobs.has_value());
}

TEST(OpenAiProtocolTest, BoundaryValuesAreAccepted) {
  json ok = Completion({{"temperature", 0},
                        {"top_p", 1},
                        {"n", 128},
                        {"logprobs", 20},
                        {"presence_penalty", -2},
                        {"frequency_penalty", 2},
                        {"max_tokens", 1.0},
                        {"stop", "x"},
                        {"seed", -1},
                        {"top_k", -1},
                        {"best_of", 128},
                        {"response_format", {{"type", "text"}}},
                        {"logit_bias", {{"7", 100}, {"8", -100}}},
                        {"min_tokens", 0},
                        {"truncate_prompt_tokens", -1}});
  auto r = ParseCompletionRequest(ok.dump());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.max_tokens, 1);
  EXPECT_THAT(r->params.stop, ElementsAre("x"));
  EXPECT_TRUE(r->params.seed.has_value());
}

TEST(OpenAiProtocolTest, BadJsonIs400WithoutParam) {
  for (const char* body : {"{", "", "[1]", "\"x\"", "{\"prompt\": \"a\",}"}) {
    auto r = ParseCompletionRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    const ApiError e = ToApiError(r.status());
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.param, "");
  }
}

TEST(OpenAiProtocolTest, ErrorBodyIsOpenAiShaped) {
  const ApiError e = ToApiError(InvalidParam("prompt", "too long", "context_length_exceeded"));
  const json j = json::parse(ErrorJson(e));
  EXPECT_EQ(j["error"]["message"], "too long");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "prompt");
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
  const json n = json::parse(ErrorJson(ToApiError(absl::InternalError("boom"))));
  EXPECT_TRUE(n["error"]["param"].is_null());
  EXPECT_TRUE(n["error"]["code"].is_null());
  EXPECT_EQ(n["error"]["type"], "server_error");
  EXPECT_EQ(ToApiError(absl::InternalError("x")).http_status, 500);
  EXPECT_EQ(ToApiError(absl::UnavailableError("x")).http_status, 503);
  EXPECT_EQ(ToApiError(absl::ResourceExhaustedError("x")).http_status, 429);
  EXPECT_EQ(ToApiError(absl::ResourceExhaustedError("x")).code, "rate_limit_exceeded");
  EXPECT_EQ(ToApiError(absl::DeadlineExceededError("x")).http_status, 504);
}

TEST(OpenAiProtocolTest, CompletionResponseShape) {
  ResponseMeta meta{Endpoint::kCompletions, "cmpl-1", 123, "m", true};
  ChoiceResult c{0,
                 "ab",
                 {{"a", -0.5f, {{"a", -0.5f}, {"b", -1.0f}}, 0}, {"b", -0.25f, {{"b", -0.25f}}, 1}},
                 "length"};
  const json j = json::parse(ResponseJson(meta, {c}, Usage{3, 2, 1}));
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 123);
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["choices"][0]["text"], "ab");
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -0.25}));
  EXPECT_EQ(lp["top_logprobs"][0], json({{"a", -0.5}, {"b", -1.0}}));
  EXPECT_EQ(lp["text_offset"], json({0, 1}));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
}

TEST(OpenAiProtocolTest, ChatResponseAndChunkShapes) {
  ResponseMeta meta{Endpoint::kChatCompletions, "chatcmpl-1", 5, "m", true};
  ChoiceResult c{1, "hé", {{"h", -0.5f, {{"x", -1.0f}}, 0}, {"é", -0.25f, {}, 1}}, "stop"};
  const json j = json::parse(ResponseJson(meta, {c}, Usage{}));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["index"], 1);
  EXPECT_EQ(j["choices"][0]["message"], json({{"role", "assistant"}, {"content", "hé"}}));
  const json& content = j["choices"][0]["logprobs"]["content"];
  EXPECT_EQ(content[0]["token"], "h");
  EXPECT_EQ(content[0]["bytes"], json({104}));
  EXPECT_EQ(content[0]["top_logprobs"][0],
            json({{"token", "x"}, {"logprob", -1.0}, {"bytes", {120}}}));
  EXPECT_EQ(content[1]["bytes"], json({0xC3, 0xA9}));

  StreamDelta role;
  role.index = 2;
  role.role = true;
  std::string ev = StreamChunkEvent(meta, role, /*usage_null=*/true);
  ASSERT_EQ(ev.substr(0, 6), "data: ");
  ASSERT_EQ(ev.substr(ev.size() - 2), "\n\n");
  json chunk = json::parse(ev.substr(6));
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["index"], 2);
  EXPECT_EQ(chunk["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk.contains("usage") && chunk["usage"].is_null());

  StreamDelta fin;
  fin.finish_reason = "length";
  chunk = json::parse(StreamChunkEvent(meta, fin, false).substr(6));
  EXPECT_EQ(chunk["choices"][0]["delta"], json::object());
  EXPECT_EQ(chunk["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(chunk.contains("usage"));

  chunk = json::parse(UsageChunkEvent(meta, Usage{4, 6, 0}).substr(6));
  EXPECT_EQ(chunk["choices"], json::array());
  EXPECT_EQ(chunk["usage"]["total_tokens"], 10);
}

TEST(OpenAiProtocolTest, InvalidUtf8IsReplacedNotThrown) {
  ResponseMeta meta{Endpoint::kCompletions, "cmpl-1", 1, "m", false};
  ChoiceResult c{0,
                 std::string("a\xff"
                             "b"),
                 {},
                 "stop"};
  const json j = json::parse(ResponseJson(meta, {c}, Usage{}));
  EXPECT_EQ(j["choices"][0]["text"],
            "a\xEF\xBF\xBD"
            "b");
}

}  // namespace
}  // namespace tandem::router

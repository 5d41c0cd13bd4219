// Walks every row of the API field table (api_fields.h) through the real parser, so no field can
// drift into "silently ignored": a rejected field gives a 400 naming it, a no-op parses exactly
// like the request without it, an implemented field changes the parsed request. And docs/api.md
// holds the same table, row for row.
#include "runtime/router/api_fields.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/router/openai_protocol.h"

namespace tandem::router {
namespace {

using json = nlohmann::json;

// Per field: the fields to add to the endpoint's base request. The comparison request is the same
// without the field itself (so companions such as `stream: true` are in both).
const std::map<std::string, json>& Examples() {
  static const auto* m = new std::map<std::string, json>{
      {"model", {{"model", "some-model"}}},
      {"prompt", {{"prompt", {"one", "two"}}}},
      {"messages", {{"messages", {{{"role", "user"}, {"content", "other"}}}}}},
      {"stream", {{"stream", true}}},
      {"stream_options", {{"stream", true}, {"stream_options", {{"include_usage", true}}}}},
      {"n", {{"n", 3}}},
      {"best_of", {{"n", 2}, {"best_of", 2}}},
      {"priority", {{"priority", -5}}},
      {"echo", {{"echo", true}}},
      {"max_tokens", {{"max_tokens", 7}}},
      {"max_completion_tokens", {{"max_completion_tokens", 7}}},
      {"min_tokens", {{"min_tokens", 4}}},
      {"ignore_eos", {{"ignore_eos", true}}},
      {"temperature", {{"temperature", 0.5}}},
      {"top_p", {{"top_p", 0.5}}},
      {"top_k", {{"top_k", 5}}},
      {"min_p", {{"min_p", 0.1}}},
      {"seed", {{"seed", 42}}},
      {"presence_penalty", {{"presence_penalty", 0.5}}},
      {"frequency_penalty", {{"frequency_penalty", 0.5}}},
      {"repetition_penalty", {{"repetition_penalty", 1.2}}},
      {"logit_bias", {{"logit_bias", {{"17", 5}}}}},
      {"allowed_token_ids", {{"allowed_token_ids", {1, 2}}}},
      {"stop", {{"stop", "x"}}},
      {"stop_token_ids", {{"stop_token_ids", {3}}}},
      {"include_stop_str_in_output", {{"stop", "x"}, {"include_stop_str_in_output", true}}},
      {"logprobs", {}},  // per endpoint below
      {"top_logprobs", {{"logprobs", true}, {"top_logprobs", 3}}},
      {"skip_special_tokens", {{"skip_special_tokens", false}}},
      {"spaces_between_special_tokens", {{"spaces_between_special_tokens", false}}},
      {"prompt_logprobs", {{"prompt_logprobs", 1}}},
      {"return_tokens_as_token_ids", {{"return_tokens_as_token_ids", true}}},
      {"return_token_ids", {{"return_token_ids", true}}},
      {"add_special_tokens", {{"add_special_tokens", false}}},
      {"truncate_prompt_tokens", {{"truncate_prompt_tokens", 8}}},
      {"add_generation_prompt", {{"add_generation_prompt", false}}},
      {"continue_final_message",
       {{"add_generation_prompt", false},
        {"messages",
         {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "A"}}}},
        {"continue_final_message", true}}},
      {"chat_template_kwargs", {{"chat_template_kwargs", {{"enable_thinking", false}}}}},
      {"chat_template", {{"chat_template", "{{ messages }}"}}},
      {"documents", {{"documents", {{{"title", "t"}, {"text", "x"}}}}}},
      {"mm_processor_kwargs", {{"mm_processor_kwargs", json::object({{"a", 1}})}}},
      {"response_format", {{"response_format", {{"type", "json_object"}}}}},
      {"guided_json", {{"guided_json", {{"type", "object"}}}}},
      {"guided_regex", {{"guided_regex", "a+"}}},
      {"guided_choice", {{"guided_choice", {"a", "b"}}}},
      {"guided_grammar", {{"guided_grammar", "root ::= \"a\""}}},
      {"guided_decoding_backend", {{"guided_decoding_backend", "xgrammar"}}},
      {"guided_whitespace_pattern",
       {{"guided_json", {{"type", "object"}}}, {"guided_whitespace_pattern", "[ \\n]?"}}},
      {"structured_outputs", {{"structured_outputs", {{"choice", {"a"}}}}}},
      {"tools",
       {{"tools",
         {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}}}}},
      {"tool_choice",
       {{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
        {"tool_choice", "required"}}},
      {"parallel_tool_calls",
       {{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
        {"parallel_tool_calls", false}}},
      {"functions", {{"functions", {{{"name", "f"}}}}}},
      {"function_call", {{"function_call", "auto"}}},
      {"suffix", {{"suffix", "end"}}},
      {"use_beam_search", {{"use_beam_search", true}}},
      {"length_penalty", {{"length_penalty", 0.5}}},
      {"bad_words", {{"bad_words", {"x"}}}},
      {"logits_processors", {{"logits_processors", {"x"}}}},
      {"prompt_embeds", {{"prompt_embeds", "AAAA"}}},
      {"kv_transfer_params", {{"kv_transfer_params", json::object({{"a", 1}})}}},
      {"vllm_xargs", {{"vllm_xargs", json::object({{"a", 1}})}}},
      {"cache_salt", {{"cache_salt", "tenant-1"}}},
      {"request_id", {{"request_id", "r-1"}}},
      {"audio", {{"audio", {{"voice", "alloy"}, {"format", "wav"}}}}},
      {"modalities", {{"modalities", {"text", "audio"}}}},
      {"prediction", {{"prediction", {{"type", "content"}, {"content", "x"}}}}},
      {"reasoning_effort", {{"reasoning_effort", "low"}}},
      {"verbosity", {{"verbosity", "low"}}},
      {"web_search_options", {{"web_search_options", json::object()}}},
      {"store", {{"store", true}}},
      {"user", {{"user", "u-1"}}},
      {"safety_identifier", {{"safety_identifier", "s-1"}}},
      {"metadata", {{"metadata", {{"k", "v"}}}}},
      {"service_tier", {{"service_tier", "auto"}}},
      {"prompt_cache_key", {{"prompt_cache_key", "k"}}},
  };
  return *m;
}

// Values of rejected fields that are accepted because they change nothing.
const std::map<std::string, json>& AcceptedDefaults() {
  static const auto* m = new std::map<std::string, json>{
      {"spaces_between_special_tokens", true},
      {"use_beam_search", false},
      {"length_penalty", 1},
      {"modalities", {"text"}},
      {"store", false},
  };
  return *m;
}

json Base(uint8_t endpoint) {
  if (endpoint == kChatField) return {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  return {{"prompt", "hello"}};
}

absl::StatusOr<OpenAiRequest> Parse(uint8_t endpoint, const json& body) {
  return endpoint == kChatField ? ParseChatCompletionRequest(body.dump())
                                : ParseCompletionRequest(body.dump());
}

json ExampleFor(const ApiField& field, uint8_t endpoint) {
  if (field.name == "logprobs") {
    return endpoint == kChatField ? json{{"logprobs", true}} : json{{"logprobs", 2}};
  }
  return Examples().at(std::string(field.name));
}

const char* EndpointName(uint8_t e) { return e == kChatField ? "chat" : "completions"; }

TEST(ApiFieldsTest, EveryRowBehavesAsTheTableSays) {
  for (const ApiField& field : ApiFields()) {
    ASSERT_TRUE(Examples().contains(std::string(field.name)))
        << "no example for '" << field.name << "': add one to Examples()";
    for (uint8_t endpoint : {kCompletionsField, kChatField}) {
      if ((field.endpoints & endpoint) == 0) continue;
      SCOPED_TRACE(std::string(field.name) + " on " + EndpointName(endpoint));
      const json example = ExampleFor(field, endpoint);
      json with = Base(endpoint);
      with.update(example);
      json without = with;
      without.erase(std::string(field.name));
      if (field.name == "prompt" || field.name == "messages") without = Base(endpoint);
      absl::StatusOr<OpenAiRequest> a = Parse(endpoint, with);
      switch (field.support) {
        case FieldSupport::kRejected: {
          ASSERT_FALSE(a.ok()) << with.dump();
          const ApiError e = ToApiError(a.status());
          EXPECT_EQ(e.http_status, 400);
          EXPECT_EQ(e.param, field.name);
          EXPECT_EQ(e.code, "unsupported_parameter");
          if (auto d = AcceptedDefaults().find(std::string(field.name));
              d != AcceptedDefaults().end()) {
            json with_default = Base(endpoint);
            with_default[std::string(field.name)] = d->second;
            absl::StatusOr<OpenAiRequest> ok = Parse(endpoint, with_default);
            ASSERT_TRUE(ok.ok()) << with_default.dump() << ": " << ok.status();
            EXPECT_EQ(RequestDebugJson(*ok), RequestDebugJson(*Parse(endpoint, Base(endpoint))));
          }
          break;
        }
        case FieldSupport::kNoOp:
        case FieldSupport::kImplemented: {
          ASSERT_TRUE(a.ok()) << with.dump() << ": " << a.status();
          absl::StatusOr<OpenAiRequest> b = Parse(endpoint, without);
          ASSERT_TRUE(b.ok()) << without.dump() << ": " << b.status();
          if (field.support == FieldSupport::kNoOp) {
            EXPECT_EQ(RequestDebugJson(*a), RequestDebugJson(*b));
          } else {
            EXPECT_NE(RequestDebugJson(*a), RequestDebugJson(*b))
                << "'" << field.name << "' is implemented but the parsed request does not change";
          }
          break;
        }
      }
    }
  }
}

TEST(ApiFieldsTest, AFieldOfTheOtherEndpointOrOfNoEndpointIsUnknown) {
  for (const ApiField& field : ApiFields()) {
    for (uint8_t endpoint : {kCompletionsField, kChatField}) {
      if ((field.endpoints & endpoint) != 0) continue;
      SCOPED_TRACE(std::string(field.name) + " on " + EndpointName(endpoint));
      const uint8_t other = endpoint == kChatField ? kCompletionsField : kChatField;
      // The field alone (its companions in Examples() may be unknown here too).
      json body = Base(endpoint);
      body[std::string(field.name)] = ExampleFor(field, other)[std::string(field.name)];
      absl::StatusOr<OpenAiRequest> r = Parse(endpoint, body);
      ASSERT_FALSE(r.ok()) << body.dump();
      EXPECT_EQ(ToApiError(r.status()).param, field.name);
      EXPECT_EQ(ToApiError(r.status()).code, "unknown_parameter");
    }
  }
  for (uint8_t endpoint : {kCompletionsField, kChatField}) {
    json body = Base(endpoint);
    body["temprature"] = 0.5;  // a typo is not a silent default
    absl::StatusOr<OpenAiRequest> r = Parse(endpoint, body);
    ASSERT_FALSE(r.ok());
    const ApiError e = ToApiError(r.status());
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.param, "temprature");
    EXPECT_EQ(e.code, "unknown_parameter");
  }
}

TEST(ApiFieldsTest, NamesAreUniquePerEndpoint) {
  std::set<std::pair<std::string, int>> seen;
  for (const ApiField& field : ApiFields()) {
    for (int e : {1, 2}) {
      if ((field.endpoints & e) == 0) continue;
      EXPECT_TRUE(seen.insert({std::string(field.name), e}).second) << field.name;
    }
  }
}

std::string EndpointsCell(uint8_t e) {
  if (e == kBothEndpoints) return "both";
  return e == kChatField ? "chat" : "completions";
}

// docs/api.md, between its field-table markers: `| \`name\` | endpoints | status | note |`.
TEST(ApiFieldsTest, DocsApiMdHoldsTheSameTable) {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/docs/api.md");
  ASSERT_TRUE(in) << "docs/api.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const size_t begin = doc.find("<!-- api-fields:begin -->");
  const size_t end = doc.find("<!-- api-fields:end -->");
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  std::vector<std::string> rows;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(doc).substr(begin, end - begin), '\n')) {
    if (absl::StartsWith(line, "| `")) rows.emplace_back(line);
  }
  const std::span<const ApiField> fields = ApiFields();
  ASSERT_EQ(rows.size(), fields.size()) << "docs/api.md and api_fields.cc list different fields";
  for (size_t i = 0; i < fields.size(); ++i) {
    const ApiField& f = fields[i];
    const std::string want = absl::StrCat("| `", f.name, "` | ", EndpointsCell(f.endpoints), " | ",
                                          FieldSupportName(f.support), " | ", f.note, " |");
    EXPECT_EQ(rows[i], want) << "row " << i;
  }
}

}  // namespace
}  // namespace tandem::router

// The router frontend over real loopback sockets and a FakeGenerationBackend.
//
// The test model is written here: a byte-level tokenizer whose ids 0..255 are the bytes (no
// merges) plus three special tokens, a ChatML template, and a config.json with a 64-token
// context. So token counts follow from byte counts by hand, and the fake backend's tokens
// ('a' + (seed + j) % 26) give the expected texts independently of the frontend.
#include "runtime/router/frontend.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "prometheus/registry.h"
#include "runtime/router/frontend_fake_backend.h"
#include "runtime/router/http_test_client.h"

namespace tandem::router {
namespace {

using json = nlohmann::json;
using testing::ClientResponse;
using ::testing::ElementsAre;
using testing::Fetch;
using ::testing::HasSubstr;
using testing::RawRequest;
using testing::SseEvents;
using testing::TestConnection;

constexpr int kContext = 64;
constexpr char kModelName[] = "tiny-chatml";

// GPT-2's bytes_to_unicode: the printable character standing for each byte.
std::string ByteChar(int b) {
  int cp = b;
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE))) ++n;
    }
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

std::string WriteTestModel() {
  const std::string dir = ::testing::TempDir() + "/router_frontend_test/" + kModelName;
  std::filesystem::create_directories(dir);
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  json added = json::array();
  int id = 256;
  for (const char* t : {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}) {
    added.push_back({{"id", id++},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const json tokenizer = {
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  const json config = {
      {"chat_template",
       "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"},
      {"eos_token", "<|endoftext|>"}};
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  const json model_config = {{"architectures", {"LlamaForCausalLM"}},
                             {"vocab_size", 259},
                             {"hidden_size", 16},
                             {"intermediate_size", 32},
                             {"num_hidden_layers", 1},
                             {"num_attention_heads", 2},
                             {"num_key_value_heads", 2},
                             {"max_position_embeddings", kContext}};
  std::ofstream(dir + "/config.json") << model_config.dump();
  return dir;
}

// Prompt tokens of a one-message ChatML conversation: 3 specials + role + "\n" + content +
// "\n" after <|im_end|> + "assistant\n".
int ChatPromptTokens(const std::string& role, const std::string& content) {
  return 3 + static_cast<int>(role.size() + 1 + content.size() + 1 + 10);
}

std::string Letters(uint64_t seed, int n) {
  std::string s;
  for (int j = 0; j < n; ++j) s += static_cast<char>('a' + (seed + j) % 26);
  return s;
}

json ChatBody(const json& extra = json::object()) {
  json j = {{"model", kModelName}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  j.update(extra);
  return j;
}

json CompletionBody(const json& extra = json::object()) {
  json j = {{"model", kModelName}, {"prompt", "hello"}};
  j.update(extra);
  return j;
}

class FrontendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_dir_ = new std::string(WriteTestModel()); }
  static void TearDownTestSuite() { delete model_dir_; }

  void SetUp() override { StartFrontend(); }
  void TearDown() override {
    if (frontend_ != nullptr) frontend_->Stop();
    frontend_.reset();
  }

  void StartFrontend(absl::Duration shutdown_grace = absl::Seconds(5)) {
    RouterFrontendOptions options;
    options.http.host = "127.0.0.1";
    options.http.port = 0;
    options.http.num_threads = 4;
    options.http.max_body_bytes = 64 << 10;
    options.http.shutdown_grace = shutdown_grace;
    options.model_dir = *model_dir_;
    options.model_options = model_options_;
    options.extra_metrics = [] { return std::string("tandem_test_extra_metric 1\n"); };
    auto frontend = RouterFrontend::Create(options, &backend_, &registry_);
    ASSERT_TRUE(frontend.ok()) << frontend.status();
    frontend_ = *std::move(frontend);
    ASSERT_TRUE(frontend_->Start().ok());
    port_ = frontend_->port();
    ASSERT_GT(port_, 0);
  }

  ClientResponse Post(const std::string& path, const json& body) {
    auto r = Fetch(port_, "POST", path, body.dump());
    EXPECT_TRUE(r.has_value()) << path << " " << body.dump();
    return r.value_or(ClientResponse{});
  }
  static json Json(const ClientResponse& r) {
    json j = json::parse(r.body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.body;
    return j;
  }
  // The parsed SSE events of a streamed response, with [DONE] as the string "[DONE]".
  static std::vector<json> Events(const ClientResponse& r) {
    std::vector<json> out;
    for (const std::string& e : SseEvents(r.body)) {
      out.push_back(e == "[DONE]" ? json("[DONE]") : json::parse(e, nullptr, false));
    }
    return out;
  }

  static std::string* model_dir_;
  FrontendModelOptions model_options_;
  FakeGenerationBackend backend_;
  prometheus::Registry registry_;
  std::unique_ptr<RouterFrontend> frontend_;
  int port_ = 0;
};

std::string* FrontendTest::model_dir_ = nullptr;

// ---- Bad input: every row over a real socket, then a good request still works ----

struct BadCase {
  const char* name;
  std::string method;
  std::string path;
  std::string body;
  int status;
  std::string type;
  std::string param;  // "" = null
  std::string code;   // "" = null
};

std::vector<BadCase> BadCases() {
  const std::string kC = "/v1/completions";
  const std::string kChat = "/v1/chat/completions";
  const std::string bad = "invalid_request_error";
  auto c = [](const json& extra) { return CompletionBody(extra).dump(); };
  auto ch = [](const json& extra) { return ChatBody(extra).dump(); };
  json no_prompt = CompletionBody();
  no_prompt.erase("prompt");
  json no_messages = ChatBody();
  no_messages.erase("messages");
  json seventeen = json::array();
  for (int i = 0; i < 17; ++i) seventeen.push_back(absl::StrCat("s", i));
  return {
      {"bad json", "POST", kC, "{\"prompt\": ", 400, bad, "", ""},
      {"bad json chat", "POST", kChat, "not json", 400, bad, "", ""},
      {"body not an object", "POST", kC, "[1, 2]", 400, bad, "", ""},
      {"missing prompt", "POST", kC, no_prompt.dump(), 400, bad, "prompt", ""},
      {"empty prompt", "POST", kC, c({{"prompt", ""}}), 400, bad, "prompt", ""},
      {"empty token prompt", "POST", kC, c({{"prompt", json::array()}}), 400, bad, "prompt", ""},
      {"empty prompt in a batch", "POST", kC, c({{"prompt", {"a", ""}}}), 400, bad, "prompt", ""},
      {"prompt wrong type", "POST", kC, c({{"prompt", 5}}), 400, bad, "prompt", ""},
      {"token id outside vocab", "POST", kC, c({{"prompt", {1, 100000}}}), 400, bad, "prompt", ""},
      {"negative token id", "POST", kC, c({{"prompt", {1, -1}}}), 400, bad, "prompt", ""},
      {"temperature type", "POST", kC, c({{"temperature", "hot"}}), 400, bad, "temperature", ""},
      {"temperature high", "POST", kC, c({{"temperature", 2.5}}), 400, bad, "temperature", ""},
      {"temperature negative", "POST", kChat, ch({{"temperature", -1}}), 400, bad, "temperature",
       ""},
      {"top_p zero", "POST", kC, c({{"top_p", 0}}), 400, bad, "top_p", ""},
      {"top_p high", "POST", kChat, ch({{"top_p", 1.01}}), 400, bad, "top_p", ""},
      {"top_k", "POST", kC, c({{"top_k", -5}}), 400, bad, "top_k", ""},
      {"min_p", "POST", kC, c({{"min_p", 2}}), 400, bad, "min_p", ""},
      {"n zero", "POST", kC, c({{"n", 0}}), 400, bad, "n", ""},
      {"n too many", "POST", kChat, ch({{"n", 129}}), 400, bad, "n", ""},
      {"n fractional", "POST", kC, c({{"n", 1.5}}), 400, bad, "n", ""},
      {"logprobs high", "POST", kC, c({{"logprobs", 21}}), 400, bad, "logprobs", ""},
      {"logprobs negative", "POST", kC, c({{"logprobs", -1}}), 400, bad, "logprobs", ""},
      {"chat logprobs type", "POST", kChat, ch({{"logprobs", 3}}), 400, bad, "logprobs", ""},
      {"top_logprobs high", "POST", kChat, ch({{"logprobs", true}, {"top_logprobs", 21}}), 400, bad,
       "top_logprobs", ""},
      {"top_logprobs without logprobs", "POST", kChat, ch({{"top_logprobs", 2}}), 400, bad,
       "top_logprobs", ""},
      {"presence_penalty", "POST", kC, c({{"presence_penalty", 2.5}}), 400, bad, "presence_penalty",
       ""},
      {"frequency_penalty", "POST", kChat, ch({{"frequency_penalty", -3}}), 400, bad,
       "frequency_penalty", ""},
      {"repetition_penalty zero", "POST", kC, c({{"repetition_penalty", 0}}), 400, bad,
       "repetition_penalty", ""},
      {"max_tokens zero", "POST", kC, c({{"max_tokens", 0}}), 400, bad, "max_tokens", ""},
      {"max_tokens type", "POST", kChat, ch({{"max_tokens", "10"}}), 400, bad, "max_tokens", ""},
      {"max_completion_tokens", "POST", kChat, ch({{"max_completion_tokens", -1}}), 400, bad,
       "max_completion_tokens", ""},
      {"seed type", "POST", kC, c({{"seed", "x"}}), 400, bad, "seed", ""},
      {"stop type", "POST", kC, c({{"stop", 5}}), 400, bad, "stop", ""},
      {"stop too many", "POST", kC, c({{"stop", seventeen}}), 400, bad, "stop", ""},
      {"stop empty string", "POST", kChat, ch({{"stop", {""}}}), 400, bad, "stop", ""},
      {"stream type", "POST", kC, c({{"stream", "yes"}}), 400, bad, "stream", ""},
      {"stream_options without stream", "POST", kChat,
       ch({{"stream_options", {{"include_usage", true}}}}), 400, bad, "stream_options", ""},
      {"prompt_logprobs streamed", "POST", kC, c({{"prompt_logprobs", 1}, {"stream", true}}), 400,
       bad, "prompt_logprobs", ""},
      {"prompt_logprobs over 20", "POST", kChat, ch({{"prompt_logprobs", 21}}), 400, bad,
       "prompt_logprobs", ""},
      {"ignore_eos type", "POST", kC, c({{"ignore_eos", "yes"}}), 400, bad, "ignore_eos", ""},
      {"tools", "POST", kChat, ch({{"tools", {{{"type", "function"}}}}}), 400, bad,
       "tools[0].function", ""},
      {"unknown model", "POST", kC, c({{"model", "gpt-4"}}), 404, "not_found_error", "model",
       "model_not_found"},
      {"unknown model chat", "POST", kChat, ch({{"model", "gpt-4"}}), 404, "not_found_error",
       "model", "model_not_found"},
      {"unknown role", "POST", kChat, ch({{"messages", {{{"role", "bad"}, {"content", "x"}}}}}),
       400, bad, "messages[0].role", ""},
      {"template in a role", "POST", kChat,
       ch({{"messages", {{{"role", "{{ raise }}"}, {"content", "x"}}}}}), 400, bad,
       "messages[0].role", ""},
      {"legacy functions", "POST", kChat, ch({{"functions", json::array()}}), 400, bad, "functions",
       "unsupported_parameter"},
      {"legacy function_call", "POST", kChat, ch({{"function_call", "auto"}}), 400, bad,
       "function_call", "unsupported_parameter"},
      {"tool_choice without tools", "POST", kChat, ch({{"tool_choice", "auto"}}), 400, bad,
       "tool_choice", ""},
      {"audio", "POST", kChat, ch({{"audio", json::object()}}), 400, bad, "audio",
       "unsupported_parameter"},
      {"prediction", "POST", kChat, ch({{"prediction", json::object()}}), 400, bad, "prediction",
       "unsupported_parameter"},
      {"audio modality", "POST", kChat, ch({{"modalities", {"text", "audio"}}}), 400, bad,
       "modalities", "unsupported_parameter"},
      {"missing messages", "POST", kChat, no_messages.dump(), 400, bad, "messages", ""},
      {"empty messages", "POST", kChat, ch({{"messages", json::array()}}), 400, bad, "messages",
       ""},
      {"messages not a list", "POST", kChat, ch({{"messages", "hi"}}), 400, bad, "messages", ""},
      {"message without role", "POST", kChat, ch({{"messages", {{{"content", "x"}}}}}), 400, bad,
       "messages[0].role", ""},
      {"content wrong type", "POST", kChat,
       ch({{"messages", {{{"role", "user"}, {"content", 5}}}}}), 400, bad, "messages[0].content",
       ""},
      {"image content part", "POST", kChat,
       ch({{"messages",
            {{{"role", "user"},
              {"content", {{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}}}}}}}),
       400, bad, "messages[0].content[0].type", ""},
      {"prompt over context", "POST", kC, c({{"prompt", std::string(kContext, 'x')}}), 400, bad,
       "prompt", "context_length_exceeded"},
      {"token prompt over context", "POST", kC, c({{"prompt", std::vector<int>(kContext + 5, 65)}}),
       400, bad, "prompt", "context_length_exceeded"},
      {"messages over context", "POST", kChat,
       ch({{"messages", {{{"role", "user"}, {"content", std::string(kContext, 'x')}}}}}), 400, bad,
       "messages", "context_length_exceeded"},
      {"prompt plus max_tokens over context", "POST", kC, c({{"max_tokens", kContext - 5 + 1}}),
       400, bad, "prompt", "context_length_exceeded"},
      {"messages plus max_tokens over context", "POST", kChat, ch({{"max_tokens", kContext}}), 400,
       bad, "messages", "context_length_exceeded"},
      {"stop token id outside vocab", "POST", kC, c({{"stop_token_ids", {100000}}}), 400, bad,
       "stop_token_ids", ""},
      {"unknown route", "GET", "/v1/nothing", "", 404, "not_found_error", "", ""},
      {"unknown route post", "POST", "/foo", "{}", 404, "not_found_error", "", ""},
      {"unknown model card", "GET", "/v1/models/gpt-4", "", 404, "not_found_error", "model",
       "model_not_found"},
      {"wrong method completions", "GET", kC, "", 405, bad, "", ""},
      {"wrong method chat", "PUT", kChat, "{}", 405, bad, "", ""},
      {"wrong method models", "POST", "/v1/models", "{}", 405, bad, "", ""},
      {"wrong method health", "DELETE", "/health", "", 405, bad, "", ""},
      {"body too large", "POST", kC, c({{"prompt", std::string(70 << 10, 'x')}}), 413, bad, "", ""},
  };
}

TEST_F(FrontendTest, BadRequestsGetOpenAiErrorsAndServerKeepsServing) {
  for (const BadCase& bc : BadCases()) {
    SCOPED_TRACE(bc.name);
    auto r = Fetch(port_, bc.method, bc.path, bc.body);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, bc.status) << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    const json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
    EXPECT_EQ(e["type"], bc.type);
    EXPECT_EQ(e["param"], bc.param.empty() ? json(nullptr) : json(bc.param)) << e.dump();
    EXPECT_EQ(e["code"], bc.code.empty() ? json(nullptr) : json(bc.code)) << e.dump();
    if (bc.status == 405) {
      EXPECT_FALSE(r->Header("allow").empty());
    }
  }
  EXPECT_TRUE(backend_.requests().empty()) << "no bad request may reach the backend";
  auto ok = Post("/v1/completions", CompletionBody({{"max_tokens", 2}}));
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(Json(ok)["choices"][0]["text"], "ab");
}

TEST_F(FrontendTest, WrongMethodNamesTheAllowedOne) {
  auto r = Fetch(port_, "GET", "/v1/chat/completions");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->Header("allow"), "POST");
  r = Fetch(port_, "POST", "/v1/models", "{}");
  EXPECT_EQ(r->Header("allow"), "GET");
}

// ---- Good requests ----

// Request ids carry 128 random bits each: two consecutive ids share no half (the old scheme, a
// per-process prefix plus a counter, let one client predict the next client's id and cancel it).
TEST_F(FrontendTest, RequestIdsAreUnguessable) {
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto r = Post("/v1/completions", CompletionBody({{"max_tokens", 1}}));
    ASSERT_EQ(r.status, 200) << r.body;
    std::string id = Json(r)["id"].get<std::string>();
    ASSERT_TRUE(absl::StartsWith(id, "cmpl-"));
    id = id.substr(5);
    ASSERT_EQ(id.size(), 32u) << id;
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
    ids.push_back(id);
  }
  for (size_t i = 1; i < ids.size(); ++i) {
    EXPECT_NE(ids[i].substr(0, 16), ids[i - 1].substr(0, 16));
    EXPECT_NE(ids[i].substr(16), ids[i - 1].substr(16));
  }
}

TEST_F(FrontendTest, CompletionNonStreaming) {
  const int64_t before = absl::ToUnixSeconds(absl::Now());
  auto r = Post("/v1/completions", CompletionBody({{"max_tokens", 5}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.Header("content-type"), HasSubstr("application/json"));
  json j = Json(r);
  EXPECT_TRUE(absl::StartsWith(j["id"].get<std::string>(), "cmpl-"));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], kModelName);
  EXPECT_GE(j["created"].get<int64_t>(), before);
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], "abcde");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);  // "hello": five byte tokens
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["usage"]["total_tokens"], 10);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  auto reqs = backend_.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].prompt_token_ids, std::vector<int32_t>({'h', 'e', 'l', 'l', 'o'}));
  EXPECT_EQ(reqs[0].request_id, j["id"].get<std::string>() + "-0");
}

TEST_F(FrontendTest, CompletionDefaultsTo16TokensLikeOpenAi) {
  auto r = Post("/v1/completions", CompletionBody());
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(Json(r)["choices"][0]["text"], Letters(0, 16));
  EXPECT_EQ(backend_.requests()[0].params.max_tokens, 16);
  // Near the context limit the default shrinks to what is left.
  r = Post("/v1/completions", CompletionBody({{"prompt", std::string(kContext - 3, 'x')}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(backend_.requests()[1].params.max_tokens, 3);
}

TEST_F(FrontendTest, TokenIdPromptAndCachedTokens) {
  FakeBackendBehavior b;
  b.cached_tokens = 2;
  backend_.set_behavior(b);
  auto r = Post("/v1/completions", CompletionBody({{"prompt", {72, 105, 33}}, {"max_tokens", 1}}));
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Json(r);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  EXPECT_EQ(backend_.requests()[0].prompt_token_ids, std::vector<int32_t>({72, 105, 33}));
}

TEST_F(FrontendTest, ChatNonStreamingAppliesTemplate) {
  auto r = Post("/v1/chat/completions", ChatBody({{"max_completion_tokens", 3}}));
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Json(r);
  EXPECT_TRUE(absl::StartsWith(j["id"].get<std::string>(), "chatcmpl-"));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "abc");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], ChatPromptTokens("user", "hi"));
  // The ChatML rendering, token by token: <|im_start|>=256, <|im_end|>=257.
  std::vector<int32_t> want = {256};
  for (char ch : std::string("user\nhi")) want.push_back(ch);
  want.push_back(257);
  want.push_back('\n');
  want.push_back(256);
  for (char ch : std::string("assistant\n")) want.push_back(ch);
  EXPECT_EQ(backend_.requests()[0].prompt_token_ids, want);
}

TEST_F(FrontendTest, ChatContentPartsEqualPlainString) {
  ASSERT_EQ(Post("/v1/chat/completions", ChatBody()).status, 200);
  json parts = ChatBody(
      {{"messages",
        {{{"role", "user"},
          {"content", {{{"type", "text"}, {"text", "h"}}, {{"type", "text"}, {"text", "i"}}}}}}}});
  ASSERT_EQ(Post("/v1/chat/completions", parts).status, 200);
  auto reqs = backend_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].prompt_token_ids, reqs[1].prompt_token_ids);
  // Unset max_tokens: the chat endpoint leaves it to the backend (up to the context limit).
  EXPECT_FALSE(reqs[0].params.max_tokens.has_value());
}

TEST_F(FrontendTest, CompletionStreamingWithUsage) {
  auto r = Post("/v1/completions", CompletionBody({{"max_tokens", 4},
                                                   {"stream", true},
                                                   {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(r.chunked);
  EXPECT_EQ(r.Header("content-type"), "text/event-stream");
  std::vector<json> events = Events(r);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json& usage_chunk = events[events.size() - 2];
  EXPECT_EQ(usage_chunk["choices"], json::array());
  EXPECT_EQ(usage_chunk["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 4);
  EXPECT_EQ(usage_chunk["usage"]["total_tokens"], 9);
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json& e = events[i];
    EXPECT_EQ(e["object"], "text_completion");
    EXPECT_TRUE(e.contains("usage") && e["usage"].is_null());
    ASSERT_EQ(e["choices"].size(), 1u);
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, "abcd");
  EXPECT_EQ(finish, "length");
}

TEST_F(FrontendTest, ChatStreamingWithoutUsage) {
  auto r = Post("/v1/chat/completions", ChatBody({{"max_tokens", 3}, {"stream", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<json> events = Events(r);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_FALSE(events[i].contains("usage"));
    const json& delta = events[i]["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(text, "abc");
  const json& last = events[events.size() - 2];
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
}

TEST_F(FrontendTest, NChoicesFanOutWithSeedPlusIndex) {
  auto r = Post("/v1/completions", CompletionBody({{"n", 2}, {"seed", 3}, {"max_tokens", 4}}));
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Json(r);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], Letters(3, 4));
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["text"], Letters(4, 4));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  auto reqs = backend_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  std::vector<uint64_t> seeds = {*reqs[0].params.seed, *reqs[1].params.seed};
  std::sort(seeds.begin(), seeds.end());
  EXPECT_THAT(seeds, ElementsAre(3u, 4u));
  EXPECT_NE(reqs[0].request_id, reqs[1].request_id);
}

TEST_F(FrontendTest, BatchedPromptsGetNChoicesEachInPromptOrder) {
  auto r = Post("/v1/completions", CompletionBody({{"prompt", {"hi", {72, 105, 33, 33}}},
                                                   {"n", 2},
                                                   {"seed", 5},
                                                   {"max_tokens", 3},
                                                   {"echo", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Json(r);
  ASSERT_EQ(j["choices"].size(), 4u);
  // index = prompt * n + j; the j-th choice of each prompt draws with seed + j.
  EXPECT_EQ(j["choices"][0]["text"], "hi" + Letters(5, 3));
  EXPECT_EQ(j["choices"][1]["text"], "hi" + Letters(6, 3));
  EXPECT_EQ(j["choices"][2]["text"], "Hi!!" + Letters(5, 3));
  EXPECT_EQ(j["choices"][3]["text"], "Hi!!" + Letters(6, 3));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(j["choices"][i]["index"], i);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2 + 4);  // each prompt once
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  auto reqs = backend_.requests();
  ASSERT_EQ(reqs.size(), 4u);
  int short_prompts = 0;
  for (const BackendRequest& b : reqs) short_prompts += b.prompt_token_ids.size() == 2 ? 1 : 0;
  EXPECT_EQ(short_prompts, 2);
  // Too many choices in all, and an empty prompt in the batch, are 400s naming the field.
  r = Post("/v1/completions",
           CompletionBody({{"prompt", json::array({"a", "b", "c", "d", "e", "f", "g", "h", "i"})},
                           {"n", 128}}));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["param"], "n");
  r = Post("/v1/completions", CompletionBody({{"prompt", {"a", ""}}}));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["param"], "prompt");
}

TEST_F(FrontendTest, LogitControlsMinTokensAndStopOptionsReachTheBackend) {
  auto r = Post("/v1/completions", CompletionBody({{"max_tokens", 6},
                                                   {"min_tokens", 4},
                                                   {"logit_bias", {{"98", 3.5}, {"97", -100}}},
                                                   {"allowed_token_ids", {97, 98, 99}},
                                                   {"stop", "zz"},
                                                   {"include_stop_str_in_output", true},
                                                   {"skip_special_tokens", false}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<BackendRequest> reqs = backend_.requests();
  const SamplingParams& p = reqs[0].params;
  EXPECT_EQ(p.min_tokens, 4);
  EXPECT_THAT(p.logit_bias, ElementsAre(std::pair<int32_t, float>{97, -100.0f},
                                        std::pair<int32_t, float>{98, 3.5f}));
  EXPECT_THAT(p.allowed_token_ids, ElementsAre(97, 98, 99));
  EXPECT_TRUE(p.include_stop_str_in_output);
  EXPECT_FALSE(p.skip_special_tokens);
  // Against the vocabulary (259 tokens) and max_tokens: 400s naming the field.
  r = Post("/v1/completions", CompletionBody({{"logit_bias", {{"5000", 1}}}}));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["param"], "logit_bias");
  r = Post("/v1/completions", CompletionBody({{"min_tokens", 17}}));  // the default max is 16
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["param"], "min_tokens");
}

TEST_F(FrontendTest, TruncateAddSpecialTokensAndUnknownFields) {
  auto r = Post("/v1/completions",
                CompletionBody({{"truncate_prompt_tokens", 2}, {"max_tokens", 1}, {"echo", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(backend_.requests()[0].prompt_token_ids, std::vector<int32_t>({'l', 'o'}));
  EXPECT_EQ(Json(r)["choices"][0]["text"], "lo" + Letters(0, 1));
  EXPECT_EQ(Json(r)["usage"]["prompt_tokens"], 2);
  r = Post("/v1/chat/completions", ChatBody({{"temprature", 0.2}}));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["param"], "temprature");
  EXPECT_EQ(Json(r)["error"]["code"], "unknown_parameter");
}

TEST_F(FrontendTest, ContinueFinalMessageLeavesTheAssistantTurnOpen) {
  json messages = {{{"role", "user"}, {"content", "hi"}},
                   {{"role", "assistant"}, {"content", "Sure: "}}};
  auto r = Post("/v1/chat/completions", ChatBody({{"messages", messages},
                                                  {"add_generation_prompt", false},
                                                  {"continue_final_message", true},
                                                  {"max_tokens", 1}}));
  ASSERT_EQ(r.status, 200) << r.body;
  // ChatML: ...<|im_start|>assistant\nSure:  -- cut after the trimmed content, no <|im_end|>.
  std::vector<int32_t> want = {256};
  for (char ch : std::string("user\nhi")) want.push_back(ch);
  want.push_back(257);
  want.push_back('\n');
  want.push_back(256);
  for (char ch : std::string("assistant\nSure:")) want.push_back(ch);
  EXPECT_EQ(backend_.requests()[0].prompt_token_ids, want);
  // With a generation prompt too, or without a final assistant message: 400.
  r = Post("/v1/chat/completions",
           ChatBody({{"messages", messages}, {"continue_final_message", true}}));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["param"], "continue_final_message");
  r = Post("/v1/chat/completions",
           ChatBody({{"add_generation_prompt", false}, {"continue_final_message", true}}));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["param"], "continue_final_message");
  // chat_template_kwargs may not override the request's own variables.
  r = Post("/v1/chat/completions", ChatBody({{"chat_template_kwargs", {{"messages", 1}}}}));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["param"], "chat_template_kwargs");
  r = Post("/v1/chat/completions", ChatBody({{"chat_template_kwargs", {{"unused", 1}}}}));
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(FrontendTest, TokenizeDetokenizeAndVersion) {
  // Completion form: the byte tokenizer gives one id per byte; no model limit applies.
  auto r = Post("/tokenize", json{{"model", kModelName}, {"prompt", "hey"}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Json(r);
  EXPECT_EQ(j["count"], 3);
  EXPECT_EQ(j["max_model_len"], kContext);
  EXPECT_EQ(j["tokens"], json({'h', 'e', 'y'}));
  EXPECT_TRUE(j["token_strs"].is_null());
  r = Post("/tokenize",
           json{{"prompt", std::string(kContext + 5, 'x')}, {"return_token_strs", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json(r)["count"], kContext + 5);
  EXPECT_EQ(Json(r)["token_strs"][0], "x");
  // Chat form: the same ids the chat endpoint sends to a worker.
  ASSERT_EQ(Post("/v1/chat/completions", ChatBody({{"max_tokens", 1}})).status, 200);
  r = Post("/tokenize", json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json(r)["tokens"].get<std::vector<int32_t>>(), backend_.requests()[0].prompt_token_ids);
  // Detokenize: specials kept.
  r = Post("/detokenize", json{{"tokens", {256, 'o', 'k'}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json(r)["prompt"], "<|im_start|>ok");
  // Bad input: 400 naming the field; another model: 404; GET: 405.
  r = Post("/detokenize", json{{"tokens", {100000}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["param"], "tokens");
  r = Post("/tokenize", json{{"prompt", "a"}, {"messages", json::array()}});
  EXPECT_EQ(r.status, 400);
  r = Post("/tokenize", json{{"prompt", "a"}, {"temperature", 0}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["param"], "temperature");
  r = Post("/tokenize", json{{"model", "other"}, {"prompt", "a"}});
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(Fetch(port_, "GET", "/tokenize", "")->status, 405);
  r = Post("/v1/embeddings", json{{"model", kModelName}, {"input", "hello"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json(r)["error"]["code"], "model_not_supported");
  auto v = Fetch(port_, "GET", "/version", "");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->status, 200);
  EXPECT_FALSE(json::parse(v->body)["version"].get<std::string>().empty());
}

TEST_F(FrontendTest, GenerationConfigDefaultsFillWhatTheRequestLeavesOut) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "frontend-generation-config";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "generation_config.json")
      << R"({"temperature": 0.25, "top_k": 7, "max_new_tokens": 5, "eos_token_id": [2]})";
  frontend_->Stop();
  model_options_.generation_config = dir.string();
  StartFrontend();
  ASSERT_EQ(Post("/v1/completions", CompletionBody()).status, 200);
  ASSERT_EQ(
      Post("/v1/completions", CompletionBody({{"temperature", 0.9}, {"max_tokens", 2}})).status,
      200);
  ASSERT_EQ(Post("/v1/chat/completions", ChatBody()).status, 200);
  auto reqs = backend_.requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_FLOAT_EQ(reqs[0].params.temperature, 0.25f);
  EXPECT_EQ(reqs[0].params.top_k, 7);
  EXPECT_EQ(reqs[0].params.max_tokens, 5);            // over the completions default of 16
  EXPECT_FLOAT_EQ(reqs[1].params.temperature, 0.9f);  // the request's own wins
  EXPECT_EQ(reqs[1].params.top_k, 7);
  EXPECT_EQ(reqs[1].params.max_tokens, 2);
  EXPECT_EQ(reqs[2].params.max_tokens, 5);
  // "vllm": no defaults.
  frontend_->Stop();
  model_options_.generation_config = "vllm";
  StartFrontend();
  ASSERT_EQ(Post("/v1/completions", CompletionBody()).status, 200);
  EXPECT_FLOAT_EQ(backend_.requests()[3].params.temperature, 1.0f);
  EXPECT_EQ(backend_.requests()[3].params.max_tokens, 16);
  // A value out of range, or a directory without the file: the frontend does not start.
  std::ofstream(dir / "generation_config.json") << R"({"temperature": 5})";
  RouterFrontendOptions bad;
  bad.model_dir = *model_dir_;
  bad.model_options.generation_config = dir.string();
  absl::StatusOr<std::unique_ptr<RouterFrontend>> f =
      RouterFrontend::Create(bad, &backend_, &registry_);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("temperature"));
  bad.model_options.generation_config = (dir / "missing").string();
  EXPECT_FALSE(RouterFrontend::Create(bad, &backend_, &registry_).ok());
}

TEST_F(FrontendTest, ChatTemplateFileReplacesTheModelsTemplate) {
  const std::filesystem::path file =
      std::filesystem::path(::testing::TempDir()) / "frontend-template.jinja";
  std::ofstream(file) << "{% for m in messages %}[{{ m.content }}]{% endfor %}";
  frontend_->Stop();
  model_options_.chat_template_file = file.string();
  StartFrontend();
  ASSERT_EQ(Post("/v1/chat/completions", ChatBody({{"max_tokens", 1}})).status, 200);
  EXPECT_EQ(backend_.requests()[0].prompt_token_ids, std::vector<int32_t>({'[', 'h', 'i', ']'}));
  // One that does not compile, or does not exist: the frontend does not start.
  std::ofstream(file) << "{% for m in messages %}";
  RouterFrontendOptions bad;
  bad.model_dir = *model_dir_;
  bad.model_options.chat_template_file = file.string();
  absl::StatusOr<std::unique_ptr<RouterFrontend>> f =
      RouterFrontend::Create(bad, &backend_, &registry_);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("--chat-template"));
  bad.model_options.chat_template_file = file.string() + ".missing";
  EXPECT_FALSE(RouterFrontend::Create(bad, &backend_, &registry_).ok());
}

// Tools reach the template as its `tools` variable, in chat and in /tokenize alike.
TEST_F(FrontendTest, ToolsAreRenderedByTheTemplate) {
  const std::filesystem::path file =
      std::filesystem::path(::testing::TempDir()) / "frontend-tools-template.jinja";
  std::ofstream(file) << "{% if tools %}{% for t in tools %}<{{ t.function.name }}>{% endfor %}"
                         "{% endif %}{% for m in messages %}[{{ m.content }}]{% endfor %}";
  frontend_->Stop();
  model_options_.chat_template_file = file.string();
  StartFrontend();
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "ab"}},
                                     {"type": "function", "function": {"name": "c"}}])");
  ClientResponse r =
      Post("/tokenize", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", tools}});
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<int32_t> want;
  for (char ch : std::string("<ab><c>[hi]")) want.push_back(static_cast<unsigned char>(ch));
  EXPECT_EQ(Json(r)["tokens"].get<std::vector<int32_t>>(), want);
  ASSERT_EQ(Post("/v1/chat/completions",
                 ChatBody({{"tools", tools}, {"tool_choice", "none"}, {"max_tokens", 1}}))
                .status,
            200);
  EXPECT_EQ(backend_.requests().back().prompt_token_ids, want);
}

TEST_F(FrontendTest, NChoicesStreamCarryIndex) {
  auto r = Post("/v1/chat/completions",
                ChatBody({{"n", 2}, {"seed", 0}, {"max_tokens", 3}, {"stream", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<json> events = Events(r);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::map<int, std::string> text;
  std::map<int, int> finishes;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json& c = events[i]["choices"][0];
    const int index = c["index"];
    if (c["delta"].contains("content")) text[index] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++finishes[index];
  }
  EXPECT_EQ(text[0], Letters(0, 3));
  EXPECT_EQ(text[1], Letters(1, 3));
  EXPECT_EQ(finishes[0], 1);
  EXPECT_EQ(finishes[1], 1);
}

TEST_F(FrontendTest, CompletionLogprobsShape) {
  auto r = Post("/v1/completions", CompletionBody({{"max_tokens", 3}, {"logprobs", 2}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const json lp = Json(r)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b", "c"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.125, -0.25, -0.375}));
  EXPECT_EQ(lp["top_logprobs"], json::array({{{"A", -0.5}, {"B", -1.0}},
                                             {{"A", -0.5}, {"B", -1.0}},
                                             {{"A", -0.5}, {"B", -1.0}}}));
  EXPECT_EQ(lp["text_offset"], json({0, 1, 2}));
  EXPECT_EQ(backend_.requests()[0].params.logprobs, 2);
}

TEST_F(FrontendTest, ChatLogprobsShape) {
  auto r = Post("/v1/chat/completions",
                ChatBody({{"max_tokens", 2}, {"logprobs", true}, {"top_logprobs", 1}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const json content = Json(r)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0],
            json({{"token", "a"},
                  {"logprob", -0.125},
                  {"bytes", {97}},
                  {"top_logprobs", {{{"token", "A"}, {"logprob", -0.5}, {"bytes", {65}}}}}}));
  EXPECT_EQ(content[1]["token"], "b");
  EXPECT_EQ(content[1]["logprob"], -0.25);
  // Streamed: each content chunk carries its tokens' logprobs.
  r = Post("/v1/chat/completions",
           ChatBody({{"max_tokens", 2}, {"logprobs", true}, {"stream", true}}));
  int entries = 0;
  for (const json& e : Events(r)) {
    if (e.is_string()) continue;
    const json& l = e["choices"][0]["logprobs"];
    if (!l.is_null()) entries += static_cast<int>(l["content"].size());
  }
  EXPECT_EQ(entries, 2);
}

TEST_F(FrontendTest, EchoPrependsPrompt) {
  auto r = Post("/v1/completions", CompletionBody({{"max_tokens", 2}, {"echo", true}}));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(Json(r)["choices"][0]["text"], "helloab");
  r = Post("/v1/completions",
           CompletionBody({{"max_tokens", 2}, {"echo", true}, {"stream", true}}));
  std::string text;
  for (const json& e : Events(r)) {
    if (!e.is_string()) text += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "helloab");
}

// OpenAI's echo with logprobs: the prompt's tokens lead the logprobs, the first with nulls, the
// rest with the worker's prompt scores (fake backend: -0.25 * position) and `logprobs`
// alternatives; then the completion's. Streamed, the first chunk carries the prompt's.
TEST_F(FrontendTest, EchoWithLogprobsLeadsWithThePromptsTokens) {
  auto r =
      Post("/v1/completions", CompletionBody({{"max_tokens", 2}, {"echo", true}, {"logprobs", 1}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const json choice = Json(r)["choices"][0];
  EXPECT_EQ(choice["text"], "helloab");
  const json lp = choice["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"h", "e", "l", "l", "o", "a", "b"}));
  EXPECT_EQ(lp["token_logprobs"], json({nullptr, -0.25, -0.5, -0.75, -1.0, -0.125, -0.25}));
  const json alt = {{"A", -0.5}};
  EXPECT_EQ(lp["top_logprobs"], json::array({nullptr, alt, alt, alt, alt, alt, alt}));
  EXPECT_EQ(lp["text_offset"], json({0, 1, 2, 3, 4, 5, 6}));
  EXPECT_FALSE(choice.contains("prompt_logprobs"));
  ASSERT_FALSE(backend_.requests().empty());
  EXPECT_EQ(backend_.requests().back().params.prompt_logprobs, 1);

  r = Post("/v1/completions",
           CompletionBody({{"max_tokens", 2}, {"echo", true}, {"logprobs", 1}, {"stream", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  json tokens = json::array(), values = json::array();
  for (const json& e : Events(r)) {
    if (e.is_string()) continue;
    const json& l = e["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (const json& t : l["tokens"]) tokens.push_back(t);
    for (const json& v : l["token_logprobs"]) values.push_back(v);
  }
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(values, lp["token_logprobs"]);
}

// vLLM's prompt_logprobs: per choice on completions (batched prompts each their own), at the top
// level on chat; {token id: {logprob, rank, decoded_token}}, the prompt token first.
TEST_F(FrontendTest, PromptLogprobsShapes) {
  auto r = Post(
      "/v1/completions",
      CompletionBody({{"max_tokens", 1}, {"prompt", {"hello", "hi"}}, {"prompt_logprobs", 2}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const json choices = Json(r)["choices"];
  ASSERT_EQ(choices.size(), 2u);
  const json& first = choices[0]["prompt_logprobs"];
  ASSERT_EQ(first.size(), 5u);
  EXPECT_TRUE(first[0].is_null());
  EXPECT_EQ(first[1], json({{"101", {{"logprob", -0.25}, {"rank", 1}, {"decoded_token", "e"}}},
                            {"65", {{"logprob", -0.5}, {"rank", 1}, {"decoded_token", "A"}}},
                            {"66", {{"logprob", -1.0}, {"rank", 2}, {"decoded_token", "B"}}}}));
  EXPECT_EQ(first[4]["111"]["logprob"], -1.0);
  EXPECT_EQ(first[4]["111"]["rank"], 4);
  ASSERT_EQ(choices[1]["prompt_logprobs"].size(), 2u);
  EXPECT_EQ(choices[1]["prompt_logprobs"][1]["105"]["decoded_token"], "i");
  EXPECT_TRUE(choices[0]["logprobs"].is_null());

  r = Post("/v1/chat/completions", ChatBody({{"max_tokens", 1}, {"prompt_logprobs", 0}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const json body = Json(r);
  ASSERT_TRUE(body["prompt_logprobs"].is_array()) << body.dump();
  EXPECT_TRUE(body["prompt_logprobs"][0].is_null());
  ASSERT_GE(body["prompt_logprobs"].size(), 2u);
  EXPECT_EQ(body["prompt_logprobs"][1].size(), 1u);  // the prompt token alone
}

// A worker whose prompt scores are not this prompt's fails the request (500), never passes them.
TEST_F(FrontendTest, PromptLogprobsThatDoNotMatchThePromptFailTheRequest) {
  FakeBackendBehavior b;
  b.misscore_prompt = true;
  b.endless = true;  // only a cancel ends the misscoring stream
  backend_.set_behavior(b);
  auto r = Post("/v1/completions", CompletionBody({{"max_tokens", 2}, {"prompt_logprobs", 1}}));
  EXPECT_EQ(r.status, 500) << r.body;
  EXPECT_THAT(Json(r)["error"]["message"].get<std::string>(),
              ::testing::HasSubstr("prompt logprobs do not match"));
  EXPECT_TRUE(backend_.WaitForIdle(absl::Seconds(10))) << "the misscoring stream was not cancelled";
  backend_.set_behavior({});
  r = Post("/v1/completions", CompletionBody({{"max_tokens", 2}}));
  EXPECT_EQ(r.status, 200);
}

TEST_F(FrontendTest, SamplingParametersReachTheBackend) {
  auto r = Post("/v1/completions", CompletionBody({{"max_tokens", 2},
                                                   {"stop", {"xy", "z"}},
                                                   {"temperature", 0.5},
                                                   {"top_p", 0.75},
                                                   {"top_k", 5},
                                                   {"min_p", 0.25},
                                                   {"presence_penalty", 0.5},
                                                   {"frequency_penalty", -0.5},
                                                   {"repetition_penalty", 1.5},
                                                   {"ignore_eos", true},
                                                   {"seed", 7},
                                                   {"user", "u1"}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const SamplingParams p = backend_.requests()[0].params;
  EXPECT_THAT(p.stop, ElementsAre("xy", "z"));
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.top_p, 0.75f);
  EXPECT_EQ(p.top_k, 5);
  EXPECT_FLOAT_EQ(p.min_p, 0.25f);
  EXPECT_FLOAT_EQ(p.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.5f);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_EQ(p.max_tokens, 2);
  r = Post("/v1/chat/completions", ChatBody({{"stop", "end"}, {"max_tokens", 1}}));
  ASSERT_EQ(r.status, 200);
  EXPECT_THAT(backend_.requests()[1].params.stop, ElementsAre("end"));
}

TEST_F(FrontendTest, KeepAliveServesTwoRequestsOnOneConnection) {
  TestConnection conn(port_);
  ASSERT_TRUE(conn.connected());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(conn.Send(
        RawRequest("POST", "/v1/completions", CompletionBody({{"max_tokens", 2}}).dump())));
    auto r = conn.ReadResponse();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->Header("connection"), "keep-alive");
  }
  // A stream, then a plain request, still on the same connection.
  ASSERT_TRUE(conn.Send(RawRequest("POST", "/v1/chat/completions",
                                   ChatBody({{"max_tokens", 2}, {"stream", true}}).dump())));
  auto s = conn.ReadResponse();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(SseEvents(s->body).back(), "[DONE]");
  ASSERT_TRUE(conn.Send(RawRequest("GET", "/v1/models", "")));
  auto m = conn.ReadResponse();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->status, 200);
}

TEST_F(FrontendTest, SixtyFourConcurrentStreamsAllComplete) {
  FakeBackendBehavior b;
  b.token_delay = absl::Milliseconds(5);
  backend_.set_behavior(b);
  constexpr int kClients = 64;
  std::vector<std::string> texts(kClients);
  std::vector<bool> done(kClients, false);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      const json body = i % 2 == 0
                            ? CompletionBody({{"max_tokens", 10}, {"stream", true}, {"seed", i}})
                            : ChatBody({{"max_tokens", 10}, {"stream", true}, {"seed", i}});
      auto r = Fetch(port_, "POST", i % 2 == 0 ? "/v1/completions" : "/v1/chat/completions",
                     body.dump());
      if (!r.has_value() || r->status != 200) return;
      for (const std::string& e : SseEvents(r->body)) {
        if (e == "[DONE]") {
          done[i] = true;
          continue;
        }
        const json c = json::parse(e)["choices"][0];
        if (c.contains("text")) texts[i] += c["text"].get<std::string>();
        if (c.contains("delta") && c["delta"].contains("content")) {
          texts[i] += c["delta"]["content"].get<std::string>();
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_TRUE(done[i]) << i;
    EXPECT_EQ(texts[i], Letters(i, 10)) << i;
  }
  EXPECT_TRUE(backend_.WaitForIdle(absl::Seconds(5)));
}

TEST_F(FrontendTest, ClientDisconnectMidStreamCancelsBackend) {
  FakeBackendBehavior b;
  b.endless = true;
  b.token_delay = absl::Milliseconds(10);
  backend_.set_behavior(b);
  std::string id;
  {
    TestConnection conn(port_);
    ASSERT_TRUE(conn.Send(
        RawRequest("POST", "/v1/chat/completions", ChatBody({{"stream", true}, {"n", 2}}).dump())));
    auto head = conn.ReadHead();
    ASSERT_TRUE(head.has_value());
    ASSERT_EQ(head->status, 200);
    id = head->Header("x-request-id");
    ASSERT_TRUE(absl::StartsWith(id, "chatcmpl-"));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(conn.ReadChunk().has_value());
  }  // closes the socket mid-stream
  EXPECT_TRUE(backend_.WaitForCancel(id + "-", absl::Seconds(2), /*count=*/2))
      << "both choices must be cancelled promptly";
  EXPECT_TRUE(backend_.WaitForIdle(absl::Seconds(2)));
  backend_.set_behavior(FakeBackendBehavior{});
  EXPECT_EQ(Post("/v1/completions", CompletionBody({{"max_tokens", 1}})).status, 200);
}

TEST_F(FrontendTest, ClientDisconnectWhileWaitingNonStreamCancelsBackend) {
  FakeBackendBehavior b;
  b.endless = true;
  b.token_delay = absl::Milliseconds(10);
  backend_.set_behavior(b);
  {
    TestConnection conn(port_);
    ASSERT_TRUE(conn.Send(RawRequest("POST", "/v1/completions", CompletionBody().dump())));
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(backend_.WaitForCancel("cmpl-", absl::Seconds(2)));
  EXPECT_TRUE(backend_.WaitForIdle(absl::Seconds(2)));
}

TEST_F(FrontendTest, BackendUnavailableBeforeFirstTokenIs503) {
  FakeBackendBehavior b;
  b.fail_status = absl::UnavailableError("no healthy decode worker");
  backend_.set_behavior(b);
  for (bool stream : {false, true}) {
    auto r = Post("/v1/chat/completions", ChatBody({{"stream", stream}}));
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(r.Header("retry-after"), "2");
    json j = Json(r);
    EXPECT_EQ(j["error"]["type"], "service_unavailable_error");
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("no healthy decode worker"));
  }
}

// X-Request-Id: a client's id is echoed (and logged beside ours); a malformed one is refused.
TEST_F(FrontendTest, ClientRequestIdIsEchoedAndValidated) {
  const std::string body = ChatBody().dump();
  auto ok = Fetch(port_, "POST", "/v1/chat/completions", body, "X-Request-Id: trace-42\r\n");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(ok->Header("x-request-id"), "trace-42");
  auto ours = Fetch(port_, "POST", "/v1/chat/completions", body);
  ASSERT_TRUE(ours.has_value());
  EXPECT_EQ(ours->Header("x-request-id").rfind("chatcmpl-", 0), 0u);
  auto bad = Fetch(port_, "POST", "/v1/chat/completions", body,
                   absl::StrCat("X-Request-Id: ", std::string(200, 'x'), "\r\n"));
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_THAT(Json(*bad)["error"]["message"].get<std::string>(), HasSubstr("X-Request-Id"));
}

// Fairness: a request's n choices run at most max_parallel_choices (4) at a time, all complete,
// and each keeps its own seed offset.
TEST_F(FrontendTest, ChoicesOfOneRequestRunAFewAtATime) {
  FakeBackendBehavior b;
  b.token_delay = absl::Milliseconds(2);
  backend_.set_behavior(b);
  for (bool stream : {false, true}) {
    auto r = Post("/v1/completions",
                  CompletionBody({{"n", 10}, {"max_tokens", 3}, {"seed", 7}, {"stream", stream}}));
    ASSERT_EQ(r.status, 200) << r.body;
    if (!stream) {
      EXPECT_EQ(Json(r)["choices"].size(), 10u);
    } else {
      int finished = 0;
      for (const json& e : Events(r)) {
        if (e.is_object() && e.contains("choices") && !e["choices"].empty() &&
            !e["choices"][0]["finish_reason"].is_null()) {
          ++finished;
        }
      }
      EXPECT_EQ(finished, 10);
    }
  }
  EXPECT_LE(backend_.max_generating(), 4);
  EXPECT_GE(backend_.max_generating(), 2);
  std::set<uint64_t> seeds;
  for (const BackendRequest& request : backend_.requests()) seeds.insert(*request.params.seed);
  EXPECT_EQ(seeds.size(), 10u);
}

TEST_F(FrontendTest, FullRouterIs429WithRetryAfter) {
  FakeBackendBehavior b;
  b.fail_status = absl::ResourceExhaustedError("router at capacity (1 requests in flight)");
  backend_.set_behavior(b);
  for (bool stream : {false, true}) {
    auto r = Post("/v1/chat/completions", ChatBody({{"stream", stream}}));
    EXPECT_EQ(r.status, 429) << r.body;
    EXPECT_EQ(r.Header("retry-after"), "1");
    json j = Json(r);
    EXPECT_EQ(j["error"]["code"], "rate_limit_exceeded");
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("at capacity"));
  }
}

TEST_F(FrontendTest, OtherBackendErrorBeforeStreamingIs500) {
  FakeBackendBehavior b;
  b.fail_status = absl::InternalError("worker crashed");
  backend_.set_behavior(b);
  for (bool stream : {false, true}) {
    auto r = Post("/v1/completions", CompletionBody({{"stream", stream}}));
    EXPECT_EQ(r.status, 500) << r.body;
    EXPECT_EQ(Json(r)["error"]["type"], "server_error");
  }
}

TEST_F(FrontendTest, ErrorMidStreamIsAnSseErrorEventThenDone) {
  FakeBackendBehavior b;
  b.fail_status = absl::InternalError("decode worker died");
  b.fail_after_tokens = 2;
  backend_.set_behavior(b);
  auto r = Post("/v1/chat/completions", ChatBody({{"stream", true}, {"max_tokens", 10}}));
  ASSERT_EQ(r.status, 200);
  std::vector<json> events = Events(r);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json& err = events[events.size() - 2];
  ASSERT_TRUE(err.contains("error")) << err.dump();
  EXPECT_EQ(err["error"]["type"], "server_error");
  EXPECT_THAT(err["error"]["message"].get<std::string>(), HasSubstr("decode worker died"));
  // Non-streaming, the same failure is a 500.
  r = Post("/v1/chat/completions", ChatBody({{"max_tokens", 10}}));
  EXPECT_EQ(r.status, 500);
}

TEST_F(FrontendTest, OneFailingChoiceCancelsTheOthers) {
  FakeBackendBehavior b;
  b.endless = true;
  b.token_delay = absl::Milliseconds(5);
  b.fail_status = absl::InternalError("boom");
  b.fail_after_tokens = 2;
  b.fail_only_suffix = "-1";  // only choice 1 fails
  backend_.set_behavior(b);
  auto r = Post("/v1/completions", CompletionBody({{"n", 3}, {"stream", true}}));
  ASSERT_EQ(r.status, 200);
  std::vector<json> events = Events(r);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_TRUE(events[events.size() - 2].contains("error"));
  // The others are cancelled right after the error is written.
  EXPECT_TRUE(backend_.WaitForCancel("cmpl-", absl::Seconds(2), /*count=*/2));
  std::vector<std::string> cancelled = backend_.cancelled();
  std::sort(cancelled.begin(), cancelled.end());
  ASSERT_EQ(cancelled.size(), 2u);
  EXPECT_TRUE(absl::EndsWith(cancelled[0], "-0"));
  EXPECT_TRUE(absl::EndsWith(cancelled[1], "-2"));
  EXPECT_TRUE(backend_.WaitForIdle(absl::Seconds(2)));
}

TEST_F(FrontendTest, NotReadyIs503AndHealthReportsTheReason) {
  auto h = Fetch(port_, "GET", "/health");
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->status, 200);
  backend_.set_ready(absl::UnavailableError("prefill pool has no healthy worker"));
  h = Fetch(port_, "GET", "/health");
  EXPECT_EQ(h->status, 503);
  EXPECT_THAT(h->body, HasSubstr("prefill pool has no healthy worker"));
  auto r = Post("/v1/completions", CompletionBody());
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(Json(r)["error"]["type"], "service_unavailable_error");
  EXPECT_TRUE(backend_.requests().empty());
  backend_.set_ready(absl::OkStatus());
  EXPECT_EQ(Post("/v1/completions", CompletionBody()).status, 200);
}

TEST_F(FrontendTest, ModelsListsTheServedModel) {
  auto r = Fetch(port_, "GET", "/v1/models");
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200);
  json j = Json(*r);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], kModelName);  // the model dir's basename
  EXPECT_EQ(j["data"][0]["object"], "model");
  r = Fetch(port_, "GET", std::string("/v1/models/") + kModelName);
  EXPECT_EQ(r->status, 200);
  // The model field may be omitted.
  json body = CompletionBody({{"max_tokens", 1}});
  body.erase("model");
  EXPECT_EQ(Post("/v1/completions", body).status, 200);
}

TEST_F(FrontendTest, ServedModelNameIsSettable) {
  frontend_->Stop();
  RouterFrontendOptions options;
  options.http.host = "127.0.0.1";
  options.model_dir = *model_dir_;
  options.served_model_name = "my-model";
  auto frontend = RouterFrontend::Create(options, &backend_, &registry_);
  ASSERT_TRUE(frontend.ok());
  ASSERT_TRUE((*frontend)->Start().ok());
  const int port = (*frontend)->port();
  EXPECT_EQ(Json(*Fetch(port, "GET", "/v1/models"))["data"][0]["id"], "my-model");
  auto r = Fetch(port, "POST", "/v1/completions",
                 json({{"model", "my-model"}, {"prompt", "x"}, {"max_tokens", 1}}).dump());
  EXPECT_EQ(r->status, 200);
  r = Fetch(port, "POST", "/v1/completions", CompletionBody().dump());
  EXPECT_EQ(r->status, 404);
}

// Access checks on the served API: a listed browser origin gets CORS headers on every answer
// (also the 401 and the stream), its preflight needs no key, and the key guards /v1/.
TEST_F(FrontendTest, AccessChecksAndCorsOnServedResponses) {
  frontend_->Stop();
  RouterFrontendOptions options;
  options.http.host = "127.0.0.1";
  options.model_dir = *model_dir_;
  options.access.api_keys = {"sekrit"};
  options.access.cors_origins = {"https://app.example"};
  auto frontend = RouterFrontend::Create(options, &backend_, &registry_);
  ASSERT_TRUE(frontend.ok()) << frontend.status();
  ASSERT_TRUE((*frontend)->Start().ok());
  const int port = (*frontend)->port();
  const std::string body = CompletionBody({{"max_tokens", 2}}).dump();
  const auto send = [&](const std::string& method, const std::string& path,
                        const std::string& payload, const std::string& headers) {
    TestConnection conn(port);
    EXPECT_TRUE(conn.Send(RawRequest(method, path, payload, false, headers)));
    return conn.ReadResponse();
  };
  const std::string origin = "Origin: https://app.example\r\n";
  auto r = send("POST", "/v1/completions", body, origin);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->Header("access-control-allow-origin"), "https://app.example");
  EXPECT_EQ(r->Header("www-authenticate"), "Bearer");
  r = send("OPTIONS", "/v1/completions", "", origin + "Access-Control-Request-Method: POST\r\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 204);
  r = send("POST", "/v1/completions", body, origin + "Authorization: Bearer sekrit\r\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->Header("access-control-allow-origin"), "https://app.example");
  json streamed = CompletionBody({{"max_tokens", 2}, {"stream", true}});
  r = send("POST", "/v1/completions", streamed.dump(), origin + "Authorization: Bearer sekrit\r\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->Header("access-control-allow-origin"), "https://app.example");
  r = send("POST", "/v1/completions", body,
           "Origin: https://evil.example\r\nAuthorization: Bearer sekrit\r\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200) << "CORS is the browser's check: the server only omits the header";
  EXPECT_EQ(r->Header("access-control-allow-origin"), "");
  r = send("GET", "/health", "", "");
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->status, 401) << "probes need no key";
  (*frontend)->Stop();
}

TEST_F(FrontendTest, MetricsExposeRouterHistogramsAndExtraText) {
  ASSERT_EQ(Post("/v1/completions", CompletionBody({{"max_tokens", 3}})).status, 200);
  ASSERT_EQ(Post("/v1/completions", CompletionBody({{"temperature", 9}})).status, 400);
  // The request's end is recorded just after its response is written: scrape until it shows.
  std::optional<ClientResponse> r;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  do {
    r = Fetch(port_, "GET", "/metrics");
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->status, 200);
  } while (r->body.find("tandem_e2e_request_latency_seconds_count 1") == std::string::npos &&
           absl::Now() < deadline);
  const std::string& m = r->body;
  EXPECT_THAT(m, HasSubstr("tandem_requests_total{code=\"200\",endpoint=\"/v1/completions\"} 1"));
  EXPECT_THAT(m, HasSubstr("tandem_requests_total{code=\"400\",endpoint=\"/v1/completions\"} 1"));
  EXPECT_THAT(m, HasSubstr("tandem_time_to_first_token_seconds_count 1"));
  EXPECT_THAT(m, HasSubstr("tandem_inter_token_latency_seconds_count 2"));
  EXPECT_THAT(m, HasSubstr("tandem_e2e_request_latency_seconds_count 1"));
  EXPECT_THAT(m, HasSubstr("tandem_prompt_tokens_total 5"));
  EXPECT_THAT(m, HasSubstr("tandem_generation_tokens_total 3"));
  EXPECT_THAT(m, HasSubstr("tandem_ttft_prefill_seconds_sum 0.002"));
  EXPECT_THAT(m, HasSubstr("tandem_requests_running 0"));
  EXPECT_THAT(m, HasSubstr("tandem_test_extra_metric 1"));
}

TEST_F(FrontendTest, StopCancelsInFlightStreams) {
  frontend_->Stop();
  frontend_.reset();
  StartFrontend(/*shutdown_grace=*/absl::Milliseconds(100));
  FakeBackendBehavior b;
  b.endless = true;
  b.token_delay = absl::Milliseconds(10);
  backend_.set_behavior(b);
  TestConnection conn(port_);
  ASSERT_TRUE(
      conn.Send(RawRequest("POST", "/v1/completions", CompletionBody({{"stream", true}}).dump())));
  auto head = conn.ReadHead();
  ASSERT_TRUE(head.has_value());
  ASSERT_TRUE(conn.ReadChunk().has_value());
  const absl::Time start = absl::Now();
  frontend_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE(backend_.WaitForCancel("cmpl-", absl::Seconds(1)));
  EXPECT_TRUE(backend_.WaitForIdle(absl::Seconds(1)));
}

TEST_F(FrontendTest, RequestTimeoutBecomesTheBackendDeadline) {
  frontend_->Stop();
  EXPECT_FALSE(frontend_->Start().ok()) << "a stopped frontend does not restart";
  RouterFrontendOptions options;
  options.http.host = "127.0.0.1";
  options.model_dir = *model_dir_;
  options.request_timeout = absl::Seconds(30);
  auto frontend = RouterFrontend::Create(options, &backend_, &registry_);
  ASSERT_TRUE(frontend.ok());
  ASSERT_TRUE((*frontend)->Start().ok());
  const absl::Time before = absl::Now();
  auto r = Fetch((*frontend)->port(), "POST", "/v1/completions", CompletionBody().dump());
  ASSERT_EQ(r->status, 200);
  const absl::Time deadline = backend_.requests()[0].deadline;
  EXPECT_GE(deadline, before + absl::Seconds(30));
  EXPECT_LE(deadline, absl::Now() + absl::Seconds(30));
}

TEST(FrontendCreateTest, BadModelDirFails) {
  FakeGenerationBackend backend;
  prometheus::Registry registry;
  RouterFrontendOptions options;
  options.model_dir = "/nonexistent/model";
  EXPECT_FALSE(RouterFrontend::Create(options, &backend, &registry).ok());
}

}  // namespace
}  // namespace tandem::router

namespace tandem::router {
namespace {

// ---- Tool calling ----

const json& WeatherTools() {
  static const json* tools = new json(json::parse(R"([
    {"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop"}}])"));
  return *tools;
}

constexpr char kTwoCalls[] =
    "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
    "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"noop\", \"arguments\": "
    "{}}\n</tool_call>";

TEST_F(FrontendTest, AutoToolChoiceWithoutAParserIsAClear400) {
  // The test model's ChatML template shows no tool-call format.
  ClientResponse r = Post("/v1/chat/completions", ChatBody({{"tools", WeatherTools()}}));
  EXPECT_EQ(r.status, 400) << r.body;
  const json e = Json(r)["error"];
  EXPECT_EQ(e["param"], "tool_choice");
  EXPECT_THAT(e["message"].get<std::string>(), HasSubstr("--tool-call-parser"));
  EXPECT_TRUE(backend_.requests().empty());
}

TEST_F(FrontendTest, HermesCallsBecomeToolCallsWithContentBeside) {
  model_options_.tool_call_parser = "hermes";
  StartFrontend();
  FakeBackendBehavior b;
  b.script = kTwoCalls;
  backend_.set_behavior(b);
  ClientResponse r = Post("/v1/chat/completions", ChatBody({{"tools", WeatherTools()}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const json choice = Json(r)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "Checking.");
  const json& calls = choice["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u) << r.body;
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(calls[1]["function"]["name"], "noop");
  EXPECT_NE(calls[0]["id"], calls[1]["id"]);
  // The tools reached the prompt? The test template does not render them; the backend got the
  // request unconstrained (auto).
  ASSERT_EQ(backend_.requests().size(), 1u);
  EXPECT_TRUE(backend_.requests()[0].params.guided.empty());

  // tool_choice none: the same text is content, untouched.
  ClientResponse none =
      Post("/v1/chat/completions", ChatBody({{"tools", WeatherTools()}, {"tool_choice", "none"}}));
  ASSERT_EQ(none.status, 200) << none.body;
  const json nc = Json(none)["choices"][0];
  EXPECT_EQ(nc["message"]["content"], kTwoCalls);
  EXPECT_FALSE(nc["message"].contains("tool_calls"));
  EXPECT_EQ(nc["finish_reason"], "stop");
}

TEST_F(FrontendTest, StreamedToolCallsAccumulateToTheSameCalls) {
  model_options_.tool_call_parser = "hermes";
  StartFrontend();
  FakeBackendBehavior b;
  b.script = kTwoCalls;
  backend_.set_behavior(b);
  ClientResponse r = Post("/v1/chat/completions",
                          ChatBody({{"tools", WeatherTools()}, {"stream", true}, {"n", 2}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<json> events = Events(r);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  // As a client accumulates them (the openai SDK's way): by choice, then by call index.
  std::map<int, std::string> content;
  std::map<int, std::map<int, json>> calls;
  std::map<int, std::string> finish;
  for (const json& e : events) {
    if (!e.is_object()) continue;
    for (const json& c : e["choices"]) {
      const int i = c["index"];
      const json& d = c["delta"];
      if (d.contains("content") && d["content"].is_string()) content[i] += d["content"];
      if (d.contains("tool_calls")) {
        for (const json& t : d["tool_calls"]) {
          json& acc = calls[i][t["index"].get<int>()];
          if (t.contains("id")) {
            EXPECT_FALSE(acc.contains("id")) << "id sent twice";
            acc["id"] = t["id"];
            acc["name"] = t["function"]["name"];
            EXPECT_EQ(t["type"], "function");
          }
          acc["arguments"] =
              acc.value("arguments", "") + t["function"]["arguments"].get<std::string>();
        }
      }
      if (c["finish_reason"].is_string()) finish[i] = c["finish_reason"];
    }
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(content[i], "Checking.") << i;
    ASSERT_EQ(calls[i].size(), 2u) << i;
    EXPECT_EQ(calls[i][0]["name"], "get_weather");
    EXPECT_EQ(calls[i][0]["arguments"], R"({"city":"Paris"})");
    EXPECT_EQ(calls[i][1]["name"], "noop");
    EXPECT_EQ(finish[i], "tool_calls");
  }
}

TEST_F(FrontendTest, ForcedToolChoicesConstrainTheBackendAndParseItsOutput) {
  FakeBackendBehavior b;
  b.script = R"({"city": "Oslo"})";
  backend_.set_behavior(b);
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  ClientResponse r =
      Post("/v1/chat/completions", ChatBody({{"tools", WeatherTools()}, {"tool_choice", named}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const json choice = Json(r)["choices"][0];
  EXPECT_TRUE(choice["message"]["content"].is_null()) << r.body;
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], R"({"city": "Oslo"})");
  EXPECT_EQ(choice["finish_reason"], "stop");  // as OpenAI's for a named function
  ASSERT_EQ(backend_.requests().size(), 1u);
  EXPECT_FALSE(backend_.requests()[0].params.guided.regex.empty());

  b.script =
      R"([{"name": "noop", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Rome"}}])";
  backend_.set_behavior(b);
  ClientResponse req = Post("/v1/chat/completions",
                            ChatBody({{"tools", WeatherTools()}, {"tool_choice", "required"}}));
  ASSERT_EQ(req.status, 200) << req.body;
  const json rc = Json(req)["choices"][0];
  ASSERT_EQ(rc["message"]["tool_calls"].size(), 2u) << req.body;
  EXPECT_EQ(rc["message"]["tool_calls"][1]["function"]["arguments"], R"({"city":"Rome"})");
  EXPECT_EQ(rc["finish_reason"], "tool_calls");
}

TEST_F(FrontendTest, ToolHistoryReachesTheTemplate) {
  const json messages = json::parse(R"([
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_9", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}])");
  ClientResponse r = Post("/tokenize", {{"model", kModelName}, {"messages", messages}});
  ASSERT_EQ(r.status, 200) << r.body;
  // The test template prints every message's content: the call turn's null content is "" (as
  // vLLM passes it), the tool result itself; 7 special tokens.
  const std::string text = "user\nWeather?\nassistant\n\ntool\nsunny\nassistant\n";
  EXPECT_EQ(Json(r)["count"], static_cast<int>(text.size()) + 7) << r.body;
  ClientResponse bad =
      Post("/v1/chat/completions",
           ChatBody({{"messages", json::parse(R"([{"role": "tool", "content": "x"}])")}}));
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(Json(bad)["error"]["param"], "messages[0].tool_call_id");
}

}  // namespace
}  // namespace tandem::router

// ChatTemplate: loading from tokenizer_config.json and the variables transformers'
// apply_chat_template gives a template. (Byte-for-byte checks of real templates are in
// tests/reference/chat_template.)

#include "runtime/model/chat_template.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/model/jinja_chat_template.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ModelDir {
 public:
  ModelDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / ("tandem_chat_template_test_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~ModelDir() { fs::remove_all(path_); }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

const std::vector<ChatMessage> kHello = {{"user", "Hello"}};

std::string RenderFromDir(const ModelDir& dir, bool add_generation_prompt = false) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromModelDir(dir.path());
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return "<error>";
  absl::StatusOr<std::string> out = (*t)->Render(kHello, add_generation_prompt);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "<error>";
}

TEST(ChatTemplateFromModelDir, StringTemplateAndStringTokens) {
  ModelDir dir;
  dir.Write("tokenizer_config.json", R"({
    "bos_token": "<s>", "eos_token": "</s>",
    "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
  })");
  EXPECT_EQ(RenderFromDir(dir), "<s>[user]Hello</s>");
  EXPECT_EQ(RenderFromDir(dir, true), "<s>[user]Hello</s>[assistant]");
}

TEST(ChatTemplateFromModelDir, AddedTokenObjectsAndNullBos) {
  ModelDir dir;
  dir.Write("tokenizer_config.json", R"({
    "bos_token": {"__type": "AddedToken", "content": "<|begin|>", "lstrip": false},
    "eos_token": null,
    "chat_template": "{{ bos_token }}|{{ eos_token is defined }}|{{ messages[0].content }}"
  })");
  EXPECT_EQ(RenderFromDir(dir), "<|begin|>|False|Hello");
}

TEST(ChatTemplateFromModelDir, NamedTemplateListPicksDefault) {
  ModelDir dir;
  dir.Write("tokenizer_config.json", R"({
    "chat_template": [
      {"name": "tool_use", "template": "TOOLS"},
      {"name": "default", "template": "DEFAULT {{ messages | length }}"}
    ]
  })");
  EXPECT_EQ(RenderFromDir(dir), "DEFAULT 1");
}

TEST(ChatTemplateFromModelDir, NamedTemplateListWithoutDefaultIsAnError) {
  ModelDir dir;
  dir.Write(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "rag", "template": "x"}, {"name": "tool_use", "template": "y"}]})");
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromModelDir(dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), HasSubstr("no \"default\""));
  EXPECT_THAT(t.status().message(), HasSubstr("rag, tool_use"));
}

TEST(ChatTemplateFromModelDir, MissingChatTemplateIsAClearError) {
  ModelDir dir;
  dir.Write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromModelDir(dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), HasSubstr("has no \"chat_template\""));
  EXPECT_THAT(t.status().message(), HasSubstr("tokenizer_config.json"));
}

TEST(ChatTemplateFromModelDir, FallsBackToChatTemplateJinja) {
  ModelDir dir;
  dir.Write("tokenizer_config.json", R"({"eos_token": "<e>"})");
  dir.Write("chat_template.jinja",
            "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\n");
  EXPECT_EQ(RenderFromDir(dir), "Hello<e>");
}

TEST(ChatTemplateFromModelDir, MissingOrMalformedConfig) {
  ModelDir empty;
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromModelDir(empty.path());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);

  ModelDir bad_json;
  bad_json.Write("tokenizer_config.json", "{\"chat_template\": ");
  t = ChatTemplate::FromModelDir(bad_json.path());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);

  ModelDir bad_type;
  bad_type.Write("tokenizer_config.json", R"({"chat_template": 42})");
  t = ChatTemplate::FromModelDir(bad_type.path());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);

  ModelDir bad_token;
  bad_token.Write("tokenizer_config.json", R"({"chat_template": "x", "eos_token": [1]})");
  t = ChatTemplate::FromModelDir(bad_token.path());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateFromModelDir, UnsupportedTemplateFailsAtLoadWithDirAndLine) {
  ModelDir dir;
  dir.Write(
      "tokenizer_config.json",
      R"({"chat_template": "{% for m in messages %}\n{{ m.content | wordcount }}{% endfor %}"})");
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromModelDir(dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr(dir.path()));
  EXPECT_THAT(t.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(t.status().message(), HasSubstr("filter 'wordcount'"));
}

TEST(ChatTemplateRender, VariablesMatchApplyChatTemplate) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Compile(
      "{{ tools is none }} {{ tools is defined }} {{ documents is none }} "
      "{{ add_generation_prompt }} {{ bos_token }} {{ eos_token }} {{ messages | tojson }}",
      "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<ChatMessage> messages = {{"system", "S \"q\""}, {"user", "é\n"}};
  absl::StatusOr<std::string> out = (*t)->Render(messages, true);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "True True True True <s> </s> "
            R"([{"role": "system", "content": "S \"q\""}, {"role": "user", "content": "é\n"}])");
}

TEST(ChatTemplateRender, EmptyBosTokenIsUndefined) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
      ChatTemplate::Compile("{{ bos_token is defined }}{{ eos_token }}", "", "<|im_end|>");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*(*t)->Render(kHello, false), "False<|im_end|>");
}

TEST(ChatTemplateRender, RaiseExceptionBecomesAnError) {
  // The role-alternation check of Llama 2 / Mistral style templates.
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Compile(
      "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) "
      "%}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') "
      "}}{% endif %}{{ message['content'] }}{% endfor %}",
      "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<ChatMessage> good = {{"user", "a"}, {"assistant", "b"}};
  EXPECT_EQ(*(*t)->Render(good, false), "ab");
  std::vector<ChatMessage> bad = {{"user", "a"}, {"user", "b"}};
  absl::StatusOr<std::string> out = (*t)->Render(bad, false);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("Conversation roles must alternate"));
}

TEST(ChatTemplateRender, ExtraVariablesOverrideDefaults) {
  absl::StatusOr<std::unique_ptr<JinjaChatTemplate>> t = JinjaChatTemplate::Create(
      "{% if not date_string is defined %}{% set date_string = '26 Jul 2024' %}{% endif %}"
      "{{ date_string }}",
      "", "");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*(*t)->Render(kHello, false), "26 Jul 2024");
  EXPECT_EQ(*(*t)->RenderWithVariables(kHello, false,
                                       {{"date_string", jinja::Value::String("01 Jan 2025")}}),
            "01 Jan 2025");
}

TEST(ChatTemplateRender, KwargsJsonBecomesTemplateVariables) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Compile(
      "{% if enable_thinking is defined and not enable_thinking %}no-think {% endif %}"
      "{{ user.name }}:{{ user.tags[1] }}:{{ n + 1 }}:{{ x is none }}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  ChatRenderOptions options;
  options.kwargs_json =
      R"({"enable_thinking": false, "user": {"name": "ada", "tags": ["a", "b"]}, "n": 41, "x": null})";
  EXPECT_EQ(*(*t)->Render(kHello, options),
            "no-think ada:b:42:True");  // Jinja prints Python booleans
  options.kwargs_json = "[1]";
  EXPECT_EQ((*t)->Render(kHello, options).status().code(), absl::StatusCode::kInvalidArgument);
  // Nesting is bounded.
  std::string deep = R"({"a": )";
  for (int i = 0; i < 40; ++i) deep += "[";
  for (int i = 0; i < 40; ++i) deep += "]";
  options.kwargs_json = deep + "}";
  EXPECT_THAT((*t)->Render(kHello, options).status().message(), HasSubstr("nested deeper"));
}

TEST(ChatTemplateRender, ContinueFinalMessageCutsAfterItsTrimmedContent) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Compile(
      "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<ChatMessage> chat = {{"user", "hi"}, {"assistant", "  Once upon "}};
  ChatRenderOptions options;
  options.add_generation_prompt = false;
  EXPECT_EQ(*(*t)->Render(chat, options), "<user>hi</user><assistant>Once upon</assistant>");
  options.continue_final_message = true;
  EXPECT_EQ(*(*t)->Render(chat, options), "<user>hi</user><assistant>Once upon");
  // A template that rewrites the message: a clear error, not a wrong prompt.
  absl::StatusOr<std::unique_ptr<ChatTemplate>> upper =
      ChatTemplate::Compile("{% for m in messages %}{{ m.content | upper }}{% endfor %}", "", "");
  ASSERT_TRUE(upper.ok()) << upper.status();
  EXPECT_THAT((*upper)->Render(chat, options).status().message(),
              HasSubstr("does not appear in the rendered chat"));
}

TEST(ChatTemplateRender, ConcurrentRendersAgree) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Compile(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.content }}{% endfor %}{{ ns.n }}",
      "", "");
  ASSERT_TRUE(t.ok());
  std::vector<ChatMessage> messages(50, ChatMessage{"user", "x"});
  std::vector<std::string> results(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 20; ++rep) results[i] = *(*t)->Render(messages, false);
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& r : results) EXPECT_EQ(r, std::string(50, 'x') + "50");
}

}  // namespace
}  // namespace tandem

// The chat template engine (runtime/model: Jinja lexer, parser and renderer, and the
// JinjaChatTemplate that sets apply_chat_template's variables) over fuzzed templates and
// messages, and the bundled model's template over fuzzed messages.
//
// Input: a flags byte, then NUL-separated fields: the template source (absent with kBundled),
// then role, content, role, content, ... (at most 32 messages).
//   flags & 1   add_generation_prompt
//   flags & 2   kBundled: render models/target's chat template (its messages are the whole rest)
//   flags & 4   lex without trim_blocks/lstrip_blocks; & 8 keep_trailing_newline (own templates)
//   flags & 16  extra variables: a tools list and date_string (Llama 3.1 templates read them)
// Properties: no crash; the bundled (ChatML) template renders exactly what its source says for
// any messages. A template can loop or repeat itself into gigabytes by design (the model
// directory is trusted); the bundled template must render any messages within the time limit.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "runtime/model/chat_template.h"
#include "runtime/model/jinja_chat_template.h"
#include "runtime/model/jinja_template.h"

namespace {

using tandem::ChatMessage;
namespace jinja = tandem::jinja;

constexpr int kFlagGenerationPrompt = 1;
constexpr int kFlagBundled = 2;
constexpr int kFlagNoTrim = 4;
constexpr int kFlagKeepNewline = 8;
constexpr int kFlagExtra = 16;
constexpr size_t kMaxMessages = 32;

const tandem::JinjaChatTemplate& Bundled() {
  static const tandem::JinjaChatTemplate* t = [] {
    absl::StatusOr<tandem::ChatTemplateSource> src =
        tandem::ReadChatTemplateSource(tandem::fuzz::ModelDir());
    if (!src.ok()) std::abort();
    auto created = tandem::JinjaChatTemplate::Create(src->source, src->bos_token, src->eos_token);
    if (!created.ok()) std::abort();
    return created->release();
  }();
  return *t;
}

std::vector<std::string_view> SplitNul(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t nul = s.find('\0', start);
    if (nul == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, nul - start));
    start = nul + 1;
  }
}

jinja::Object ExtraVariables(std::string_view name) {
  jinja::Object function = {{"name", jinja::Value::String(std::string(name))},
                            {"description", jinja::Value::String("d")},
                            {"parameters", jinja::Value::MakeObject({})}};
  jinja::Object tool = {{"type", jinja::Value::String("function")},
                        {"function", jinja::Value::MakeObject(std::move(function))}};
  return {{"tools", jinja::Value::MakeArray({jinja::Value::MakeObject(std::move(tool))})},
          {"date_string", jinja::Value::String("26 Jul 2024")}};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int flags = data[0];
  std::vector<std::string_view> fields =
      SplitNul(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  const bool bundled = (flags & kFlagBundled) != 0;
  std::string_view source;
  size_t next = 0;
  if (!bundled) source = fields[next++];
  std::vector<ChatMessage> messages;
  for (; next + 1 < fields.size() && messages.size() < kMaxMessages; next += 2) {
    messages.push_back({std::string(fields[next]), std::string(fields[next + 1])});
  }
  const bool generation_prompt = (flags & kFlagGenerationPrompt) != 0;
  const jinja::Object extra = (flags & kFlagExtra) != 0 && !messages.empty()
                                  ? ExtraVariables(messages.back().content)
                                  : jinja::Object{};

  if (bundled) {
    absl::StatusOr<std::string> out =
        Bundled().RenderWithVariables(messages, generation_prompt, extra);
    FUZZ_CHECK(out.ok());
    // The bundled template is ChatML: bos, then <|im_start|>role\ncontent<|im_end|>\n per message.
    std::string expected = "<|endoftext|>";
    for (const ChatMessage& m : messages) {
      expected += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
    if (generation_prompt) expected += "<|im_start|>assistant\n";
    FUZZ_CHECK(*out == expected);
    return 0;
  }

  if ((flags & (kFlagNoTrim | kFlagKeepNewline)) == 0) {
    auto t = tandem::JinjaChatTemplate::Create(std::string(source), "<s>", "</s>");
    if (t.ok()) (void)(*t)->RenderWithVariables(messages, generation_prompt, extra);
    return 0;
  }
  jinja::LexOptions options;
  options.trim_blocks = options.lstrip_blocks = (flags & kFlagNoTrim) == 0;
  options.keep_trailing_newline = (flags & kFlagKeepNewline) != 0;
  absl::StatusOr<jinja::Template> t = jinja::Template::Compile(source, options);
  if (!t.ok()) return 0;
  jinja::Array message_values;
  for (const ChatMessage& m : messages) {
    message_values.push_back(jinja::Value::MakeObject(
        {{"role", jinja::Value::String(m.role)}, {"content", jinja::Value::String(m.content)}}));
  }
  jinja::Object variables = {{"messages", jinja::Value::MakeArray(std::move(message_values))},
                             {"add_generation_prompt", jinja::Value::Bool(generation_prompt)},
                             {"bos_token", jinja::Value::String("<s>")}};
  variables.insert(variables.end(), extra.begin(), extra.end());
  (void)t->Render(variables);
  return 0;
}

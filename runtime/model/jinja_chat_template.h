#pragma once
// The ChatTemplate (chat_template.h) implementation over the Jinja interpreter, plus the
// tokenizer_config.json reading behind ChatTemplate::FromModelDir. Exposed for tests that need to
// pin template variables (e.g. `date_string` of the Llama 3.1 template) through
// RenderWithVariables; everything else should use the ChatTemplate interface.
//
// Thread-safety: immutable after Create; Render / RenderWithVariables may run concurrently.

#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/model/chat_template.h"
#include "runtime/model/jinja_template.h"
#include "runtime/model/jinja_value.h"

namespace tandem {

// The chat-template fields of a model directory.
struct ChatTemplateSource {
  std::string source;     // Jinja text
  std::string bos_token;  // "" when the config has none
  std::string eos_token;
};

// Reads `<dir>/tokenizer_config.json`: "chat_template" as a string or as a list of
// {"name", "template"} (the "default" entry); when the config has no chat_template, falls back to
// `<dir>/chat_template.jinja` (where newer transformers versions save it). bos_token/eos_token
// may be strings, {"content": ...} objects or null.
// Errors: NotFound (no config / no template), InvalidArgument (malformed JSON or fields).
absl::StatusOr<ChatTemplateSource> ReadChatTemplateSource(const std::string& dir);

class JinjaChatTemplate final : public ChatTemplate {
 public:
  static absl::StatusOr<std::unique_ptr<JinjaChatTemplate>> Create(const std::string& source,
                                                                   const std::string& bos_token,
                                                                   const std::string& eos_token);

  // Template variables as transformers' apply_chat_template sets them: messages ([{role,
  // content}]), add_generation_prompt, tools = none, documents = none, bos_token / eos_token
  // (when non-empty), and the functions raise_exception and strftime_now.
  // kwargs_json values become template values (objects, arrays, strings, numbers, booleans,
  // none) added after these, as extra keyword arguments to apply_chat_template would be.
  absl::StatusOr<std::string> Render(std::span<const ChatMessage> messages,
                                     const ChatRenderOptions& options) const override;
  using ChatTemplate::Render;
  const std::string& source() const override { return source_; }

  // Render with `extra` variables added (overriding the defaults above), as extra keyword
  // arguments to apply_chat_template would be.
  absl::StatusOr<std::string> RenderWithVariables(std::span<const ChatMessage> messages,
                                                  bool add_generation_prompt,
                                                  const jinja::Object& extra) const;

 private:
  JinjaChatTemplate(std::string source, jinja::Template tmpl, std::string bos_token,
                    std::string eos_token)
      : source_(std::move(source)),
        template_(std::move(tmpl)),
        bos_token_(std::move(bos_token)),
        eos_token_(std::move(eos_token)) {}

  std::string source_;
  jinja::Template template_;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace tandem

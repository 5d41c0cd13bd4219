#pragma once
// Renders a model's `chat_template` (tokenizer_config.json) as Hugging Face
// `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` does, through a small
// Jinja interpreter covering what the Llama 3 / 3.1 / 3.2 and ChatML (Qwen) templates use.
// A template that uses anything outside that subset fails at Compile (load time) with the
// construct and position, never renders a silently wrong prompt.
//
// Thread-safety: immutable after Compile; Render may run concurrently.

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

// A call of a tool the assistant made, as a chat history carries it back.
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON object text; the template sees it parsed (as vLLM passes it)
};

// One message as the template sees it: {role, content} plus, only where set, tool_calls
// ([{id, type: "function", function: {name, arguments}}]), tool_call_id and name, so a template's
// `'tool_calls' in message` tests hold as they do for Hugging Face's dicts. A null content (a
// turn of tool calls only) is "" here, as vLLM passes it: templates then test it for truth.
struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role_in, std::string content_in)
      : role(std::move(role_in)), content(std::move(content_in)) {}

  std::string role;  // "system", "user", "assistant", "tool", "ipython", ...
  std::string content;
  std::vector<ChatToolCall> tool_calls = {};
  std::string tool_call_id;  // a tool result's call id ("" when none)
  std::string name;          // a tool result's function name ("" when none)
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Hugging Face's continue_final_message: the text ends right after the final message's content
  // (whitespace-trimmed), so the model continues that message instead of opening a new turn.
  // Needs add_generation_prompt false; the content must appear in the rendered text.
  bool continue_final_message = false;
  // Extra template variables (vLLM's chat_template_kwargs) as JSON object text; "" for none.
  // Nested at most 32 deep.
  std::string kwargs_json;
  // The request's tools ([{type: "function", function: {name, description, parameters}}]) as
  // JSON array text, the template's `tools` variable; "" leaves it none.
  std::string tools_json;
};

class ChatTemplate {
 public:
  // `source` is the Jinja text; bos/eos are exposed to the template as bos_token / eos_token.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Compile(const std::string& source,
                                                               const std::string& bos_token,
                                                               const std::string& eos_token);
  // Reads `<dir>/tokenizer_config.json` ("chat_template" string, or the "default" entry of a
  // list of named templates; bos_token/eos_token as strings or {"content": ...}).
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromModelDir(const std::string& dir);
  // `--chat-template FILE`: the Jinja text of `file` (at most 1 MiB) instead of the model's
  // template, with bos_token/eos_token from `<model_dir>/tokenizer_config.json` when it exists.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromFile(const std::string& file,
                                                                const std::string& model_dir);
  virtual ~ChatTemplate() = default;

  // The Jinja text (what a tool-call format is detected from).
  virtual const std::string& source() const = 0;

  // Errors: raise_exception() in the template (e.g. bad role order), runtime type errors;
  // InvalidArgument for kwargs_json that is not an object, or a continued final message that the
  // rendered text does not hold.
  virtual absl::StatusOr<std::string> Render(std::span<const ChatMessage> messages,
                                             const ChatRenderOptions& options) const = 0;
  absl::StatusOr<std::string> Render(std::span<const ChatMessage> messages,
                                     bool add_generation_prompt) const {
    ChatRenderOptions options;
    options.add_generation_prompt = add_generation_prompt;
    return Render(messages, options);
  }
};

}  // namespace tandem

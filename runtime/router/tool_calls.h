#pragma once
// Tool calling for chat completions: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`,
// and the parsers that turn a model's output text back into `tool_calls`.
//
// Request side (ParseToolRequest):
// - `tools`: at most kMaxTools functions, {type: "function", function: {name, description?,
//   parameters?, strict?}}; names match [a-zA-Z0-9_-]{1,64} and are unique; `parameters` is a
//   JSON Schema that runtime/grammar/json_schema.h compiles (checked for every tool, also under
//   `auto`, so a schema we can't constrain is a 400 naming the keyword, whatever is chosen).
//   The tools go to the chat template as its `tools` variable, in the client's key order.
// - `tool_choice`: "none" (tools are rendered, output is text), "auto" (the default with tools;
//   output is parsed for calls in the model's format), "required" (the output is constrained to
//   a JSON list of {"name", "parameters"} calls, as vLLM does), or {type: "function",
//   function: {name}} (the output is constrained to that function's arguments). The two forced
//   kinds set SamplingParams::Guided, so they cannot be combined with response_format or
//   guided_* fields.
// - `parallel_tool_calls: false`: at most one call (forced kinds: by the grammar; auto: calls
//   after the first stay content text).
//
// Output side: a ToolCallParser is per choice and streaming: Feed() takes each text delta and
// returns the content that may go out now and the tool-call deltas completed so far; Finish()
// flushes what it held back. Text that looks like a call but does not parse, or names a function
// the request did not offer, comes back as content: nothing is lost. Parsers by name:
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5, Qwen3,
//                Hermes); text around calls is content.
//   llama3_json  output that opens with `{` (or <|python_tag|>) is one or more
//                {"name": ..., "parameters": {...}} objects separated by `;` (Llama 3.1 / 3.2).
// The forced kinds use their own parsers (CreateToolCallParser picks them from the request).
//
// Thread-safety: the parse functions are pure; a parser object belongs to one choice.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/sampling/sampling_params.h"

namespace tandem::router {

inline constexpr int kMaxTools = 128;

enum class ToolChoice { kNone, kAuto, kRequired, kFunction };

struct ToolFunction {
  std::string name;  // the schema lives on as its regex (forced choices) and in tools_json
};

struct ToolRequest {
  std::vector<ToolFunction> functions;  // empty: no tools
  std::string tools_json;               // `tools` as ordered JSON text, for the template
  ToolChoice choice = ToolChoice::kNone;
  std::string function;  // kFunction: its name
  bool parallel = true;
  // Output is parsed for calls (auto and the forced kinds).
  bool parses_output() const { return !functions.empty() && choice != ToolChoice::kNone; }
};

// `j` is the chat request parsed from `body`. Sets `*guided` for the forced kinds; a guided
// constraint already there (response_format, guided_*) is then a 400.
absl::Status ParseToolRequest(const nlohmann::json& j, absl::string_view body, ToolRequest* out,
                              SamplingParams::Guided* guided);

// The names CreateToolCallParser takes for `auto`, and "" for none.
inline constexpr absl::string_view kToolCallParsers[] = {"hermes", "llama3_json"};
// The parser a chat template's text implies: "hermes" when it writes <tool_call>, "llama3_json"
// when it writes <|python_tag|> or {"name": ..., "parameters": ...}; "" when neither.
std::string DetectToolCallParser(absl::string_view template_source);

// One piece of a call: the first delta of call `index` carries id and name; arguments arrive in
// one or more deltas (concatenated, they are the arguments' JSON text).
struct ToolCallDelta {
  int index = 0;
  std::string id;    // "" after the first delta
  std::string name;  // "" after the first delta
  std::string arguments;
};

struct ToolParseOutput {
  std::string content;
  std::vector<ToolCallDelta> calls;
};

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  virtual ToolParseOutput Feed(absl::string_view text) = 0;
  virtual ToolParseOutput Finish() = 0;
  // Whether any call came out (the finish reason becomes "tool_calls" for auto and required).
  virtual int calls() const = 0;
};

// The parser for `request` (which parses_output()): the forced kinds' own, or `auto_parser` (a
// kToolCallParsers name) for auto; "" there is a 400 on tool_choice saying what to do.
absl::StatusOr<std::unique_ptr<ToolCallParser>> CreateToolCallParser(const ToolRequest& request,
                                                                     absl::string_view auto_parser);

// A fresh call id: "call_" and 24 random letters and digits.
std::string NewToolCallId();

// A whole tool call, as the non-streaming response carries it (deltas of one index joined).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};
void AppendToolCallDeltas(const std::vector<ToolCallDelta>& deltas, std::vector<ToolCall>* calls);

}  // namespace tandem::router

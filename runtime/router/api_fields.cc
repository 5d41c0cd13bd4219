#include "runtime/router/api_fields.h"

namespace tandem::router {
namespace {

constexpr uint8_t C = kCompletionsField;
constexpr uint8_t H = kChatField;
constexpr uint8_t B = kBothEndpoints;
constexpr FieldSupport I = FieldSupport::kImplemented;
constexpr FieldSupport R = FieldSupport::kRejected;
constexpr FieldSupport N = FieldSupport::kNoOp;

constexpr ApiField kFields[] = {
    // ---- The request itself ----
    {"model", B, I, "the served model's name, or omitted; another name is 404 model_not_found"},
    {"prompt", C, I,
     "a string, a list of token ids, or a list of strings or token-id lists (batched prompts: "
     "choice index = prompt index * n + choice)"},
    {"messages", H, I,
     "roles system, developer, user, assistant, tool, ipython; content a string, null (assistant) "
     "or text parts; assistant `tool_calls`, tool `tool_call_id`, `name`"},
    {"stream", B, I, "server-sent events ending in `data: [DONE]`"},
    {"stream_options", B, I, "`include_usage` only; needs `stream: true`"},
    {"n", B, I, "1 to 128 choices"},
    {"best_of", B, N, "accepted when equal to `n` (then it changes nothing); other values are 400"},
    {"priority", B, I, "vLLM: lower is scheduled first; any 32-bit integer"},
    {"echo", C, I,
     "the prompt text before the completion; with `logprobs`, the prompt's tokens lead the "
     "logprobs (the first one null)"},
    // ---- Length ----
    {"max_tokens", B, I, "completions default 16; chat default: up to the context limit"},
    {"max_completion_tokens", H, I, "wins over `max_tokens`"},
    {"min_tokens", B, I,
     "vLLM: EOS and `stop_token_ids` cannot be sampled, and stop strings are not matched, before "
     "this many tokens"},
    {"ignore_eos", B, I, "vLLM: EOS does not stop the output"},
    // ---- Sampling ----
    {"temperature", B, I, "[0, 2]; 0 is greedy"},
    {"top_p", B, I, "(0, 1]"},
    {"top_k", B, I, "vLLM: -1 or 0 off"},
    {"min_p", B, I, "vLLM: [0, 1]"},
    {"seed", B, I, "same seed, same tokens, whatever else is batched"},
    {"presence_penalty", B, I, "[-2, 2], over output tokens"},
    {"frequency_penalty", B, I, "[-2, 2], over output tokens"},
    {"repetition_penalty", B, I, "vLLM/HF: > 0, over prompt and output tokens"},
    {"logit_bias", B, I,
     "token id (a string key) to a bias in [-100, 100], added to the logits before sampling; at "
     "most 1024 entries"},
    {"allowed_token_ids", B, I, "vLLM: only these tokens can be sampled"},
    // ---- Stopping ----
    {"stop", B, I, "a string or up to 16 strings, matched on the detokenized text"},
    {"stop_token_ids", B, I, "vLLM: token ids that end the output"},
    {"include_stop_str_in_output", B, I, "vLLM: a matched stop string stays in the text"},
    // ---- Output form ----
    {"logprobs", B, I, "completions: 0 to 20 alternatives; chat: a boolean"},
    {"top_logprobs", H, I, "0 to 20, needs `logprobs: true`"},
    {"skip_special_tokens", B, I, "vLLM: special tokens left out of the text (default true)"},
    {"spaces_between_special_tokens", B, R,
     "vLLM; `true` (what the detokenizer does) is accepted, `false` is 400"},
    {"prompt_logprobs", B, I,
     "vLLM: 0 to 20; each prompt token after the first with logprob, rank and alternatives "
     "(completions: per choice; chat: top level); not with `stream`; such requests are prefilled "
     "on the decode worker and skip the prefix cache"},
    {"return_tokens_as_token_ids", B, R, "vLLM"},
    {"return_token_ids", B, R, "vLLM"},
    // ---- Prompt handling ----
    {"add_special_tokens", B, I,
     "vLLM: the tokenizer's BOS/EOS around the prompt (completions default true, chat default "
     "false: the template adds them)"},
    {"truncate_prompt_tokens", B, I, "vLLM: keep only the last k prompt tokens (k >= 1)"},
    {"add_generation_prompt", H, I, "default true"},
    {"continue_final_message", H, I,
     "vLLM/HF: the final assistant message is continued, not closed; needs "
     "`add_generation_prompt: false`"},
    {"chat_template_kwargs", H, I,
     "vLLM: extra variables for the chat template (an object; the names the template is given "
     "anyway are 400)"},
    {"chat_template", H, R,
     "per-request templates are not run; start the server with "
     "`--chat-template FILE`"},
    {"documents", H, R, "vLLM RAG documents"},
    {"mm_processor_kwargs", H, R, "no multimodal models"},
    // ---- Structured outputs (runtime/router/structured_outputs.h) ----
    {"response_format", B, I,
     "OpenAI: `text`; `json_object` (a JSON object); `json_schema` (the output validates against "
     "`schema`, strict or not; docs/structured_outputs.md lists the keywords)"},
    {"guided_json", B, I,
     "vLLM: a JSON Schema (an object, or its JSON text) the output validates "
     "against"},
    {"guided_regex", B, I,
     "vLLM: the output matches the regex in full (the subset in runtime/grammar/byte_dfa.h; "
     "anything else is a 400 naming the construct)"},
    {"guided_choice", B, I, "vLLM: the output is exactly one of the strings"},
    {"guided_grammar", B, I,
     "vLLM: a GBNF grammar (docs/structured_outputs.md), run as a pushdown automaton; "
     "left recursion is 400"},
    {"guided_decoding_backend", B, N, "vLLM: one engine (Tandem's own), whatever is named"},
    {"guided_whitespace_pattern", B, I,
     "vLLM: the regex allowed between JSON tokens (whitespace only; default: at most one space)"},
    {"structured_outputs", B, I,
     "vLLM: `regex`, `choice`, `json`, `json_object`, `grammar` and `whitespace_pattern`; the "
     "rest are 400"},
    // ---- Tools ----
    {"tools", H, I,
     "at most 128 functions; rendered by the chat template; `parameters` must compile "
     "(docs/structured_outputs.md)"},
    {"tool_choice", H, I,
     "`none`, `auto` (parsed in the model's format, `--tool-call-parser`), `required` and a "
     "named function (both grammar-constrained)"},
    {"parallel_tool_calls", H, I, "`false`: at most one call"},
    {"functions", H, R, "legacy function calling"},
    {"function_call", H, R, "legacy function calling"},
    // ---- Not offered ----
    {"suffix", C, R, "insertion is not supported"},
    {"use_beam_search", B, R, "vLLM; `false` is accepted"},
    {"length_penalty", B, R, "vLLM beam search; `1` is accepted"},
    {"bad_words", B, R, "vLLM"},
    {"logits_processors", B, R, "vLLM; no code from requests"},
    {"prompt_embeds", C, R, "vLLM"},
    {"kv_transfer_params", B, R, "vLLM; Tandem moves KV itself"},
    {"vllm_xargs", B, R, "vLLM"},
    {"cache_salt", B, R, "vLLM; the prefix cache is not partitioned per tenant"},
    {"request_id", B, R, "vLLM; send an `X-Request-Id` header instead"},
    {"audio", H, R, "no audio"},
    {"modalities", H, R, "`[\"text\"]` is accepted"},
    {"prediction", H, R, "predicted outputs"},
    {"reasoning_effort", H, R, "no reasoning models"},
    {"verbosity", H, R, "no reasoning models"},
    {"web_search_options", H, R, "no web search"},
    {"store", H, R, "completions are not stored; `false` is accepted"},
    // ---- Accepted, no effect ----
    {"user", B, N, "an end-user id for the client's records"},
    {"safety_identifier", H, N, "an end-user id for the client's records"},
    {"metadata", H, N, "string pairs for the client's records"},
    {"service_tier", H, N, "one tier: `auto` and `default` are accepted, others are 400"},
    {"prompt_cache_key", H, N, "prefix caching is automatic"},
};

}  // namespace

std::span<const ApiField> ApiFields() { return kFields; }

const ApiField* FindApiField(uint8_t endpoint, absl::string_view name) {
  for (const ApiField& f : kFields) {
    if (f.name == name && (f.endpoints & endpoint) != 0) return &f;
  }
  return nullptr;
}

absl::string_view FieldSupportName(FieldSupport support) {
  switch (support) {
    case FieldSupport::kImplemented:
      return "implemented";
    case FieldSupport::kRejected:
      return "rejected";
    case FieldSupport::kNoOp:
      return "no-op";
  }
  return "?";
}

}  // namespace tandem::router

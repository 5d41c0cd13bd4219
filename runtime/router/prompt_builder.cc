#include "runtime/router/prompt_builder.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/sampling/sampling_params.h"

namespace tandem::router {
namespace {

absl::StatusOr<PreparedPrompt> Tokenize(const FrontendModel& model, const OpenAiRequest& req,
                                        const OpenAiRequest::Prompt* prompt) {
  const Tokenizer& tok = *model.tokenizer;
  PreparedPrompt out;
  if (prompt == nullptr) {  // chat
    if (model.chat_template == nullptr) return InvalidParam("messages", model.chat_template_error);
    ChatRenderOptions options;
    options.add_generation_prompt = req.add_generation_prompt;
    options.continue_final_message = req.continue_final_message;
    options.kwargs_json = req.chat_template_kwargs;
    options.tools_json = req.tools.tools_json;
    absl::StatusOr<std::string> rendered = model.chat_template->Render(req.messages, options);
    if (!rendered.ok()) {
      const absl::string_view message = rendered.status().message();
      const std::string param =
          absl::StartsWith(message, "chat_template_kwargs")     ? "chat_template_kwargs"
          : absl::StartsWith(message, "continue_final_message") ? "continue_final_message"
                                                                : "messages";
      return InvalidParam(param, absl::StrCat("chat template: ", message));
    }
    out.token_ids = tok.Encode(*rendered, req.add_special_tokens.value_or(false));
    out.text = *std::move(rendered);
  } else if (prompt->token_ids.has_value()) {
    for (int32_t id : *prompt->token_ids) {
      if (id >= tok.vocab_size()) {
        return InvalidParam("prompt", absl::StrCat("token id ", id, " is outside the vocabulary (",
                                                   tok.vocab_size(), " tokens)"));
      }
    }
    out.token_ids = *prompt->token_ids;
    if (req.echo) out.text = tok.Decode(out.token_ids, /*skip_special_tokens=*/false);
  } else {
    out.token_ids = tok.Encode(prompt->text, req.add_special_tokens.value_or(true));
    out.text = prompt->text;
  }
  return out;
}

}  // namespace

absl::StatusOr<PreparedPrompt> TokenizePrompt(const FrontendModel& model, const OpenAiRequest& req,
                                              size_t index) {
  if (req.endpoint == Endpoint::kChatCompletions) return Tokenize(model, req, nullptr);
  if (index >= req.prompts.size()) return InvalidParam("prompt", "'prompt' is required");
  return Tokenize(model, req, &req.prompts[index]);
}

absl::StatusOr<std::vector<PreparedPrompt>> PreparePrompts(const FrontendModel& model,
                                                           const OpenAiRequest& req) {
  const Tokenizer& tok = *model.tokenizer;
  const bool chat = req.endpoint == Endpoint::kChatCompletions;
  const std::string prompt_param = chat ? "messages" : "prompt";
  const int limit = model.max_model_len;
  std::vector<PreparedPrompt> out;
  const size_t count = chat ? 1 : req.prompts.size();
  if (count == 0) return InvalidParam(prompt_param, "'prompt' is required");
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    absl::StatusOr<PreparedPrompt> p = Tokenize(model, req, chat ? nullptr : &req.prompts[i]);
    if (!p.ok()) return p.status();
    std::vector<int32_t>& ids = p->token_ids;
    const std::string which =
        count > 1 ? absl::StrCat("prompt ", i, " of the batch") : std::string("the prompt");
    if (req.truncate_prompt_tokens.has_value()) {
      const int keep = *req.truncate_prompt_tokens < 0 ? limit - 1 : *req.truncate_prompt_tokens;
      if (static_cast<int>(ids.size()) > keep) {
        ids.erase(ids.begin(), ids.end() - keep);
        if (!chat && req.echo) p->text = tok.Decode(ids, /*skip_special_tokens=*/false);
      }
    }
    if (ids.empty()) {
      return InvalidParam(prompt_param, absl::StrCat(which, " is empty after tokenization"));
    }
    const int len = static_cast<int>(ids.size());
    if (len >= limit) {
      return InvalidParam(
          prompt_param,
          absl::StrCat("this model's maximum context length is ", limit, " tokens; ", which,
                       " has ", len, " tokens, leaving no room for output"),
          "context_length_exceeded");
    }
    SamplingParams params = req.params;
    const GenerationDefaults& d = model.generation_defaults;
    if (!req.given.temperature && d.temperature.has_value()) params.temperature = *d.temperature;
    if (!req.given.top_p && d.top_p.has_value()) params.top_p = *d.top_p;
    if (!req.given.top_k && d.top_k.has_value()) params.top_k = *d.top_k;
    if (!req.given.min_p && d.min_p.has_value()) params.min_p = *d.min_p;
    if (!req.given.repetition_penalty && d.repetition_penalty.has_value()) {
      params.repetition_penalty = *d.repetition_penalty;
    }
    const std::optional<int> default_max =
        d.max_tokens.has_value() ? d.max_tokens : req.default_max_tokens;
    if (params.max_tokens.has_value()) {
      if (static_cast<int64_t>(len) + *params.max_tokens > limit) {
        return InvalidParam(prompt_param,
                            absl::StrCat("this model's maximum context length is ", limit,
                                         " tokens; ", which, " has ", len, " tokens and ",
                                         *params.max_tokens, " output tokens were requested"),
                            "context_length_exceeded");
      }
    } else if (default_max.has_value()) {
      params.max_tokens = std::min(*default_max, limit - len);
    }
    if (absl::Status s = ValidateSamplingParams(params, tok.vocab_size()); !s.ok()) {
      // The message starts with the parameter's name ("stop_token_ids: ...").
      const absl::string_view message = s.message();
      return InvalidParam(message.substr(0, message.find(':')), message);
    }
    p->max_tokens = params.max_tokens;
    p->params = std::move(params);
    out.push_back(*std::move(p));
  }
  return out;
}

}  // namespace tandem::router

#include "runtime/server/sampling_convert.h"

namespace tandem::server {

SamplingParams SamplingParamsFromProto(const v1::SamplingParams& proto) {
  SamplingParams params;
  params.temperature = proto.temperature();
  params.top_k = proto.top_k();
  params.top_p = proto.top_p() == 0.0f ? 1.0f : proto.top_p();
  params.min_p = proto.min_p();
  if (proto.has_seed()) params.seed = proto.seed();
  params.repetition_penalty =
      proto.repetition_penalty() == 0.0f ? 1.0f : proto.repetition_penalty();
  params.presence_penalty = proto.presence_penalty();
  params.frequency_penalty = proto.frequency_penalty();
  if (proto.max_tokens() != 0) params.max_tokens = proto.max_tokens();
  params.stop_token_ids.assign(proto.stop_token_ids().begin(), proto.stop_token_ids().end());
  params.stop.assign(proto.stop().begin(), proto.stop().end());
  params.ignore_eos = proto.ignore_eos();
  if (proto.logprobs() != -1) params.logprobs = proto.logprobs();
  if (proto.has_prompt_logprobs()) params.prompt_logprobs = proto.prompt_logprobs();
  params.skip_special_tokens = !proto.keep_special_tokens();
  params.min_tokens = proto.min_tokens();
  params.logit_bias.reserve(proto.logit_bias_size());
  for (const v1::LogitBias& b : proto.logit_bias()) {
    params.logit_bias.emplace_back(b.token_id(), b.bias());
  }
  params.allowed_token_ids.assign(proto.allowed_token_ids().begin(),
                                  proto.allowed_token_ids().end());
  params.include_stop_str_in_output = proto.include_stop_str_in_output();
  params.guided.regex = proto.guided().regex();
  params.guided.choices.assign(proto.guided().choices().begin(), proto.guided().choices().end());
  params.guided.grammar = proto.guided().grammar();
  return params;
}

v1::SamplingParams SamplingParamsToProto(const SamplingParams& params) {
  v1::SamplingParams proto;
  proto.set_temperature(params.temperature);
  proto.set_top_k(params.top_k);
  proto.set_top_p(params.top_p);
  proto.set_min_p(params.min_p);
  proto.set_has_seed(params.seed.has_value());
  if (params.seed.has_value()) proto.set_seed(*params.seed);
  proto.set_repetition_penalty(params.repetition_penalty);
  proto.set_presence_penalty(params.presence_penalty);
  proto.set_frequency_penalty(params.frequency_penalty);
  proto.set_max_tokens(params.max_tokens.value_or(0));
  for (int32_t id : params.stop_token_ids) proto.add_stop_token_ids(id);
  for (const std::string& s : params.stop) proto.add_stop(s);
  proto.set_ignore_eos(params.ignore_eos);
  proto.set_logprobs(params.logprobs.value_or(-1));
  if (params.prompt_logprobs.has_value()) proto.set_prompt_logprobs(*params.prompt_logprobs);
  proto.set_keep_special_tokens(!params.skip_special_tokens);
  proto.set_min_tokens(params.min_tokens);
  for (const auto& [id, bias] : params.logit_bias) {
    v1::LogitBias* b = proto.add_logit_bias();
    b->set_token_id(id);
    b->set_bias(bias);
  }
  for (int32_t id : params.allowed_token_ids) proto.add_allowed_token_ids(id);
  proto.set_include_stop_str_in_output(params.include_stop_str_in_output);
  if (!params.guided.empty()) {
    proto.mutable_guided()->set_regex(params.guided.regex);
    for (const std::string& c : params.guided.choices) proto.mutable_guided()->add_choices(c);
    proto.mutable_guided()->set_grammar(params.guided.grammar);
  }
  return proto;
}

}  // namespace tandem::server

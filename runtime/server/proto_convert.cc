#include "runtime/server/proto_convert.h"

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
  return proto;
}

void TokenLogprobsToProto(const TokenLogprobs& logprobs, v1::TokenLogprobs* proto) {
  proto->set_token_id(logprobs.token);
  proto->set_logprob(logprobs.logprob);
  proto->clear_top();
  for (const TokenLogprob& top : logprobs.top) {
    v1::TopLogprob* t = proto->add_top();
    t->set_token_id(top.token);
    t->set_logprob(top.logprob);
  }
}

TokenLogprobs TokenLogprobsFromProto(const v1::TokenLogprobs& proto) {
  TokenLogprobs logprobs;
  logprobs.token = proto.token_id();
  logprobs.logprob = proto.logprob();
  for (const v1::TopLogprob& t : proto.top()) {
    logprobs.top.push_back(TokenLogprob{t.token_id(), t.logprob()});
  }
  return logprobs;
}

void UsageToProto(const Usage& usage, v1::Usage* proto) {
  proto->set_prompt_tokens(usage.prompt_tokens);
  proto->set_completion_tokens(usage.completion_tokens);
  proto->set_cached_prompt_tokens(usage.cached_prompt_tokens);
}

}  // namespace tandem::server

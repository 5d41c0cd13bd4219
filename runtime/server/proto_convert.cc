#include "runtime/server/proto_convert.h"

#include <utility>

namespace tandem::server {

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

void ScoredTokenToProto(const ScoredToken& scored, v1::TokenLogprobs* proto) {
  TokenLogprobsToProto(TokenLogprobs{scored.token, scored.logprob, scored.top}, proto);
  proto->set_rank(scored.rank);
}

ScoredToken ScoredTokenFromProto(const v1::TokenLogprobs& proto) {
  TokenLogprobs lp = TokenLogprobsFromProto(proto);
  return ScoredToken{lp.token, lp.logprob, proto.rank(), std::move(lp.top)};
}

void UsageToProto(const Usage& usage, v1::Usage* proto) {
  proto->set_prompt_tokens(usage.prompt_tokens);
  proto->set_completion_tokens(usage.completion_tokens);
  proto->set_cached_prompt_tokens(usage.cached_prompt_tokens);
}

}  // namespace tandem::server

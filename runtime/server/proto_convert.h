#pragma once
// Conversions between tandem.v1 protobuf messages and the engine's value types, done once at the
// service edge so nothing past it sees protobuf.
//
// The sampling parameters' conversion is sampling_convert.h (the router uses it too).
//
// Pure functions, thread-safe.

#include "runtime/engine/engine.h"
#include "runtime/sampling/sampling_params.h"
#include "runtime/server/sampling_convert.h"
#include "tandem/v1/common.pb.h"

namespace tandem::server {

void TokenLogprobsToProto(const TokenLogprobs& logprobs, v1::TokenLogprobs* proto);
TokenLogprobs TokenLogprobsFromProto(const v1::TokenLogprobs& proto);
// A scored prompt token (rank included).
void ScoredTokenToProto(const ScoredToken& scored, v1::TokenLogprobs* proto);
ScoredToken ScoredTokenFromProto(const v1::TokenLogprobs& proto);

void UsageToProto(const Usage& usage, v1::Usage* proto);

}  // namespace tandem::server

#pragma once
// Conversions between tandem.v1 protobuf messages and the engine's value types, done once at the
// service edge so nothing past it sees protobuf.
//
// Proto3 has no field presence, so zero means "unset" where zero is not a valid value:
// max_tokens 0 = no limit, top_p 0 = 1 (off), repetition_penalty 0 = 1 (off); logprobs -1 = none.
// SamplingParamsFromProto only maps; ValidateSamplingParams (runtime/sampling) judges ranges.
//
// Pure functions, thread-safe.

#include "runtime/engine/engine.h"
#include "runtime/sampling/sampling_params.h"
#include "tandem/v1/common.pb.h"

namespace tandem::server {

SamplingParams SamplingParamsFromProto(const v1::SamplingParams& proto);
v1::SamplingParams SamplingParamsToProto(const SamplingParams& params);

void TokenLogprobsToProto(const TokenLogprobs& logprobs, v1::TokenLogprobs* proto);
TokenLogprobs TokenLogprobsFromProto(const v1::TokenLogprobs& proto);

void UsageToProto(const Usage& usage, v1::Usage* proto);

}  // namespace tandem::server

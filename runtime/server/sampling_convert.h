#pragma once
// SamplingParams <-> tandem.v1.SamplingParams: the one conversion every hop uses (the router's
// backend when it calls a worker, the workers when they take a call), so a field cannot travel
// one way and be dropped the other (sampling_convert_test round-trips every field).
//
// Proto3 has no field presence, so zero means "unset" where zero is not a valid value:
// max_tokens 0 = no limit, top_p 0 = 1 (off), repetition_penalty 0 = 1 (off); logprobs -1 = none;
// keep_special_tokens is the negation of skip_special_tokens (so the zero value skips them).
// FromProto only maps; ValidateSamplingParams (runtime/sampling) judges ranges.
//
// Pure functions, thread-safe. Depends on the proto and the sampling types only.

#include "runtime/sampling/sampling_params.h"
#include "tandem/v1/common.pb.h"

namespace tandem::server {

SamplingParams SamplingParamsFromProto(const v1::SamplingParams& proto);
v1::SamplingParams SamplingParamsToProto(const SamplingParams& params);

}  // namespace tandem::server

#include "runtime/server/sampling_convert.h"

#include <gtest/gtest.h>

namespace tandem::server {
namespace {

// Every field set to a value other than its default.
SamplingParams Everything() {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.seed = 1234567890123ULL;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = -0.5f;
  p.stop_token_ids = {2, 7};
  p.stop = {"\n\n", "END"};
  p.max_tokens = 99;
  p.ignore_eos = true;
  p.logprobs = 3;
  p.prompt_logprobs = 4;
  p.skip_special_tokens = false;
  p.min_tokens = 12;
  p.logit_bias = {{5, -100.0f}, {9, 2.5f}};
  p.allowed_token_ids = {1, 2, 3};
  p.include_stop_str_in_output = true;
  p.guided.choices = {"yes", "no"};
  p.guided.grammar = "root ::= \"x\"";  // (one kind at a time is the validator's rule)
  return p;
}

void ExpectSame(const SamplingParams& a, const SamplingParams& b) {
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  EXPECT_EQ(a.stop_token_ids, b.stop_token_ids);
  EXPECT_EQ(a.stop, b.stop);
  EXPECT_EQ(a.max_tokens, b.max_tokens);
  EXPECT_EQ(a.ignore_eos, b.ignore_eos);
  EXPECT_EQ(a.logprobs, b.logprobs);
  EXPECT_EQ(a.prompt_logprobs, b.prompt_logprobs);
  EXPECT_EQ(a.skip_special_tokens, b.skip_special_tokens);
  EXPECT_EQ(a.min_tokens, b.min_tokens);
  EXPECT_EQ(a.logit_bias, b.logit_bias);
  EXPECT_EQ(a.allowed_token_ids, b.allowed_token_ids);
  EXPECT_EQ(a.include_stop_str_in_output, b.include_stop_str_in_output);
  EXPECT_EQ(a.guided.regex, b.guided.regex);
  EXPECT_EQ(a.guided.choices, b.guided.choices);
  EXPECT_EQ(a.guided.grammar, b.guided.grammar);
}

TEST(SamplingConvertTest, EveryFieldRoundTrips) {
  ExpectSame(Everything(), SamplingParamsFromProto(SamplingParamsToProto(Everything())));
}

TEST(SamplingConvertTest, DefaultsRoundTripAndTheEmptyMessageIsTheDefaults) {
  ExpectSame(SamplingParams{}, SamplingParamsFromProto(SamplingParamsToProto(SamplingParams{})));
  // A peer that sends nothing gets what a client that set nothing gets, except the proto's
  // temperature zero (greedy): proto3 has no presence, so senders always set it.
  SamplingParams from_empty = SamplingParamsFromProto(v1::SamplingParams{});
  from_empty.temperature = 1.0f;
  from_empty.logprobs.reset();  // the empty message says logprobs 0, not -1
  ExpectSame(SamplingParams{}, from_empty);
}

TEST(SamplingConvertTest, UnsetProtoFieldsMeanOffAndBadValuesPassThroughForValidation) {
  v1::SamplingParams proto;
  proto.set_logprobs(-1);
  const SamplingParams p = SamplingParamsFromProto(proto);
  EXPECT_EQ(p.temperature, 0.0f);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_FALSE(p.max_tokens.has_value());
  EXPECT_FALSE(p.logprobs.has_value());
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_TRUE(ValidateSamplingParams(p, 100).ok());
  // An out-of-range value is mapped as is, for validation to reject.
  v1::SamplingParams bad = SamplingParamsToProto(Everything());
  bad.set_temperature(-1.0f);
  EXPECT_EQ(ValidateSamplingParams(SamplingParamsFromProto(bad), 100).code(),
            absl::StatusCode::kInvalidArgument);
}

// A field added to the message must be added to both conversions and to Everything() above:
// this count is the reminder.
TEST(SamplingConvertTest, TheMessageHasTheFieldsThisFileConverts) {
  EXPECT_EQ(v1::SamplingParams::descriptor()->field_count(), 21)
      << "a field was added to tandem.v1.SamplingParams: convert it in sampling_convert.cc and "
         "round-trip it in Everything()";
  EXPECT_EQ(v1::GuidedDecoding::descriptor()->field_count(), 3)
      << "a field was added to tandem.v1.GuidedDecoding: convert it too";
}

}  // namespace
}  // namespace tandem::server

#pragma once
// Every request field of `POST /v1/completions` and `POST /v1/chat/completions` this router knows
// (OpenAI's and vLLM's extensions), with what it does with each: implemented, rejected with a 400
// that names the field, or accepted as a documented no-op. A field that is not in the table is
// rejected too ("unrecognized request argument"), so nothing is silently ignored.
//
// docs/api.md holds the same table for users; api_fields_test checks that the two agree and walks
// every row through the parser (a rejected field gives 400 naming it, a no-op changes nothing,
// an implemented one changes the parsed request).
//
// Constant data; thread-safe.

#include <cstdint>
#include <span>

#include "absl/strings/string_view.h"

namespace tandem::router {

enum class FieldSupport {
  kImplemented,  // parsed and acted on (some values may still be refused: see `note`)
  kRejected,     // 400 naming the field when given (null counts as absent); see `note` for values
                 // that are accepted because they change nothing (a default)
  kNoOp,         // accepted, validated for its type, and deliberately without effect
};

// Bit set of endpoints.
inline constexpr uint8_t kCompletionsField = 1;
inline constexpr uint8_t kChatField = 2;
inline constexpr uint8_t kBothEndpoints = kCompletionsField | kChatField;

struct ApiField {
  absl::string_view name;
  uint8_t endpoints;
  FieldSupport support;
  absl::string_view note;  // one line for docs/api.md
};

// In docs/api.md order.
std::span<const ApiField> ApiFields();

// The row for `name` on `endpoint` (kCompletionsField or kChatField), or nullptr.
const ApiField* FindApiField(uint8_t endpoint, absl::string_view name);

absl::string_view FieldSupportName(FieldSupport support);  // "implemented", "rejected", "no-op"

}  // namespace tandem::router

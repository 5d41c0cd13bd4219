#pragma once
// UTF-8 and Unicode helpers shared by the tokenizer's components: code point iteration, lossy
// UTF-8 repair with Rust's `String::from_utf8_lossy` rules (one U+FFFD per maximal invalid
// subpart), GPT-2's byte <-> printable-character map, ICU normalization forms and the Unicode
// White_Space property.
//
// Thread-safety: all functions are pure (the byte-level tables are built once, thread-safely).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::tokenizer_internal {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length in bytes of the valid UTF-8 sequence at s[pos], or 0 when it is not valid.
size_t ValidUtf8SequenceLength(std::string_view s, size_t pos);

bool IsValidUtf8(std::string_view s);

// Replaces every maximal invalid subpart with U+FFFD (as Rust's String::from_utf8_lossy).
std::string Utf8Lossy(std::string_view s);

// Decodes the code point at s[pos] (s must be valid UTF-8) and advances pos past it.
char32_t NextCodePoint(std::string_view s, size_t& pos);

void AppendUtf8(char32_t cp, std::string& out);

// Unicode White_Space (Rust's char::is_whitespace).
bool IsWhitespace(char32_t cp);
// Alphabetic or numeric (Rust's char::is_alphanumeric).
bool IsAlphanumeric(char32_t cp);

// GPT-2 byte-level alphabet: each byte maps to one printable code point, as UTF-8.
const std::string& ByteToUnicode(uint8_t byte);
// The byte that code point `cp` stands for, or nullopt when `cp` is not in the alphabet.
std::optional<uint8_t> UnicodeToByte(char32_t cp);

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };
// Normalizes valid UTF-8 text with ICU. Errors only on ICU failures.
absl::StatusOr<std::string> Normalize(std::string_view text, NormalizationForm form);

}  // namespace tandem::tokenizer_internal

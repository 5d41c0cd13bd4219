#include "runtime/model/tokenizer_unicode.h"

#include <array>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/utf8.h"
#include "unicode/normalizer2.h"
#include "unicode/uchar.h"
#include "unicode/unistr.h"

namespace tandem::tokenizer_internal {
namespace {

// Valid second-byte range for a lead byte (Unicode Table 3-7); {1, 0} when the lead is invalid.
struct SecondRange {
  uint8_t lo;
  uint8_t hi;
  int length;
};

SecondRange RangeFor(uint8_t lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return {0x80, 0xBF, 2};
  if (lead == 0xE0) return {0xA0, 0xBF, 3};
  if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) return {0x80, 0xBF, 3};
  if (lead == 0xED) return {0x80, 0x9F, 3};
  if (lead == 0xF0) return {0x90, 0xBF, 4};
  if (lead >= 0xF1 && lead <= 0xF3) return {0x80, 0xBF, 4};
  if (lead == 0xF4) return {0x80, 0x8F, 4};
  return {1, 0, 0};
}

// Number of bytes starting at `pos` forming a valid prefix of a sequence (at least 1), and
// whether that prefix is a complete character.
size_t ValidPrefix(std::string_view s, size_t pos, bool& complete) {
  const auto lead = static_cast<uint8_t>(s[pos]);
  complete = false;
  if (lead < 0x80) {
    complete = true;
    return 1;
  }
  const SecondRange r = RangeFor(lead);
  if (r.length == 0) return 1;
  size_t n = 1;
  for (int i = 1; i < r.length; ++i) {
    if (pos + n >= s.size()) return n;
    const auto b = static_cast<uint8_t>(s[pos + n]);
    const uint8_t lo = i == 1 ? r.lo : 0x80;
    const uint8_t hi = i == 1 ? r.hi : 0xBF;
    if (b < lo || b > hi) return n;
    ++n;
  }
  complete = true;
  return n;
}

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::vector<int> to_byte;  // indexed by code point, -1 when absent
};

const ByteTables& Tables() {
  static const ByteTables* tables = [] {
    auto* t = new ByteTables;
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    t->to_byte.assign(512, -1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = printable[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      AppendUtf8(cp, t->to_unicode[b]);
      t->to_byte[cp] = b;
    }
    return t;
  }();
  return *tables;
}

}  // namespace

size_t ValidUtf8SequenceLength(std::string_view s, size_t pos) {
  bool complete = false;
  const size_t n = ValidPrefix(s, pos, complete);
  return complete ? n : 0;
}

bool IsValidUtf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = ValidUtf8SequenceLength(s, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string Utf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    bool complete = false;
    const size_t n = ValidPrefix(s, pos, complete);
    if (complete) {
      out.append(s.substr(pos, n));
    } else {
      out.append(kReplacementChar);
    }
    pos += n;
  }
  return out;
}

char32_t NextCodePoint(std::string_view s, size_t& pos) {
  const auto lead = static_cast<uint8_t>(s[pos]);
  if (lead < 0x80) {
    ++pos;
    return lead;
  }
  int len = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
  char32_t cp = lead & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (int i = 1; i < len && pos + i < s.size(); ++i) {
    cp = (cp << 6) | (static_cast<uint8_t>(s[pos + i]) & 0x3F);
  }
  pos += len;
  return cp;
}

void AppendUtf8(char32_t cp, std::string& out) {
  tandem::AppendUtf8(static_cast<uint32_t>(cp), &out);
}

bool IsWhitespace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

bool IsAlphanumeric(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC)) return true;
  const int8_t type = u_charType(c);
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

const std::string& ByteToUnicode(uint8_t byte) { return Tables().to_unicode[byte]; }

std::optional<uint8_t> UnicodeToByte(char32_t cp) {
  const ByteTables& t = Tables();
  if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(t.to_byte[cp]);
}

absl::StatusOr<std::string> Normalize(std::string_view text, NormalizationForm form) {
  bool ascii = true;
  for (char c : text) {
    if (static_cast<uint8_t>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(text);  // ASCII is invariant under every normalization form
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case NormalizationForm::kNfc:
      normalizer = icu::Normalizer2::getNFCInstance(err);
      break;
    case NormalizationForm::kNfd:
      normalizer = icu::Normalizer2::getNFDInstance(err);
      break;
    case NormalizationForm::kNfkc:
      normalizer = icu::Normalizer2::getNFKCInstance(err);
      break;
    case NormalizationForm::kNfkd:
      normalizer = icu::Normalizer2::getNFKDInstance(err);
      break;
  }
  if (U_FAILURE(err) || normalizer == nullptr) {
    return absl::InternalError(absl::StrCat("ICU normalizer unavailable: ", u_errorName(err)));
  }
  const icu::UnicodeString in = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  icu::UnicodeString out = normalizer->normalize(in, err);
  if (U_FAILURE(err)) {
    return absl::InternalError(absl::StrCat("ICU normalization failed: ", u_errorName(err)));
  }
  std::string result;
  out.toUTF8String(result);
  return result;
}

}  // namespace tandem::tokenizer_internal

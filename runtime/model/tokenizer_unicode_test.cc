// UTF-8 repair follows the Unicode Standard's "maximal subpart" practice (Table 3-8 example),
// which Rust's String::from_utf8_lossy implements; the byte map is GPT-2's bytes_to_unicode.
#include "runtime/model/tokenizer_unicode.h"

#include "gtest/gtest.h"

namespace tandem::tokenizer_internal {
namespace {

TEST(TokenizerUnicodeTest, LossyUsesMaximalSubparts) {
  // Unicode Standard, Table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  const std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string r(kReplacementChar);
  EXPECT_EQ(Utf8Lossy(in), "a" + r + r + r + "b" + r + "c" + r + r + "d");
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), r + r + r);  // a surrogate is never valid
  EXPECT_EQ(Utf8Lossy("ok \xF0\x9F\x98\x80"), "ok \xF0\x9F\x98\x80");
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), r);  // truncated 4-byte sequence: one replacement
  EXPECT_TRUE(IsValidUtf8("\xE4\xBD\xA0\xE5\xA5\xBD"));
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));
}

TEST(TokenizerUnicodeTest, CodePoints) {
  std::string s;
  AppendUtf8(0x1F600, s);
  AppendUtf8(0xE9, s);
  EXPECT_EQ(s, "\xF0\x9F\x98\x80\xC3\xA9");
  size_t pos = 0;
  EXPECT_EQ(NextCodePoint(s, pos), char32_t{0x1F600});
  EXPECT_EQ(NextCodePoint(s, pos), char32_t{0xE9});
  EXPECT_EQ(pos, s.size());
}

TEST(TokenizerUnicodeTest, Gpt2ByteMap) {
  EXPECT_EQ(ByteToUnicode(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(ByteToUnicode('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(ByteToUnicode('a'), "a");
  EXPECT_EQ(ByteToUnicode(0xAD), "\xC5\x83");  // U+0143: the last unprintable byte below 0xAE
  for (int b = 0; b < 256; ++b) {
    const std::string& u = ByteToUnicode(static_cast<uint8_t>(b));
    size_t pos = 0;
    EXPECT_EQ(UnicodeToByte(NextCodePoint(u, pos)), b);
  }
  EXPECT_EQ(UnicodeToByte(0x4E00), std::nullopt);
}

TEST(TokenizerUnicodeTest, NormalizationAndWhitespace) {
  EXPECT_EQ(*Normalize("e\xCC\x81", NormalizationForm::kNfc), "\xC3\xA9");
  EXPECT_EQ(*Normalize("\xC3\xA9", NormalizationForm::kNfd), "e\xCC\x81");
  EXPECT_EQ(*Normalize("\xEF\xAC\x81", NormalizationForm::kNfkc), "fi");  // U+FB01 ligature
  EXPECT_TRUE(IsWhitespace(' '));
  EXPECT_TRUE(IsWhitespace(0x3000));
  EXPECT_TRUE(IsWhitespace(0x85));
  EXPECT_FALSE(IsWhitespace(0x200B));
  EXPECT_FALSE(IsWhitespace('x'));
}

}  // namespace
}  // namespace tandem::tokenizer_internal

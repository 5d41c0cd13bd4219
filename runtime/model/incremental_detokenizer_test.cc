// IncrementalDetokenizer: deltas never split a UTF-8 character and concatenate to Decode(all).
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/tokenizer.h"
#include "runtime/model/tokenizer_unicode.h"

namespace tandem {
namespace {

using json = nlohmann::json;

// Byte-level tokenizer whose vocab is the 256 byte characters only: every multi-byte character
// is split across tokens. "<|eot|>" is a special added token.
std::unique_ptr<Tokenizer> BytesTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[tokenizer_internal::ByteToUnicode(static_cast<uint8_t>(b))] = b;
  }
  json j = {
      {"added_tokens", json::array({{{"id", 256}, {"content", "<|eot|>"}, {"special", true}}})},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  auto t = Tokenizer::FromJson(j.dump(), "bytes");
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

// SentencePiece-style tokenizer with byte fallback for every byte, Llama 2 decoder chain.
std::unique_ptr<Tokenizer> ByteFallbackTokenizer() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"\u2581", 3}, {"a", 4}, {"\u2581a", 5}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 6 + b;
  }
  json j = {
      {"added_tokens", json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}},
                                    {{"id", 2}, {"content", "</s>"}, {"special", true}}})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array(
             {{{"type", "Prepend"}, {"prepend", "\u2581"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", true},
        {"vocab", vocab},
        {"merges", {"\u2581 a"}}}}};
  auto t = Tokenizer::FromJson(j.dump(), "fallback");
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

// Streams `ids`; checks each delta is whole UTF-8 and the concatenation is Decode(ids). Unless
// the full decode itself has U+FFFD (bytes broken up by a special token), no delta may have one.
void ExpectStreamsLikeDecode(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
  const std::string expected = t.Decode(ids, skip);
  const bool broken = expected.find(tokenizer_internal::kReplacementChar) != std::string::npos;
  IncrementalDetokenizer detok(t, skip);
  std::string all;
  for (int32_t id : ids) {
    const std::string delta = detok.Push(id);
    EXPECT_TRUE(tokenizer_internal::IsValidUtf8(delta));
    if (!broken) {
      EXPECT_EQ(delta.find(tokenizer_internal::kReplacementChar), std::string::npos)
          << "a delta split a character";
    }
    all += delta;
  }
  all += detok.Flush();
  EXPECT_EQ(all, expected);
  EXPECT_EQ(detok.ids(), ids);
}

TEST(IncrementalDetokenizerTest, EmojiSplitAcrossByteTokens) {
  auto t = BytesTokenizer();
  // Thumbs up + skin tone, a ZWJ family, CJK, Devanagari.
  const std::string text =
      "ok \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D"
      "\xF0\x9F\x91\xA7 \xE4\xBD\xA0\xE5\xA5\xBD \xE0\xA4\xA8\xE0\xA4\xAE";
  const std::vector<int32_t> ids = t->Encode(text, false);
  ASSERT_EQ(ids.size(), text.size());  // one token per byte
  EXPECT_EQ(t->Decode(ids, false), text);
  ExpectStreamsLikeDecode(*t, ids, false);

  // Nothing comes out until the 4th byte of the emoji arrives.
  IncrementalDetokenizer detok(*t, false);
  const std::vector<int32_t> emoji = t->Encode("\xF0\x9F\x98\x80", false);
  ASSERT_EQ(emoji.size(), 4u);
  EXPECT_EQ(detok.Push(emoji[0]), "");
  EXPECT_EQ(detok.Push(emoji[1]), "");
  EXPECT_EQ(detok.Push(emoji[2]), "");
  EXPECT_EQ(detok.Push(emoji[3]), "\xF0\x9F\x98\x80");
}

TEST(IncrementalDetokenizerTest, SpecialTokensSkippedOrKept) {
  auto t = BytesTokenizer();
  std::vector<int32_t> ids = t->Encode("a\xE4\xBD\xA0", false);
  ids.insert(ids.begin() + 2, 256);  // <|eot|> between the CJK character's bytes
  ids.push_back(256);
  EXPECT_EQ(t->Decode(ids, true), "a\xE4\xBD\xA0");
  ExpectStreamsLikeDecode(*t, ids, true);
  ExpectStreamsLikeDecode(*t, ids, false);
}

TEST(IncrementalDetokenizerTest, ByteFallbackCjkAndLeadingSpace) {
  auto t = ByteFallbackTokenizer();
  const std::vector<int32_t> ids =
      t->Encode("a \xE4\xBD\xA0\xE5\xA5\xBD a \xF0\x9F\x98\x80", false);
  // "a" merges with its U+2581; CJK and emoji fall back to byte tokens.
  EXPECT_EQ(ids.front(), 5);
  EXPECT_EQ(t->Decode(ids, false), "a \xE4\xBD\xA0\xE5\xA5\xBD a \xF0\x9F\x98\x80");
  ExpectStreamsLikeDecode(*t, ids, false);
  std::vector<int32_t> with_bos = t->Encode("a a", true);
  EXPECT_EQ(with_bos.front(), 1);
  ExpectStreamsLikeDecode(*t, with_bos, true);
}

TEST(IncrementalDetokenizerTest, TruncatedCharacterFlushesAsReplacement) {
  auto t = BytesTokenizer();
  std::vector<int32_t> ids = t->Encode("x\xE4\xBD\xA0", false);
  ids.pop_back();  // the stream ends in the middle of a character
  IncrementalDetokenizer detok(*t, false);
  std::string all;
  for (int32_t id : ids) all += detok.Push(id);
  EXPECT_EQ(all, "x");
  all += detok.Flush();
  EXPECT_EQ(all, t->Decode(ids, false));
  EXPECT_EQ(all, "x\xEF\xBF\xBD");
}

}  // namespace
}  // namespace tandem

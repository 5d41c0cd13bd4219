// Tokenizer tests on small hand-written tokenizer.json files. Expected ids follow from the BPE
// rules by hand; Split behaviours are the examples of the `tokenizers` documentation.
#include "runtime/model/tokenizer.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/tokenizer_components.h"
#include "runtime/model/tokenizer_unicode.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A SentencePiece-style (Llama 2 like) tokenizer.json over a tiny vocab.
json SentencePieceJson(const json& vocab, const json& merges) {
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({{{"id", 0},
                                     {"content", "<unk>"},
                                     {"single_word", false},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"normalized", false},
                                     {"special", true}},
                                    {{"id", 1},
                                     {"content", "<s>"},
                                     {"single_word", false},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"normalized", false},
                                     {"special", true}}})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array(
             {{{"type", "Prepend"}, {"prepend", "\u2581"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", merges}}}};
}

// A byte-level (GPT-2 / Llama 3 like) tokenizer.json: the 256 byte characters are ids 0..255,
// `extra` tokens follow from id 256, then added tokens.
json ByteLevelJson(const std::vector<std::string>& extra, const json& merges,
                   const json& added = json::array()) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[tokenizer_internal::ByteToUnicode(static_cast<uint8_t>(b))] = b;
  }
  int next = 256;
  for (const std::string& t : extra) vocab[t] = next++;
  return json{
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {{{"type", "Split"},
               {"pattern",
                {{"Regex",
                  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", merges}}}};
}

std::unique_ptr<Tokenizer> Load(const json& j) {
  auto t = Tokenizer::FromJson(j.dump(), "test");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

TEST(TokenizerTest, MergesApplyInRankOrder) {
  const json vocab = {{"<unk>", 0}, {"<s>", 1}, {"\u2581", 2}, {"a", 3},
                      {"b", 4},     {"c", 5},   {"ab", 6},     {"bc", 7}};
  // "b c" outranks "a b": abc -> a + bc.
  auto t1 = Load(SentencePieceJson(vocab, {"b c", "a b"}));
  ASSERT_NE(t1, nullptr);
  EXPECT_THAT(t1->Encode("abc", false), ElementsAre(2, 3, 7));
  // Reversed ranks: abc -> ab + c. Merges may also be [a, b] pairs.
  auto t2 = Load(SentencePieceJson(vocab, json::array({{"a", "b"}, {"b", "c"}})));
  ASSERT_NE(t2, nullptr);
  EXPECT_THAT(t2->Encode("abc", false), ElementsAre(2, 6, 5));
}

TEST(TokenizerTest, EqualRanksMergeLeftmostFirst) {
  const json vocab = {{"<unk>", 0}, {"<s>", 1}, {"\u2581", 2}, {"a", 3}, {"aa", 4}};
  auto t = Load(SentencePieceJson(vocab, {"a a"}));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("aaa", false), ElementsAre(2, 4, 3));
  EXPECT_THAT(t->Encode("aaaa", false), ElementsAre(2, 4, 4));
}

TEST(TokenizerTest, ChainedMergesBuildWholeWord) {
  const json vocab = {{"<unk>", 0}, {"<s>", 1}, {"\u2581", 2},  {"h", 3},
                      {"i", 4},     {"hi", 5},  {"\u2581hi", 6}};
  auto t = Load(SentencePieceJson(vocab, {"h i", "\u2581 hi"}));
  ASSERT_NE(t, nullptr);
  // Prepend adds U+2581 to the text, Replace turns spaces into U+2581.
  EXPECT_THAT(t->Encode("hi hi", false), ElementsAre(6, 6));
  EXPECT_THAT(t->Encode("hi", true), ElementsAre(1, 6));
  // No tokenizer_config.json: the BOS is what the post-processor prepends; no EOS is known.
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->bos_token(), "<s>");
  EXPECT_EQ(t->eos_id(), std::nullopt);
  EXPECT_EQ(t->Decode(std::vector<int32_t>{1, 6, 6}, true), "hi hi");
  EXPECT_EQ(t->Decode(std::vector<int32_t>{1, 6, 6}, false), "<s> hi hi");
}

TEST(TokenizerTest, ByteFallbackAndFusedUnknown) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"\u2581", 2}, {"a", 3}};
  vocab["<0xC3>"] = 4;
  vocab["<0xA9>"] = 5;
  auto t = Load(SentencePieceJson(vocab, json::array()));
  ASSERT_NE(t, nullptr);
  // U+00E9 is C3 A9: both bytes have tokens.
  EXPECT_THAT(t->Encode("a\u00e9", false), ElementsAre(2, 3, 4, 5));
  EXPECT_EQ(t->Decode(std::vector<int32_t>{2, 3, 4, 5}, false), "a\u00e9");
  // U+00FC is C3 BC: no <0xBC>, so unk; consecutive unknowns fuse into one.
  EXPECT_THAT(t->Encode("a\u00fc\u00fc", false), ElementsAre(2, 3, 0));
  // A lone byte token decodes to U+FFFD.
  EXPECT_EQ(t->Decode(std::vector<int32_t>{3, 4}, false), "a\xEF\xBF\xBD");
}

TEST(TokenizerTest, SpecialTokensAreMatchedBeforeNormalization) {
  const json vocab = {{"<unk>", 0}, {"<s>", 1}, {"\u2581", 2}, {"a", 3},
                      {"s", 4},     {"<", 5},   {">", 6}};
  auto t = Load(SentencePieceJson(vocab, json::array()));
  ASSERT_NE(t, nullptr);
  // Each text section is normalized on its own, so each gets its own U+2581.
  EXPECT_THAT(t->Encode("a<s>a", false), ElementsAre(2, 3, 1, 2, 3));
  EXPECT_THAT(t->Encode("<s>", false), ElementsAre(1));
}

TEST(TokenizerTest, ByteLevelSpecialTokensAndLongestMatch) {
  const json added = json::array(
      {{{"id", 300}, {"content", "<|eot|>"}, {"special", true}, {"normalized", false}},
       {{"id", 301}, {"content", "<|eot|>x"}, {"special", false}, {"normalized", false}},
       {{"id", 302},
        {"content", "<R>"},
        {"special", true},
        {"normalized", false},
        {"rstrip", true},
        {"lstrip", true}}});
  auto t = Load(ByteLevelJson({}, json::array(), added));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("a<|eot|>b", false), ElementsAre('a', 300, 'b'));
  EXPECT_THAT(t->Encode("<|eot|>xy", false), ElementsAre(301, 'y'));
  // lstrip/rstrip swallow the surrounding whitespace.
  EXPECT_THAT(t->Encode("a  <R>  b", false), ElementsAre('a', 302, 'b'));
  EXPECT_TRUE(t->IsSpecial(300));
  EXPECT_FALSE(t->IsSpecial(301));
  EXPECT_EQ(t->Decode(std::vector<int32_t>{'a', 300, 'b'}, true), "ab");
  EXPECT_EQ(t->Decode(std::vector<int32_t>{'a', 300, 'b'}, false), "a<|eot|>b");
  EXPECT_EQ(t->TokenToId("<|eot|>"), 300);
  EXPECT_EQ(t->IdToToken(301), "<|eot|>x");
  EXPECT_EQ(t->vocab_size(), 303);
}

TEST(TokenizerTest, SingleWordAndNormalizedAddedTokens) {
  const json added = json::array({{{"id", 300},
                                   {"content", "cat"},
                                   {"special", false},
                                   {"single_word", true},
                                   {"normalized", false}}});
  auto t = Load(ByteLevelJson({}, json::array(), added));
  ASSERT_NE(t, nullptr);
  // Only a whole word matches a single_word token (U+00E9 is a letter, so "écat" is no match).
  EXPECT_THAT(t->Encode("a cat", false), ElementsAre('a', ' ', 300));
  EXPECT_THAT(t->Encode("cats", false), ElementsAre('c', 'a', 't', 's'));
  EXPECT_THAT(t->Encode("\u00e9cat", false), ElementsAre(0xC3, 0xA9, 'c', 'a', 't'));

  // A normalized added token is matched in the normalized text: "x y" becomes "▁x▁y".
  const json vocab = {{"<unk>", 0}, {"<s>", 1}, {"\u2581", 2}, {"x", 3}, {"y", 4}};
  json j = SentencePieceJson(vocab, json::array());
  j["added_tokens"].push_back(
      {{"id", 5}, {"content", "\u2581y"}, {"special", false}, {"normalized", true}});
  auto sp = Load(j);
  ASSERT_NE(sp, nullptr);
  EXPECT_THAT(sp->Encode("x y", false), ElementsAre(2, 3, 5));
}

TEST(TokenizerTest, ByteLevelMergesIgnoreMergesAndRegex) {
  // "Ġ" is the byte-level space. Merges build " hello"; "world" is a whole vocab entry with no
  // merge path, reachable only through ignore_merges.
  const std::vector<std::string> extra = {"he", "ll", "hell", "hello", "\xC4\xA0hello", "world"};
  const json merges = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 hello"};
  auto t = Load(ByteLevelJson(extra, merges));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("hello hello\nworld", false), ElementsAre(259, 260, '\n', 261));
  // "Ġworld" is not in the vocab and no merge reaches it: bytes stay apart.
  EXPECT_THAT(t->Encode(" world", false), ElementsAre(' ', 'w', 'o', 'r', 'l', 'd'));
  // Digits split in runs of at most three; contractions split off case-insensitively.
  EXPECT_THAT(t->Encode("12345", false), ElementsAre('1', '2', '3', '4', '5'));
  EXPECT_EQ(t->Decode(t->Encode("I'LL say \u4f60\u597d\n\n  x", false), false),
            "I'LL say \u4f60\u597d\n\n  x");
  EXPECT_EQ(t->Decode(std::vector<int32_t>{259, 260}, false), "hello hello");
}

// Split behaviours: the `tokenizers` documentation's "the-final--countdown" example.
std::vector<std::string> SplitWith(const std::string& behavior, bool invert = false) {
  auto pre = tokenizer_internal::MakePreTokenizer(json{{"type", "Split"},
                                                       {"pattern", {{"String", "-"}}},
                                                       {"behavior", behavior},
                                                       {"invert", invert}});
  EXPECT_TRUE(pre.ok()) << pre.status();
  std::vector<tokenizer_internal::Piece> pieces = {{"the-final--countdown", true}};
  EXPECT_TRUE((*pre)->Apply(pieces).ok());
  std::vector<std::string> out;
  for (const auto& p : pieces) out.push_back(p.text);
  return out;
}

TEST(TokenizerTest, SplitBehaviours) {
  EXPECT_THAT(SplitWith("Removed"), ElementsAre("the", "final", "countdown"));
  EXPECT_THAT(SplitWith("Isolated"), ElementsAre("the", "-", "final", "-", "-", "countdown"));
  EXPECT_THAT(SplitWith("MergedWithPrevious"), ElementsAre("the-", "final-", "-", "countdown"));
  EXPECT_THAT(SplitWith("MergedWithNext"), ElementsAre("the", "-final", "-", "-countdown"));
  EXPECT_THAT(SplitWith("Contiguous"), ElementsAre("the", "-", "final", "--", "countdown"));
  // Inverted: the non-matches are the delimiters, so Removed keeps only the dashes.
  EXPECT_THAT(SplitWith("Removed", true), ElementsAre("-", "-", "-"));
}

TEST(TokenizerTest, SplitRegexUsesUnicodeClasses) {
  auto pre = tokenizer_internal::MakePreTokenizer(json{{"type", "Split"},
                                                       {"pattern", {{"Regex", "\\p{L}+"}}},
                                                       {"behavior", "Removed"},
                                                       {"invert", true}});
  ASSERT_TRUE(pre.ok()) << pre.status();
  std::vector<tokenizer_internal::Piece> pieces = {{"\u00e9t\u00e9 42 \u03b1\u03b2", true}};
  ASSERT_TRUE((*pre)->Apply(pieces).ok());
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].text, "\u00e9t\u00e9");
  EXPECT_EQ(pieces[1].text, "\u03b1\u03b2");
}

TEST(TokenizerTest, MetaspacePreTokenizerAndDecoder) {
  auto pre = tokenizer_internal::MakePreTokenizer(
      json{{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}});
  ASSERT_TRUE(pre.ok()) << pre.status();
  std::vector<tokenizer_internal::Piece> pieces = {{"hi there", true}, {"x y", false}};
  ASSERT_TRUE((*pre)->Apply(pieces).ok());
  std::vector<std::string> texts;
  for (const auto& p : pieces) texts.push_back(p.text);
  EXPECT_THAT(texts, ElementsAre("\u2581hi", "\u2581there", "x", "\u2581y"));
  auto dec = tokenizer_internal::MakeDecoder(
      json{{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}});
  ASSERT_TRUE(dec.ok()) << dec.status();
  std::vector<std::string> tokens = {"\u2581hi", "\u2581there"};
  (*dec)->Apply(tokens);
  EXPECT_THAT(tokens, ElementsAre("hi", " there"));
}

TEST(TokenizerTest, NfcNormalizerComposes) {
  // U+00E9 is C3 A9; its byte-level spelling is two characters.
  const std::string c3 = tokenizer_internal::ByteToUnicode(0xC3);
  const std::string a9 = tokenizer_internal::ByteToUnicode(0xA9);
  json j = ByteLevelJson({c3 + a9}, {c3 + " " + a9});
  j["normalizer"] = {{"type", "NFC"}};
  auto t = Load(j);
  ASSERT_NE(t, nullptr);
  // "e" + COMBINING ACUTE composes to U+00E9, which the merge joins into one token.
  EXPECT_THAT(t->Encode("e\u0301", false), ElementsAre(256));
  EXPECT_THAT(t->Encode("\u00e9", false), ElementsAre(256));
}

TEST(TokenizerTest, BadJsonIsAnError) {
  auto t = Tokenizer::FromJson("{\"model\": ", "bad.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("bad.json"));
  EXPECT_FALSE(Tokenizer::FromJson("[]", "x").ok());
  EXPECT_FALSE(Tokenizer::FromFile("/nonexistent/tokenizer.json").ok());
}

TEST(TokenizerTest, MalformedModelIsAnError) {
  json j = ByteLevelJson({}, {"a b c"});
  auto t = Tokenizer::FromJson(j.dump(), "x");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("merge"));
  j = ByteLevelJson({}, {"a zz"});
  EXPECT_FALSE(Tokenizer::FromJson(j.dump(), "x").ok());
  j = ByteLevelJson({}, json::array());
  j["model"]["vocab"] = "nope";
  EXPECT_FALSE(Tokenizer::FromJson(j.dump(), "x").ok());
}

// Found by fuzz/tokenizer_json_fuzz.cc: ids were read with get<int32_t>, undefined for a float out
// of range and truncating for wide integers, and the id table was sized by the largest id.
TEST(TokenizerTest, TokenIdsMustBeSmallIntegers) {
  for (const json& bad :
       {json(6.3e120), json(5.0), json(-1), json(uint64_t{1} << 32), json(2147483647), json("7")}) {
    json j = ByteLevelJson({}, json::array());
    j["model"]["vocab"]["x"] = bad;
    auto t = Tokenizer::FromJson(j.dump(), "x");
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_THAT(t.status().message(), HasSubstr("token id")) << bad;
    j = ByteLevelJson({}, json::array(),
                      json::array({{{"id", bad}, {"content", "<s>"}, {"special", true}}}));
    EXPECT_FALSE(Tokenizer::FromJson(j.dump(), "x").ok()) << bad;
  }
  // The post-processor may only add ids of the vocabulary.
  json j = ByteLevelJson({}, json::array());
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}})},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}}}}};
  auto t = Tokenizer::FromJson(j.dump(), "x");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("outside the vocabulary"));
  j["post_processor"]["special_tokens"]["<s>"]["ids"] = {255};
  EXPECT_TRUE(Tokenizer::FromJson(j.dump(), "x").ok());
}

void ExpectUnsupported(const char* field, const json& value, const std::string& type) {
  json j = ByteLevelJson({}, json::array());
  j[field] = value;
  auto t = Tokenizer::FromJson(j.dump(), "tok.json");
  ASSERT_FALSE(t.ok()) << field;
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(t.status().message(), HasSubstr(type));
  EXPECT_THAT(t.status().message(), HasSubstr("tok.json"));
}

TEST(TokenizerTest, UnsupportedComponentsAreNamed) {
  ExpectUnsupported("normalizer", {{"type", "BertNormalizer"}}, "normalizer type 'BertNormalizer'");
  ExpectUnsupported("normalizer",
                    {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "Lowercase"}}})}},
                    "'Lowercase'");
  ExpectUnsupported("pre_tokenizer", {{"type", "Whitespace"}}, "pre_tokenizer type 'Whitespace'");
  ExpectUnsupported("decoder", {{"type", "WordPiece"}}, "decoder type 'WordPiece'");
  ExpectUnsupported("post_processor", {{"type", "RobertaProcessing"}}, "'RobertaProcessing'");
  ExpectUnsupported("model", {{"type", "Unigram"}, {"vocab", json::array()}},
                    "model type 'Unigram'");
  ExpectUnsupported("model", {{"type", "WordPiece"}, {"vocab", json::object()}},
                    "model type 'WordPiece'");
}

TEST(TokenizerTest, ModelDirReadsBosAndEos) {
  const std::string dir = ::testing::TempDir() + "/tok_model_dir";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  const json vocab = {{"<unk>", 0}, {"<s>", 1}, {"\u2581", 2}, {"</s>", 3}};
  {
    std::ofstream(dir + "/tokenizer.json") << SentencePieceJson(vocab, json::array()).dump();
    std::ofstream(dir + "/tokenizer_config.json")
        << json{{"bos_token", {{"content", "<s>"}}}, {"eos_token", "</s>"}}.dump();
  }
  auto t = Tokenizer::FromModelDir(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bos_id(), 1);
  EXPECT_EQ((*t)->eos_id(), 3);
  EXPECT_EQ((*t)->bos_token(), "<s>");
  EXPECT_EQ((*t)->eos_token(), "</s>");
}

// TokenBytes is what a token adds mid-text: over the bundled byte-level tokenizer, the bytes of
// a text's tokens concatenate to the text itself (grammar masks rely on it).
TEST(TokenizerTest, TokenBytesConcatenateToTheText) {
  auto t = Tokenizer::FromModelDir(std::string(TANDEM_SOURCE_DIR) + "/models/target");
  ASSERT_TRUE(t.ok()) << t.status();
  for (const char* text : {"Hello, world!", " leading space", "{\"a\": [1, 2.5e-3]}",
                           "naïve café ☕ 😀", "tabs\tand\nnewlines  "}) {
    std::string joined;
    for (int32_t id : (*t)->Encode(text, /*add_special_tokens=*/false)) {
      joined += (*t)->TokenBytes(id);
    }
    EXPECT_EQ(joined, text);
  }
  ASSERT_TRUE((*t)->eos_id().has_value());
  EXPECT_EQ((*t)->TokenBytes(*(*t)->eos_id()), "");  // special
  EXPECT_EQ((*t)->TokenBytes(-1), "");
  EXPECT_EQ((*t)->TokenBytes((*t)->vocab_size()), "");
}

// SentencePiece: "▁" is a space mid-text even where the decoder strips it at the start.
TEST(TokenizerTest, TokenBytesOfSentencePieceKeepTheSpace) {
  const json vocab = {{"<unk>", 0}, {"<s>", 1},     {"\u2581", 2}, {"</s>", 3},
                      {"a", 4},     {"\u2581b", 5}, {"<0x41>", 6}};
  std::unique_ptr<Tokenizer> t = Load(SentencePieceJson(vocab, json::array()));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->TokenBytes(5), " b");
  EXPECT_EQ(t->TokenBytes(4), "a");
  EXPECT_EQ(t->TokenBytes(6), "A");
}

}  // namespace
}  // namespace tandem

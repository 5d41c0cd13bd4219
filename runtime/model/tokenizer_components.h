#pragma once
// The pipeline stages of a Hugging Face `tokenizer.json` (normalizers, pre-tokenizers, the BPE
// model, decoders), each built from its JSON object. Private to tokenizer.cc and its tests.
//
// Building: every Make* returns an InvalidArgument/Unimplemented error naming the component type
// (and the JSON path) when the object is malformed or of an unsupported type; nothing is retained.
// Thread-safety: every built component is immutable; its const methods may run concurrently.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer_internal {

// Token ids are dense indexes (the tokenizer keeps a table of max id + 1 entries), so larger ones
// are refused rather than allocated for; real vocabularies are below 2^18.
inline constexpr int32_t kMaxTokenId = (1 << 22) - 1;
// A token id from tokenizer.json: an integer in [0, kMaxTokenId]; InvalidArgument naming `where`
// otherwise (a float, a string, a negative or too large number).
absl::StatusOr<int32_t> TokenIdFromJson(const nlohmann::json& v, std::string_view where);

// A compiled PCRE2 pattern (UTF + UCP), or a literal string, found left to right.
class Pattern {
 public:
  static absl::StatusOr<std::unique_ptr<Pattern>> Regex(const std::string& regex);
  static std::unique_ptr<Pattern> Literal(std::string literal);
  // From a `{"String": ...}` or `{"Regex": ...}` object.
  static absl::StatusOr<std::unique_ptr<Pattern>> FromJson(const nlohmann::json& j,
                                                           const char* where);
  ~Pattern();
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  // Non-overlapping matches [begin, end) in valid UTF-8 `text`; empty matches are skipped.
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> FindAll(std::string_view text) const;

 private:
  Pattern() = default;
  std::string literal_;
  void* code_ = nullptr;  // pcre2_code_8*, owned; null for a literal
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual absl::Status Apply(std::string& text) const = 0;
};
absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& j);

// A piece of text during pre-tokenization; `at_origin` is true when it starts at offset 0 of
// the original input (Metaspace's prepend_scheme "first" needs it).
struct Piece {
  std::string text;
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual absl::Status Apply(std::vector<Piece>& pieces) const = 0;
};
absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const nlohmann::json& j);

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF `decode_chain`: tokens in, tokens out.
  virtual void Apply(std::vector<std::string>& tokens) const = 0;
  // As Apply, but bytes that do not form valid UTF-8 stay as they are instead of becoming U+FFFD
  // (Tokenizer::TokenBytes: a token may hold part of a character).
  virtual void ApplyRaw(std::vector<std::string>& tokens) const { Apply(tokens); }
};
absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const nlohmann::json& j);

// The BPE model (`"model": {"type": "BPE", ...}`).
class BpeModel {
 public:
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& j);
  // Appends the ids of one pre-tokenized word.
  void Tokenize(std::string_view word, std::vector<int32_t>& out) const;

  const absl::flat_hash_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct MergeTarget {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const MergeTarget* FindMerge(int32_t a, int32_t b) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, MergeTarget> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xXX> ids, -1 when absent (byte_fallback only)
};

}  // namespace tandem::tokenizer_internal

#pragma once
// A Hugging Face `tokenizer.json` BPE tokenizer, encoding exactly as the `tokenizers` library does:
// normalizers (NFC, Prepend, Replace, Sequence), pre-tokenizers (Split with the family's regex,
// ByteLevel, Sequence), byte-level and SentencePiece-style (U+2581, byte fallback) BPE models with
// merges by rank, added/special tokens matched in the text, post-processor (BOS when asked) and
// decoders.
//
// Thread-safety: immutable after construction; Encode/Decode may run concurrently.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class Tokenizer {
 public:
  // Loads `tokenizer.json` text. Unsupported model types, normalizers, pre-tokenizers or decoders
  // are errors naming the component (never a silently different encoding).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json_text,
                                                             const std::string& source);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // Loads `<dir>/tokenizer.json`, and `<dir>/tokenizer_config.json` if present (bos/eos tokens).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromModelDir(const std::string& dir);
  virtual ~Tokenizer() = default;

  // Like HF `tokenizer.encode(text, add_special_tokens=...)`.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const = 0;
  // Like HF `tokenizer.decode(ids, skip_special_tokens=...)`. Invalid UTF-8 becomes U+FFFD.
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  // The bytes token `id` adds in the middle of a text, before any UTF-8 repair: for byte-level
  // BPE the token's bytes, for SentencePiece "▁" as a space and <0xHH> as the byte. "" for
  // special tokens and ids out of range. Grammar masks walk these (runtime/grammar).
  virtual std::string TokenBytes(int32_t id) const {
    if (IsSpecial(id)) return "";
    const int32_t one[] = {id};
    return Decode(one, /*skip_special_tokens=*/true);
  }

  virtual int vocab_size() const = 0;  // including added tokens
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual std::string IdToToken(int32_t id) const = 0;  // "" when out of range
  virtual bool IsSpecial(int32_t id) const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  virtual std::string bos_token() const = 0;  // "" when none
  virtual std::string eos_token() const = 0;
};

// Streaming detokenizer: turns ids into text deltas that never split a UTF-8 character, and whose
// concatenation equals Decode(all ids) (as vLLM's incremental detokenization does).
// Not thread-safe; one per sequence.
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);
  // Appends `id`; returns the newly completed text (possibly empty).
  std::string Push(int32_t id);
  // Returns any withheld text at end of stream (incomplete UTF-8 becomes U+FFFD).
  std::string Flush();
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // ids_[prefix_offset_, read_offset_) give context for decoding
  size_t read_offset_ = 0;    // text of ids_[.. read_offset_) has been emitted
};

}  // namespace tandem

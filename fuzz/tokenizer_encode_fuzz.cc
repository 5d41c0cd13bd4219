// Encoding and decoding with the bundled model's tokenizer (models/target, loaded once):
// Tokenizer::Encode on arbitrary text, Tokenizer::Decode and the streaming IncrementalDetokenizer
// on arbitrary ids.
//
// Input: one mode byte, then
//   mode & 1 == 0: text to encode (add_special_tokens = mode & 2);
//   mode & 1 == 1: ids, two bytes each (little-endian; values past the vocabulary included), to
//                  decode (skip_special_tokens = mode & 2).
// Properties: no crash; ids lie in [0, vocab_size); decoding valid UTF-8 text's ids gives the text
// back (byte-level BPE is lossless); decoded text is valid UTF-8; the detokenizer's deltas
// concatenate to Decode of all ids (its documented contract).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "runtime/model/tokenizer.h"

namespace {

const tandem::Tokenizer& Bundled() {
  static const tandem::Tokenizer* tok = [] {
    absl::StatusOr<std::unique_ptr<tandem::Tokenizer>> t =
        tandem::Tokenizer::FromModelDir(tandem::fuzz::ModelDir());
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
      std::abort();
    }
    return t->release();
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const tandem::Tokenizer& tok = Bundled();
  const int vocab = tok.vocab_size();
  const uint8_t mode = data[0];
  const bool flag = (mode & 2) != 0;
  ++data;
  --size;

  if ((mode & 1) == 0) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const std::vector<int32_t> ids = tok.Encode(text, /*add_special_tokens=*/flag);
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < vocab);
    const std::string decoded = tok.Decode(ids, /*skip_special_tokens=*/false);
    FUZZ_CHECK(tandem::fuzz::IsValidUtf8(decoded));
    if (!flag && tandem::fuzz::IsValidUtf8(text)) FUZZ_CHECK(decoded == text);
    return 0;
  }

  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2) {
    const int v = data[i] | (data[i + 1] << 8);
    ids.push_back(v % (vocab + 16) - 2);  // mostly in the vocabulary, a few outside on both ends
  }
  const std::string whole = tok.Decode(ids, /*skip_special_tokens=*/flag);
  FUZZ_CHECK(tandem::fuzz::IsValidUtf8(whole));
  tandem::IncrementalDetokenizer detok(tok, /*skip_special_tokens=*/flag);
  std::string streamed;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) continue;  // the engine only ever pushes sampled (valid) ids
    const std::string delta = detok.Push(id);
    FUZZ_CHECK(tandem::fuzz::IsValidUtf8(delta));
    streamed += delta;
  }
  streamed += detok.Flush();
  std::vector<int32_t> valid;
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab) valid.push_back(id);
  }
  FUZZ_CHECK(streamed == tok.Decode(valid, /*skip_special_tokens=*/flag));
  return 0;
}

// tokenizer.json loading (Tokenizer::FromJson: model, normalizers, pre-tokenizers, added tokens,
// post-processor, decoders), then a few encodes and decodes with whatever loaded.
//
// Input: the text of a tokenizer.json. Seeds: small tokenizers of each supported kind; ./quickstart
// fuzz also adds the bundled model's tokenizer.json to the scratch corpus.
// Properties: no crash; encoded ids lie in [0, vocab_size); decoded text is valid UTF-8;
// IdToToken/TokenToId agree on every id they both know.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "runtime/model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<tandem::Tokenizer>> loaded =
      tandem::Tokenizer::FromJson(text, "fuzz/tokenizer.json");
  if (!loaded.ok()) return 0;
  const tandem::Tokenizer& tok = **loaded;
  const int vocab = tok.vocab_size();
  FUZZ_CHECK(vocab >= 0);

  static const char* const kProbes[] = {
      "Hello, world! It's 2024.",
      " leading  spaces\tand\nnewlines\r\n",
      "<|im_start|>user\nhi<|im_end|><|endoftext|>",
      "h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82",  // héllo 世界 🙂
      "bad \xFF\xFE utf8 \xC3",
      "",
  };
  for (const char* probe : kProbes) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok.Encode(probe, special);
      for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < vocab);
      FUZZ_CHECK(tandem::fuzz::IsValidUtf8(tok.Decode(ids, /*skip_special_tokens=*/false)));
      FUZZ_CHECK(tandem::fuzz::IsValidUtf8(tok.Decode(ids, /*skip_special_tokens=*/true)));
    }
  }
  // Every id (bounded), and a few outside the vocabulary.
  std::vector<int32_t> all;
  for (int32_t id = -2; id < vocab + 2 && id < 512; ++id) all.push_back(id);
  FUZZ_CHECK(tandem::fuzz::IsValidUtf8(tok.Decode(all, /*skip_special_tokens=*/false)));
  for (int32_t id : all) {
    const std::string piece = tok.IdToToken(id);
    if (id < 0 || id >= vocab) {
      FUZZ_CHECK(piece.empty());
      continue;
    }
    tok.IsSpecial(id);
    if (std::optional<int32_t> back = tok.TokenToId(piece); back.has_value()) {
      FUZZ_CHECK(*back >= 0 && *back < vocab);
    }
  }
  if (std::optional<int32_t> bos = tok.bos_id()) FUZZ_CHECK(*bos >= 0 && *bos < vocab);
  if (std::optional<int32_t> eos = tok.eos_id()) FUZZ_CHECK(*eos >= 0 && *eos < vocab);
  return 0;
}

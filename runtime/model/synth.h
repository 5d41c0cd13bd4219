#pragma once
// `tandem model synth`: writes a complete Hugging Face model directory with random weights at the
// shapes of a real model (or of `tiny`, a few-million-parameter Llama for tests):
// config.json, generation_config.json, model-0000k-of-0000n.safetensors (bf16) with
// model.safetensors.index.json, tokenizer.json and tokenizer_config.json.
//
// Output is a pure function of (like, seed, tokenizer file, max_shard_bytes): the same inputs give
// byte-identical files whatever the thread count. Weights: linears ~N(0, 0.02) (o_proj and
// down_proj scaled by 1/sqrt(2 * layers)), biases ~N(0, 0.02), norms exactly 1.
//
// Tokenizer: with `tokenizer_path`, that tokenizer.json is copied in (with the
// tokenizer_config.json found beside it) and vocab_size becomes its max token id + 1. Without it, a
// small byte-level BPE tokenizer is written (256 byte tokens, merges learned from a built-in
// English text, special tokens <|begin_of_text|> <|end_of_text|> <|im_start|> <|im_end|>) with a
// ChatML chat template; `tiny` then uses exactly that vocabulary, the real-shape models keep their
// real vocab_size (ids past the tokenizer's have embeddings but no text, as in Qwen2.5's padded
// vocabulary).
//
// Thread-safety: SynthesizeModel may run concurrently for different out_dirs. A failure may leave
// a partly written out_dir behind.

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/model_config.h"

namespace tandem {

struct SynthOptions {
  std::string like;     // one of SynthModelNames()
  std::string out_dir;  // created if missing; files of the same names are overwritten
  uint64_t seed = 0;
  std::string tokenizer_path;  // optional tokenizer.json to copy in
  size_t max_shard_bytes = 0;  // 0: 2 GiB, or 4 MiB for `tiny` (so it always has >= 2 shards)
  int num_threads = 0;         // 0: all hardware threads
};

// "tiny", "llama-3.2-1b", "llama-3-8b", "qwen2.5-7b".
std::vector<std::string> SynthModelNames();

// The config `like` synthesizes with the built-in tokenizer; InvalidArgument for unknown names.
absl::StatusOr<ModelConfig> SynthConfigFor(const std::string& like);

// Writes the model directory. Progress lines go to `progress` when it is not null.
absl::Status SynthesizeModel(const SynthOptions& options, std::ostream* progress);

}  // namespace tandem

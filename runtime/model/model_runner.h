#pragma once
// The scheduler -> runner contract: one forward pass over a batch that may mix prefill chunks and
// decode tokens of sequences of different lengths, against a paged KV cache the runner owns.
//
// KV layout (per layer, K and V separately): [num_blocks, block_size, num_kv_heads, head_dim].
// Block ids come from the block pool (runtime/kvcache); the runner never allocates blocks.
//
// Thread-safety: a runner belongs to the engine thread; none of its methods may be called
// concurrently.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "runtime/model/model_config.h"

namespace tandem {

struct SequenceChunk {
  // New tokens of one sequence processed this step: positions [start_pos, start_pos + size).
  // KV of positions [0, start_pos) is already in the cache (earlier chunks or prefix cache).
  std::span<const int32_t> tokens;
  int start_pos = 0;
  // Block table covering positions [0, start_pos + tokens.size()): block_table[p / block_size].
  std::span<const int32_t> block_table;
  // When true, logits of the chunk's last token are produced (one row of ForwardOutput).
  bool need_logits = true;
};

struct ForwardBatch {
  std::vector<SequenceChunk> chunks;
};

struct ForwardOutput {
  // [rows, vocab_size] float32, one row per chunk with need_logits, in chunk order.
  std::vector<float> logits;
  int rows = 0;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelConfig& config() const = 0;
  virtual int block_size() const = 0;  // tokens per KV block
  virtual int num_blocks() const = 0;  // KV blocks the runner allocated
  // Runs the batch. Writes the chunks' K/V into their blocks and fills `out`. On error the KV of
  // the chunks' new positions is unspecified (the caller recomputes or drops those sequences).
  virtual absl::Status Forward(const ForwardBatch& batch, ForwardOutput* out) = 0;
};

}  // namespace tandem

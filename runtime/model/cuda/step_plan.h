#pragma once
// Host-side planning of one CUDA forward step: turns a ForwardBatch into the flat int32 metadata
// the kernels read (one host->device copy), decides the row order and the CUDA-graph padding.
// Pure host logic over plain data (no CUDA), so it is unit-tested without a GPU.
//
// Row order: "decode rows" come first, in chunk order: every chunk of exactly one new token, and
// every chunk whose every token needs logits with at most kMaxVerifyRows tokens (a sequence's
// last token and its drafts, or a short prompt scored whole), one row per token, each attending
// to its own prefix (context_len = its position + 1: the step appends every row's KV before any
// attention, so a row sees the rows before it). Then the rows of the other chunks ("prefill
// rows"), chunk after chunk. The decode rows go through the paged decode-attention kernel, the
// prefill rows through the prefill-attention kernel; every other op is row-wise and does not care
// about the order. A verifying step is thus a decode step of more rows, and graphed like one.
//
// CUDA graphs: a batch made only of decode rows, at most kMaxGraphBatch of them, is padded to the
// next bucket of kGraphBuckets. Padding rows read token 0 at position 0, write no KV (slot -1),
// and read none (context_len 0: the decode kernel writes zeros): harmless, and their logits are
// never returned. Block tables are padded to a power-of-two width so that graphs are keyed by
// (bucket, width) and a graph's pointers and scalar arguments stay valid for every batch of its
// key. Graphed or not, decode block tables use that power-of-two width and the attention
// split hint max_context_len = width * block_size, so graphs on and off run the same kernels with
// the same arguments when no padding is needed.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/model/model_runner.h"

namespace tandem::cuda_runner {

inline constexpr int kGraphBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
inline constexpr int kMaxGraphBatch = 256;
// The most tokens of a chunk run as decode rows (see the header comment).
inline constexpr int kMaxVerifyRows = 16;

// The smallest bucket >= rows, or 0 when rows > kMaxGraphBatch or rows <= 0.
int GraphBucketFor(int rows);
// The smallest power of two >= n (n >= 1).
int RoundUpPow2(int n);

struct StepPlanLimits {
  int block_size = 16;
  int num_blocks = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  bool use_graphs = true;
};

// Offsets (in int32 elements) of the sections of StepPlan::meta.
struct MetaOffsets {
  size_t ids = 0;             // [num_rows] token ids
  size_t positions = 0;       // [num_rows]
  size_t slots = 0;           // [num_rows] block * block_size + offset; -1 for padding rows
  size_t decode_tables = 0;   // [num_decode, decode_table_width]
  size_t context_lens = 0;    // [num_decode]
  size_t prefill_tables = 0;  // [num_prefill, prefill_table_width]
  size_t seq_starts = 0;      // [num_prefill + 1], relative to the first prefill row
  size_t start_pos = 0;       // [num_prefill]
  size_t logit_rows = 0;      // [num_logit_rows] rows (in plan order) whose logits are computed
  size_t total = 0;
};

struct StepPlan {
  int num_rows = 0;       // rows run on the device, padding included
  int num_real_rows = 0;  // rows of the batch
  int num_decode = 0;     // decode rows [0, num_decode), padding included
  int num_prefill = 0;    // prefill chunks; their rows are [num_decode, num_rows)
  int decode_table_width = 0;
  int prefill_table_width = 0;
  int decode_max_context = 0;  // split hint for the decode kernel: decode_table_width * block_size
  int prefill_max_new_tokens = 0;
  int graph_bucket = 0;  // 0: run eagerly; else == num_rows == num_decode
  // Logits are computed for num_logit_rows gathered rows (every row of a graphed batch, else the
  // rows that need them). output_rows[i] is the computed-logits row of the i-th output row
  // (ForwardOutput row order: the last num_logits tokens of each chunk with need_logits, in chunk
  // and token order).
  int num_logit_rows = 0;
  std::vector<int> output_rows;
  MetaOffsets off;
  std::vector<int32_t> meta;  // off.total int32s, uploaded with one copy
};

// Checks the batch as the CPU runner does (InvalidArgument naming the chunk: empty chunk, negative
// start, positions past max_position_embeddings, token ids outside the vocabulary, block tables
// too short or with block ids outside [0, num_blocks)).
absl::Status ValidateBatch(const ForwardBatch& batch, const StepPlanLimits& limits);

// Validates and plans. `plan` is overwritten (its vectors' capacity reused). On error `plan` is
// unspecified.
absl::Status PlanStep(const ForwardBatch& batch, const StepPlanLimits& limits, StepPlan* plan);

}  // namespace tandem::cuda_runner

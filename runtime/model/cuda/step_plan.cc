#include "runtime/model/cuda/step_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "runtime/base/status.h"

namespace tandem::cuda_runner {

int GraphBucketFor(int rows) {
  if (rows <= 0) return 0;
  for (int b : kGraphBuckets) {
    if (rows <= b) return b;
  }
  return 0;
}

int RoundUpPow2(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

absl::Status ValidateBatch(const ForwardBatch& batch, const StepPlanLimits& limits) {
  for (size_t i = 0; i < batch.chunks.size(); ++i) {
    const SequenceChunk& ch = batch.chunks[i];
    const int64_t n = static_cast<int64_t>(ch.tokens.size());
    if (n == 0) return absl::InvalidArgumentError(absl::StrFormat("chunk %d has no tokens", i));
    if (ch.start_pos < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("chunk %d: negative start_pos %d", i, ch.start_pos));
    }
    if (ch.need_logits && (ch.num_logits < 1 || ch.num_logits > n)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("chunk %d: num_logits %d is not in [1, %d]", i, ch.num_logits, n));
    }
    const int64_t end = ch.start_pos + n;
    if (end > limits.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrFormat("chunk %d: positions up to %d exceed max_position_embeddings %d", i, end,
                          limits.max_position_embeddings));
    }
    for (int64_t t = 0; t < n; ++t) {
      if (ch.tokens[t] < 0 || ch.tokens[t] >= limits.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrFormat("chunk %d: token id %d outside vocabulary [0, %d)", i, ch.tokens[t],
                            limits.vocab_size));
      }
    }
    const int64_t blocks_needed = (end + limits.block_size - 1) / limits.block_size;
    if (static_cast<int64_t>(ch.block_table.size()) < blocks_needed) {
      return absl::InvalidArgumentError(
          absl::StrFormat("chunk %d: block table has %d blocks, positions up to %d need %d", i,
                          ch.block_table.size(), end, blocks_needed));
    }
    for (int64_t b = 0; b < blocks_needed; ++b) {
      if (ch.block_table[b] < 0 || ch.block_table[b] >= limits.num_blocks) {
        return absl::InvalidArgumentError(absl::StrFormat("chunk %d: block id %d outside [0, %d)",
                                                          i, ch.block_table[b], limits.num_blocks));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// Whether the chunk's tokens run as decode rows (step_plan.h).
bool RunsAsDecodeRows(const SequenceChunk& ch) {
  const int n = static_cast<int>(ch.tokens.size());
  return n == 1 || (ch.need_logits && ch.num_logits == n && n <= kMaxVerifyRows);
}

}  // namespace

absl::Status PlanStep(const ForwardBatch& batch, const StepPlanLimits& limits, StepPlan* plan) {
  RETURN_IF_ERROR(ValidateBatch(batch, limits));
  const int bs = limits.block_size;
  StepPlan& p = *plan;
  p.num_rows = p.num_real_rows = p.num_decode = p.num_prefill = 0;
  p.prefill_max_new_tokens = 0;
  int decode_blocks = 1, prefill_blocks = 1, logit_count = 0;
  for (const SequenceChunk& ch : batch.chunks) {
    const int n = static_cast<int>(ch.tokens.size());
    const int blocks = (ch.start_pos + n + bs - 1) / bs;
    p.num_real_rows += n;
    if (RunsAsDecodeRows(ch)) {
      p.num_decode += n;
      decode_blocks = std::max(decode_blocks, blocks);
    } else {
      ++p.num_prefill;
      prefill_blocks = std::max(prefill_blocks, blocks);
      p.prefill_max_new_tokens = std::max(p.prefill_max_new_tokens, n);
    }
    logit_count += ch.need_logits ? ch.num_logits : 0;
  }
  const int real_decode = p.num_decode;
  p.graph_bucket = 0;
  if (limits.use_graphs && p.num_prefill == 0) p.graph_bucket = GraphBucketFor(real_decode);
  if (p.graph_bucket > 0) p.num_decode = p.graph_bucket;
  p.num_rows = p.num_decode + (p.num_real_rows - real_decode);
  p.decode_table_width = RoundUpPow2(decode_blocks);
  p.decode_max_context = p.decode_table_width * bs;
  p.prefill_table_width = p.num_prefill > 0 ? prefill_blocks : 0;
  p.num_logit_rows = p.graph_bucket > 0 ? p.graph_bucket : logit_count;

  MetaOffsets& o = p.off;
  size_t at = 0;
  auto section = [&at](size_t n) {
    const size_t start = at;
    at += n;
    return start;
  };
  o.ids = section(p.num_rows);
  o.positions = section(p.num_rows);
  o.slots = section(p.num_rows);
  o.decode_tables = section(static_cast<size_t>(p.num_decode) * p.decode_table_width);
  o.context_lens = section(p.num_decode);
  o.prefill_tables = section(static_cast<size_t>(p.num_prefill) * p.prefill_table_width);
  o.seq_starts = section(p.num_prefill > 0 ? p.num_prefill + 1 : 0);
  o.start_pos = section(p.num_prefill);
  o.logit_rows = section(p.num_logit_rows);
  o.total = at;
  p.meta.assign(o.total, 0);
  int32_t* m = p.meta.data();

  // Padding decode rows: token 0 at position 0, no KV write (slot -1), no KV read (context 0).
  for (int r = real_decode; r < p.num_decode; ++r) m[o.slots + r] = -1;
  p.output_rows.clear();
  int decode_row = 0, prefill_row = p.num_decode, prefill_seq = 0, logit_row = 0;
  if (p.num_prefill > 0) m[o.seq_starts] = 0;
  for (const SequenceChunk& ch : batch.chunks) {
    const int n = static_cast<int>(ch.tokens.size());
    const int blocks = (ch.start_pos + n + bs - 1) / bs;
    int first_row;
    if (RunsAsDecodeRows(ch)) {
      first_row = decode_row;
      for (int i = 0; i < n; ++i, ++decode_row) {
        const int context = ch.start_pos + i + 1;
        int32_t* table =
            m + o.decode_tables + static_cast<size_t>(decode_row) * p.decode_table_width;
        std::copy_n(ch.block_table.begin(), (context + bs - 1) / bs, table);
        m[o.context_lens + decode_row] = context;
      }
    } else {
      first_row = prefill_row;
      prefill_row += n;
      int32_t* table =
          m + o.prefill_tables + static_cast<size_t>(prefill_seq) * p.prefill_table_width;
      std::copy_n(ch.block_table.begin(), blocks, table);
      m[o.start_pos + prefill_seq] = ch.start_pos;
      m[o.seq_starts + prefill_seq + 1] = prefill_row - p.num_decode;
      ++prefill_seq;
    }
    for (int i = 0; i < n; ++i) {
      const int pos = ch.start_pos + i;
      m[o.ids + first_row + i] = ch.tokens[i];
      m[o.positions + first_row + i] = pos;
      m[o.slots + first_row + i] = ch.block_table[pos / bs] * bs + pos % bs;
    }
    if (ch.need_logits) {
      // A graphed step computes every row's logits (its rows are all decode rows).
      for (int k = ch.num_logits; k >= 1; --k) {
        const int row = first_row + n - k;
        if (p.graph_bucket > 0) {
          p.output_rows.push_back(row);
        } else {
          m[o.logit_rows + logit_row] = row;
          p.output_rows.push_back(logit_row++);
        }
      }
    }
  }
  if (p.graph_bucket > 0) {
    for (int r = 0; r < p.num_logit_rows; ++r) m[o.logit_rows + r] = r;
  }
  return absl::OkStatus();
}

}  // namespace tandem::cuda_runner

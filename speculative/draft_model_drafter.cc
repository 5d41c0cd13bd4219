#include "speculative/draft_model_drafter.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::speculative {
namespace {

int32_t Argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

}  // namespace

DraftModelDrafter::DraftModelDrafter(std::unique_ptr<ModelRunner> runner,
                                     const DraftModelOptions& options)
    : runner_(std::move(runner)),
      options_(options),
      kv_(runner_->num_blocks(), runner_->block_size(), /*enable_prefix_caching=*/false) {}

absl::StatusOr<std::unique_ptr<DraftModelDrafter>> DraftModelDrafter::Create(
    std::unique_ptr<ModelRunner> runner, const DraftModelOptions& options) {
  if (runner == nullptr || runner->num_blocks() <= 0 || runner->block_size() <= 0) {
    return absl::InvalidArgumentError("draft drafter: the draft runner has no KV blocks");
  }
  if (options.max_batch_tokens < 1) {
    return absl::InvalidArgumentError("draft drafter: max_batch_tokens must be >= 1");
  }
  return std::unique_ptr<DraftModelDrafter>(new DraftModelDrafter(std::move(runner), options));
}

void DraftModelDrafter::Drop(int64_t key) {
  kv_.Free(key);
  fed_.erase(key);
}

void DraftModelDrafter::Release(int64_t key, std::span<const int32_t>, int) { Drop(key); }

absl::StatusOr<std::vector<std::vector<int32_t>>> DraftModelDrafter::Propose(
    std::span<const DraftRequest> requests, absl::Time deadline) {
  const int vocab = runner_->config().vocab_size;
  const int max_pos = runner_->config().max_position_embeddings;
  std::vector<std::vector<int32_t>> drafts(requests.size());
  // Who drafts this time, and how many (after the roll-back and the block reservation).
  std::vector<int> want(requests.size(), 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    const int len = static_cast<int>(r.tokens.size());
    const int k = std::min(r.max_tokens, max_pos - len);  // positions len .. len+k-2 are fed
    if (len == 0 || k < 1) continue;
    std::vector<int32_t>& fed = fed_[r.key];
    // Roll back to what still agrees (never the whole sequence: its last token is fed again).
    const size_t agree =
        std::mismatch(fed.begin(), fed.end(), r.tokens.begin(), r.tokens.end()).first - fed.begin();
    fed.resize(std::min<size_t>(agree, static_cast<size_t>(len - 1)));
    const int positions = len + k - 1;
    if (!kv_.CanAllocate(r.key, nullptr, positions)) {
      Drop(r.key);
      continue;
    }
    kv_.Allocate(r.key, nullptr, positions);
    want[i] = k;
  }

  // Catch-up: feed tokens[fed .. len) of every drafting sequence, split into forward passes of
  // at most max_batch_tokens; the piece ending at len gives the first draft.
  struct Piece {
    size_t request;
    int start, end;
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (want[i] == 0) continue;
    const int from = static_cast<int>(fed_[requests[i].key].size());
    const int len = static_cast<int>(requests[i].tokens.size());
    for (int s = from; s < len; s += options_.max_batch_tokens) {
      pieces.push_back({i, s, std::min(len, s + options_.max_batch_tokens)});
    }
  }
  // Runs one forward pass over `batch`; each chunk's (request, logits?) in `rows`.
  auto forward = [&](const std::vector<std::pair<size_t, SequenceChunk>>& batch) -> absl::Status {
    ForwardBatch fb;
    for (const auto& [i, chunk] : batch) fb.chunks.push_back(chunk);
    ForwardOutput out;
    if (absl::Status s = runner_->Forward(fb, &out); !s.ok()) return s;
    size_t row = 0;
    for (const auto& [i, chunk] : batch) {
      tokens_fed_ += static_cast<int64_t>(chunk.tokens.size());
      if (!chunk.need_logits) continue;
      if (out.logits.size() < (row + 1) * static_cast<size_t>(vocab)) {
        return absl::InternalError("draft runner returned too few logits rows");
      }
      drafts[i].push_back(Argmax(std::span<const float>(out.logits).subspan(row * vocab, vocab)));
      ++row;
    }
    return absl::OkStatus();
  };
  auto fail = [&](const absl::Status& s) {
    // The draft cache is in an unknown state: start every sequence over.
    for (const DraftRequest& r : requests) Drop(r.key);
    return absl::Status(s.code(), absl::StrCat("draft model: ", s.message()));
  };
  for (size_t p = 0; p < pieces.size();) {
    std::vector<std::pair<size_t, SequenceChunk>> batch;
    int tokens = 0;
    for (; p < pieces.size(); ++p) {
      const Piece& piece = pieces[p];
      const int n = piece.end - piece.start;  // at most max_batch_tokens
      if (!batch.empty() && tokens + n > options_.max_batch_tokens) break;
      const DraftRequest& r = requests[piece.request];
      SequenceChunk chunk;
      chunk.tokens = r.tokens.subspan(piece.start, piece.end - piece.start);
      chunk.start_pos = piece.start;
      chunk.block_table = kv_.BlockTable(r.key);
      chunk.need_logits = piece.end == static_cast<int>(r.tokens.size());
      batch.emplace_back(piece.request, chunk);
      tokens += n;
    }
    if (absl::Status s = forward(batch); !s.ok()) return fail(s);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (want[i] > 0) {
      fed_[requests[i].key].assign(requests[i].tokens.begin(), requests[i].tokens.end());
    }
  }

  // Drafting steps: feed each sequence's latest draft while it wants more.
  const int most = *std::max_element(want.begin(), want.end());
  std::vector<int32_t> step_tokens(requests.size());
  for (int j = 1; j < most && absl::Now() < deadline; ++j) {
    std::vector<std::pair<size_t, SequenceChunk>> batch;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (want[i] <= j || static_cast<int>(drafts[i].size()) != j) continue;
      const DraftRequest& r = requests[i];
      step_tokens[i] = drafts[i].back();
      SequenceChunk chunk;
      chunk.tokens = std::span<const int32_t>(&step_tokens[i], 1);
      chunk.start_pos = static_cast<int>(r.tokens.size()) + j - 1;
      chunk.block_table = kv_.BlockTable(r.key);
      chunk.need_logits = true;
      batch.emplace_back(i, chunk);
    }
    if (batch.empty()) break;
    if (absl::Status s = forward(batch); !s.ok()) return fail(s);
    for (const auto& [i, chunk] : batch) fed_[requests[i].key].push_back(step_tokens[i]);
  }
  return drafts;
}

}  // namespace tandem::speculative

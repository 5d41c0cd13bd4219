#pragma once
// DraftModelDrafter ("draft:DIR"): a small model on the decode worker drafts greedily. It keeps
// its own paged KV cache (a KvCacheManager over its runner's blocks, no prefix caching) and, per
// sequence, the tokens whose KV that cache holds. Each Propose:
//   1. rolls every sequence back to the longest common prefix of what its cache holds and the
//      sequence's accepted tokens (rejected drafts' positions are simply overwritten later);
//   2. feeds what is missing (the prompt the first time, then the accepted tokens and the bonus
//      token) in chunks of at most max_batch_tokens, batched across sequences, and takes the
//      greedy token after the last one: the first draft;
//   3. runs max_tokens - 1 more batched one-token steps, each feeding the previous draft.
// Drafts are greedy, so each is a point mass: the engine's verification (accept a draft when
// the target's own sample equals it) is exact rejection sampling for them.
// A sequence whose blocks do not fit gets no draft and loses its draft state (it is re-fed next
// time). Past the deadline no further step starts; the drafts so far are returned.
//
// The draft model must share the target's vocabulary (CreateDrafter checks vocab_size).
//
// Thread-compatible: the engine thread owns the drafter and so the draft runner (one thread
// owns each device's work).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "runtime/kvcache/block_pool.h"
#include "runtime/model/model_runner.h"
#include "speculative/drafter.h"

namespace tandem::speculative {

struct DraftModelOptions {
  int max_batch_tokens = 512;  // tokens per draft forward pass (catch-up chunks are split)
};

class DraftModelDrafter : public Drafter {
 public:
  // InvalidArgument for a runner without blocks or bad options.
  static absl::StatusOr<std::unique_ptr<DraftModelDrafter>> Create(
      std::unique_ptr<ModelRunner> runner, const DraftModelOptions& options);
  std::string_view name() const override { return "draft"; }
  absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(std::span<const DraftRequest> requests,
                                                            absl::Time deadline) override;
  void Release(int64_t key, std::span<const int32_t> tokens, int num_prompt_tokens) override;

  const ModelConfig& config() const { return runner_->config(); }
  // Tokens fed to the draft model so far (catch-up and drafts), for tests and benchmarks.
  int64_t tokens_fed() const { return tokens_fed_; }
  int live_sequences() const { return static_cast<int>(fed_.size()); }

 private:
  DraftModelDrafter(std::unique_ptr<ModelRunner> runner, const DraftModelOptions& options);
  void Drop(int64_t key);

  std::unique_ptr<ModelRunner> runner_;
  DraftModelOptions options_;
  KvCacheManager kv_;
  absl::flat_hash_map<int64_t, std::vector<int32_t>> fed_;  // key -> tokens whose KV is cached
  int64_t tokens_fed_ = 0;
};

}  // namespace tandem::speculative

#pragma once
// A deterministic ModelRunner for tests that also checks the paged-KV contract.
//
// Its "KV" of position p is a chained hash of (KV of p-1, token at p, p). Forward writes, for
// every new position, {position, hash, parent hash} into slot (block_table[p / B], p % B) and
// verifies, before producing logits, that every position [0, end) of the chunk's block table
// holds the entry of that position with an unbroken parent chain. A wrong block table, a block
// reused while still referenced, or a prefix-cache hit with other content therefore either
// fails the check (Forward returns Internal and `violations()` records it) or changes the logits.
// Logits are a pseudo-random function of the last position's hash, so ReferenceLogits(tokens)
// (computed with no cache at all) is an independent reference for what the engine must produce.
//
// kv_layout() exposes the records as a real KV cache (1 layer, 1 KV head, head_dim =
// sizeof(Slot) one-byte elements); each record is written to both K and V, and the check also
// requires V to equal K. So KV copied between two fake runners with the layout formula (a
// simulated transfer) passes the check exactly when every block of both K and V was copied to
// the right place.
//
// Transfer mirror (EnableTransferMirror): transfer_layout() then points at a second buffer of the
// same geometry, standing in for a device runner's pinned host mirror, and StageKv copies blocks
// (K and V) between the two and logs every call. Without it the runner is a host runner
// (transfer_layout() == kv_layout(), StageKv a no-op).
//
// Layer progress (EnableKvProgress, as a device runner has): its one layer counts as done once
// every chunk of the step is written, before the step's checks and logits.
//
// Thread-safety: like every runner, engine thread only (kv_layout and transfer_layout from any
// thread); read counters after the engine stopped (or from an engine callback, which runs on the
// engine thread).

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/model_runner.h"

namespace tandem {

class FakeModelRunner : public ModelRunner {
 public:
  FakeModelRunner(int vocab_size, int num_blocks, int block_size, int max_position_embeddings,
                  std::vector<int> eos_token_ids = {});

  const ModelConfig& config() const override { return config_; }
  int block_size() const override { return block_size_; }
  int num_blocks() const override { return num_blocks_; }
  KvCacheLayout kv_layout() const override;
  absl::StatusOr<KvCacheLayout> transfer_layout() override;
  absl::Status EnableKvProgress() override;
  KvProgress kv_progress() const override;
  absl::Status Forward(const ForwardBatch& batch, ForwardOutput* out) override;
  // InvalidArgument for a block id out of range (nothing copied); the injected failure of
  // FailNextStages zero-fills the destination blocks (a torn copy) and returns its status.
  absl::Status StageKv(std::span<const int32_t> blocks, KvStage dir) override;

  // Call before handing the runner to an engine.
  void EnableTransferMirror();
  // Samples rows on the runner (model_runner.h) with the CPU sampler, grammar masks included
  // (calling ForwardBatch::masks_ready after computing the logits), as a device runner would.
  void EnableDeviceSampling() { device_sampling_ = true; }
  bool SupportsDeviceSampling() const override { return device_sampling_; }
  // Rows sampled on the runner so far, and those of them under a grammar mask.
  int64_t runner_sampled_rows() const { return runner_sampled_rows_; }
  int64_t masked_rows() const { return masked_rows_; }
  struct StageCall {
    KvStage dir;
    std::vector<int32_t> blocks;
  };
  // Every StageKv call, in order (failed ones included; without a mirror they do nothing).
  const std::vector<StageCall>& stage_calls() const { return stage_calls_; }
  // Makes the next `count` StageKv calls fail with `status`.
  void FailNextStages(int count, absl::Status status);

  // The logits the model yields after `tokens`, without any cache.
  static std::vector<float> ReferenceLogits(std::span<const int32_t> tokens, int vocab_size);
  // Greedy continuation of `prompt` by `n` tokens (stopping after a token in `stop_ids`).
  // While fewer than `min_tokens` tokens are out, `stop_ids` cannot be picked (min_tokens).
  static std::vector<int32_t> ReferenceGreedy(std::vector<int32_t> prompt, int n, int vocab_size,
                                              const std::vector<int>& stop_ids = {},
                                              int min_tokens = 0);

  // Makes the next `count` Forward calls fail with `status` after validating the batch.
  void FailNextForwards(int count, absl::Status status);
  // Runs `hook` at the start of every Forward (on the engine thread), e.g. to hold the engine
  // in a step while a test acts.
  void set_forward_hook(std::function<void()> hook) { forward_hook_ = std::move(hook); }
  // Makes the logits of the next `count` Forward calls NaN.
  void NanLogitsNextForwards(int count) { nan_count_ = count; }

  const std::vector<std::string>& violations() const { return violations_; }
  int64_t forward_calls() const { return forward_calls_; }
  int64_t tokens_computed() const { return tokens_computed_; }
  int max_batch_chunks() const { return max_batch_chunks_; }

 private:
  // Plain bytes (no padding), so that it can be copied as KV.
  struct Slot {
    int32_t written = 0;
    int32_t pos = -1;
    uint64_t hash = 0;
    uint64_t parent = 0;
  };
  static_assert(sizeof(Slot) == 24);
  absl::Status Violation(std::string message);
  // Slot of position `pos` in `block`, K (kv = 0) or V (kv = 1).
  Slot& At(int kv, int32_t block, int pos) {
    return slots_[(static_cast<size_t>(kv) * num_blocks_ + block) * block_size_ +
                  pos % block_size_];
  }

  ModelConfig config_;
  int num_blocks_;
  int block_size_;
  std::vector<Slot> slots_;   // [2 (K, V), num_blocks, block_size]
  std::vector<Slot> mirror_;  // empty, or as slots_ (EnableTransferMirror)
  bool progress_enabled_ = false;
  uint64_t progress_value_ = 0;
  std::atomic<uint64_t> progress_{0};  // read by other threads through kv_progress()
  std::vector<StageCall> stage_calls_;
  int stage_fail_count_ = 0;
  absl::Status stage_fail_status_;
  int fail_count_ = 0;
  int nan_count_ = 0;
  std::function<void()> forward_hook_;
  absl::Status fail_status_;
  std::vector<std::string> violations_;
  int64_t forward_calls_ = 0;
  int64_t tokens_computed_ = 0;
  int max_batch_chunks_ = 0;
  bool device_sampling_ = false;
  int64_t runner_sampled_rows_ = 0;
  int64_t masked_rows_ = 0;
};

}  // namespace tandem

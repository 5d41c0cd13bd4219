#pragma once
// Continuous-batching scheduler with chunked prefill (vLLM v1 style), as host-only logic over
// plain data: no threads, no device, no protobuf.
//
// Every sequence is a token list (prompt + generated) and a count of tokens whose KV is computed;
// each step it gets up to (tokens - computed) new tokens, so prefill, chunked prefill, decode and
// recompute after preemption are one mechanism. A step's plan, under a token budget
// (`max_num_batched_tokens`) and a cap on running sequences (`max_num_seqs`):
//   1. running sequences with one token left (decodes), oldest first;
//   2. running sequences still prefilling, as chunks that fit the remaining budget;
//   3. ready sequences (see below), then waiting sequences in priority order, FCFS within a
//      priority (prefix-cache hits skip their cached blocks), the latter only if no sequence was
//      preempted in this step;
//   4. with long_prefill_token_threshold T > 0, each prefill chunk of steps 2-3 takes at most T
//      tokens, so a long prompt shares the step with the prompts behind it instead of taking the
//      whole budget; what is left of the budget then tops the capped chunks up, in plan order,
//      without preempting (a lone long prompt still gets the whole budget).
// When a running sequence needs a block and none is available, the least urgent running sequence
// (the highest priority value; the newest among equals) is preempted by recompute: its blocks are
// freed (cached full blocks stay in the prefix cache) and it goes to the front of its priority
// class in the waiting queue with its prompt + generated tokens. Priorities order admission and
// preemption only: a waiting urgent sequence does not evict a running one to get in.
//
// Usage per step: Schedule() (allocates blocks), run the forward pass over the plan, then
// OnStepComputed(plan), then AppendToken()/Finish() for each chunk with need_logits.
//
// Speculative decoding: SetDrafts appends draft tokens to a running sequence that has one token
// left to compute; its next decode chunk then covers that token and the drafts, all or nothing
// (when the step's budget or the free blocks cannot take them, the drafts are dropped and it
// decodes one token: drafts never preempt anyone). Draft positions never enter the prefix cache.
// After the step, TakeDrafts removes them again (their KV stays in the slots, uncomputed), the
// engine appends what it verified token by token, and AcceptDraftKv marks an appended token's KV
// computed when it equals the draft the step computed at that position. Preemption drops drafts.
//
// Disaggregation (a sequence's KV computed elsewhere, or kept for someone else to read):
// - Decode side: AddAwaitingKv reserves blocks for the whole prompt plus its first generated
//   token (prefix-cache hits reused) and parks the sequence (kAwaitingKv): never scheduled, never
//   preempted, its blocks pinned, nothing new published to the prefix cache. CompleteKv (the KV
//   arrived: the full blocks enter the prefix cache, the first token is appended) or FailKv (it
//   will not: prefill the uncached part locally) moves it to the ready queue (kReady). Ready
//   sequences are admitted before the waiting queue and need no new block to be admitted, so
//   pinned reservations can never deadlock admission.
// - Prefill side: Hold takes a running sequence out of the batch but keeps its blocks referenced
//   (kHeld) until Abort: they are never handed out, evicted or written meanwhile (prefix-cache
//   hits may still read its full blocks).
//
// Thread-safety: none; owned by the engine thread. Misuse (unknown ids, a plan applied twice) is
// a broken invariant and CHECK-fails.

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "runtime/kvcache/block_pool.h"

namespace tandem {

struct SchedulerConfig {
  int num_blocks = 0;
  int block_size = 16;
  int max_num_seqs = 64;             // running sequences at most
  int max_num_batched_tokens = 512;  // tokens (decode + prefill chunks) per step
  // Fairness within a step (vLLM's long_prefill_token_threshold, but work-conserving): a prefill
  // chunk's first share of the budget. 0: no cap, chunks are cut by the budget alone (FCFS).
  int long_prefill_token_threshold = 0;
  bool enable_prefix_caching = true;
  // Record prefix-cache events (block_pool.h) for TakePrefixCacheEvents; the engine drains them
  // every step into its PrefixCacheEventLog.
  bool record_prefix_cache_events = false;
};

enum class SequenceState {
  kWaiting,     // queued, no blocks
  kRunning,     // in the batch, owns blocks covering its computed tokens
  kAwaitingKv,  // owns blocks for prompt + 1 token; the prompt's KV is being written from outside
  kReady,       // owns blocks for its tokens; queued for admission ahead of kWaiting
  kHeld,        // out of the batch; its blocks stay referenced and unchanged until Abort
};

struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int num_prompt_tokens = 0;
  int num_computed = 0;               // tokens whose KV is in the cache
  int num_cached_prompt_tokens = -1;  // prefix-cache hit at first admission; -1 before it
  int num_preemptions = 0;
  int priority = 0;                // lower is more urgent (vLLM's convention)
  bool skip_prefix_cache = false;  // never reuses cached blocks (every position is computed)
  int num_draft = 0;               // trailing draft tokens of `tokens` (SetDrafts)
  // After TakeDrafts: the drafts the last step computed, from position verify_start on.
  std::vector<int32_t> verifying;
  int verify_start = 0;
  SequenceState state = SequenceState::kWaiting;
  bool running() const { return state == SequenceState::kRunning; }
  int num_output_tokens() const { return static_cast<int>(tokens.size()) - num_prompt_tokens; }
};

// Blocks reserved by AddAwaitingKv.
struct KvReservation {
  std::vector<int32_t> block_ids;  // the prompt's blocks in position order (ceil(len / B) ids)
  int num_cached_tokens = 0;       // leading prompt tokens already in the cache (whole blocks)
};

// One sequence's part of a step: tokens[start_pos, start_pos + num_tokens).
struct ScheduledChunk {
  int64_t seq_id = 0;
  int start_pos = 0;
  int num_tokens = 0;
  bool need_logits = false;  // the chunk ends at the sequence's last token: sample after it
};

struct SchedulerStep {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks
  std::vector<int64_t> preempted;      // sequences preempted (requeued) in this step
  int num_batched_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  const SchedulerConfig& config() const { return config_; }
  const KvCacheManager& kv() const { return kv_; }

  // Queues a new sequence behind every waiting one of the same or a lower `priority` value (lower
  // is more urgent; all 0: FCFS). `id` must be new; `prompt` non-empty.
  // `skip_prefix_cache`: the sequence computes every position (prompt logprobs need each one's
  // logits); its blocks still enter the prefix cache for others.
  void Add(int64_t id, std::vector<int32_t> prompt, int priority = 0,
           bool skip_prefix_cache = false);
  // Removes a sequence in any state and frees its blocks. Returns false for unknown ids.
  bool Abort(int64_t id);

  // Decode side of a remote prefill. Whether AddAwaitingKv(id, prompt) would succeed now.
  bool CanAddAwaitingKv(int64_t id, std::span<const int32_t> prompt) const;
  // Adds sequence `id` in state kAwaitingKv with blocks for prompt + 1 token. `id` must be new,
  // `prompt` non-empty; CHECK-fails unless CanAddAwaitingKv(id, prompt).
  KvReservation AddAwaitingKv(int64_t id, std::vector<int32_t> prompt);
  // The prompt's KV is in the reserved blocks: num_computed = prompt length, the full blocks enter
  // the prefix cache, `first_token` is appended, and the sequence becomes kReady (its next chunk
  // is the first token's decode). CHECK-fails unless `id` is kAwaitingKv.
  void CompleteKv(int64_t id, int32_t first_token);
  // The KV will not arrive: the sequence becomes kReady with num_computed = its cached prefix and
  // prefills the rest locally in its reserved blocks. CHECK-fails unless `id` is kAwaitingKv.
  void FailKv(int64_t id);

  // Prefill side: a running sequence leaves the batch (kHeld), keeping its blocks until Abort.
  void Hold(int64_t id);

  // Plans the next step and allocates its blocks. Empty when there is nothing to run.
  SchedulerStep Schedule();
  // The plan's KV has been written: advances computed counts and fills the prefix cache.
  void OnStepComputed(const SchedulerStep& step);
  // Appends a sampled token to a running sequence whose last chunk had need_logits.
  void AppendToken(int64_t id, int32_t token);
  // Speculative decoding (see above). SetDrafts: `id` is running with exactly one token left to
  // compute and no drafts; appends `drafts` (may be empty: no-op).
  void SetDrafts(int64_t id, std::span<const int32_t> drafts);
  // After OnStepComputed: removes the sequence's drafts (returned, in order) and leaves its
  // tokens as before SetDrafts, all computed; empty when it had none (dropped by Schedule).
  std::vector<int32_t> TakeDrafts(int64_t id);
  // The token just appended equals the draft the last step computed at its position: its KV is
  // computed (num_computed + 1). CHECK-fails unless it does.
  void AcceptDraftKv(int64_t id);
  // Removes a finished sequence and frees its blocks.
  void Finish(int64_t id);

  const Sequence* Get(int64_t id) const;
  // The sequence's block table; valid until the next non-const call.
  std::span<const int32_t> BlockTable(int64_t id) const { return kv_.BlockTable(id); }
  // Sequences not running yet: kWaiting, kReady and kAwaitingKv.
  int NumWaiting() const {
    return static_cast<int>(waiting_.size() + ready_.size()) + num_awaiting_;
  }
  int NumRunning() const { return static_cast<int>(running_.size()); }
  // Prompt tokens of kWaiting and kReady sequences whose KV is not computed yet (the prefill work
  // queued ahead of a new request).
  int64_t WaitingPromptTokens() const;
  // The prefix-cache events recorded since the last call (config.record_prefix_cache_events).
  std::vector<PrefixCacheEvent> TakePrefixCacheEvents() { return kv_.TakeEvents(); }
  int NumAwaitingKv() const { return num_awaiting_; }
  int NumHeld() const { return num_held_; }
  // Whether Schedule() has something to plan (kAwaitingKv and kHeld sequences do not count).
  bool HasWork() const { return !waiting_.empty() || !ready_.empty() || !running_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Running sequences, oldest first.
  const std::vector<int64_t>& running() const { return running_; }

  // CHECK-fails unless: running sequences own block tables covering their computed tokens,
  // waiting ones own none, awaiting / ready / held ones own tables covering their tokens, and
  // the KV manager is consistent. For tests.
  void CheckInvariants() const;

 private:
  Sequence& Mutable(int64_t id);
  // Index in running_ of the next preemption victim: the highest priority value, the newest
  // among equals.
  size_t VictimIndex() const;
  void Preempt(int64_t id);
  // Removes a sequence's drafts (tokens back to before SetDrafts; computed count capped there).
  static void DropDrafts(Sequence& seq);

  SchedulerConfig config_;
  KvCacheManager kv_;
  absl::flat_hash_map<int64_t, Sequence> seqs_;
  std::deque<int64_t> waiting_;
  std::deque<int64_t> ready_;     // kReady, admitted before waiting_
  std::vector<int64_t> running_;  // oldest admission first
  int num_awaiting_ = 0;
  int num_held_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace tandem

#pragma once
// The engine loop: ONE thread owns the ModelRunner, the scheduler (with its KV block manager) and
// the sampler, and runs step after step (schedule -> forward -> sample -> emit), llama.cpp
// server-queue style.
//
// Threads: Submit, SubmitRemotePrefill, CompleteRemotePrefill, ReleaseHeldKv, Cancel, Shutdown,
// stats and kv_layout may be called from any thread; they only touch the request queues under
// `mu_` and never wait on a forward pass. Callbacks (on_output, on_reserved, on_prefilled) run on
// the engine thread, outside `mu_`: they must return quickly and must not call Shutdown (every
// other method is fine).
//
// Per request, the callback receives zero or more outputs followed by exactly one final output
// (finish_reason set): stop (EOS, a stop token id or a stop string), length (max_tokens or the
// context limit), abort (Cancel or Shutdown) or error (the forward pass failed; `error` says why).
// A request rejected by Submit gets no callback at all.
//
// Sampling: rows whose params need only the logits (SamplesFromLogitsOnly: no penalties, no
// top-logprob list) are sampled by the runner when it SupportsDeviceSampling(), so only tokens
// leave the device when a whole step's rows qualify; the result is the same token and logprob
// as the host sampler's (same seed and step). Other rows, and every row of a step with any other
// row, are sampled here from the logits.
//
// Ownership: the engine owns the runner; the tokenizer (optional) must outlive the engine.
//
// Disaggregated serving (whole-prompt KV transfer between a prefill engine P and a decode
// engine D, see DESIGN.md "A request, end to end"):
// - D: SubmitRemotePrefill reserves blocks for the prompt (prefix-cache hits reused) and reports
//   them through on_reserved; somebody else writes the prompt's KV into them (kv_layout() gives
//   the addresses) and calls CompleteRemotePrefill with the first token, or with an error, in
//   which case D prefills the prompt itself. Until then the sequence is never scheduled, its
//   blocks are pinned and nothing of it enters the prefix cache.
// - P: a request with hold_kv_after_prefill computes its prompt, samples one token, reports the
//   blocks holding the prompt's KV through on_prefilled and keeps them unchanged (never evicted,
//   reused or written) until ReleaseHeldKv, Cancel, the lease (EngineOptions::held_kv_lease) or
//   the end of Shutdown. Its request id stays live (Submit of the same id: AlreadyExists) until
//   then.
// - Transfer memory: backends move bytes of transfer_layout(), which is kv_layout() for host
//   runners and a host mirror for device runners (model_runner.h), allocated when somebody first
//   asks for it (a worker, before it serves). Once it was obtained, the engine stages on its own
//   thread: P copies the prompt's blocks (all of them, prefix-cached ones included) device ->
//   mirror after the forward pass and before on_prefilled; if that copy fails, the request ends
//   with kError (no on_prefilled; its blocks are freed) so the caller reports the prefill failed
//   and D recomputes. D copies the blocks P wrote (those not wholly inside the reservation's
//   num_cached_tokens) mirror -> device when CompleteRemotePrefill succeeds and before the
//   sequence joins the batch; if that copy fails D prefills the prompt itself, as for a failed
//   remote prefill. (Two held prompts sharing a prefix-cached block on P both stage it: the
//   second copy rewrites bytes a transfer may be reading with the same values.) Host runners
//   skip all of this (no call at all), as does an engine whose transfer_layout() nobody asked
//   for (no transfer can read the mirror then), and requests with stage_kv false.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/engine/stop_strings.h"
#include "runtime/kvcache/prefix_cache_events.h"
#include "runtime/model/model_runner.h"
#include "runtime/model/tokenizer.h"
#include "runtime/sampling/sampler.h"
#include "runtime/sampling/sampling_params.h"
#include "runtime/scheduler/scheduler.h"
#include "speculative/drafter.h"

namespace tandem {
namespace grammar {
class CompiledGrammar;
class GrammarCache;
class MaskPrefetcher;
}  // namespace grammar

enum class FinishReason { kStop, kLength, kAbort, kError };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", "abort", "error"

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
};

struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // params.logprobs entries, most likely first
};

// Where the time to the first token went, in microseconds (on the first output that carries a
// token). Locally prefilled request: queue = Submit -> first scheduled step, prefill = first
// scheduled step -> end of the forward pass that produced the prompt's logits (chunks and
// preemptions included), first_decode = that -> first token emitted (sampling, callbacks of
// earlier requests of the step). Remote prefill: queue = Submit -> blocks reserved, prefill =
// reserved -> CompleteRemotePrefill called (the caller knows the finer split of its own side),
// first_decode = CompleteRemotePrefill called -> first token emitted. Remote prefill that fell
// back: queue = Submit -> reserved, prefill = reserved -> local prompt logits (the failed
// attempt included), first_decode as for a local request.
struct FirstTokenTimings {
  int64_t queue_us = 0;
  int64_t prefill_us = 0;
  int64_t first_decode_us = 0;
};

struct GenerationOutput {
  std::string request_id;
  std::vector<int32_t> token_ids;             // tokens generated since the previous output
  std::vector<TokenLogprobs> logprobs;        // parallel to token_ids when params.logprobs is set
  std::string text;                           // text delta (empty without a tokenizer)
  std::optional<FinishReason> finish_reason;  // set on the final output only
  absl::Status error;                         // why, when finish_reason is kError
  Usage usage;                                // running totals
  std::optional<FirstTokenTimings> first_token_timings;  // on the first output with a token
  // params.prompt_logprobs: on the first output with a token, prompt tokens 1..n-1 (n - 1
  // entries; the first prompt token has none), each scored against the logits before it.
  std::vector<ScoredToken> prompt_logprobs;
};

using OutputCallback = std::function<void(const GenerationOutput&)>;

// Prefill side: the prompt's KV as it sits in this engine's cache after the prefill.
struct PrefilledKv {
  std::string request_id;
  std::vector<int32_t> block_ids;  // position order; ceil(num_tokens / block_size) blocks
  int num_tokens = 0;              // = prompt length: positions [0, num_tokens) are computed
  int32_t first_token = 0;         // sampled after the prompt with the request's params
  std::optional<TokenLogprobs> first_token_logprobs;  // when params.logprobs is set
  int prefix_cached_tokens = 0;  // leading prompt tokens served from this engine's prefix cache
};

// Prefill side, layer-wise streaming: one step's chunk of a held prompt, reported on the engine
// thread just BEFORE the step's forward pass runs. The KV of positions [begin, end) is complete
// for layer l once *progress >= first_value + l + 1 (progress non-null; the runner's layer
// progress, model_runner.h), and for every layer once the step has finished (on_prefilled for
// the last chunk, or the next chunk's report). Positions [0, begin) were computed by earlier
// steps or came from the prefix cache.
struct KvChunk {
  std::string request_id;
  std::vector<int32_t> block_ids;  // the blocks of positions [0, end), position order
  int begin = 0;
  int end = 0;
  const volatile uint64_t* progress = nullptr;
  uint64_t first_value = 0;
};

struct GenerateRequest {
  std::string request_id;  // unique among the engine's live requests
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
  // Scheduling priority, lower is more urgent (vLLM's `priority`): orders admission (and queued
  // remote-prefill reservations) and picks preemption victims; FCFS among equals.
  int priority = 0;
  // Migration (a request resumed on this engine after its first engine failed mid-stream): the
  // last `resumed_output_tokens` prompt tokens are output an earlier attempt generated. They are
  // not emitted again, but they count as output for sampling (the seed position, so a seeded
  // request continues with the tokens it would have drawn; the penalties' output tokens) and for
  // stop strings, which may span the seam, and for min_tokens (the router passes the client's
  // min_tokens unchanged; max_tokens it reduces). `resumed_text_bytes` of their text already
  // reached the client; the rest (what the earlier attempt held back: a partial UTF-8 character, a
  // possible stop-string prefix) comes out with the next output. A sampled request (temperature >
  // 0) must carry its seed. Usage counts only this engine's tokens.
  int resumed_output_tokens = 0;
  int64_t resumed_text_bytes = 0;
  OutputCallback on_output;
  // Prefill side (Submit only): compute the prompt, sample one token, call on_prefilled (engine
  // thread) and keep the blocks until ReleaseHeldKv; then the final output (that token,
  // finish_reason length; no stop checks) is emitted.
  bool hold_kv_after_prefill = false;
  std::function<void(const PrefilledKv&)> on_prefilled;
  // SubmitRemotePrefill only: the latest time to obtain blocks (besides
  // EngineOptions::reserve_timeout after Submit).
  absl::Time deadline = absl::InfiniteFuture();
  // hold_kv_after_prefill and SubmitRemotePrefill: whether this request's KV crosses through
  // transfer_layout() (staged when that is a host mirror). False when the transfer reads or
  // writes the KV cache itself (a device backend such as cuda_ipc): no staging at all.
  bool stage_kv = true;
  // hold_kv_after_prefill only: called with each chunk of the prompt before its step runs (engine
  // thread; must return quickly). Only when EngineOptions::kv_layer_progress took effect.
  std::function<void(const KvChunk&)> on_kv_chunk;
};

// Decode side: the blocks reserved for a remote prefill.
struct RemoteKvReservation {
  std::vector<int32_t> block_ids;  // the prompt's blocks, position order (ceil(len / block_size))
  int num_cached_tokens = 0;       // leading prompt tokens already present (whole blocks): the
                                   // blocks wholly inside them must not be written
};

// Decode side: what the prefill produced besides the KV.
struct RemotePrefillResult {
  int32_t first_token = 0;
  // Required when the request's params.logprobs is set (its token must be first_token).
  std::optional<TokenLogprobs> first_token_logprobs;
};

struct EngineOptions {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  // SchedulerConfig::long_prefill_token_threshold: a prefill chunk's first share of a step when
  // other prompts compete for it (fairness); 0: none.
  int long_prefill_token_threshold = 0;
  int max_model_len = 0;  // 0: the model's max_position_embeddings
  bool enable_prefix_caching = true;
  // Stop tokens besides the model config's eos_token_ids and the tokenizer's EOS.
  std::vector<int32_t> extra_eos_token_ids;
  absl::Duration idle_poll = absl::Milliseconds(50);  // loop wake-up when idle
  // SubmitRemotePrefill: longest wait for enough free blocks before on_reserved(ResourceExhausted)
  // (the request's own deadline cuts it shorter). Long: under overload requests queue for blocks
  // rather than fail.
  absl::Duration reserve_timeout = absl::Seconds(600);
  // hold_kv_after_prefill: blocks not released by then are freed (with a warning).
  absl::Duration held_kv_lease = absl::Seconds(30);
  // Layer-wise KV streaming (prefill workers): turn on the runner's layer progress and report
  // held prompts' chunks (GenerateRequest::on_kv_chunk). A runner without it (host runners)
  // reports nothing: its KV is whole when the step ends.
  bool kv_layer_progress = false;
  // Guided decoding: compute each guided sequence's next token mask on a helper thread while the
  // forward pass runs (grammar::MaskPrefetcher), instead of after it on the engine thread.
  bool prefetch_grammar_masks = true;
  // Speculative decoding (docs/speculative.md): each step asks `drafter` for up to
  // num_speculative_tokens tokens per decoding sequence, scores them with the sequence's last
  // token in one forward pass and keeps those the target's own sampling reproduces, token by
  // token (same seed, step, penalties and grammar mask as without speculation, so outputs are
  // identical). The count adapts per request: it grows while every draft is accepted and
  // shrinks to what was. Null drafter or 0: off. Prefill-role requests never speculate.
  std::shared_ptr<speculative::Drafter> drafter;
  int num_speculative_tokens = 0;  // the most drafts per sequence and step, [0, 64]
  // A drafter answer later than this is dropped and the step runs without drafts.
  absl::Duration drafter_deadline = absl::Milliseconds(50);
};

struct EngineStats {
  int64_t steps = 0;
  int64_t batched_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t finished_requests = 0;
  double forward_seconds = 0;  // inside ModelRunner::Forward
  double busy_seconds = 0;     // loop iterations that ran a step: forward plus host work
  // Steps that only decoded (every chunk one token with logits, no drafts): their count, forward
  // seconds, sequences and the tokens those sequences already had in the KV cache. Over a window,
  // the served step time at a mean batch and context, which `tandem profile calibrate` compares
  // with a profile's prediction.
  int64_t decode_steps = 0;
  double decode_forward_seconds = 0;
  int64_t decode_sequences = 0;
  int64_t decode_context_tokens = 0;
  // Steps that only computed prompt tokens (no decode row, no drafts): their count, forward
  // seconds, prompt chunks, the chunks' tokens and the tokens their sequences already had cached
  // before them. Over a window, the served prefill step at a mean chunk, which `tandem profile
  // calibrate` compares with the profile's prefill points.
  int64_t prefill_steps = 0;
  double prefill_forward_seconds = 0;
  int64_t prefill_chunks = 0;
  int64_t prefill_tokens = 0;
  int64_t prefill_cached_tokens = 0;
  // Time between steps while work waited: for a step after which the engine still had work and
  // began its next iteration without waiting for input, the wall seconds from the end of that
  // step's iteration to the start of the next (publishing stats, taking the lock, and whatever
  // kept the engine thread off the CPU). Over the backlogged steps, a served step's cost beyond
  // its busy time; a planner adds it to every simulated step.
  int64_t backlogged_steps = 0;
  double gap_seconds = 0;
  // Speculative decoding: tokens drafted and scheduled, of them accepted, verifications (a
  // sequence's drafts scored in a step), drafter calls that failed or were late, and seconds
  // spent waiting for the drafter.
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  int64_t spec_verifications = 0;
  int64_t spec_fallbacks = 0;
  double drafter_seconds = 0;
  // MLP offload (docs/mlp.md): layer calls to the MLP backend, those moved to another shard or
  // the fallback after a failure, and those that failed (their steps' requests failed).
  int64_t mlp_calls = 0;
  int64_t mlp_failovers = 0;
  int64_t mlp_failures = 0;
  int64_t mlp_plane_calls = 0;
  int blocks_total = 0;
  int blocks_used = 0;         // includes reserved (awaiting KV) and held blocks
  int blocks_free = 0;         // free + cached-idle
  int blocks_cached_idle = 0;  // of blocks_free: holding a cached prefix, evicted on demand
  int running = 0;
  int waiting = 0;                    // includes remote prefills waiting for blocks or for their KV
  int awaiting_kv = 0;                // remote prefills with reserved blocks, KV not yet complete
  int held_kv = 0;                    // prefilled requests whose blocks are held for transfer
  int64_t waiting_prompt_tokens = 0;  // uncomputed prompt tokens of waiting sequences
  // Of waiting and waiting_prompt_tokens: requests the worker holds in front of the engine
  // (SetQueuedOutside; the prefill worker's admission queue).
  int queued_outside = 0;
};

class Engine {
 public:
  // Starts the loop thread. `tokenizer` may be null (no text, no stop strings). InvalidArgument
  // for a runner with no blocks or vocabulary, or bad options.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<ModelRunner> runner,
                                                        const Tokenizer* tokenizer,
                                                        const EngineOptions& options);
  ~Engine();  // Shutdown(absl::ZeroDuration()) if not done yet
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and enqueues; returns at once. InvalidArgument (naming the field) for an empty
  // prompt, token ids outside the vocabulary, a prompt that leaves no room under the context
  // limit, prompt + max_tokens over it, bad sampling parameters, stop strings without a
  // tokenizer, prompt_logprobs with hold_kv_after_prefill or a resumed request (the engine that
  // prefills a prompt and emits its first token scores it); AlreadyExists for a live request
  // id; Unavailable after Shutdown began.
  absl::Status Submit(GenerateRequest request);
  // Aborts a live request (its final output has finish_reason kAbort); no-op for unknown ids.
  // A remote prefill still waiting for blocks gets on_reserved(Cancelled) instead (and no other
  // callback); a request whose KV is held is released (as ReleaseHeldKv).
  void Cancel(const std::string& request_id);

  // Decode side. Validates like Submit (plus: on_reserved set, hold_kv_after_prefill false, no
  // prompt_logprobs) and
  // enqueues; returns at once. On the engine thread: allocates blocks for the whole prompt
  // (reusing prefix-cached ones) and calls on_reserved(reservation); when blocks are short the
  // request waits, FCFS ahead of local admissions, until request.deadline or reserve_timeout and
  // then gets on_reserved(ResourceExhausted) (Unavailable if the engine shuts down first) and no
  // other callback. After a reservation the request counts as waiting until
  // CompleteRemotePrefill; Cancel and Shutdown then free its blocks and emit kAbort.
  absl::Status SubmitRemotePrefill(
      GenerateRequest request,
      std::function<void(absl::StatusOr<RemoteKvReservation>)> on_reserved);
  // Thread-safe; no-op for an unknown, finished or cancelled id, or one not awaiting its KV. OK:
  // the prompt's KV is in the reserved blocks; they become computed and prefix-cacheable,
  // first_token is emitted like a sampled token (stop checks apply; max_tokens 1 finishes here)
  // and decoding continues in the batch. Error (or a first token outside the vocabulary, or
  // logprobs requested but missing): the engine prefills the prompt itself in the reserved
  // blocks, transparently to the client.
  void CompleteRemotePrefill(const std::string& request_id,
                             absl::StatusOr<RemotePrefillResult> result);

  // Prefill side. Thread-safe: frees the blocks held for `request_id`; no-op when none are held.
  void ReleaseHeldKv(const std::string& request_id);
  // Stops accepting requests, lets live ones run for up to `drain_timeout`, aborts the rest and
  // joins the loop. Idempotent.
  void Shutdown(absl::Duration drain_timeout);

  EngineStats stats() const;
  // The worker's own queue in front of the engine (requests and their prompt tokens), added to
  // stats().waiting and waiting_prompt_tokens so every reader of the load sees it. Lock-free:
  // callable under the caller's locks.
  void SetQueuedOutside(int requests, int64_t prompt_tokens);
  // What the prefix cache stored and evicted, numbered (kvcache/prefix_cache_events.h); updated
  // after every step. Thread-safe. Empty when prefix caching is off.
  const PrefixCacheEventLog& prefix_cache_events() const { return prefix_cache_events_; }
  int max_model_len() const { return max_model_len_; }
  const ModelConfig& config() const { return runner_->config(); }
  // Whether held prompts' chunks are reported (EngineOptions::kv_layer_progress on a runner that
  // has layer progress). Fixed after Create.
  bool reports_kv_chunks() const { return reports_kv_chunks_; }
  // The runner's KV memory; immutable after Create, callable from any thread.
  const KvCacheLayout& kv_layout() const { return kv_layout_; }
  // What a transfer backend registers and addresses: the runner's transfer_layout() (the KV
  // cache itself, or its host mirror, allocated by the first call). Thread-safe; the same layout
  // once it succeeded. Errors: the runner's (allocation; a later call retries), or
  // InvalidArgument when its geometry differs from kv_layout()'s.
  absl::StatusOr<KvCacheLayout> transfer_layout();

 private:
  struct Active;
  Engine(std::unique_ptr<ModelRunner> runner, const Tokenizer* tokenizer,
         const EngineOptions& options, int max_model_len, bool reports_kv_chunks);
  using ReservedCallback = std::function<void(absl::StatusOr<RemoteKvReservation>)>;
  struct Incoming {
    GenerateRequest request;
    ReservedCallback on_reserved;  // set for SubmitRemotePrefill
    absl::Time submitted;
    std::shared_ptr<const grammar::CompiledGrammar> grammar;  // params.guided, compiled
  };
  struct Completion {
    std::string request_id;
    absl::StatusOr<RemotePrefillResult> result;
    absl::Time arrived;
  };
  struct HeldKv {
    int64_t seq_id = 0;
    absl::Time expiry;
  };

  absl::Status Validate(const GenerateRequest& request) const;
  absl::Status Enqueue(Incoming incoming);
  void Loop();
  void Admit(Incoming incoming);
  // Reserves blocks for queued remote prefills in FCFS order; fails those past their deadline.
  void ProcessReservations(absl::Time now);
  // A queued (unreserved) remote prefill ends with on_reserved(status) and no other callback.
  void RejectReservation(int64_t seq_id, absl::Status status);
  void OnRemotePrefillDone(Completion completion);
  void CancelRequest(const std::string& request_id);
  // Frees held KV; `reason` is logged when not empty.
  void ReleaseHeld(const std::string& request_id, const char* reason);
  void ExpireHeldLeases(absl::Time now);
  // Whether anything is still live: schedulable work, reservations, awaiting or held KV.
  bool HasLiveWork() const;
  // Runs one scheduled step; false when nothing could be scheduled.
  bool Step();
  // Speculative decoding: asks the drafter for the decoding sequences' drafts (SetDrafts).
  void ProposeDrafts();
  // After a step that scored `seq_id`'s last token and drafts (drafts + 1 rows): emits the tokens
  // plain decoding would, accepting drafts while they agree. sample_row(i) samples and emits row
  // i (from its logits, or the runner's token) and returns the token, or nullopt for NaN logits
  // (the request then fails); it is called for rows 0, 1, ... while the drafts hold.
  void VerifyDrafts(int64_t seq_id,
                    const std::function<std::optional<int32_t>(size_t)>& sample_row);
  // Samples one token for `seq_id` from `logits` and emits it (or holds the KV); returns it
  // (-1 when the request failed first: a grammar that allows no token).
  int32_t OnLogits(int64_t seq_id, std::span<const float> logits);
  // Emits the token sampled for `seq_id` (on the host or by the runner), or holds the KV.
  void OnSampled(int64_t seq_id, const SampleResult& sampled);
  // Emits a token already appended to the sequence; may finish the request.
  void EmitToken(int64_t seq_id, int32_t token, std::optional<TokenLogprobs> logprobs);
  void HoldAfterPrefill(int64_t seq_id, const SampleResult& sampled);
  // A resumed request's text: prepends what its earlier attempt held back, drops what the client
  // already has.
  static void TrimResumedText(Active& a, std::string* text);
  // The text `token` adds as the request's `output_index`-th token (1-based, resumed output
  // included), through the stop-string buffer from the min_tokens-th token on.
  static std::string PushText(Active& a, int32_t token, int output_index);
  // What the sampler must not draw after `output_len` tokens: EOS (unless ignore_eos) and
  // stop_token_ids while output_len < min_tokens; empty otherwise.
  std::vector<int32_t> SuppressedTokens(const Active& a, int output_len) const;
  // `a`'s grammar mask at its state into `words` (ceil(vocab / 64) of them), EOS allowed exactly
  // where the output is a whole match; false when it allows no token.
  bool GrammarMask(const Active& a, std::span<uint64_t> words) const;
  // Stages the prompt blocks of `seq_id` from index `first_block` on (no-op for host runners).
  absl::Status StagePromptKv(int64_t seq_id, int first_block, KvStage dir);
  void FinishRequest(int64_t seq_id, FinishReason reason, absl::Status error, GenerationOutput out);
  void AbortAll();
  void PublishStats();

  // Fixed at construction.
  const std::unique_ptr<ModelRunner> runner_;
  const Tokenizer* const tokenizer_;
  // Guided decoding: the compiled constraints over the vocabulary's token bytes, made on the
  // first guided request (any thread: Validate runs on the submitter's).
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> Grammar(
      const SamplingParams::Guided& guided) const;
  mutable absl::Mutex grammar_mu_;
  mutable std::unique_ptr<grammar::GrammarCache> grammars_ ABSL_GUARDED_BY(grammar_mu_);
  const EngineOptions options_;
  // Set when options_.prefetch_grammar_masks; used by the engine thread only.
  std::unique_ptr<grammar::MaskPrefetcher> mask_prefetcher_;
  const int max_model_len_;
  const KvCacheLayout kv_layout_;
  const bool reports_kv_chunks_;
  // Set once by transfer_layout(); stages_kv_: that layout is a mirror (StageKv around transfers).
  absl::Mutex transfer_mu_;
  std::optional<KvCacheLayout> transfer_layout_ ABSL_GUARDED_BY(transfer_mu_);
  std::atomic<bool> stages_kv_{false};
  std::atomic<int> queued_outside_{0};
  std::atomic<int64_t> queued_outside_tokens_{0};
  absl::flat_hash_set<int32_t> eos_ids_;

  // Engine thread only.
  Scheduler scheduler_;
  absl::flat_hash_map<int64_t, std::unique_ptr<Active>> active_;
  absl::flat_hash_map<std::string, int64_t> seq_by_request_;
  std::deque<int64_t> reservations_;  // remote prefills waiting for blocks, FCFS
  absl::flat_hash_map<std::string, HeldKv> held_;
  int64_t next_seq_id_ = 0;
  std::mt19937_64 seed_rng_;
  EngineStats local_stats_;
  bool last_step_ran_ = true;
  absl::Time last_step_end_;  // when the last iteration that ran a step finished it

  // Shared with callers.
  mutable absl::Mutex mu_;
  std::vector<Incoming> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> cancels_ ABSL_GUARDED_BY(mu_);
  std::vector<Completion> completions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> releases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> live_ids_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time drain_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool loop_done_ ABSL_GUARDED_BY(mu_) = false;
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  PrefixCacheEventLog prefix_cache_events_;  // thread-safe; appended by the engine thread

  absl::Mutex shutdown_mu_;  // serializes Shutdown callers
  std::thread thread_;
};

}  // namespace tandem

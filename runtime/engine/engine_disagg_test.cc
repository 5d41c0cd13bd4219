// The engine's disaggregation API over contract-checking fake runners: a prefill engine P holds
// the prompt's KV, the test copies it into the blocks a decode engine D reserved (the fake KV
// records are real bytes, so a wrong or missing copy fails the fake's history check), and D must
// then generate exactly the uncached reference tokens. Also: local fallback, cancellation, block
// waits and timeouts, leases, held blocks under churn.
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/logging.h"
#include "runtime/engine/disagg_test_util.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/engine/fake_model_runner.h"

namespace tandem {
namespace {

using ::testing::IsEmpty;

constexpr int kVocab = 64;
constexpr int kBlock = 4;

using Collector = OutputCollector;
using Result = OutputCollector::Result;

struct Node {
  explicit Node(int num_blocks, EngineOptions options = {}, std::vector<int> eos = {}) {
    auto owned = std::make_unique<FakeModelRunner>(kVocab, num_blocks, kBlock, 1024, eos);
    runner = owned.get();
    auto created = Engine::Create(std::move(owned), nullptr, options);
    CHECK(created.ok()) << created.status();
    engine = std::move(*created);
  }
  GenerateRequest Request(const std::string& id, std::vector<int32_t> prompt, SamplingParams p) {
    GenerateRequest r;
    r.request_id = id;
    r.prompt_token_ids = std::move(prompt);
    r.params = std::move(p);
    r.on_output = collector.Callback();
    return r;
  }
  // Waits (polling stats) until `pred` holds.
  bool WaitStats(const std::function<bool(const EngineStats&)>& pred,
                 absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (pred(engine->stats())) return true;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return pred(engine->stats());
  }
  FakeModelRunner* runner;
  Collector collector;
  std::unique_ptr<Engine> engine;
};

SamplingParams Greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

// Prefills `prompt` on P with held KV; returns what on_prefilled reported.
PrefilledKv PrefillAndHold(Node& p, const std::string& id, std::vector<int32_t> prompt,
                           SamplingParams params) {
  auto slot = std::make_shared<Waitable<PrefilledKv>>();
  GenerateRequest r = p.Request(id, std::move(prompt), std::move(params));
  r.hold_kv_after_prefill = true;
  r.on_prefilled = [slot](const PrefilledKv& kv) { slot->Set(kv); };
  CHECK(p.engine->Submit(std::move(r)).ok());
  auto kv = slot->Wait();
  CHECK(kv.has_value()) << "no on_prefilled for " << id;
  return *kv;
}

struct RemoteRun {
  RemoteKvReservation reservation;
  PrefilledKv prefilled;
  int blocks_copied = 0;
};

// The whole disaggregated flow for one request: D reserves, P prefills and holds, the test copies
// the KV, D completes, P releases.
RemoteRun RunRemote(Node& p, Node& d, const std::string& id, const std::vector<int32_t>& prompt,
                    const SamplingParams& params) {
  RemoteRun run;
  auto reservation = ReserveRemotePrefill(*d.engine, d.Request(id, prompt, params));
  CHECK(reservation.ok()) << reservation.status();
  run.reservation = *reservation;
  run.prefilled = PrefillAndHold(p, id, prompt, params);
  CHECK_EQ(run.prefilled.num_tokens, static_cast<int>(prompt.size()));
  run.blocks_copied = CopyPromptKv(p.engine->kv_layout(), run.prefilled.block_ids,
                                   d.engine->kv_layout(), run.reservation.block_ids,
                                   run.prefilled.num_tokens, run.reservation.num_cached_tokens);
  d.engine->CompleteRemotePrefill(
      id, RemotePrefillResult{run.prefilled.first_token, run.prefilled.first_token_logprobs});
  p.engine->ReleaseHeldKv(id);
  return run;
}

TEST(EngineDisaggTest, RemotePrefillBetweenTwoEnginesMatchesReference) {
  Node p(64), d(64);
  std::mt19937 rng(1);
  // Local requests on D run throughout.
  std::vector<std::vector<int32_t>> local;
  for (int i = 0; i < 4; ++i) {
    local.push_back(RandomPrompt(rng, 3 + rng() % 20, kVocab));
    ASSERT_TRUE(d.engine->Submit(d.Request(absl::StrCat("local", i), local[i], Greedy(30))).ok());
  }
  std::vector<std::vector<int32_t>> remote;
  remote.push_back(RandomPrompt(rng, 12, kVocab));
  for (int i = 1; i < 5; ++i) remote.push_back(RandomPrompt(rng, 1 + rng() % 25, kVocab));
  SamplingParams with_logprobs = Greedy(12);
  with_logprobs.logprobs = 3;
  for (int i = 0; i < 5; ++i) {
    const RemoteRun run = RunRemote(p, d, absl::StrCat("r", i), remote[i], with_logprobs);
    EXPECT_EQ(run.reservation.num_cached_tokens, 0);
    EXPECT_EQ(run.reservation.block_ids.size(), (remote[i].size() + kBlock - 1) / kBlock);
  }
  // A prefix-cache hit on D: shares r0's first 2 blocks, published when r0's KV arrived. Only the
  // other 2 blocks are copied.
  std::vector<int32_t> hit(remote[0].begin(), remote[0].begin() + 2 * kBlock);
  for (int t : {5, 6, 7, 8, 9}) hit.push_back(t);
  const RemoteRun run = RunRemote(p, d, "hit", hit, with_logprobs);
  EXPECT_EQ(run.reservation.num_cached_tokens, 2 * kBlock);
  EXPECT_EQ(run.blocks_copied, 2);
  remote.push_back(hit);

  ASSERT_TRUE(d.collector.WaitFinished(4 + 6));
  ASSERT_TRUE(p.collector.WaitFinished(6));
  for (size_t i = 0; i < remote.size(); ++i) {
    const std::string id = i < 5 ? absl::StrCat("r", i) : "hit";
    const Result r = d.collector.Get(id);
    EXPECT_EQ(r.finish, FinishReason::kLength) << id;
    EXPECT_EQ(r.tokens, FakeModelRunner::ReferenceGreedy(remote[i], 12, kVocab)) << id;
    ASSERT_EQ(r.logprobs.size(), r.tokens.size()) << id;
    EXPECT_EQ(r.outputs_after_finish, 0) << id;
    EXPECT_EQ(r.outputs_with_timings, 1) << id;
    EXPECT_EQ(r.usage.prompt_tokens, static_cast<int>(remote[i].size()));
    EXPECT_EQ(r.usage.completion_tokens, 12);
    // P's final output: the one token, finish length.
    const Result pr = p.collector.Get(id);
    EXPECT_EQ(pr.finish, FinishReason::kLength) << id;
    ASSERT_EQ(pr.tokens.size(), 1u) << id;
    EXPECT_EQ(pr.tokens[0], r.tokens[0]) << id;
    ASSERT_EQ(pr.logprobs.size(), 1u);
    EXPECT_EQ(pr.logprobs[0].top.size(), r.logprobs[0].top.size());
    EXPECT_FLOAT_EQ(pr.logprobs[0].logprob, r.logprobs[0].logprob);
  }
  EXPECT_EQ(d.collector.Get("hit").usage.cached_prompt_tokens, 2 * kBlock);
  for (int i = 0; i < 4; ++i) {
    const Result r = d.collector.Get(absl::StrCat("local", i));
    EXPECT_EQ(r.tokens, FakeModelRunner::ReferenceGreedy(local[i], 30, kVocab)) << i;
  }
  ASSERT_TRUE(p.WaitStats([](const EngineStats& s) { return s.held_kv == 0; }));
  ASSERT_TRUE(d.WaitStats([](const EngineStats& s) { return s.blocks_used == 0; }));
  p.engine->Shutdown(absl::Seconds(5));
  d.engine->Shutdown(absl::Seconds(5));
  EXPECT_EQ(p.engine->stats().blocks_used, 0);
  EXPECT_THAT(p.runner->violations(), IsEmpty());
  EXPECT_THAT(d.runner->violations(), IsEmpty());
}

// A missing copy of one block (K and V) is caught by the fake's history check: the test harness
// above can fail.
TEST(EngineDisaggTest, IncompleteCopyIsDetected) {
  Node p(32), d(32);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  auto reservation = ReserveRemotePrefill(*d.engine, d.Request("x", prompt, Greedy(4)));
  ASSERT_TRUE(reservation.ok());
  const PrefilledKv kv = PrefillAndHold(p, "x", prompt, Greedy(4));
  // Copy blocks 0 and 2 only.
  CopyPromptKv(p.engine->kv_layout(), kv.block_ids, d.engine->kv_layout(), reservation->block_ids,
               kBlock, 0);
  std::vector<int32_t> src_last = {kv.block_ids[2]}, dst_last = {reservation->block_ids[2]};
  CopyPromptKv(p.engine->kv_layout(), src_last, d.engine->kv_layout(), dst_last, 2, 0);
  d.engine->CompleteRemotePrefill("x", RemotePrefillResult{kv.first_token, std::nullopt});
  ASSERT_TRUE(d.collector.WaitFinished(1));
  EXPECT_EQ(d.collector.Get("x").finish, FinishReason::kError);
  EXPECT_FALSE(d.runner->violations().empty());
}

TEST(EngineDisaggTest, FailedRemotePrefillFallsBackToLocalPrefill) {
  Node d(32);
  std::mt19937 rng(2);
  // Seed D's prefix cache so that the fallback also starts after a cached prefix.
  const std::vector<int32_t> base = RandomPrompt(rng, 9, kVocab);
  ASSERT_TRUE(d.engine->Submit(d.Request("base", base, Greedy(1))).ok());
  ASSERT_TRUE(d.collector.WaitFinished(1));
  std::vector<int32_t> prompt(base.begin(), base.begin() + 8);
  for (int32_t t : RandomPrompt(rng, 7, kVocab)) prompt.push_back(t);

  SamplingParams lp = Greedy(6);
  lp.logprobs = 2;
  const std::vector<std::pair<std::string, absl::StatusOr<RemotePrefillResult>>> failures = {
      {"error", absl::UnavailableError("prefill worker died")},
      {"bad_token", RemotePrefillResult{kVocab + 3, std::nullopt}},
      {"no_logprobs", RemotePrefillResult{1, std::nullopt}},  // lp requested, not given
  };
  int finished = 1;
  for (const auto& [id, result] : failures) {
    auto reservation = ReserveRemotePrefill(*d.engine, d.Request(id, prompt, lp));
    ASSERT_TRUE(reservation.ok()) << reservation.status();
    // 8 from "base"; later ones also hit the third block, computed by the first fallback.
    const int cached = reservation->num_cached_tokens;
    EXPECT_EQ(cached, finished == 1 ? 8 : 12);
    // A half-done transfer scribbled over the uncached blocks.
    const KvCacheLayout layout = d.engine->kv_layout();
    for (size_t i = cached / kBlock; i < reservation->block_ids.size(); ++i) {
      for (int kv = 0; kv < 2; ++kv) {
        std::memset(layout.BlockPtr(0, kv, reservation->block_ids[i]), 0x5a, layout.block_bytes);
      }
    }
    d.engine->CompleteRemotePrefill(id, result);
    ASSERT_TRUE(d.collector.WaitFinished(++finished));
    const Result r = d.collector.Get(id);
    EXPECT_EQ(r.finish, FinishReason::kLength) << id;
    EXPECT_EQ(r.tokens, FakeModelRunner::ReferenceGreedy(prompt, 6, kVocab)) << id;
    EXPECT_EQ(r.logprobs.size(), 6u) << id;
    EXPECT_EQ(r.usage.cached_prompt_tokens, cached) << id;
    EXPECT_EQ(r.outputs_with_timings, 1) << id;
  }
  d.engine->Shutdown(absl::Seconds(5));
  EXPECT_EQ(d.engine->stats().blocks_used, 0);
  EXPECT_THAT(d.runner->violations(), IsEmpty());
}

TEST(EngineDisaggTest, CancelOrShutdownWhileAwaitingKvFreesBlocks) {
  Node d(32);
  auto reservation =
      ReserveRemotePrefill(*d.engine, d.Request("a", {1, 2, 3, 4, 5, 6, 7, 8, 9}, Greedy(5)));
  ASSERT_TRUE(reservation.ok());
  ASSERT_TRUE(d.WaitStats([](const EngineStats& s) { return s.awaiting_kv == 1; }));
  EngineStats stats = d.engine->stats();
  EXPECT_EQ(stats.blocks_used, 3);  // 10 positions
  EXPECT_EQ(stats.waiting, 1);
  EXPECT_EQ(stats.running, 0);
  d.engine->Cancel("a");
  ASSERT_TRUE(d.collector.WaitFinished(1));
  EXPECT_EQ(d.collector.Get("a").finish, FinishReason::kAbort);
  EXPECT_TRUE(d.collector.Get("a").tokens.empty());
  ASSERT_TRUE(
      d.WaitStats([](const EngineStats& s) { return s.blocks_used == 0 && s.awaiting_kv == 0; }));
  // Late and unknown completions are no-ops (a later request's end proves they were processed).
  d.engine->CompleteRemotePrefill("a", RemotePrefillResult{1, std::nullopt});
  d.engine->CompleteRemotePrefill("nobody", RemotePrefillResult{1, std::nullopt});
  ASSERT_TRUE(d.engine->Submit(d.Request("probe", {1}, Greedy(1))).ok());
  ASSERT_TRUE(d.collector.WaitFinished(2));
  EXPECT_EQ(d.collector.Get("a").outputs, 1);
  EXPECT_EQ(d.collector.Get("nobody").outputs, 0);
  // The id is free again.
  auto again = ReserveRemotePrefill(*d.engine, d.Request("a", {1, 2, 3}, Greedy(5)));
  ASSERT_TRUE(again.ok());
  d.engine->Shutdown(absl::ZeroDuration());
  EXPECT_EQ(d.collector.finished(), 3);
  EXPECT_EQ(d.collector.Get("a").finish, FinishReason::kAbort);
  EXPECT_EQ(d.collector.Get("a").outputs, 2);  // one abort per request named "a"
  EXPECT_EQ(d.engine->stats().blocks_used, 0);
  EXPECT_EQ(d.runner->forward_calls(), 1);  // the probe only
}

TEST(EngineDisaggTest, ReservationWaitsForBlocksThenSucceedsOrTimesOut) {
  EngineOptions options;
  options.reserve_timeout = absl::Milliseconds(300);
  Node d(8, options);
  std::vector<int32_t> big(20, 3), mid(10, 4), huge(25, 5), small = {7, 8};
  auto first = ReserveRemotePrefill(*d.engine, d.Request("big", big, Greedy(3)));  // 6 blocks
  ASSERT_TRUE(first.ok());
  // mid needs 3 blocks, 2 are free: it waits, FCFS ahead of later reservations.
  auto mid_slot = std::make_shared<Waitable<absl::StatusOr<RemoteKvReservation>>>();
  ASSERT_TRUE(d.engine
                  ->SubmitRemotePrefill(d.Request("mid", mid, Greedy(3)),
                                        [mid_slot](auto r) { mid_slot->Set(r); })
                  .ok());
  auto small_slot = std::make_shared<Waitable<absl::StatusOr<RemoteKvReservation>>>();
  ASSERT_TRUE(d.engine
                  ->SubmitRemotePrefill(d.Request("small", small, Greedy(3)),
                                        [small_slot](auto r) { small_slot->Set(r); })
                  .ok());
  ASSERT_TRUE(d.WaitStats([](const EngineStats& s) { return s.waiting == 3; }));
  EXPECT_FALSE(mid_slot->Wait(absl::Milliseconds(50)).has_value());
  EXPECT_FALSE(small_slot->Wait(absl::Milliseconds(1)).has_value());
  d.engine->Cancel("big");  // frees 6 blocks: mid and small get theirs
  auto mid_r = mid_slot->Wait();
  ASSERT_TRUE(mid_r.has_value());
  ASSERT_TRUE(mid_r->ok()) << mid_r->status();
  ASSERT_TRUE(small_slot->Wait().has_value());
  // huge (7 blocks) cannot be had while mid and small hold 4: ResourceExhausted after the timeout.
  const absl::Time start = absl::Now();
  auto huge_r = ReserveRemotePrefill(*d.engine, d.Request("huge", huge, Greedy(3)));
  EXPECT_EQ(huge_r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  // The request's own deadline, when earlier, wins.
  GenerateRequest soon = d.Request("soon", huge, Greedy(3));
  soon.deadline = absl::Now() + absl::Milliseconds(20);
  EXPECT_EQ(ReserveRemotePrefill(*d.engine, std::move(soon)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Cancel while still queued: on_reserved(Cancelled), nothing else.
  auto queued = std::make_shared<Waitable<absl::StatusOr<RemoteKvReservation>>>();
  ASSERT_TRUE(d.engine
                  ->SubmitRemotePrefill(d.Request("queued", huge, Greedy(3)),
                                        [queued](auto r) { queued->Set(r); })
                  .ok());
  d.engine->Cancel("queued");
  auto cancelled = queued->Wait();
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ(cancelled->status().code(), absl::StatusCode::kCancelled);
  // Shutdown while queued: on_reserved(Unavailable).
  auto at_exit = std::make_shared<Waitable<absl::StatusOr<RemoteKvReservation>>>();
  ASSERT_TRUE(d.engine
                  ->SubmitRemotePrefill(d.Request("at_exit", huge, Greedy(3)),
                                        [at_exit](auto r) { at_exit->Set(r); })
                  .ok());
  d.engine->Shutdown(absl::ZeroDuration());
  auto unavailable = at_exit->Wait();
  ASSERT_TRUE(unavailable.has_value());
  EXPECT_EQ(unavailable->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(at_exit->sets(), 1);
  // Rejected reservations got no output; big, mid and small were aborted.
  EXPECT_EQ(d.collector.finished(), 3);
  EXPECT_EQ(d.collector.Get("huge").outputs, 0);
  EXPECT_EQ(d.collector.Get("queued").outputs, 0);
  EXPECT_EQ(d.collector.Get("at_exit").outputs, 0);
  EXPECT_EQ(d.engine->stats().blocks_used, 0);
}

TEST(EngineDisaggTest, FirstTokenAppliesStopChecksAndPublishesThePrefix) {
  const std::vector<int32_t> prompt = {9, 8, 7, 6, 5, 4, 3, 2, 1};
  const std::vector<int32_t> ref = FakeModelRunner::ReferenceGreedy(prompt, 3, kVocab);
  Node d(32, EngineOptions{}, /*eos=*/{63});
  // max_tokens 1: finished by the first token itself.
  auto r1 = ReserveRemotePrefill(*d.engine, d.Request("one", prompt, Greedy(1)));
  ASSERT_TRUE(r1.ok());
  d.engine->CompleteRemotePrefill("one", RemotePrefillResult{ref[0], std::nullopt});
  ASSERT_TRUE(d.collector.WaitFinished(1));
  Result one = d.collector.Get("one");
  EXPECT_EQ(one.finish, FinishReason::kLength);
  EXPECT_EQ(one.tokens, std::vector<int32_t>{ref[0]});
  EXPECT_EQ(one.outputs, 1);
  EXPECT_EQ(one.outputs_with_timings, 1);
  // EOS as the first token: stop.
  auto r2 = ReserveRemotePrefill(*d.engine, d.Request("eos", {4, 4, 4}, Greedy(5)));
  ASSERT_TRUE(r2.ok());
  d.engine->CompleteRemotePrefill("eos", RemotePrefillResult{63, std::nullopt});
  ASSERT_TRUE(d.collector.WaitFinished(2));
  EXPECT_EQ(d.collector.Get("eos").finish, FinishReason::kStop);
  EXPECT_EQ(d.collector.Get("eos").tokens, std::vector<int32_t>{63});
  // (Nobody wrote the KV of "one" and "eos": they never needed it.) A remote prefill whose KV
  // did arrive publishes its full blocks: a later local request hits them.
  Node p(32);
  const std::vector<int32_t> prompt2 = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  const RemoteRun run = RunRemote(p, d, "two", prompt2, Greedy(1));
  ASSERT_TRUE(d.collector.WaitFinished(3));
  std::vector<int32_t> longer = prompt2;
  longer.push_back(20);
  ASSERT_TRUE(d.engine->Submit(d.Request("local", longer, Greedy(4))).ok());
  ASSERT_TRUE(d.collector.WaitFinished(4));
  const Result local = d.collector.Get("local");
  EXPECT_EQ(local.usage.cached_prompt_tokens, 8);  // two full blocks published by CompleteKv
  EXPECT_EQ(local.tokens, FakeModelRunner::ReferenceGreedy(longer, 4, kVocab));
  p.engine->Shutdown(absl::Seconds(5));
  d.engine->Shutdown(absl::Seconds(5));
  EXPECT_THAT(d.runner->violations(), IsEmpty());
  EXPECT_EQ(run.prefilled.first_token, d.collector.Get("two").tokens[0]);
}

TEST(EngineDisaggTest, HeldKvReleasedByReleaseCancelOrLeaseExpiry) {
  EngineOptions options;
  options.held_kv_lease = absl::Milliseconds(200);
  Node p(32, options);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  const PrefilledKv kv = PrefillAndHold(p, "h", prompt, Greedy(7));
  EXPECT_EQ(kv.request_id, "h");
  EXPECT_EQ(kv.num_tokens, 6);
  EXPECT_EQ(kv.block_ids.size(), 2u);
  EXPECT_EQ(kv.first_token, FakeModelRunner::ReferenceGreedy(prompt, 1, kVocab)[0]);
  EXPECT_EQ(kv.prefix_cached_tokens, 0);
  EXPECT_FALSE(kv.first_token_logprobs.has_value());
  ASSERT_TRUE(p.collector.WaitFinished(1));
  const Result r = p.collector.Get("h");
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_EQ(r.tokens, std::vector<int32_t>{kv.first_token});
  EXPECT_EQ(r.usage.completion_tokens, 1);
  EXPECT_EQ(r.outputs_with_timings, 1);
  ASSERT_TRUE(p.WaitStats([](const EngineStats& s) { return s.held_kv == 1; }));
  EXPECT_EQ(p.engine->stats().blocks_used, 2);
  // The id stays live while held.
  EXPECT_EQ(p.engine->Submit(p.Request("h", {1}, Greedy(1))).code(),
            absl::StatusCode::kAlreadyExists);
  // Lease expiry frees the blocks.
  ASSERT_TRUE(
      p.WaitStats([](const EngineStats& s) { return s.held_kv == 0 && s.blocks_used == 0; }));
  EXPECT_TRUE(p.engine->Submit(p.Request("h", {1}, Greedy(1))).ok());
  ASSERT_TRUE(p.collector.WaitFinished(2));
  // Prefix-cache hit on P is reported; ReleaseHeldKv and Cancel free too.
  std::vector<int32_t> longer = prompt;
  longer.insert(longer.end(), {7, 8, 9});
  const PrefilledKv kv2 = PrefillAndHold(p, "h2", longer, Greedy(1));
  EXPECT_EQ(kv2.prefix_cached_tokens, 4);
  EXPECT_EQ(kv2.block_ids[0], kv.block_ids[0]);  // the cached block is reused
  ASSERT_TRUE(p.WaitStats([](const EngineStats& s) { return s.held_kv == 1; }));
  p.engine->ReleaseHeldKv("h2");
  p.engine->ReleaseHeldKv("h2");  // idempotent
  ASSERT_TRUE(p.WaitStats([](const EngineStats& s) { return s.held_kv == 0; }));
  PrefillAndHold(p, "h3", prompt, Greedy(1));
  ASSERT_TRUE(p.WaitStats([](const EngineStats& s) { return s.held_kv == 1; }));
  p.engine->Cancel("h3");
  ASSERT_TRUE(
      p.WaitStats([](const EngineStats& s) { return s.held_kv == 0 && s.blocks_used == 0; }));
  // Shutdown frees whatever is still held.
  PrefillAndHold(p, "h4", prompt, Greedy(1));
  ASSERT_TRUE(p.WaitStats([](const EngineStats& s) { return s.held_kv == 1; }));
  p.engine->Shutdown(absl::ZeroDuration());
  EXPECT_EQ(p.engine->stats().blocks_used, 0);
  EXPECT_EQ(p.engine->stats().held_kv, 0);
  EXPECT_THAT(p.runner->violations(), IsEmpty());
}

// Held blocks are never handed out, evicted or written while other requests churn the cache (with
// preemptions): their bytes stay identical until release.
TEST(EngineDisaggTest, HeldBlocksUnchangedUnderChurn) {
  EngineOptions options;
  options.max_num_batched_tokens = 16;
  absl::Notification all_submitted;  // outlives the engine, whose runner's hook waits on it
  Node p(16, options);
  std::mt19937 rng(3);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 10, kVocab);
  const PrefilledKv kv = PrefillAndHold(p, "held", prompt, Greedy(1));
  ASSERT_TRUE(p.collector.WaitFinished(1));
  const KvCacheLayout layout = p.engine->kv_layout();
  auto snapshot = [&] {
    std::string bytes;
    for (int32_t b : kv.block_ids) {
      for (int k = 0; k < 2; ++k) bytes.append(layout.BlockPtr(0, k, b), layout.block_bytes);
    }
    return bytes;
  };
  const std::string before = snapshot();
  // The churn's first forward pass waits until all 24 requests are queued, so they compete for the
  // cache together and preempt each other on every run (not only when the submitting thread wins
  // the race against the engine thread).
  p.runner->set_forward_hook(
      [&] { all_submitted.WaitForNotificationWithTimeout(absl::Seconds(30)); });
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 24; ++i) {
    prompts.push_back(RandomPrompt(rng, 2 + rng() % 12, kVocab));
    ASSERT_TRUE(p.engine->Submit(p.Request(absl::StrCat("c", i), prompts[i], Greedy(12))).ok());
  }
  all_submitted.Notify();
  ASSERT_TRUE(p.collector.WaitFinished(25));
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(p.collector.Get(absl::StrCat("c", i)).tokens,
              FakeModelRunner::ReferenceGreedy(prompts[i], 12, kVocab));
  }
  EXPECT_GT(p.engine->stats().preemptions, 0);
  EXPECT_EQ(snapshot(), before);
  ASSERT_TRUE(p.WaitStats([](const EngineStats& s) { return s.running == 0; }));
  EXPECT_EQ(p.engine->stats().blocks_used, 3);
  p.engine->ReleaseHeldKv("held");
  ASSERT_TRUE(p.WaitStats([](const EngineStats& s) { return s.blocks_used == 0; }));
  p.engine->Shutdown(absl::Seconds(5));
  EXPECT_THAT(p.runner->violations(), IsEmpty());
}

TEST(EngineDisaggTest, RejectsInconsistentRequests) {
  Node n(16);
  GenerateRequest r = n.Request("a", {1, 2}, Greedy(2));
  EXPECT_EQ(n.engine->SubmitRemotePrefill(r, nullptr).code(), absl::StatusCode::kInvalidArgument);
  GenerateRequest hold = r;
  hold.hold_kv_after_prefill = true;
  EXPECT_EQ(n.engine->SubmitRemotePrefill(hold, [](auto) {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(n.engine->Submit(hold).code(), absl::StatusCode::kInvalidArgument);  // on_prefilled
  GenerateRequest empty = r;
  empty.prompt_token_ids.clear();
  EXPECT_EQ(n.engine->SubmitRemotePrefill(empty, [](auto) {}).code(),
            absl::StatusCode::kInvalidArgument);
  n.engine->Shutdown(absl::ZeroDuration());
  EXPECT_EQ(n.engine->SubmitRemotePrefill(r, [](auto) {}).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(n.collector.finished(), 0);
}

}  // namespace
}  // namespace tandem

#include "runtime/scheduler/scheduler.h"

#include <algorithm>

#include "runtime/base/logging.h"

namespace tandem {

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config), kv_(config.num_blocks, config.block_size, config.enable_prefix_caching) {
  CHECK_GT(config.max_num_seqs, 0);
  CHECK_GT(config.max_num_batched_tokens, 0);
  CHECK_GE(config.long_prefill_token_threshold, 0);
  kv_.set_record_events(config.record_prefix_cache_events);
}

int64_t Scheduler::WaitingPromptTokens() const {
  int64_t total = 0;
  for (const std::deque<int64_t>* queue : {&waiting_, &ready_}) {
    for (int64_t id : *queue) {
      const Sequence& s = seqs_.at(id);
      total += std::max(0, s.num_prompt_tokens - s.num_computed);
    }
  }
  return total;
}

void Scheduler::Add(int64_t id, std::vector<int32_t> prompt, int priority, bool skip_prefix_cache) {
  CHECK(!prompt.empty());
  Sequence seq;
  seq.id = id;
  seq.priority = priority;
  seq.skip_prefix_cache = skip_prefix_cache;
  seq.num_prompt_tokens = static_cast<int>(prompt.size());
  seq.tokens = std::move(prompt);
  CHECK(seqs_.emplace(id, std::move(seq)).second) << "duplicate sequence id " << id;
  // Behind every waiting sequence of the same or a more urgent priority (FCFS within a class).
  auto pos = std::find_if(waiting_.begin(), waiting_.end(),
                          [&](int64_t other) { return seqs_.at(other).priority > priority; });
  waiting_.insert(pos, id);
}

size_t Scheduler::VictimIndex() const {
  CHECK(!running_.empty());
  size_t victim = running_.size() - 1;
  for (size_t i = running_.size(); i-- > 0;) {
    if (seqs_.at(running_[i]).priority > seqs_.at(running_[victim]).priority) victim = i;
  }
  return victim;
}

bool Scheduler::Abort(int64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  switch (it->second.state) {
    case SequenceState::kWaiting:
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
      break;
    case SequenceState::kRunning:
      running_.erase(std::find(running_.begin(), running_.end(), id));
      break;
    case SequenceState::kAwaitingKv:
      --num_awaiting_;
      break;
    case SequenceState::kReady:
      ready_.erase(std::find(ready_.begin(), ready_.end(), id));
      break;
    case SequenceState::kHeld:
      --num_held_;
      break;
  }
  kv_.Free(id);
  seqs_.erase(it);
  return true;
}

bool Scheduler::CanAddAwaitingKv(int64_t id, std::span<const int32_t> prompt) const {
  if (prompt.empty() || seqs_.contains(id)) return false;
  const PrefixMatch match = kv_.FindCachedPrefix(prompt);
  return kv_.CanAllocate(id, &match, static_cast<int>(prompt.size()) + 1);
}

KvReservation Scheduler::AddAwaitingKv(int64_t id, std::vector<int32_t> prompt) {
  CHECK(!prompt.empty());
  CHECK(!seqs_.contains(id)) << "duplicate sequence id " << id;
  const int len = static_cast<int>(prompt.size());
  const PrefixMatch match = kv_.FindCachedPrefix(prompt);
  CHECK(kv_.CanAllocate(id, &match, len + 1)) << "AddAwaitingKv without CanAddAwaitingKv";
  kv_.Allocate(id, &match, len + 1, len);
  Sequence seq;
  seq.id = id;
  seq.num_prompt_tokens = len;
  seq.tokens = std::move(prompt);
  seq.num_computed = match.num_tokens(config_.block_size);
  seq.num_cached_prompt_tokens = seq.num_computed;
  seq.state = SequenceState::kAwaitingKv;
  KvReservation reservation;
  const std::span<const int32_t> table = kv_.BlockTable(id);
  const size_t prompt_blocks = (len + config_.block_size - 1) / config_.block_size;
  reservation.block_ids.assign(table.begin(), table.begin() + prompt_blocks);
  reservation.num_cached_tokens = seq.num_computed;
  seqs_.emplace(id, std::move(seq));
  ++num_awaiting_;
  return reservation;
}

void Scheduler::CompleteKv(int64_t id, int32_t first_token) {
  Sequence& seq = Mutable(id);
  CHECK(seq.state == SequenceState::kAwaitingKv) << "CompleteKv of sequence " << id;
  CHECK_EQ(static_cast<int>(seq.tokens.size()), seq.num_prompt_tokens);
  seq.num_computed = seq.num_prompt_tokens;
  kv_.CommitComputed(id, seq.tokens, seq.num_computed);
  seq.tokens.push_back(first_token);
  seq.state = SequenceState::kReady;
  --num_awaiting_;
  ready_.push_back(id);
}

void Scheduler::FailKv(int64_t id) {
  Sequence& seq = Mutable(id);
  CHECK(seq.state == SequenceState::kAwaitingKv) << "FailKv of sequence " << id;
  seq.state = SequenceState::kReady;
  --num_awaiting_;
  ready_.push_back(id);
}

void Scheduler::Hold(int64_t id) {
  Sequence& seq = Mutable(id);
  CHECK(seq.running()) << "Hold of a sequence that is not running: " << id;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  seq.state = SequenceState::kHeld;
  ++num_held_;
}

Sequence& Scheduler::Mutable(int64_t id) {
  auto it = seqs_.find(id);
  CHECK(it != seqs_.end()) << "unknown sequence " << id;
  return it->second;
}

const Sequence* Scheduler::Get(int64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

void Scheduler::Preempt(int64_t id) {
  Sequence& seq = Mutable(id);
  CHECK(seq.running());
  DropDrafts(seq);
  kv_.Free(id);
  seq.state = SequenceState::kWaiting;
  seq.num_computed = 0;
  ++seq.num_preemptions;
  ++num_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  // At the front of its priority class: it was admitted before everything waiting there.
  auto pos = std::find_if(waiting_.begin(), waiting_.end(),
                          [&](int64_t other) { return seqs_.at(other).priority >= seq.priority; });
  waiting_.insert(pos, id);
}

SchedulerStep Scheduler::Schedule() {
  SchedulerStep step;
  int budget = config_.max_num_batched_tokens;
  // A prefill chunk's first share of the step (decodes are one token anyway).
  const int cap = config_.long_prefill_token_threshold > 0 ? config_.long_prefill_token_threshold
                                                           : config_.max_num_batched_tokens;
  auto unschedule = [&](int64_t id) {
    for (auto it = step.chunks.begin(); it != step.chunks.end(); ++it) {
      if (it->seq_id == id) {
        budget += it->num_tokens;
        step.chunks.erase(it);
        return;
      }
    }
  };

  // Running sequences: decodes (pass 0) before prefill chunks (pass 1).
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      const int64_t id = running_[i];
      Sequence& seq = Mutable(id);
      seq.verifying.clear();  // the last step's verification is over
      int remaining = static_cast<int>(seq.tokens.size()) - seq.num_computed;
      CHECK_GT(remaining, 0);
      if ((remaining == 1 + seq.num_draft) != (pass == 0)) continue;
      if (seq.num_draft > 0 &&
          (remaining > budget || !kv_.CanAllocate(id, nullptr, seq.num_computed + remaining))) {
        // Drafts take the whole chunk or nothing, and never preempt anyone.
        DropDrafts(seq);
        remaining = 1;
      }
      const int n = seq.num_draft > 0 ? remaining : std::min({remaining, budget, cap});
      bool self_preempted = false;
      while (!kv_.CanAllocate(id, nullptr, seq.num_computed + n)) {
        // The least urgent running sequence, the newest among equals.
        const size_t v = VictimIndex();
        const int64_t victim = running_[v];
        unschedule(victim);
        Preempt(victim);
        step.preempted.push_back(victim);
        if (victim == id) {
          self_preempted = true;
          break;
        }
        if (v < i) --i;  // running_[i] is still `id`
      }
      if (self_preempted) {
        // Whatever followed it is more urgent (or it was the last): carry on at the same index.
        --i;  // wraps at 0 and comes back with ++i
        continue;
      }
      kv_.Allocate(id, nullptr, seq.num_computed + n);
      step.chunks.push_back(
          {id, seq.num_computed, n, seq.num_computed + n == int(seq.tokens.size())});
      budget -= n;
    }
  }

  // Ready sequences (they own their blocks, so even a step that had to preempt admits them), then
  // waiting ones, FCFS, unless this step had to preempt.
  while (!ready_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    const int64_t id = ready_.front();
    Sequence& seq = Mutable(id);
    const int n = std::min({static_cast<int>(seq.tokens.size()) - seq.num_computed, budget, cap});
    CHECK_GT(n, 0);
    // The reservation covers prompt + 1 token: a ready sequence never needs a new block here.
    CHECK(kv_.CanAllocate(id, nullptr, seq.num_computed + n));
    kv_.Allocate(id, nullptr, seq.num_computed + n);
    seq.state = SequenceState::kRunning;
    ready_.pop_front();
    running_.push_back(id);
    step.chunks.push_back(
        {id, seq.num_computed, n, seq.num_computed + n == static_cast<int>(seq.tokens.size())});
    budget -= n;
  }
  while (step.preempted.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    const int64_t id = waiting_.front();
    Sequence& seq = Mutable(id);
    const PrefixMatch match =
        seq.skip_prefix_cache ? PrefixMatch{} : kv_.FindCachedPrefix(seq.tokens);
    const int cached = match.num_tokens(config_.block_size);
    const int n = std::min({static_cast<int>(seq.tokens.size()) - cached, budget, cap});
    if (!kv_.CanAllocate(id, &match, cached + n)) break;
    kv_.Allocate(id, &match, cached + n, static_cast<int>(seq.tokens.size()));
    if (seq.num_cached_prompt_tokens < 0) {
      seq.num_cached_prompt_tokens = std::min(cached, seq.num_prompt_tokens);
    }
    seq.num_computed = cached;
    seq.state = SequenceState::kRunning;
    waiting_.pop_front();
    running_.push_back(id);
    step.chunks.push_back({id, cached, n, cached + n == static_cast<int>(seq.tokens.size())});
    budget -= n;
  }
  // What the cap left unused tops the capped prefill chunks up, in plan order, where blocks allow
  // without preempting.
  for (size_t i = 0; i < step.chunks.size() && budget > 0 && cap < config_.max_num_batched_tokens;
       ++i) {
    ScheduledChunk& chunk = step.chunks[i];
    const int len = static_cast<int>(Mutable(chunk.seq_id).tokens.size());
    const int end = chunk.start_pos + chunk.num_tokens;
    const int extra = std::min(len - end, budget);
    if (extra <= 0 || !kv_.CanAllocate(chunk.seq_id, nullptr, end + extra)) continue;
    kv_.Allocate(chunk.seq_id, nullptr, end + extra);
    chunk.num_tokens += extra;
    chunk.need_logits = end + extra == len;
    budget -= extra;
  }
  step.num_batched_tokens = config_.max_num_batched_tokens - budget;
  return step;
}

void Scheduler::OnStepComputed(const SchedulerStep& step) {
  for (const ScheduledChunk& chunk : step.chunks) {
    Sequence& seq = Mutable(chunk.seq_id);
    CHECK(seq.running());
    CHECK_EQ(seq.num_computed, chunk.start_pos) << "plan applied twice for " << chunk.seq_id;
    seq.num_computed += chunk.num_tokens;
    CHECK_LE(seq.num_computed, static_cast<int>(seq.tokens.size()));
    // Draft positions are not the sequence's yet: they never enter the prefix cache.
    kv_.CommitComputed(
        chunk.seq_id, seq.tokens,
        std::min(seq.num_computed, static_cast<int>(seq.tokens.size()) - seq.num_draft));
  }
}

void Scheduler::DropDrafts(Sequence& seq) {
  seq.tokens.resize(seq.tokens.size() - static_cast<size_t>(seq.num_draft));
  seq.num_computed = std::min(seq.num_computed, static_cast<int>(seq.tokens.size()));
  seq.num_draft = 0;
  seq.verifying.clear();
}

void Scheduler::SetDrafts(int64_t id, std::span<const int32_t> drafts) {
  Sequence& seq = Mutable(id);
  CHECK(seq.running());
  CHECK_EQ(seq.num_draft, 0) << "drafts set twice for " << id;
  CHECK_EQ(seq.num_computed + 1, static_cast<int>(seq.tokens.size()))
      << "drafts for a sequence that is not decoding";
  seq.verifying.clear();
  seq.tokens.insert(seq.tokens.end(), drafts.begin(), drafts.end());
  seq.num_draft = static_cast<int>(drafts.size());
}

std::vector<int32_t> Scheduler::TakeDrafts(int64_t id) {
  Sequence& seq = Mutable(id);
  CHECK(seq.running());
  if (seq.num_draft == 0) return {};
  CHECK_EQ(seq.num_computed, static_cast<int>(seq.tokens.size())) << "drafts not computed";
  const size_t keep = seq.tokens.size() - static_cast<size_t>(seq.num_draft);
  seq.verifying.assign(seq.tokens.begin() + static_cast<std::ptrdiff_t>(keep), seq.tokens.end());
  seq.verify_start = static_cast<int>(keep);
  seq.tokens.resize(keep);
  seq.num_computed = static_cast<int>(keep);
  seq.num_draft = 0;
  return seq.verifying;
}

void Scheduler::AcceptDraftKv(int64_t id) {
  Sequence& seq = Mutable(id);
  CHECK(seq.running());
  const int pos = static_cast<int>(seq.tokens.size()) - 1;  // the appended token's position
  CHECK_EQ(seq.num_computed, pos) << "AcceptDraftKv without a freshly appended token";
  const int i = pos - seq.verify_start;
  CHECK(i >= 0 && i < static_cast<int>(seq.verifying.size()) &&
        seq.verifying[static_cast<size_t>(i)] == seq.tokens.back())
      << "token at " << pos << " is not the draft computed there";
  seq.num_computed = pos + 1;
  kv_.CommitComputed(id, seq.tokens, seq.num_computed);
}

void Scheduler::AppendToken(int64_t id, int32_t token) {
  Sequence& seq = Mutable(id);
  CHECK(seq.running());
  CHECK_EQ(seq.num_computed, static_cast<int>(seq.tokens.size()))
      << "token appended before its context was computed";
  seq.tokens.push_back(token);
}

void Scheduler::Finish(int64_t id) { CHECK(Abort(id)) << "Finish of unknown sequence " << id; }

void Scheduler::CheckInvariants() const {
  kv_.CheckInvariants();
  CHECK_EQ(seqs_.size(),
           running_.size() + waiting_.size() + ready_.size() + num_awaiting_ + num_held_);
  CHECK_LE(static_cast<int>(running_.size()), config_.max_num_seqs);
  CHECK_EQ(kv_.NumSequences(),
           static_cast<int>(running_.size() + ready_.size()) + num_awaiting_ + num_held_);
  int awaiting = 0, held = 0;
  for (const auto& [id, seq] : seqs_) {
    CHECK_EQ(seq.id, id);
    CHECK_LE(seq.num_computed, static_cast<int>(seq.tokens.size()));
    const int covered =
        kv_.HasTable(id) ? static_cast<int>(kv_.BlockTable(id).size()) * config_.block_size : 0;
    switch (seq.state) {
      case SequenceState::kWaiting:
        CHECK(std::find(waiting_.begin(), waiting_.end(), id) != waiting_.end());
        CHECK(!kv_.HasTable(id));
        CHECK_EQ(seq.num_computed, 0);
        break;
      case SequenceState::kRunning:
        CHECK(std::find(running_.begin(), running_.end(), id) != running_.end());
        CHECK(kv_.HasTable(id));
        CHECK_GE(covered, seq.num_computed);
        break;
      case SequenceState::kAwaitingKv:
        ++awaiting;
        CHECK(kv_.HasTable(id));
        CHECK_EQ(static_cast<int>(seq.tokens.size()), seq.num_prompt_tokens);
        CHECK_GE(covered, seq.num_prompt_tokens + 1);
        break;
      case SequenceState::kReady:
        CHECK(std::find(ready_.begin(), ready_.end(), id) != ready_.end());
        CHECK(kv_.HasTable(id));
        CHECK_GE(covered, static_cast<int>(seq.tokens.size()));
        CHECK_LT(seq.num_computed, static_cast<int>(seq.tokens.size()));
        break;
      case SequenceState::kHeld:
        ++held;
        CHECK(kv_.HasTable(id));
        CHECK_GE(covered, seq.num_computed);
        break;
    }
  }
  CHECK_EQ(awaiting, num_awaiting_);
  CHECK_EQ(held, num_held_);
}

}  // namespace tandem

#include "runtime/grammar/token_mask.h"

#include <utility>

namespace tandem::grammar {

TokenMasker::TokenMasker(const ByteAutomaton* automaton, std::shared_ptr<const VocabTrie> trie,
                         size_t max_cached)
    : automaton_(automaton), trie_(std::move(trie)), max_cached_(max_cached) {}

TokenBitmask TokenMasker::ComputeMask(int state) const {
  TokenBitmask mask(trie_->vocab_size());
  automaton_->AllowedTokens(state, *trie_, &mask);
  return mask;
}

bool TokenMasker::CachedOrPending(int state) const {
  absl::MutexLock lock(&mu_);
  return cache_.contains(state) || pending_.contains(state);
}

std::shared_ptr<const TokenBitmask> TokenMasker::Mask(int state) const {
  std::shared_ptr<Pending> pending;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = cache_.find(state); it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return it->second.mask;
    }
    if (auto it = pending_.find(state); it != pending_.end()) {
      pending = it->second;
    } else {
      pending_.emplace(state, std::make_shared<Pending>());
    }
  }
  if (pending != nullptr) {
    // Another thread computes it: a bounded piece of CPU work. The deadline only guards against
    // that thread never finishing; past it this one computes the mask itself.
    if (pending->done.WaitForNotificationWithTimeout(absl::Seconds(10))) return pending->mask;
    return std::make_shared<const TokenBitmask>(ComputeMask(state));
  }
  // Computed outside the lock, so callers on other states do not wait.
  auto mask = std::make_shared<const TokenBitmask>(ComputeMask(state));
  computed_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  auto node = pending_.extract(state);
  node.mapped()->mask = mask;
  node.mapped()->done.Notify();
  if (max_cached_ == 0) return mask;
  if (cache_.size() >= max_cached_) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(state);
  cache_.emplace(state, Entry{mask, lru_.begin()});
  return mask;
}

}  // namespace tandem::grammar

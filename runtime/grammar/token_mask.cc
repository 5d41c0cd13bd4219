#include "runtime/grammar/token_mask.h"

#include <algorithm>
#include <bit>
#include <utility>

namespace tandem::grammar {

int TokenBitmask::Count() const {
  int n = 0;
  for (uint64_t w : words_) n += std::popcount(w);
  return n;
}

VocabTrie::VocabTrie(const std::vector<std::string>& token_bytes)
    : vocab_size_(static_cast<int>(token_bytes.size())) {
  nodes_.emplace_back();
  for (int id = 0; id < vocab_size_; ++id) {
    const std::string& bytes = token_bytes[id];
    if (bytes.empty()) continue;
    int node = 0;
    for (unsigned char c : bytes) {
      std::vector<std::pair<uint8_t, int32_t>>& kids = nodes_[node].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), c,
                                 [](const auto& e, uint8_t b) { return e.first < b; });
      if (it != kids.end() && it->first == c) {
        node = it->second;
      } else {
        const int32_t child = static_cast<int32_t>(nodes_.size());
        kids.insert(it, {c, child});
        nodes_.emplace_back();  // invalidates `kids`: not used after this
        node = child;
      }
    }
    nodes_[node].tokens.push_back(id);
  }
}

TokenMasker::TokenMasker(const ByteDfa* dfa, std::shared_ptr<const VocabTrie> trie,
                         size_t max_cached)
    : dfa_(dfa), trie_(std::move(trie)), max_cached_(max_cached) {}

TokenBitmask TokenMasker::ComputeMask(int state) const {
  TokenBitmask mask(trie_->vocab_size());
  const std::vector<VocabTrie::Node>& nodes = trie_->nodes_;
  // Depth-first over (trie node, DFA state); the root's own tokens are none (empty bytes).
  std::vector<std::pair<int32_t, int32_t>> stack = {{0, state}};
  while (!stack.empty()) {
    const auto [node, s] = stack.back();
    stack.pop_back();
    for (const auto& [byte, child] : nodes[node].children) {
      const int t = dfa_->Next(s, byte);
      if (t == kDeadState) continue;
      for (int32_t id : nodes[child].tokens) mask.Set(id);
      if (!nodes[child].children.empty()) stack.push_back({child, t});
    }
  }
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

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

std::shared_ptr<const TokenBitmask> TokenMasker::Mask(int state) const {
  {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(state);
    if (it != cache_.end()) return it->second;
  }
  auto mask = std::make_shared<const TokenBitmask>(ComputeMask(state));
  absl::MutexLock lock(&mu_);
  if (cache_.size() >= max_cached_) return mask;
  return cache_.emplace(state, std::move(mask)).first->second;
}

}  // namespace tandem::grammar

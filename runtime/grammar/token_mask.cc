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

TokenMasker::TokenMasker(const ByteDfa* dfa, const std::vector<std::string>& token_bytes)
    : dfa_(dfa), vocab_size_(static_cast<int>(token_bytes.size())) {
  trie_.emplace_back();
  for (int id = 0; id < vocab_size_; ++id) {
    const std::string& bytes = token_bytes[id];
    if (bytes.empty()) continue;
    int node = 0;
    for (unsigned char c : bytes) {
      std::vector<std::pair<uint8_t, int32_t>>& kids = trie_[node].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), c,
                                 [](const auto& e, uint8_t b) { return e.first < b; });
      if (it != kids.end() && it->first == c) {
        node = it->second;
      } else {
        const int32_t child = static_cast<int32_t>(trie_.size());
        kids.insert(it, {c, child});
        trie_.emplace_back();  // invalidates `kids`: not used after this
        node = child;
      }
    }
    trie_[node].tokens.push_back(id);
  }
}

TokenBitmask TokenMasker::ComputeMask(int state) const {
  TokenBitmask mask(vocab_size_);
  // Depth-first over (trie node, DFA state); the root's own tokens are none (empty bytes).
  std::vector<std::pair<int32_t, int32_t>> stack = {{0, state}};
  while (!stack.empty()) {
    const auto [node, s] = stack.back();
    stack.pop_back();
    for (const auto& [byte, child] : trie_[node].children) {
      const int t = dfa_->Next(s, byte);
      if (t == kDeadState) continue;
      for (int32_t id : trie_[child].tokens) mask.Set(id);
      if (!trie_[child].children.empty()) stack.push_back({child, t});
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
  return cache_.emplace(state, std::move(mask)).first->second;
}

}  // namespace tandem::grammar

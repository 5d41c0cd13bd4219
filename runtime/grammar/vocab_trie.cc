#include "runtime/grammar/vocab_trie.h"

#include <algorithm>
#include <bit>

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

}  // namespace tandem::grammar

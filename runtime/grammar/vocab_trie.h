#pragma once
// A vocabulary's token byte strings as a trie (VocabTrie), walked by ByteAutomaton::AllowedTokens
// alongside an automaton, and the one-bit-per-token result (TokenBitmask).
//
// Thread-safety: both are values; a VocabTrie is immutable after construction.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem::grammar {

// One bit per token id.
class TokenBitmask {
 public:
  explicit TokenBitmask(int vocab_size) : size_(vocab_size), words_((vocab_size + 63) / 64, 0) {}
  void Set(int id) { words_[id >> 6] |= uint64_t{1} << (id & 63); }
  bool Test(int id) const { return (words_[id >> 6] >> (id & 63)) & 1; }
  int size() const { return size_; }
  int Count() const;
  const std::vector<uint64_t>& words() const { return words_; }

 private:
  int size_;
  std::vector<uint64_t> words_;
};

// Built once per vocabulary (206 ms for 131,072 tokens on the CI VM) and shared by every
// constraint's masker.
class VocabTrie {
 public:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node, sorted by byte
    std::vector<int32_t> tokens;                        // tokens whose bytes end here
  };
  // token_bytes[id]: the bytes token `id` adds to the text ("" for special tokens and ids that
  // decode to nothing: never allowed).
  explicit VocabTrie(const std::vector<std::string>& token_bytes);
  int vocab_size() const { return vocab_size_; }
  // Node 0 is the root (the empty prefix, no tokens).
  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  int vocab_size_;
  std::vector<Node> nodes_;
};

// Sets in `mask` every token of `trie` whose bytes, fed through `next(state, byte)` from `state`,
// never give -1 (the dead state): depth first, so tokens that share a prefix share its steps and
// a dead branch is cut with every token under it. The root's own tokens are none (empty bytes).
template <typename Next>
void MarkLiveTokens(const VocabTrie& trie, int32_t state, Next&& next, TokenBitmask* mask) {
  const std::vector<VocabTrie::Node>& nodes = trie.nodes();
  std::vector<std::pair<int32_t, int32_t>> stack = {{0, state}};
  while (!stack.empty()) {
    const auto [node, s] = stack.back();
    stack.pop_back();
    for (const auto& [byte, child] : nodes[node].children) {
      const int32_t t = next(s, byte);
      if (t == -1) continue;
      for (int32_t id : nodes[child].tokens) mask->Set(id);
      if (!nodes[child].children.empty()) stack.push_back({child, t});
    }
  }
}

}  // namespace tandem::grammar

#pragma once
// TokenMasker: which tokens of a vocabulary may come next in a ByteDfa state. A token is allowed
// when its bytes, fed to the automaton from that state, do not reach the dead state (the text
// so far plus the token is still a prefix of some match). Special tokens and tokens without
// bytes are never allowed; the caller adds EOS where the state accepts.
//
// The vocabulary's token byte strings go into a trie once (VocabTrie); a mask walks the trie
// alongside the automaton, so tokens that share a prefix share its steps, and a dead branch is cut
// with all the tokens under it. Every DFA state is context-free (its mask depends on nothing else),
// so masks are computed once per state and cached: after warm-up a step's mask is a lookup.
//
// Memory is bounded: at most `max_cached` masks are kept (vocab_size / 8 bytes each: 16 KiB at
// 131,072 tokens), the least recently used one making room for a new one. A JSON Schema's
// automaton has thousands of states, of which a request visits a changing few hundred, so the
// cache follows what is in use rather than keeping the first states ever reached.
//
// Thread-safety: Mask() may run concurrently (the cache takes a lock). A caller that asks for a
// state another thread is computing waits for that result instead of computing it again, which is
// how MaskPrefetcher takes the computation off the engine's critical path. The DFA and the
// vocabulary must outlive the masker.

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "runtime/grammar/byte_dfa.h"

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

// The vocabulary's token byte strings as a trie: built once per vocabulary (206 ms for 131,072
// tokens on the CI VM) and shared by every constraint's masker.
class VocabTrie {
 public:
  // token_bytes[id]: the bytes token `id` adds to the text ("" for special tokens and ids that
  // decode to nothing: never allowed).
  explicit VocabTrie(const std::vector<std::string>& token_bytes);
  int vocab_size() const { return vocab_size_; }

 private:
  friend class TokenMasker;
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node, sorted by byte
    std::vector<int32_t> tokens;                        // tokens whose bytes end here
  };
  int vocab_size_;
  std::vector<Node> nodes_;
};

class TokenMasker {
 public:
  static constexpr size_t kDefaultMaxCached = 256;
  TokenMasker(const ByteDfa* dfa, std::shared_ptr<const VocabTrie> trie,
              size_t max_cached = kDefaultMaxCached);
  // Builds its own trie of `token_bytes`.
  TokenMasker(const ByteDfa* dfa, const std::vector<std::string>& token_bytes)
      : TokenMasker(dfa, std::make_shared<const VocabTrie>(token_bytes)) {}

  // The tokens allowed in `state` (a live state of the DFA).
  std::shared_ptr<const TokenBitmask> Mask(int state) const;
  // Whether Mask(state) would be a lookup (cached, or being computed by another thread).
  bool CachedOrPending(int state) const;
  // The same, computed without the cache (the reference the tests and the benchmark compare).
  TokenBitmask ComputeMask(int state) const;

  int vocab_size() const { return trie_->vocab_size(); }
  // Masks computed by Mask() so far (cache misses).
  int64_t computed() const { return computed_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    std::shared_ptr<const TokenBitmask> mask;
    std::list<int>::iterator lru;  // into lru_
  };
  const ByteDfa* dfa_;
  std::shared_ptr<const VocabTrie> trie_;
  const size_t max_cached_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<int, Entry> cache_ ABSL_GUARDED_BY(mu_);
  mutable std::list<int> lru_ ABSL_GUARDED_BY(mu_);  // states, most recently used first
  struct Pending {
    absl::Notification done;
    std::shared_ptr<const TokenBitmask> mask;  // set before done
  };
  mutable absl::flat_hash_map<int, std::shared_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
  mutable std::atomic<int64_t> computed_{0};
};

}  // namespace tandem::grammar

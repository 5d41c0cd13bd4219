#pragma once
// TokenMasker: which tokens of a vocabulary may come next in a state of a constraint's automaton
// (byte_automaton.h). A token is allowed when its bytes, fed to the automaton from that state, do
// not reach the dead state (the text so far plus the token is still a prefix of some match).
// Special tokens and tokens without bytes are never allowed; the caller adds EOS where the state
// accepts.
//
// The vocabulary's token byte strings go into a trie once (VocabTrie); a mask walks the trie
// alongside the automaton (ByteAutomaton::AllowedTokens). A state's mask depends on the state
// alone (a DFA state, or a pushdown automaton's whole configuration), so masks are computed once
// per state and cached: after warm-up a step's mask is a lookup.
//
// Memory is bounded: at most `max_cached` masks are kept (vocab_size / 8 bytes each: 16 KiB at
// 131,072 tokens), the least recently used one making room for a new one. A JSON Schema's
// automaton has thousands of states, of which a request visits a changing few hundred, so the
// cache follows what is in use rather than keeping the first states ever reached.
//
// Thread-safety: Mask() may run concurrently (the cache takes a lock). A caller that asks for a
// state another thread is computing waits for that result instead of computing it again, which is
// how MaskPrefetcher takes the computation off the engine's critical path. The automaton and the
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
#include "runtime/grammar/byte_automaton.h"
#include "runtime/grammar/vocab_trie.h"

namespace tandem::grammar {

class TokenMasker {
 public:
  static constexpr size_t kDefaultMaxCached = 256;
  TokenMasker(const ByteAutomaton* automaton, std::shared_ptr<const VocabTrie> trie,
              size_t max_cached = kDefaultMaxCached);
  // Builds its own trie of `token_bytes`.
  TokenMasker(const ByteAutomaton* automaton, const std::vector<std::string>& token_bytes)
      : TokenMasker(automaton, std::make_shared<const VocabTrie>(token_bytes)) {}

  // The tokens allowed in `state` (a live state of the automaton).
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
  const ByteAutomaton* automaton_;
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

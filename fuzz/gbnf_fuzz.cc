// GBNF grammars (runtime/grammar/gbnf.h, vLLM's guided_grammar) from untrusted request text, run
// as pushdown automata (runtime/grammar/pda.h).
//
// Input: the grammar text, then optionally a NUL and bytes to feed the automaton. Properties: no
// crash or hang (tight limits keep each run small); errors are InvalidArgument; every live
// state can end or go on; a token mask over a small vocabulary is exactly the tokens whose bytes
// keep the state live.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "runtime/grammar/pda.h"
#include "runtime/grammar/vocab_trie.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string text = input.substr(0, nul);
  const std::string feed = nul == std::string::npos ? "" : input.substr(nul + 1, 64);
  tandem::grammar::PdaLimits limits;
  limits.max_nfa_states = 1 << 14;
  limits.max_dfa_states = 1 << 12;
  limits.max_configs = 1 << 12;
  limits.max_frames = 1 << 14;
  limits.max_stacks = 64;
  limits.max_subset_work = 1 << 20;
  absl::StatusOr<std::unique_ptr<tandem::grammar::GrammarPda>> pda =
      tandem::grammar::GrammarPda::FromGbnf(text, limits);
  if (!pda.ok()) {
    FUZZ_CHECK(pda.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const tandem::grammar::GrammarPda& a = **pda;
  static const std::vector<std::string> kVocab = {"a",  "b", "ab", "(", ")", "[", "]", "{",  "}",
                                                  "\"", ",", ":",  " ", "0", "1", "x", "\n", "é"};
  static const tandem::grammar::VocabTrie kTrie(kVocab);
  int state = a.start();
  for (size_t i = 0; i <= feed.size() && state != tandem::grammar::kDeadState; ++i) {
    FUZZ_CHECK(a.accepting(state) || a.can_continue(state));
    if (i % 8 == 0) {
      tandem::grammar::TokenBitmask mask(static_cast<int>(kVocab.size()));
      a.AllowedTokens(state, kTrie, &mask);
      for (size_t id = 0; id < kVocab.size(); ++id) {
        const bool live = a.Walk(state, kVocab[id]) != tandem::grammar::kDeadState;
        FUZZ_CHECK(mask.Test(static_cast<int>(id)) == live);
      }
    }
    if (i < feed.size()) state = a.Walk(state, feed.substr(i, 1));
  }
  return 0;
}

#pragma once
// GrammarPda: a GBNF grammar (gbnf.h) as a pushdown automaton over bytes, for guided decoding of
// context-free languages: recursion nests as deep as the output goes, not to a fixed depth.
//
// Compilation. Each rule's body becomes a Thompson NFA whose edges read a byte range or call a
// rule, determinized per rule (subset construction over bytes and calls). Then:
//   - rules that can never finish are an error (naming one), and every DFA state that cannot
//     reach the rule's end is pruned, so any live configuration can still complete;
//   - left recursion (a rule that can reach a call of itself without reading a byte) is an
//     error naming the rule, so a step's closure is finite.
//
// Running. A configuration is the set of stacks the input so far can be in: each stack a chain of
// frames (rule, DFA state), the caller's frame holding the state to return to. A byte moves every
// stack's top frame through its rule's DFA; the closure then follows calls (push) and rule ends
// (pop) until every top can read a byte, or the root has finished (the configuration accepts).
// Frames and configurations are interned, so a configuration is an int state (the
// ByteAutomaton interface) made the first time it is reached, and each (state, byte) step is
// computed once and remembered. A state's token mask depends on its configuration alone (the
// whole stack), which is what TokenMasker caches it by. Masks that only the top frame decides
// (XGrammar's context-independent tokens) are not split out: a mask is one trie walk over
// remembered steps.
//
// Limits (InvalidArgument at compile time; at run time a step past a limit is dead, so no token
// leads there): NFA states, per-rule DFA states, stacks per configuration (an ambiguous grammar),
// frames per stack (nesting depth), and configurations and remembered steps per grammar (memory).
//
// Thread-safety: every method may be called from any thread; one lock guards the tables (a mask
// computation holds it for its trie walk).

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "runtime/grammar/byte_automaton.h"
#include "runtime/grammar/gbnf.h"

namespace tandem::grammar {

struct PdaLimits {
  int max_nfa_states = 1 << 18;   // all rules together
  int max_dfa_states = 1 << 16;   // all rules together
  int max_non_ascii_class = 256;  // non-ASCII code points listed in one class
  int max_stacks = 1024;          // per configuration
  int max_depth = 4096;           // frames per stack
  int max_configs = 1 << 18;      // interned configurations per grammar
  int max_frames = 1 << 20;       // interned frames per grammar
  int max_steps = 1 << 22;        // remembered (configuration, byte) steps per grammar
  // Automaton states visited by the subset construction, summed over every state set it forms:
  // bounds the compile time of a grammar whose automaton blows up (nested repeats) long before
  // max_dfa_states would.
  int64_t max_subset_work = int64_t{1} << 26;
};

class GrammarPda final : public ByteAutomaton {
 public:
  static absl::StatusOr<std::unique_ptr<GrammarPda>> Compile(const GbnfGrammar& grammar,
                                                             const PdaLimits& limits = {});
  // ParseGbnf, then Compile.
  static absl::StatusOr<std::unique_ptr<GrammarPda>> FromGbnf(absl::string_view text,
                                                              const PdaLimits& limits = {});

  int start() const override { return 0; }
  int Walk(int state, absl::string_view bytes) const override;
  bool accepting(int state) const override;
  bool can_continue(int state) const override;
  void AllowedTokens(int state, const VocabTrie& trie, TokenBitmask* mask) const override;

  int num_dfa_states() const { return num_dfa_states_; }
  int num_configs() const;  // interned so far
  // Stacks in the configuration of `state`, and the deepest of them (tests, diagnostics).
  std::pair<int, int> StacksAndDepth(int state) const;

 private:
  struct RuleDfa {
    std::vector<std::array<int32_t, 256>> next;                   // -1: no edge
    std::vector<std::vector<std::pair<int32_t, int32_t>>> calls;  // (rule, return state)
    std::vector<char> accepting;
    std::vector<char> reads;  // has a byte edge
  };
  struct Frame {
    int32_t rule = 0;
    int32_t state = 0;
    int32_t parent = -1;  // the caller's frame (at its return state); -1: the root's
    int32_t depth = 1;
  };
  static constexpr int32_t kAcceptTop = -2;  // in a configuration: the root has finished

  GrammarPda(std::vector<RuleDfa> rules, int root, const PdaLimits& limits);

  // -1 when over a limit.
  int32_t InternFrame(int32_t rule, int32_t state, int32_t parent) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int32_t InternConfig(std::vector<int32_t> tops) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds to `out` the tops the stack topped by `frame` closes to; false past a limit.
  bool Close(int32_t frame, std::vector<int32_t>* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int32_t Step(int32_t config, uint8_t byte) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<RuleDfa> rules_;
  const int root_;
  const PdaLimits limits_;
  int num_dfa_states_ = 0;

  mutable absl::Mutex mu_;
  mutable std::vector<Frame> frames_ ABSL_GUARDED_BY(mu_);
  mutable absl::flat_hash_map<std::array<int32_t, 3>, int32_t> frame_ids_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::vector<int32_t>> configs_ ABSL_GUARDED_BY(mu_);  // sorted tops
  mutable absl::flat_hash_map<std::vector<int32_t>, int32_t> config_ids_ ABSL_GUARDED_BY(mu_);
  mutable absl::flat_hash_map<uint64_t, int32_t> steps_
      ABSL_GUARDED_BY(mu_);  // config * 256 + byte
  // Close's visited marks, by frame id (a generation counter, so no clearing per step).
  mutable std::vector<uint64_t> seen_gen_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t gen_ ABSL_GUARDED_BY(mu_) = 0;  // never wraps
};

}  // namespace tandem::grammar

#include "runtime/grammar/pda.h"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/utf8.h"
#include "runtime/grammar/vocab_trie.h"

namespace tandem::grammar {
namespace {

using Node = GbnfNode;

struct Nfa {
  struct Edge {
    uint8_t lo = 0, hi = 0;
    int32_t to = 0;
  };
  struct State {
    std::vector<Edge> bytes;
    std::vector<std::pair<int32_t, int32_t>> calls;  // (rule, to)
    std::vector<int32_t> eps;
  };
  std::vector<State> states;
};

// UTF-8 sequences of two or more bytes, as byte ranges per position (RFC 3629).
constexpr int kMultiByteForms = 8;
constexpr std::pair<uint8_t, uint8_t> kMultiByte[kMultiByteForms][4] = {
    {{0xC2, 0xDF}, {0x80, 0xBF}, {0, 0}, {0, 0}},
    {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}, {0, 0}},
    {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}, {0, 0}},
    {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}, {0, 0}},
    {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}, {0, 0}},
    {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
};
constexpr int kMultiByteLength[kMultiByteForms] = {2, 3, 3, 3, 3, 4, 4, 4};

// Thompson construction of the rules' bodies into one NFA.
class NfaBuilder {
 public:
  NfaBuilder(const GbnfGrammar& g, const PdaLimits& limits, Nfa* nfa)
      : g_(g), limits_(limits), nfa_(*nfa) {}
  const absl::Status& status() const { return status_; }

  int32_t New() {
    if (static_cast<int>(nfa_.states.size()) >= limits_.max_nfa_states) {
      if (status_.ok()) {
        status_ = absl::InvalidArgumentError(absl::StrCat(
            "grammar: more than ", limits_.max_nfa_states, " automaton states (repeat counts?)"));
      }
      return 0;  // harmless: the build is abandoned
    }
    nfa_.states.emplace_back();
    return static_cast<int32_t>(nfa_.states.size() - 1);
  }

  // Adds the fragment of `n` from state `in`; returns its end state.
  int32_t Build(const Node& n, int32_t in) {
    if (!status_.ok()) return in;
    switch (n.kind) {
      case Node::Kind::kLiteral: {
        int32_t cur = in;
        for (unsigned char c : n.text) {
          const int32_t next = New();
          Byte(cur, c, c, next);
          cur = next;
        }
        return cur;
      }
      case Node::Kind::kAny: {
        const int32_t out = New();
        Byte(in, 0x00, 0x7F, out);
        MultiByte(in, out);
        return out;
      }
      case Node::Kind::kClass:
        return Class(n, in);
      case Node::Kind::kRef: {
        const int32_t out = New();
        if (status_.ok()) nfa_.states[in].calls.push_back({n.rule, out});
        return out;
      }
      case Node::Kind::kSeq: {
        int32_t cur = in;
        for (const Node& k : n.kids) cur = Build(k, cur);
        return cur;
      }
      case Node::Kind::kAlt: {
        const int32_t out = New();
        for (const Node& k : n.kids) Eps(Build(k, in), out);
        return out;
      }
      case Node::Kind::kRepeat: {
        int32_t cur = in;
        for (int i = 0; i < n.min && status_.ok(); ++i) cur = Build(n.kids[0], cur);
        if (n.max < 0) {
          const int32_t loop = New();
          Eps(cur, loop);
          Eps(Build(n.kids[0], loop), loop);
          return loop;
        }
        for (int i = n.min; i < n.max && status_.ok(); ++i) {
          const int32_t end = Build(n.kids[0], cur);
          const int32_t next = New();
          Eps(cur, next);
          Eps(end, next);
          cur = next;
        }
        return cur;
      }
    }
    return in;
  }

 private:
  void Byte(int32_t from, int lo, int hi, int32_t to) {
    if (!status_.ok()) return;
    nfa_.states[from].bytes.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), to});
  }
  void Eps(int32_t from, int32_t to) {
    if (status_.ok() && from != to) nfa_.states[from].eps.push_back(to);
  }
  // Every UTF-8 character of two or more bytes, from `in` to `out`.
  void MultiByte(int32_t in, int32_t out) {
    for (int f = 0; f < kMultiByteForms; ++f) {
      int32_t cur = in;
      for (int k = 0; k < kMultiByteLength[f]; ++k) {
        const int32_t next = k + 1 == kMultiByteLength[f] ? out : New();
        Byte(cur, kMultiByte[f][k].first, kMultiByte[f][k].second, next);
        cur = next;
      }
    }
  }
  int32_t Class(const Node& n, int32_t in) {
    const int32_t out = New();
    bool ascii[128] = {};
    int wide = 0;
    for (const auto& [lo, hi] : n.ranges) {
      for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) ascii[c] = true;
      if (hi < 0x80) continue;
      if (n.negated) {
        status_ = absl::InvalidArgumentError(
            absl::StrCat("grammar ", g_.Where(n.pos),
                         ": a negated class with non-ASCII members is not supported"));
        return out;
      }
      for (uint32_t cp = std::max<uint32_t>(lo, 0x80); cp <= hi; ++cp) {
        if (++wide > limits_.max_non_ascii_class) {
          status_ = absl::InvalidArgumentError(
              absl::StrCat("grammar ", g_.Where(n.pos), ": a class with more than ",
                           limits_.max_non_ascii_class, " non-ASCII characters"));
          return out;
        }
        std::string bytes;
        AppendUtf8(cp, &bytes);
        int32_t cur = in;
        for (size_t k = 0; k < bytes.size(); ++k) {
          const int32_t next = k + 1 == bytes.size() ? out : New();
          Byte(cur, static_cast<unsigned char>(bytes[k]), static_cast<unsigned char>(bytes[k]),
               next);
          cur = next;
        }
      }
    }
    // ASCII members (or, negated, the ASCII non-members) as ranges.
    for (int c = 0; c < 128;) {
      if (ascii[c] == n.negated) {
        ++c;
        continue;
      }
      int end = c;
      while (end + 1 < 128 && ascii[end + 1] != n.negated) ++end;
      Byte(in, c, end, out);
      c = end + 1;
    }
    if (n.negated) MultiByte(in, out);
    return out;
  }

  const GbnfGrammar& g_;
  const PdaLimits& limits_;
  Nfa& nfa_;
  absl::Status status_;
};

// `*set` closed under epsilon edges, sorted and without duplicates, in time linear in the closure
// and its edges. `mark` is scratch of nfa.states.size() zeros, left all zero (a membership test
// by search made this quadratic: a fuzzed grammar of nested quantifiers took over 12 s).
void EpsClosure(const Nfa& nfa, std::vector<int32_t>* set, std::vector<char>* mark) {
  std::vector<char>& in = *mark;
  std::vector<int32_t> work;
  size_t n = 0;
  for (size_t i = 0; i < set->size(); ++i) {
    const int32_t s = (*set)[i];
    if (in[s]) continue;
    in[s] = 1;
    (*set)[n++] = s;
    work.push_back(s);
  }
  set->resize(n);
  while (!work.empty()) {
    const int32_t s = work.back();
    work.pop_back();
    for (int32_t t : nfa.states[s].eps) {
      if (!in[t]) {
        in[t] = 1;
        set->push_back(t);
        work.push_back(t);
      }
    }
  }
  for (int32_t s : *set) in[s] = 0;
  std::sort(set->begin(), set->end());
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrammarPda>> GrammarPda::FromGbnf(absl::string_view text,
                                                                 const PdaLimits& limits) {
  absl::StatusOr<GbnfGrammar> g = ParseGbnf(text);
  if (!g.ok()) return g.status();
  return Compile(*g, limits);
}

absl::StatusOr<std::unique_ptr<GrammarPda>> GrammarPda::Compile(const GbnfGrammar& g,
                                                                const PdaLimits& limits) {
  const int num_rules = static_cast<int>(g.rules.size());
  Nfa nfa;
  NfaBuilder builder(g, limits, &nfa);
  std::vector<int32_t> start(num_rules), end(num_rules);
  for (int r = 0; r < num_rules; ++r) {
    start[r] = builder.New();
    end[r] = builder.Build(g.rules[r].second, start[r]);
    if (!builder.status().ok()) return builder.status();
  }

  // Per rule: subset construction over bytes and calls. State 0 is the rule's start.
  std::vector<RuleDfa> rules(num_rules);
  int total_states = 0;
  std::vector<char> closure_mark(nfa.states.size(), 0);
  int64_t subset_work = 0;
  for (int r = 0; r < num_rules; ++r) {
    RuleDfa& d = rules[r];
    std::map<std::vector<int32_t>, int32_t> ids;
    std::deque<std::vector<int32_t>> queue;
    const auto add = [&](std::vector<int32_t> set) -> int32_t {
      // Past the budget nothing more is computed: the caller sees -1 and fails the grammar.
      if (subset_work > limits.max_subset_work) return -1;
      subset_work += static_cast<int64_t>(set.size());
      EpsClosure(nfa, &set, &closure_mark);
      subset_work += static_cast<int64_t>(set.size());
      auto [it, fresh] = ids.emplace(set, static_cast<int32_t>(ids.size()));
      if (fresh) {
        ++total_states;
        d.next.emplace_back();
        d.next.back().fill(-1);
        d.calls.emplace_back();
        d.accepting.push_back(std::binary_search(set.begin(), set.end(), end[r]));
        queue.push_back(std::move(set));
      }
      return it->second;
    };
    add({start[r]});
    for (int32_t id = 0; !queue.empty() || subset_work > limits.max_subset_work; ++id) {
      if (subset_work > limits.max_subset_work) {
        return absl::InvalidArgumentError(
            absl::StrCat("grammar: too large to compile (more than ", limits.max_subset_work,
                         " automaton states visited; rule '", g.rules[r].first, "')"));
      }
      if (total_states > limits.max_dfa_states) {
        return absl::InvalidArgumentError(absl::StrCat("grammar: more than ", limits.max_dfa_states,
                                                       " automaton states (rule '",
                                                       g.rules[r].first, "')"));
      }
      const std::vector<int32_t> set = std::move(queue.front());
      queue.pop_front();
      // Bytes: the sets are constant between range boundaries.
      std::vector<int> cuts = {0, 256};
      for (int32_t s : set) {
        for (const Nfa::Edge& e : nfa.states[s].bytes) {
          cuts.push_back(e.lo);
          cuts.push_back(e.hi + 1);
        }
      }
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      // Each edge's target goes to the intervals between cuts that its range covers (one pass
      // over the edges, not one per interval).
      std::vector<std::vector<int32_t>> targets(cuts.size() - 1);
      for (int32_t s : set) {
        for (const Nfa::Edge& e : nfa.states[s].bytes) {
          const size_t first = std::lower_bound(cuts.begin(), cuts.end(), e.lo) - cuts.begin();
          const size_t end = std::lower_bound(cuts.begin(), cuts.end(), e.hi + 1) - cuts.begin();
          for (size_t k = first; k < end; ++k) targets[k].push_back(e.to);
        }
      }
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        if (targets[k].empty()) continue;
        const int32_t t = add(std::move(targets[k]));
        if (t < 0) break;
        for (int b = cuts[k]; b < cuts[k + 1]; ++b) d.next[id][b] = t;
      }
      std::map<int32_t, std::vector<int32_t>> by_rule;
      for (int32_t s : set) {
        for (const auto& [callee, to] : nfa.states[s].calls) by_rule[callee].push_back(to);
      }
      for (auto& [callee, to] : by_rule) {
        const int32_t t = add(std::move(to));
        if (t < 0) break;
        d.calls[id].push_back({callee, t});
      }
    }
  }

  // Which rules can finish, and which states can still reach their rule's end: a fixpoint, as a
  // state's call counts only once its callee is known to finish.
  std::vector<char> finishes(num_rules, 0);
  std::vector<std::vector<char>> live(num_rules);
  std::vector<std::vector<std::vector<int32_t>>> byte_preds(num_rules);  // by target state
  for (int r = 0; r < num_rules; ++r) {
    const RuleDfa& d = rules[r];
    byte_preds[r].resize(d.next.size());
    for (size_t s = 0; s < d.next.size(); ++s) {
      int32_t last = -1;
      for (int b = 0; b < 256; ++b) {
        const int32_t t = d.next[s][b];
        if (t >= 0 && t != last) byte_preds[r][t].push_back(static_cast<int32_t>(s));
        last = t;
      }
    }
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < num_rules; ++r) {
      const RuleDfa& d = rules[r];
      const size_t n = d.next.size();
      std::vector<std::vector<int32_t>> call_preds(n);  // calls of rules known to finish
      for (size_t s = 0; s < n; ++s) {
        for (const auto& [callee, t] : d.calls[s]) {
          if (finishes[callee]) call_preds[t].push_back(static_cast<int32_t>(s));
        }
      }
      std::vector<char>& alive = live[r];
      alive.assign(n, 0);
      std::vector<int32_t> work;
      for (size_t s = 0; s < n; ++s) {
        if (d.accepting[s]) {
          alive[s] = 1;
          work.push_back(static_cast<int32_t>(s));
        }
      }
      while (!work.empty()) {
        const int32_t t = work.back();
        work.pop_back();
        for (const std::vector<int32_t>* preds : {&byte_preds[r][t], &call_preds[t]}) {
          for (int32_t p : *preds) {
            if (!alive[p]) {
              alive[p] = 1;
              work.push_back(p);
            }
          }
        }
      }
      if (!finishes[r] && alive[0]) finishes[r] = changed = true;
    }
  }
  if (!finishes[g.root]) {
    return absl::InvalidArgumentError(
        "grammar: 'root' has no finite sentence (a rule that can never finish)");
  }
  for (int r = 0; r < num_rules; ++r) {
    RuleDfa& d = rules[r];
    const int n = static_cast<int>(d.next.size());
    d.reads.assign(n, 0);
    for (int s = 0; s < n; ++s) {
      for (int b = 0; b < 256; ++b) {
        int32_t& t = d.next[s][b];
        if (t >= 0 && !live[r][t]) t = -1;
        d.reads[s] = d.reads[s] || t >= 0;
      }
      auto& calls = d.calls[s];
      calls.erase(
          std::remove_if(calls.begin(), calls.end(),
                         [&](const auto& c) { return !finishes[c.first] || !live[r][c.second]; }),
          calls.end());
    }
  }

  // Left recursion: rules that can finish without reading (nullable), then the calls a rule can
  // make before reading a byte; a cycle among those would make a closure endless.
  std::vector<char> nullable(num_rules, 0);
  const auto unread = [&](int r) {  // states reachable from the start through nullable calls
    std::vector<char> at(rules[r].next.size(), 0);
    std::vector<int32_t> work = {0};
    at[0] = 1;
    while (!work.empty()) {
      const int32_t s = work.back();
      work.pop_back();
      for (const auto& [callee, t] : rules[r].calls[s]) {
        if (nullable[callee] && !at[t]) {
          at[t] = 1;
          work.push_back(t);
        }
      }
    }
    return at;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < num_rules; ++r) {
      if (nullable[r]) continue;
      const std::vector<char> at = unread(r);
      for (size_t s = 0; s < at.size(); ++s) {
        if (at[s] && rules[r].accepting[s]) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<int32_t>> left(num_rules);
  for (int r = 0; r < num_rules; ++r) {
    const std::vector<char> at = unread(r);
    for (size_t s = 0; s < at.size(); ++s) {
      if (!at[s]) continue;
      for (const auto& [callee, t] : rules[r].calls[s]) left[r].push_back(callee);
    }
  }
  std::vector<int> color(num_rules, 0);  // 0 new, 1 on the path, 2 done
  for (int first = 0; first < num_rules; ++first) {
    if (color[first] != 0) continue;
    std::vector<std::pair<int, size_t>> path = {{first, 0}};
    color[first] = 1;
    while (!path.empty()) {
      auto& [r, k] = path.back();
      if (k == left[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const int next = left[r][k++];
      if (color[next] == 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "grammar: rule '", g.rules[next].first,
            "' is left-recursive (it can reach a call of itself before reading a character); "
            "rewrite it with a repetition"));
      }
      if (color[next] == 0) {
        color[next] = 1;
        path.emplace_back(next, 0);
      }
    }
  }
  auto pda = std::unique_ptr<GrammarPda>(new GrammarPda(std::move(rules), g.root, limits));
  pda->num_dfa_states_ = total_states;
  return pda;
}

GrammarPda::GrammarPda(std::vector<RuleDfa> rules, int root, const PdaLimits& limits)
    : rules_(std::move(rules)), root_(root), limits_(limits) {
  absl::MutexLock lock(&mu_);
  ++gen_;
  std::vector<int32_t> tops;
  const int32_t f = InternFrame(root_, 0, -1);
  Close(f, &tops);
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  InternConfig(std::move(tops));  // 0: the root's start can finish, so this is never empty
}

int32_t GrammarPda::InternFrame(int32_t rule, int32_t state, int32_t parent) const {
  const std::array<int32_t, 3> key = {rule, state, parent};
  if (auto it = frame_ids_.find(key); it != frame_ids_.end()) return it->second;
  const int32_t depth = parent < 0 ? 1 : frames_[parent].depth + 1;
  if (depth > limits_.max_depth || static_cast<int>(frames_.size()) >= limits_.max_frames) {
    return -1;
  }
  const int32_t id = static_cast<int32_t>(frames_.size());
  frames_.push_back({rule, state, parent, depth});
  seen_gen_.push_back(0);
  frame_ids_.emplace(key, id);
  return id;
}

int32_t GrammarPda::InternConfig(std::vector<int32_t> tops) const {
  if (auto it = config_ids_.find(tops); it != config_ids_.end()) return it->second;
  if (static_cast<int>(configs_.size()) >= limits_.max_configs) return kDeadState;
  const int32_t id = static_cast<int32_t>(configs_.size());
  configs_.push_back(tops);
  config_ids_.emplace(std::move(tops), id);
  return id;
}

bool GrammarPda::Close(int32_t frame, std::vector<int32_t>* out) const {
  std::vector<int32_t> work = {frame};
  bool within_limits = true;
  while (!work.empty()) {
    const int32_t f = work.back();
    work.pop_back();
    if (seen_gen_[f] == gen_) continue;
    seen_gen_[f] = gen_;
    const Frame fr = frames_[f];  // a copy: interning below may grow frames_
    const RuleDfa& d = rules_[fr.rule];
    if (d.reads[fr.state]) out->push_back(f);
    for (const auto& [callee, back] : d.calls[fr.state]) {
      const int32_t caller = InternFrame(fr.rule, back, fr.parent);
      const int32_t pushed = caller < 0 ? -1 : InternFrame(callee, 0, caller);
      if (pushed < 0) {
        within_limits = false;
        continue;
      }
      work.push_back(pushed);
    }
    if (d.accepting[fr.state]) {
      if (fr.parent < 0) {
        out->push_back(kAcceptTop);
      } else {
        work.push_back(fr.parent);
      }
    }
  }
  return within_limits;
}

int32_t GrammarPda::Step(int32_t config, uint8_t byte) const {
  const uint64_t key = static_cast<uint64_t>(config) * 256 + byte;
  if (auto it = steps_.find(key); it != steps_.end()) return it->second;
  ++gen_;
  std::vector<int32_t> tops;
  for (int32_t f : configs_[config]) {
    if (f == kAcceptTop) continue;
    const Frame fr = frames_[f];
    const int32_t t = rules_[fr.rule].next[fr.state][byte];
    if (t < 0) continue;
    const int32_t moved = InternFrame(fr.rule, t, fr.parent);
    if (moved >= 0) Close(moved, &tops);
  }
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  int32_t next = kDeadState;
  if (!tops.empty() && static_cast<int>(tops.size()) <= limits_.max_stacks) {
    next = InternConfig(std::move(tops));
  }
  if (static_cast<int>(steps_.size()) < limits_.max_steps) steps_.emplace(key, next);
  return next;
}

int GrammarPda::Walk(int state, absl::string_view bytes) const {
  absl::MutexLock lock(&mu_);
  for (unsigned char c : bytes) {
    if (state == kDeadState) return kDeadState;
    state = Step(state, c);
  }
  return state;
}

bool GrammarPda::accepting(int state) const {
  absl::MutexLock lock(&mu_);
  const std::vector<int32_t>& tops = configs_[state];
  return !tops.empty() && tops.front() == kAcceptTop;  // sorted: -2 comes first
}

bool GrammarPda::can_continue(int state) const {
  absl::MutexLock lock(&mu_);
  const std::vector<int32_t>& tops = configs_[state];
  return !tops.empty() && tops.back() != kAcceptTop;
}

void GrammarPda::AllowedTokens(int state, const VocabTrie& trie, TokenBitmask* mask) const {
  absl::MutexLock lock(&mu_);
  MarkLiveTokens(
      trie, state,
      [this](int32_t s, uint8_t byte) ABSL_NO_THREAD_SAFETY_ANALYSIS { return Step(s, byte); },
      mask);
}

int GrammarPda::num_configs() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(configs_.size());
}

std::pair<int, int> GrammarPda::StacksAndDepth(int state) const {
  absl::MutexLock lock(&mu_);
  int stacks = 0, depth = 0;
  for (int32_t f : configs_[state]) {
    if (f == kAcceptTop) continue;
    ++stacks;
    depth = std::max(depth, static_cast<int>(frames_[f].depth));
  }
  return {stacks, depth};
}

}  // namespace tandem::grammar

#include "runtime/grammar/byte_dfa.h"

#include <algorithm>
#include <bitset>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/grammar/vocab_trie.h"

namespace tandem::grammar {
namespace {

using ByteSet = std::bitset<256>;

// ---- The pattern as a tree ----

struct Node {
  enum Kind { kBytes, kConcat, kAlt, kRepeat } kind = kConcat;
  ByteSet bytes;                                // kBytes
  std::vector<std::unique_ptr<Node>> children;  // kConcat, kAlt; kRepeat: one
  int min = 0, max = 0;                         // kRepeat; max -1: unbounded
};
using NodePtr = std::unique_ptr<Node>;

NodePtr Bytes(ByteSet set) {
  auto n = std::make_unique<Node>();
  n->kind = Node::kBytes;
  n->bytes = set;
  return n;
}
NodePtr Range(int lo, int hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(b);
  return Bytes(s);
}
NodePtr Group(Node::Kind kind, std::vector<NodePtr> children) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->children = std::move(children);
  return n;
}
NodePtr Literal(absl::string_view text) {
  std::vector<NodePtr> seq;
  for (unsigned char c : text) {
    ByteSet s;
    s.set(c);
    seq.push_back(Bytes(s));
  }
  return Group(Node::kConcat, std::move(seq));
}
// Any multi-byte UTF-8 character, well-formed as RFC 3629 defines it: no overlong forms, no
// surrogates, nothing past U+10FFFF (so every output the automaton allows is valid UTF-8).
NodePtr NonAsciiChar() {
  struct Form {
    uint8_t lead_lo, lead_hi, second_lo, second_hi;
    int extra;  // continuation bytes after the lead
  };
  static constexpr Form kForms[] = {
      {0xC2, 0xDF, 0x80, 0xBF, 1}, {0xE0, 0xE0, 0xA0, 0xBF, 2}, {0xE1, 0xEC, 0x80, 0xBF, 2},
      {0xED, 0xED, 0x80, 0x9F, 2}, {0xEE, 0xEF, 0x80, 0xBF, 2}, {0xF0, 0xF0, 0x90, 0xBF, 3},
      {0xF1, 0xF3, 0x80, 0xBF, 3}, {0xF4, 0xF4, 0x80, 0x8F, 3},
  };
  std::vector<NodePtr> alts;
  for (const Form& f : kForms) {
    std::vector<NodePtr> seq;
    seq.push_back(Range(f.lead_lo, f.lead_hi));
    seq.push_back(Range(f.second_lo, f.second_hi));
    for (int k = 1; k < f.extra; ++k) seq.push_back(Range(0x80, 0xBF));
    alts.push_back(Group(Node::kConcat, std::move(seq)));
  }
  return Group(Node::kAlt, std::move(alts));
}
// ASCII members `ascii`, plus every non-ASCII character when `non_ascii`.
NodePtr CharClass(const ByteSet& ascii, bool non_ascii) {
  if (!non_ascii) return Bytes(ascii);
  std::vector<NodePtr> alts;
  alts.push_back(Bytes(ascii));
  alts.push_back(NonAsciiChar());
  return Group(Node::kAlt, std::move(alts));
}

ByteSet AsciiSet(absl::string_view members) {
  ByteSet s;
  for (unsigned char c : members) s.set(c);
  return s;
}
ByteSet AsciiRange(int lo, int hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(b);
  return s;
}
ByteSet AsciiComplement(const ByteSet& s) {
  ByteSet out;
  for (int b = 0; b < 128; ++b) out[b] = !s[b];
  return out;
}

class Parser {
 public:
  Parser(absl::string_view p, const ByteDfaLimits& limits) : p_(p), limits_(limits) {}

  absl::StatusOr<NodePtr> Parse() {
    if (!p_.empty() && p_[0] == '^') ++pos_;
    size_t end = p_.size();
    if (end > pos_ && p_[end - 1] == '$' && (end < 2 || p_[end - 2] != '\\')) --end;
    end_ = end;
    absl::StatusOr<NodePtr> n = Alt();
    if (!n.ok()) return n;
    if (pos_ != end_) return Error(p_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    return n;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("regex: ", what, " at offset ", pos_));
  }
  bool AtEnd() const { return pos_ >= end_; }
  char Peek() const { return p_[pos_]; }

  absl::StatusOr<NodePtr> Alt() {
    std::vector<NodePtr> alts;
    while (true) {
      absl::StatusOr<NodePtr> c = Concat();
      if (!c.ok()) return c;
      alts.push_back(*std::move(c));
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    if (alts.size() == 1) return std::move(alts[0]);
    return Group(Node::kAlt, std::move(alts));
  }

  absl::StatusOr<NodePtr> Concat() {
    std::vector<NodePtr> seq;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      absl::StatusOr<NodePtr> r = Repeat();
      if (!r.ok()) return r;
      seq.push_back(*std::move(r));
    }
    return Group(Node::kConcat, std::move(seq));
  }

  absl::StatusOr<int> Number() {
    int v = 0;
    const size_t start = pos_;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      if (v > limits_.max_repeat) {
        return Error(absl::StrCat("repeat count above ", limits_.max_repeat));
      }
      ++pos_;
    }
    if (pos_ == start) return Error("expected a number in {m,n}");
    return v;
  }

  absl::StatusOr<NodePtr> Repeat() {
    absl::StatusOr<NodePtr> atom = Atom();
    if (!atom.ok()) return atom;
    NodePtr n = *std::move(atom);
    while (!AtEnd()) {
      int min, max;
      const char c = Peek();
      if (c == '*') {
        min = 0, max = -1, ++pos_;
      } else if (c == '+') {
        min = 1, max = -1, ++pos_;
      } else if (c == '?') {
        min = 0, max = 1, ++pos_;
      } else if (c == '{') {
        ++pos_;
        absl::StatusOr<int> m = Number();
        if (!m.ok()) return m.status();
        min = max = *m;
        if (!AtEnd() && Peek() == ',') {
          ++pos_;
          if (!AtEnd() && Peek() == '}') {
            max = -1;
          } else {
            absl::StatusOr<int> x = Number();
            if (!x.ok()) return x.status();
            max = *x;
          }
        }
        if (AtEnd() || Peek() != '}') return Error("expected '}'");
        ++pos_;
        if (max != -1 && max < min) return Error("{m,n} with n < m");
      } else {
        break;
      }
      if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: the same language
      if (!AtEnd() && Peek() == '+') return Error("possessive quantifiers are not supported");
      auto r = std::make_unique<Node>();
      r->kind = Node::kRepeat;
      r->min = min;
      r->max = max;
      r->children.push_back(std::move(n));
      n = std::move(r);
    }
    return n;
  }

  // An escape after '\' (pos_ at the escaped character): its ASCII set, or a single byte.
  absl::StatusOr<ByteSet> Escape(bool* negated_class) {
    *negated_class = false;
    if (AtEnd()) return Error("trailing '\\'");
    const char c = p_[pos_++];
    const ByteSet digits = AsciiRange('0', '9');
    ByteSet word = AsciiRange('a', 'z') | AsciiRange('A', 'Z') | digits;
    word.set('_');
    const ByteSet space = AsciiSet(" \t\n\r\f\v");
    switch (c) {
      case 'd':
        return digits;
      case 'w':
        return word;
      case 's':
        return space;
      case 'D':
        *negated_class = true;
        return AsciiComplement(digits);
      case 'W':
        *negated_class = true;
        return AsciiComplement(word);
      case 'S':
        *negated_class = true;
        return AsciiComplement(space);
      case 'n':
        return AsciiSet("\n");
      case 'r':
        return AsciiSet("\r");
      case 't':
        return AsciiSet("\t");
      case 'f':
        return AsciiSet("\f");
      case 'v':
        return AsciiSet("\v");
      case '0': {
        ByteSet s;
        s.set(0);
        return s;
      }
      case 'x': {
        if (pos_ + 2 > end_) return Error("\\x needs two hex digits");
        int v = 0;
        for (int k = 0; k < 2; ++k) {
          const char h = p_[pos_++];
          const int d = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
          if (d < 0) return Error("\\x needs two hex digits");
          v = v * 16 + d;
        }
        if (v > 0x7F) return Error("\\x above 7F (write the UTF-8 character itself)");
        ByteSet s;
        s.set(v);
        return s;
      }
      case 'b':
      case 'B':
        --pos_;
        return Error("word boundaries are not supported");
      default:
        if ((c >= '0' && c <= '9') || c == 'k') {
          --pos_;
          return Error("backreferences are not supported");
        }
        if (static_cast<unsigned char>(c) < 0x80 && !(c >= 'a' && c <= 'z') &&
            !(c >= 'A' && c <= 'Z')) {
          return AsciiSet(std::string(1, c));
        }
        --pos_;
        return Error(absl::StrCat("unknown escape '\\", std::string(1, c), "'"));
    }
  }

  absl::StatusOr<NodePtr> Class() {
    // pos_ just past '['.
    bool negate = false;
    if (!AtEnd() && Peek() == '^') negate = true, ++pos_;
    ByteSet set;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated '['");
      if (Peek() == ']' && !first) break;
      first = false;
      ByteSet item;
      int lo = -1;
      if (Peek() == '\\') {
        ++pos_;
        bool neg = false;
        absl::StatusOr<ByteSet> e = Escape(&neg);
        if (!e.ok()) return e.status();
        if (neg) return Error("\\D, \\W and \\S inside a class are not supported");
        item = *e;
        if (item.count() == 1) {
          for (int b = 0; b < 128; ++b) {
            if (item[b]) lo = b;
          }
        }
      } else {
        const unsigned char c = static_cast<unsigned char>(p_[pos_++]);
        if (c >= 0x80) {
          --pos_;
          return Error("non-ASCII characters in a class are not supported");
        }
        if (c == '[' && !AtEnd() && Peek() == ':') return Error("POSIX classes are not supported");
        item.set(c);
        lo = c;
      }
      if (lo >= 0 && pos_ + 1 < end_ && Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        int hi;
        if (Peek() == '\\') {
          ++pos_;
          bool neg = false;
          absl::StatusOr<ByteSet> e = Escape(&neg);
          if (!e.ok()) return e.status();
          if (e->count() != 1) return Error("a range must end in one character");
          hi = -1;
          for (int b = 0; b < 128; ++b) {
            if ((*e)[b]) hi = b;
          }
        } else {
          hi = static_cast<unsigned char>(p_[pos_++]);
          if (hi >= 0x80) return Error("non-ASCII characters in a class are not supported");
        }
        if (hi < lo) return Error("a range that runs backwards");
        item = AsciiRange(lo, hi);
      }
      set |= item;
    }
    ++pos_;  // ']'
    if (negate) return CharClass(AsciiComplement(set), /*non_ascii=*/true);
    return Bytes(set);
  }

  absl::StatusOr<NodePtr> Atom() {
    if (AtEnd()) return Error("expected an expression");
    const unsigned char c = static_cast<unsigned char>(Peek());
    switch (c) {
      case '(': {
        ++pos_;
        if (!AtEnd() && Peek() == '?') {
          if (pos_ + 1 < end_ && p_[pos_ + 1] == ':') {
            pos_ += 2;
          } else {
            return Error("lookaround and named groups are not supported");
          }
        }
        absl::StatusOr<NodePtr> inner = Alt();
        if (!inner.ok()) return inner;
        if (AtEnd() || Peek() != ')') return Error("unbalanced '('");
        ++pos_;
        return inner;
      }
      case '[':
        ++pos_;
        return Class();
      case '.': {
        ++pos_;
        ByteSet ascii = AsciiRange(0, 0x7F);
        ascii.reset('\n');
        return CharClass(ascii, /*non_ascii=*/true);
      }
      case '\\': {
        ++pos_;
        bool negated = false;
        absl::StatusOr<ByteSet> e = Escape(&negated);
        if (!e.ok()) return e.status();
        return CharClass(*e, negated);
      }
      case '*':
      case '+':
      case '?':
      case '{':
        return Error("a quantifier with nothing to repeat");
      case '^':
      case '$':
        return Error("anchors are supported only at the ends");
      default: {
        // One UTF-8 character: its bytes in sequence.
        int len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (pos_ + len > end_) len = static_cast<int>(end_ - pos_);
        NodePtr n = Literal(p_.substr(pos_, len));
        pos_ += len;
        return n;
      }
    }
  }

  absl::string_view p_;
  const ByteDfaLimits& limits_;
  size_t pos_ = 0;
  size_t end_ = 0;
};

// ---- Thompson NFA ----

struct Nfa {
  struct State {
    ByteSet bytes;
    int byte_target = -1;
    std::vector<int> eps;
  };
  std::vector<State> states;
  size_t max_states;
  bool overflow = false;

  int Add() {
    if (states.size() >= max_states) {
      overflow = true;
      return 0;
    }
    states.emplace_back();
    return static_cast<int>(states.size()) - 1;
  }
  // The fragment (start, end) for `n`.
  std::pair<int, int> Build(const Node& n) {
    if (overflow) return {0, 0};
    switch (n.kind) {
      case Node::kBytes: {
        const int s = Add(), e = Add();
        if (overflow) return {0, 0};
        states[s].bytes = n.bytes;
        states[s].byte_target = e;
        return {s, e};
      }
      case Node::kConcat: {
        const int s = Add();
        int cur = s;
        for (const NodePtr& c : n.children) {
          auto [cs, ce] = Build(*c);
          if (overflow) return {0, 0};
          states[cur].eps.push_back(cs);
          cur = ce;
        }
        return {s, cur};
      }
      case Node::kAlt: {
        const int s = Add(), e = Add();
        for (const NodePtr& c : n.children) {
          auto [cs, ce] = Build(*c);
          if (overflow) return {0, 0};
          states[s].eps.push_back(cs);
          states[ce].eps.push_back(e);
        }
        return {s, e};
      }
      case Node::kRepeat: {
        const Node& child = *n.children[0];
        const int s = Add();
        int cur = s;
        for (int i = 0; i < n.min; ++i) {
          auto [cs, ce] = Build(child);
          if (overflow) return {0, 0};
          states[cur].eps.push_back(cs);
          cur = ce;
        }
        const int e = Add();
        if (overflow) return {0, 0};
        if (n.max == -1) {
          auto [cs, ce] = Build(child);
          if (overflow) return {0, 0};
          states[cur].eps.push_back(cs);
          states[cur].eps.push_back(e);
          states[ce].eps.push_back(cur);
        } else {
          for (int i = n.min; i < n.max; ++i) {
            auto [cs, ce] = Build(child);
            if (overflow) return {0, 0};
            states[cur].eps.push_back(cs);
            states[cur].eps.push_back(e);
            cur = ce;
          }
          states[cur].eps.push_back(e);
        }
        return {s, e};
      }
    }
    return {0, 0};
  }

  std::vector<int> Closure(std::vector<int> set) const {
    std::vector<bool> seen(states.size(), false);
    std::vector<int> stack = set;
    for (int s : set) seen[s] = true;
    while (!stack.empty()) {
      const int s = stack.back();
      stack.pop_back();
      for (int t : states[s].eps) {
        if (!seen[t]) {
          seen[t] = true;
          set.push_back(t);
          stack.push_back(t);
        }
      }
    }
    std::sort(set.begin(), set.end());
    return set;
  }
};

}  // namespace

class DfaBuilder {
 public:
  static absl::StatusOr<ByteDfa> Build(const Node& root, const ByteDfaLimits& limits) {
    Nfa nfa;
    nfa.max_states = static_cast<size_t>(limits.max_states) * 64;
    auto [start, final_state] = nfa.Build(root);
    if (nfa.overflow) {
      return absl::InvalidArgumentError(
          absl::StrCat("regex: more than ", nfa.max_states, " automaton states (too large)"));
    }
    // Subset construction.
    const int construction_limit = limits.minimize ? 4 * limits.max_states : limits.max_states;
    std::map<std::vector<int>, int> ids;
    std::vector<std::vector<int>> sets;
    std::vector<std::array<int32_t, 256>> next;
    sets.push_back(nfa.Closure({start}));
    ids[sets[0]] = 0;
    for (size_t d = 0; d < sets.size(); ++d) {
      std::array<int32_t, 256> row;
      row.fill(kDeadState);
      for (int b = 0; b < 256; ++b) {
        std::vector<int> targets;
        for (int s : sets[d]) {
          const Nfa::State& st = nfa.states[s];
          if (st.byte_target >= 0 && st.bytes[b]) targets.push_back(st.byte_target);
        }
        if (targets.empty()) continue;
        std::vector<int> closure = nfa.Closure(std::move(targets));
        auto [it, inserted] = ids.emplace(closure, static_cast<int>(sets.size()));
        if (inserted) {
          if (static_cast<int>(sets.size()) >= construction_limit) {
            return TooLarge(limits);
          }
          sets.push_back(std::move(closure));
        }
        row[b] = it->second;
      }
      next.push_back(row);
    }
    const int n = static_cast<int>(sets.size());
    std::vector<bool> accepting(n);
    for (int d = 0; d < n; ++d) {
      accepting[d] = std::binary_search(sets[d].begin(), sets[d].end(), final_state);
    }
    // Keep the states that can still reach an accepting one.
    std::vector<std::vector<int>> reverse(n);
    for (int d = 0; d < n; ++d) {
      for (int b = 0; b < 256; ++b) {
        if (next[d][b] != kDeadState) reverse[next[d][b]].push_back(d);
      }
    }
    std::vector<bool> live(n, false);
    std::vector<int> stack;
    for (int d = 0; d < n; ++d) {
      if (accepting[d]) live[d] = true, stack.push_back(d);
    }
    while (!stack.empty()) {
      const int d = stack.back();
      stack.pop_back();
      for (int p : reverse[d]) {
        if (!live[p]) live[p] = true, stack.push_back(p);
      }
    }
    if (!live[0]) return absl::InvalidArgumentError("regex: matches nothing");
    std::vector<int> renumber(n, kDeadState);
    int kept = 0;
    for (int d = 0; d < n; ++d) {
      if (live[d]) renumber[d] = kept++;
    }
    std::vector<std::array<int32_t, 256>> pruned(kept);
    std::vector<bool> pruned_accepting(kept);
    for (int d = 0; d < n; ++d) {
      if (!live[d]) continue;
      const int r = renumber[d];
      for (int b = 0; b < 256; ++b) {
        pruned[r][b] = next[d][b] == kDeadState ? kDeadState : renumber[next[d][b]];
      }
      pruned_accepting[r] = accepting[d];
    }
    if (limits.minimize) Minimize(&pruned, &pruned_accepting);
    if (static_cast<int>(pruned.size()) > limits.max_states) return TooLarge(limits);
    ByteDfa dfa;
    dfa.next_ = std::move(pruned);
    dfa.accepting_ = std::move(pruned_accepting);
    dfa.can_continue_.resize(dfa.next_.size());
    for (size_t d = 0; d < dfa.next_.size(); ++d) {
      bool cont = false;
      for (int b = 0; b < 256; ++b) cont |= dfa.next_[d][b] != kDeadState;
      dfa.can_continue_[d] = cont;
    }
    return dfa;
  }

 private:
  static absl::Status TooLarge(const ByteDfaLimits& limits) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex: more than ", limits.max_states, " automaton states (too large)"));
  }

  // Hopcroft's partition refinement over the bytes' equivalence classes (bytes no state tells
  // apart are one symbol), with missing transitions going to an explicit sink. Every state is
  // live, so the sink stays alone and becomes kDeadState again; the start stays state 0 and the
  // rest are numbered in breadth-first order from it.
  static void Minimize(std::vector<std::array<int32_t, 256>>* table, std::vector<bool>* accepting) {
    const int n = static_cast<int>(table->size());
    const int sink = n;
    const int total = n + 1;
    // Byte classes: bytes with the same column.
    std::vector<int> byte_class(256, -1);
    std::vector<int> representative;
    for (int b = 0; b < 256; ++b) {
      for (size_t c = 0; c < representative.size() && byte_class[b] < 0; ++c) {
        bool same = true;
        for (int d = 0; d < n && same; ++d) same = (*table)[d][b] == (*table)[d][representative[c]];
        if (same) byte_class[b] = static_cast<int>(c);
      }
      if (byte_class[b] < 0) {
        byte_class[b] = static_cast<int>(representative.size());
        representative.push_back(b);
      }
    }
    const int k = static_cast<int>(representative.size());
    const auto delta = [&](int s, int c) {
      if (s == sink) return sink;
      const int t = (*table)[s][representative[c]];
      return t == kDeadState ? sink : t;
    };
    // Inverse transitions, per class, as CSR: inv[c] lists the predecessors of each state.
    std::vector<std::vector<int>> inv_start(k, std::vector<int>(total + 1, 0));
    std::vector<std::vector<int>> inv(k, std::vector<int>(total));
    for (int c = 0; c < k; ++c) {
      std::vector<int>& start = inv_start[c];
      for (int s = 0; s < total; ++s) ++start[delta(s, c) + 1];
      for (int t = 0; t < total; ++t) start[t + 1] += start[t];
      std::vector<int> fill(start.begin(), start.end() - 1);
      for (int s = 0; s < total; ++s) inv[c][fill[delta(s, c)]++] = s;
    }
    // The partition: elems grouped by block, block b = elems[first[b], last[b]).
    std::vector<int> elems(total), pos(total), block(total), first, last, marked;
    {
      int at = 0;
      for (int pass = 0; pass < 2; ++pass) {
        const int begin = at;
        for (int s = 0; s < total; ++s) {
          const bool acc = s != sink && (*accepting)[s];
          if (acc == (pass == 0)) {
            elems[at] = s;
            pos[s] = at++;
            block[s] = static_cast<int>(first.size());
          }
        }
        if (at > begin) {
          first.push_back(begin);
          last.push_back(at);
        }
      }
    }
    marked.assign(first.size(), 0);
    std::vector<int> work;
    std::vector<bool> in_work;
    for (size_t b = 0; b < first.size(); ++b) {
      work.push_back(static_cast<int>(b));
      in_work.push_back(true);
    }
    std::vector<int> splitter, touched;
    while (!work.empty()) {
      const int a = work.back();
      work.pop_back();
      in_work[a] = false;
      splitter.assign(elems.begin() + first[a], elems.begin() + last[a]);
      for (int c = 0; c < k; ++c) {
        touched.clear();
        for (int t : splitter) {
          for (int i = inv_start[c][t]; i < inv_start[c][t + 1]; ++i) {
            const int s = inv[c][i];
            const int b = block[s];
            const int to = first[b] + marked[b];
            const int from = pos[s];
            std::swap(elems[from], elems[to]);
            pos[elems[from]] = from;
            pos[elems[to]] = to;
            if (marked[b]++ == 0) touched.push_back(b);
          }
        }
        for (int b : touched) {
          const int m = marked[b];
          marked[b] = 0;
          if (m == last[b] - first[b]) continue;
          // The marked part [first, first + m) becomes a new block.
          const int nb = static_cast<int>(first.size());
          first.push_back(first[b]);
          last.push_back(first[b] + m);
          marked.push_back(0);
          first[b] += m;
          for (int i = first[nb]; i < last[nb]; ++i) block[elems[i]] = nb;
          if (in_work[b]) {
            work.push_back(nb);
            in_work.push_back(true);
          } else {
            const bool smaller_new = m <= last[b] - first[b];
            work.push_back(smaller_new ? nb : b);
            in_work.push_back(smaller_new);
            if (!smaller_new) in_work[b] = true;
          }
        }
      }
    }
    // Number the blocks from the start's, breadth first; the sink's block is the dead state.
    std::vector<int> id(first.size(), kDeadState);
    std::vector<int> order;
    id[block[0]] = 0;
    order.push_back(block[0]);
    for (size_t i = 0; i < order.size(); ++i) {
      const int rep = elems[first[order[i]]];
      for (int c = 0; c < k; ++c) {
        const int t = delta(rep, c);
        if (t == sink) continue;
        if (id[block[t]] == kDeadState) {
          id[block[t]] = static_cast<int>(order.size());
          order.push_back(block[t]);
        }
      }
    }
    std::vector<std::array<int32_t, 256>> out(order.size());
    std::vector<bool> out_accepting(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      const int rep = elems[first[order[i]]];
      for (int b = 0; b < 256; ++b) {
        const int t = delta(rep, byte_class[b]);
        out[i][b] = t == sink ? kDeadState : id[block[t]];
      }
      out_accepting[i] = (*accepting)[rep];
    }
    *table = std::move(out);
    *accepting = std::move(out_accepting);
  }
};

std::string RegexEscape(absl::string_view text) {
  std::string out;
  for (const char c : text) {
    if (absl::string_view("\\^$.|?*+()[]{}/-").find(c) != absl::string_view::npos) {
      out.push_back('\\');
    }
    out.push_back(c);
  }
  return out;
}

int ByteDfa::Walk(int state, absl::string_view bytes) const {
  for (unsigned char c : bytes) {
    if (state == kDeadState) return kDeadState;
    state = next_[state][c];
  }
  return state;
}

void ByteDfa::AllowedTokens(int state, const VocabTrie& trie, TokenBitmask* mask) const {
  MarkLiveTokens(
      trie, state, [this](int32_t s, uint8_t byte) { return Next(s, byte); }, mask);
}

absl::StatusOr<ByteDfa> ByteDfa::FromRegex(absl::string_view pattern, const ByteDfaLimits& limits) {
  if (pattern.size() > limits.max_pattern_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex: ", pattern.size(), " bytes; at most ", limits.max_pattern_bytes));
  }
  Parser parser(pattern, limits);
  absl::StatusOr<NodePtr> root = parser.Parse();
  if (!root.ok()) return root.status();
  return DfaBuilder::Build(**root, limits);
}

absl::StatusOr<ByteDfa> ByteDfa::FromChoices(const std::vector<std::string>& choices,
                                             const ByteDfaLimits& limits) {
  if (choices.empty()) return absl::InvalidArgumentError("choices: the list is empty");
  size_t total = 0;
  std::vector<NodePtr> alts;
  for (const std::string& c : choices) {
    if (c.empty()) return absl::InvalidArgumentError("choices: an empty choice");
    total += c.size();
    if (total > limits.max_pattern_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("choices: more than ", limits.max_pattern_bytes, " bytes in all"));
    }
    alts.push_back(Literal(c));
  }
  return DfaBuilder::Build(*Group(Node::kAlt, std::move(alts)), limits);
}

}  // namespace tandem::grammar

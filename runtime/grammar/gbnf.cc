#include "runtime/grammar/gbnf.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/utf8.h"

namespace tandem::grammar {
namespace {

constexpr int kMaxRepeat = 256;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxNesting = 200;  // parentheses: a hostile grammar cannot exhaust the stack

using Node = GbnfNode;

class Parser {
 public:
  explicit Parser(absl::string_view text) : s_(text) {}

  absl::Status Parse(std::vector<std::pair<std::string, Node>>* rules, int max_rules) {
    while (true) {
      SkipBlankLines();
      if (pos_ >= s_.size()) break;
      const size_t start = pos_;
      std::string name = Name();
      if (name.empty()) return Error(start, "expected a rule name");
      SkipSpace(false);
      if (s_.substr(pos_, 3) != "::=") return Error(pos_, "expected '::=' after the rule name");
      pos_ += 3;
      SkipSpace(true);  // the body may start on the next line
      Node body;
      if (absl::Status st = Alternates(false, 0, &body); !st.ok()) return st;
      SkipSpace(false);
      if (pos_ < s_.size() && s_[pos_] != '\n' && s_[pos_] != '\r') {
        return Error(pos_, absl::StrCat("unexpected '", std::string(1, s_[pos_]), "'"));
      }
      for (const auto& [other, unused] : *rules) {
        if (other == name) return Error(start, absl::StrCat("rule '", name, "' is defined twice"));
      }
      if (static_cast<int>(rules->size()) >= max_rules) {
        return Error(start, absl::StrCat("more than ", max_rules, " rules"));
      }
      rules->emplace_back(std::move(name), std::move(body));
    }
    return absl::OkStatus();
  }

  std::string Where(size_t at) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return absl::StrCat(line, ":", col);
  }

 private:
  absl::Status Error(size_t at, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("grammar ", Where(at), ": ", what));
  }

  static bool NameChar(char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  }

  std::string Name() {
    const size_t start = pos_;
    while (pos_ < s_.size() && NameChar(s_[pos_])) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  // Spaces, tabs and comments; newlines too when `newlines` (inside parentheses).
  void SkipSpace(bool newlines) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }
  void SkipBlankLines() {
    while (true) {
      SkipSpace(false);
      if (pos_ < s_.size() && (s_[pos_] == '\n' || s_[pos_] == '\r')) {
        ++pos_;
        continue;
      }
      break;
    }
  }
  // At top level, a line that starts with '|' continues the rule's alternatives.
  bool ContinuationLine() {
    size_t p = pos_;
    while (p < s_.size()) {
      const char c = s_[p];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++p;
      } else if (c == '#') {
        while (p < s_.size() && s_[p] != '\n') ++p;
      } else {
        break;
      }
    }
    if (p < s_.size() && s_[p] == '|') {
      pos_ = p;
      return true;
    }
    return false;
  }

  absl::Status Alternates(bool nested, int depth, Node* out) {
    if (depth > kMaxNesting) return Error(pos_, "parentheses nested too deep");
    out->kind = Node::Kind::kAlt;
    out->pos = pos_;
    while (true) {
      Node seq;
      if (absl::Status st = Sequence(nested, depth, &seq); !st.ok()) return st;
      out->kids.push_back(std::move(seq));
      SkipSpace(nested);
      if (pos_ < s_.size() && s_[pos_] == '|') {
        ++pos_;
        SkipSpace(nested);
        continue;
      }
      if (!nested && ContinuationLine()) {
        ++pos_;
        SkipSpace(false);
        continue;
      }
      return absl::OkStatus();
    }
  }

  absl::Status Sequence(bool nested, int depth, Node* out) {
    out->kind = Node::Kind::kSeq;
    out->pos = pos_;
    while (true) {
      SkipSpace(nested);
      if (pos_ >= s_.size()) return absl::OkStatus();
      const char c = s_[pos_];
      if (c == '|' || c == ')' || c == '\n' || c == '\r') return absl::OkStatus();
      // A name followed by '::=' starts the next rule (a grammar written without newlines is an
      // error there, not a silent merge).
      if (NameChar(c)) {
        size_t p = pos_;
        while (p < s_.size() && NameChar(s_[p])) ++p;
        size_t q = p;
        while (q < s_.size() && (s_[q] == ' ' || s_[q] == '\t')) ++q;
        if (s_.substr(q, 3) == "::=") return Error(pos_, "a new rule must start on its own line");
      }
      Node item;
      if (absl::Status st = Primary(depth, &item); !st.ok()) return st;
      if (absl::Status st = Quantifier(&item); !st.ok()) return st;
      out->kids.push_back(std::move(item));
    }
  }

  absl::Status Quantifier(Node* item) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      int min, max;
      const size_t at = pos_;
      if (c == '*') {
        min = 0, max = -1;
        ++pos_;
      } else if (c == '+') {
        min = 1, max = -1;
        ++pos_;
      } else if (c == '?') {
        min = 0, max = 1;
        ++pos_;
      } else if (c == '{') {
        ++pos_;
        std::optional<int> lo = Int();
        if (!lo.has_value()) return Error(pos_, "expected a count in '{m,n}'");
        min = max = *lo;
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          SkipSpace(false);
          if (pos_ < s_.size() && s_[pos_] == '}') {
            max = -1;
          } else {
            std::optional<int> hi = Int();
            if (!hi.has_value()) return Error(pos_, "expected a count in '{m,n}'");
            max = *hi;
          }
        }
        SkipSpace(false);
        if (pos_ >= s_.size() || s_[pos_] != '}') return Error(pos_, "expected '}'");
        ++pos_;
        if (max >= 0 && max < min) return Error(at, "'{m,n}' with n < m");
        if (min > kMaxRepeat || max > kMaxRepeat) {
          return Error(at, absl::StrCat("counts above ", kMaxRepeat, " are not supported"));
        }
      } else {
        return absl::OkStatus();
      }
      Node rep;
      rep.kind = Node::Kind::kRepeat;
      rep.pos = at;
      rep.min = min;
      rep.max = max;
      rep.kids.push_back(std::move(*item));
      *item = std::move(rep);
    }
    return absl::OkStatus();
  }

  std::optional<int> Int() {
    SkipSpace(false);
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < s_.size() && absl::ascii_isdigit(static_cast<unsigned char>(s_[pos_]))) {
      v = v * 10 + (s_[pos_] - '0');
      if (v > 1000000) return std::nullopt;
      ++pos_;
    }
    if (pos_ == start) return std::nullopt;
    SkipSpace(false);
    return static_cast<int>(v);
  }

  absl::Status Primary(int depth, Node* out) {
    out->pos = pos_;
    const char c = s_[pos_];
    if (c == '"' || c == '\'') {
      ++pos_;
      out->kind = Node::Kind::kLiteral;
      while (true) {
        if (pos_ >= s_.size() || s_[pos_] == '\n') return Error(out->pos, "unterminated literal");
        if (s_[pos_] == c) {
          ++pos_;
          return absl::OkStatus();
        }
        uint32_t cp;
        if (absl::Status st = Char(&cp); !st.ok()) return st;
        AppendUtf8(cp, &out->text);
      }
    }
    if (c == '[') {
      ++pos_;
      out->kind = Node::Kind::kClass;
      if (pos_ < s_.size() && s_[pos_] == '^') {
        out->negated = true;
        ++pos_;
      }
      while (true) {
        if (pos_ >= s_.size() || s_[pos_] == '\n') return Error(out->pos, "unterminated class");
        if (s_[pos_] == ']') {
          ++pos_;
          break;
        }
        uint32_t lo, hi;
        if (absl::Status st = Char(&lo); !st.ok()) return st;
        hi = lo;
        if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
          ++pos_;
          if (absl::Status st = Char(&hi); !st.ok()) return st;
          if (hi < lo) return Error(out->pos, "a class range runs backwards");
        }
        out->ranges.emplace_back(lo, hi);
      }
      if (out->ranges.empty()) return Error(out->pos, "an empty class");
      return absl::OkStatus();
    }
    if (c == '.') {
      ++pos_;
      out->kind = Node::Kind::kAny;
      return absl::OkStatus();
    }
    if (c == '(') {
      ++pos_;
      SkipSpace(true);
      if (absl::Status st = Alternates(true, depth + 1, out); !st.ok()) return st;
      SkipSpace(true);
      if (pos_ >= s_.size() || s_[pos_] != ')') return Error(out->pos, "unclosed '('");
      ++pos_;
      return absl::OkStatus();
    }
    if (NameChar(c)) {
      out->kind = Node::Kind::kRef;
      out->text = Name();
      return absl::OkStatus();
    }
    return Error(pos_, absl::StrCat("unexpected '", std::string(1, c), "'"));
  }

  // One character of a literal or class, escapes decoded, as a code point.
  absl::Status Char(uint32_t* cp) {
    const size_t at = pos_;
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c == '\\') {
      if (pos_ + 1 >= s_.size()) return Error(at, "a lone '\\'");
      const char e = s_[pos_ + 1];
      pos_ += 2;
      int digits = 0;
      switch (e) {
        case 'n':
          *cp = '\n';
          return absl::OkStatus();
        case 'r':
          *cp = '\r';
          return absl::OkStatus();
        case 't':
          *cp = '\t';
          return absl::OkStatus();
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '.':
        case '/':
          *cp = static_cast<unsigned char>(e);
          return absl::OkStatus();
        case 'x':
          digits = 2;
          break;
        case 'u':
          digits = 4;
          break;
        case 'U':
          digits = 8;
          break;
        default:
          return Error(at, absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
      }
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i) {
        if (pos_ >= s_.size() || !absl::ascii_isxdigit(static_cast<unsigned char>(s_[pos_]))) {
          return Error(at,
                       absl::StrCat("'\\", std::string(1, e), "' needs ", digits, " hex digits"));
        }
        const char h = absl::ascii_tolower(static_cast<unsigned char>(s_[pos_++]));
        v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
      }
      if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
        return Error(at, "an escape that is not a Unicode scalar value");
      }
      *cp = v;
      return absl::OkStatus();
    }
    // A UTF-8 character of the grammar text.
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || pos_ + len > s_.size()) return Error(at, "invalid UTF-8");
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < len; ++i) {
      const unsigned char d = static_cast<unsigned char>(s_[pos_ + i]);
      if ((d & 0xC0) != 0x80) return Error(at, "invalid UTF-8");
      v = (v << 6) | (d & 0x3F);
    }
    pos_ += len;
    *cp = v;
    return absl::OkStatus();
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

// Every rule reference names a defined rule; sets each kRef's `rule`.
absl::Status ResolveRefs(Node& n, const std::map<std::string, int>& index, const Parser& parser) {
  if (n.kind == Node::Kind::kRef) {
    const auto it = index.find(n.text);
    if (it == index.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar ", parser.Where(n.pos), ": rule '", n.text, "' is not defined"));
    }
    n.rule = it->second;
  }
  for (Node& k : n.kids) {
    if (absl::Status s = ResolveRefs(k, index, parser); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

std::string GbnfGrammar::Where(size_t pos) const { return Parser(text).Where(pos); }

absl::StatusOr<GbnfGrammar> ParseGbnf(absl::string_view text, const GbnfOptions& options) {
  if (text.size() > options.max_grammar_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: ", text.size(), " bytes; at most ", options.max_grammar_bytes));
  }
  GbnfGrammar g;
  g.text = std::string(text);
  Parser parser(g.text);
  if (absl::Status s = parser.Parse(&g.rules, options.max_rules); !s.ok()) return s;
  std::map<std::string, int> index;
  for (size_t i = 0; i < g.rules.size(); ++i) index[g.rules[i].first] = static_cast<int>(i);
  const auto root = index.find("root");
  if (root == index.end()) return absl::InvalidArgumentError("grammar: no 'root' rule");
  g.root = root->second;
  for (auto& [name, body] : g.rules) {
    if (absl::Status s = ResolveRefs(body, index, parser); !s.ok()) return s;
  }
  return g;
}

}  // namespace tandem::grammar

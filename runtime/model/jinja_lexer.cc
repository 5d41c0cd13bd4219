#include "runtime/model/jinja_lexer.h"

#include <algorithm>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/utf8.h"

namespace tandem::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsNameStart(char c) { return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  Lexer(std::string_view src, const LexOptions& options) : src_(src), options_(options) {}

  absl::StatusOr<std::vector<Token>> Run() {
    if (!options_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') {
      src_.remove_suffix(1);
      if (!src_.empty() && src_.back() == '\r') src_.remove_suffix(1);
    }
    while (pos_ < src_.size()) {
      bool line_starting = pos_ == 0 || src_[pos_ - 1] == '\n';
      size_t tag = FindTagStart(pos_);
      std::string_view text = src_.substr(pos_, tag - pos_);
      int text_line = line_;
      line_ += static_cast<int>(std::count(text.begin(), text.end(), '\n'));
      if (tag == src_.size()) {
        Emit(TokenType::kText, std::string(text), text_line);
        break;
      }
      char kind = src_[tag + 1];  // '{', '%' or '#'
      char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
      } else if (sign != '+' && options_.lstrip_blocks && kind != '{') {
        size_t line_pos = text.rfind('\n');
        line_pos = line_pos == std::string_view::npos ? 0 : line_pos + 1;
        if (line_pos > 0 || line_starting) {
          std::string_view tail = text.substr(line_pos);
          if (std::all_of(tail.begin(), tail.end(), [](char c) { return IsSpace(c); })) {
            text = text.substr(0, line_pos);
          }
        }
      }
      Emit(TokenType::kText, std::string(text), text_line);
      pos_ = tag + 2 + ((sign == '-' || (sign == '+' && kind != '{')) ? 1 : 0);
      absl::Status status = kind == '#' ? LexComment() : LexTag(kind == '{');
      if (!status.ok()) return status;
    }
    Token end;
    end.type = TokenType::kEnd;
    end.line = line_;
    tokens_.push_back(end);
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void Emit(TokenType type, std::string text, int line) {
    if (type == TokenType::kText && text.empty()) return;
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line;
    tokens_.push_back(std::move(t));
  }

  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", line_, ": ", what));
  }

  // After a closing tag: `-` strips all following whitespace; otherwise trim_blocks drops one
  // newline after block and comment tags.
  void AfterClose(bool strip, bool block_like, bool plus) {
    if (strip) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
    } else if (block_like && !plus && options_.trim_blocks) {
      if (pos_ < src_.size() && src_[pos_] == '\n') {
        ++pos_;
        ++line_;
      } else if (pos_ + 1 < src_.size() && src_[pos_] == '\r' && src_[pos_ + 1] == '\n') {
        pos_ += 2;
        ++line_;
      }
    }
  }

  absl::Status LexComment() {
    size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) return Error("unterminated comment '{#'");
    bool strip = end > pos_ && src_[end - 1] == '-';
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                         src_.begin() + static_cast<std::ptrdiff_t>(end), '\n'));
    pos_ = end + 2;
    AfterClose(strip, /*block_like=*/true, /*plus=*/false);
    return absl::OkStatus();
  }

  absl::Status LexTag(bool is_expr) {
    int open_line = line_;
    Emit(is_expr ? TokenType::kExprOpen : TokenType::kStmtOpen, is_expr ? "{{" : "{%", line_);
    std::string brackets;  // open ( [ { awaiting their closers
    const char close_char = is_expr ? '}' : '%';
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        line_ = open_line;
        return Error(is_expr ? "unclosed '{{'" : "unclosed '{%'");
      }
      std::string_view rest = src_.substr(pos_);
      if (brackets.empty()) {
        bool minus = rest.size() >= 3 && rest[0] == '-' && rest[1] == close_char && rest[2] == '}';
        bool plus =
            !is_expr && rest.size() >= 3 && rest[0] == '+' && rest[1] == '%' && rest[2] == '}';
        if (minus || plus || (rest.size() >= 2 && rest[0] == close_char && rest[1] == '}')) {
          Emit(is_expr ? TokenType::kExprClose : TokenType::kStmtClose, is_expr ? "}}" : "%}",
               line_);
          pos_ += (minus || plus) ? 3 : 2;
          AfterClose(minus, !is_expr, plus);
          return absl::OkStatus();
        }
      }
      char c = rest[0];
      if (IsNameStart(c)) {
        size_t n = 1;
        while (n < rest.size() && IsNameChar(rest[n])) ++n;
        Emit(TokenType::kName, std::string(rest.substr(0, n)), line_);
        pos_ += n;
      } else if (IsDigit(c)) {
        absl::Status status = LexNumber();
        if (!status.ok()) return status;
      } else if (c == '\'' || c == '"') {
        absl::Status status = LexString();
        if (!status.ok()) return status;
      } else {
        static constexpr std::string_view kTwoChar[] = {"**", "//", "==", "!=", "<=", ">="};
        std::string op;
        for (std::string_view two : kTwoChar) {
          if (rest.substr(0, 2) == two) op = std::string(two);
        }
        if (op.empty()) {
          if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
            return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          brackets += op;
        } else if (op == ")" || op == "]" || op == "}") {
          char want = op == ")" ? '(' : op == "]" ? '[' : '{';
          if (brackets.empty() || brackets.back() != want) {
            return Error(absl::StrCat("unbalanced '", op, "'"));
          }
          brackets.pop_back();
        }
        Emit(TokenType::kOp, op, line_);
        pos_ += op.size();
      }
    }
  }

  absl::Status LexNumber() {
    size_t start = pos_;
    while (pos_ < src_.size() && IsDigit(src_[pos_])) ++pos_;
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && IsDigit(src_[pos_ + 1])) {
      is_float = true;
      ++pos_;
      while (pos_ < src_.size() && IsDigit(src_[pos_])) ++pos_;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && IsDigit(src_[p])) {
        is_float = true;
        pos_ = p;
        while (pos_ < src_.size() && IsDigit(src_[pos_])) ++pos_;
      }
    }
    std::string text(src_.substr(start, pos_ - start));
    Token t;
    t.line = line_;
    t.text = text;
    if (is_float) {
      t.type = TokenType::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = TokenType::kInt;
      errno = 0;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) return Error(absl::StrCat("integer literal out of range: ", text));
    }
    tokens_.push_back(std::move(t));
    return absl::OkStatus();
  }

  // Python string literal semantics (what Jinja's lexer applies): \n \t \r \b \f \v \a \0 \\ \' \"
  // \xhh \uhhhh \Uhhhhhhhh; an unknown escape keeps its backslash.
  absl::Status LexString() {
    char quote = src_[pos_];
    int start_line = line_;
    ++pos_;
    std::string value;
    while (true) {
      if (pos_ >= src_.size()) {
        line_ = start_line;
        return Error("unterminated string literal");
      }
      char c = src_[pos_++];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (pos_ >= src_.size()) continue;
      char e = src_[pos_++];
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case 'a':
          value += '\a';
          break;
        case '0':
          value += '\0';
          break;
        case '\\':
        case '\'':
        case '"':
          value += e;
          break;
        case '\n':
          ++line_;
          break;
        case 'x':
        case 'u':
        case 'U': {
          size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          std::string hex(src_.substr(pos_, digits));
          if (hex.size() != digits || !std::all_of(hex.begin(), hex.end(), [](char h) {
                return absl::ascii_isxdigit(static_cast<unsigned char>(h));
              })) {
            return Error(
                absl::StrCat("invalid \\", std::string(1, e), " escape in string literal"));
          }
          pos_ += digits;
          AppendUtf8(static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16)), &value);
          break;
        }
        default:
          value += '\\';
          value += e;
      }
    }
    Token t;
    t.type = TokenType::kString;
    t.text = std::move(value);
    t.line = start_line;
    tokens_.push_back(std::move(t));
    return absl::OkStatus();
  }

  std::string_view src_;
  LexOptions options_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Lex(std::string_view source, const LexOptions& options) {
  return Lexer(source, options).Run();
}

}  // namespace tandem::jinja

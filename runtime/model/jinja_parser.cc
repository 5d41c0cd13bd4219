#include "runtime/model/jinja_parser.h"

#include <algorithm>
#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"

namespace tandem::jinja {
namespace {

template <size_t N>
bool Contains(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

constexpr std::array<std::string_view, 23> kFilters = {
    "trim",  "length", "count",   "tojson", "upper",  "lower",      "default", "d",
    "items", "string", "join",    "reject", "select", "first",      "last",    "list",
    "int",   "float",  "replace", "title",  "abs",    "capitalize", "unique"};
constexpr std::array<std::string_view, 22> kTests = {
    "defined", "undefined", "none",    "string", "mapping",  "iterable", "sequence", "number",
    "integer", "float",     "boolean", "true",   "false",    "equalto",  "eq",       "ne",
    "odd",     "even",      "lower",   "upper",  "callable", "in"};
constexpr std::array<std::string_view, 16> kMethods = {
    "strip",   "lstrip", "rstrip", "startswith", "endswith", "split", "upper",      "lower",
    "replace", "title",  "items",  "keys",       "values",   "get",   "capitalize", "find"};
constexpr std::array<std::string_view, 4> kFunctions = {"raise_exception", "strftime_now",
                                                        "namespace", "range"};

// Statements outside the subset, named so the error says what was found.
constexpr std::array<std::string_view, 17> kUnsupportedStatements = {
    "macro",    "call",       "filter",     "block",         "extends", "include",
    "import",   "from",       "raw",        "with",          "do",      "break",
    "continue", "autoescape", "generation", "endgeneration", "trans"};

using ExprPtr = std::unique_ptr<Expr>;

// Nesting limit for expressions and blocks, so a hostile template cannot overflow the stack of the
// (recursive) parser or renderer.
constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  absl::StatusOr<std::vector<Node>> Run() {
    std::string end;
    ASSIGN_OR_RETURN(std::vector<Node> body, ParseBody({}, &end));
    return body;
  }

 private:
  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void Advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const { return Cur().type == TokenType::kOp && Cur().text == op; }
  bool IsName(std::string_view name) const {
    return Cur().type == TokenType::kName && Cur().text == name;
  }

  absl::Status Error(int line, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
  }
  absl::Status Unexpected(const std::string& expected) const {
    std::string found;
    switch (Cur().type) {
      case TokenType::kEnd:
        found = "end of template";
        break;
      case TokenType::kStmtClose:
        found = "'%}'";
        break;
      case TokenType::kExprClose:
        found = "'}}'";
        break;
      case TokenType::kString:
        found = absl::StrCat("string '", Cur().text, "'");
        break;
      default:
        found = absl::StrCat("'", Cur().text, "'");
    }
    return Error(Cur().line, absl::StrCat("expected ", expected, ", found ", found));
  }
  absl::Status ExpectOp(std::string_view op) {
    if (!IsOp(op)) return Unexpected(absl::StrCat("'", std::string(op), "'"));
    Advance();
    return absl::OkStatus();
  }
  absl::Status ExpectStmtClose() {
    if (Cur().type != TokenType::kStmtClose) return Unexpected("'%}'");
    Advance();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) return Unexpected("a name");
    std::string name = Cur().text;
    Advance();
    return name;
  }

  // Parses nodes until a `{% <one of ends> %}` tag, whose keyword is stored in *end (the tag's
  // keyword is consumed, the rest of the tag is not). With no ends, parses to the end of input.
  absl::StatusOr<std::vector<Node>> ParseBody(const std::vector<std::string>& ends,
                                              std::string* end) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxNesting) return Error(Cur().line, "blocks nested too deeply");
    std::vector<Node> body;
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case TokenType::kEnd:
          if (!ends.empty()) {
            return Error(t.line, absl::StrCat("unexpected end of template, expected '{% ",
                                              absl::StrJoin(ends, " %}' or '{% "), " %}'"));
          }
          return body;
        case TokenType::kText: {
          Node n;
          n.kind = Node::Kind::kText;
          n.line = t.line;
          n.text = t.text;
          body.push_back(std::move(n));
          Advance();
          break;
        }
        case TokenType::kExprOpen: {
          Node n;
          n.kind = Node::Kind::kOutput;
          n.line = t.line;
          Advance();
          ASSIGN_OR_RETURN(n.expr, ParseExpression());
          if (Cur().type != TokenType::kExprClose) return Unexpected("'}}'");
          Advance();
          body.push_back(std::move(n));
          break;
        }
        case TokenType::kStmtOpen: {
          Advance();
          if (Cur().type != TokenType::kName) return Unexpected("a statement keyword");
          std::string keyword = Cur().text;
          if (std::find(ends.begin(), ends.end(), keyword) != ends.end()) {
            *end = keyword;
            Advance();
            return body;
          }
          ASSIGN_OR_RETURN(Node n, ParseStatement());
          body.push_back(std::move(n));
          break;
        }
        default:
          return Unexpected("text or a tag");
      }
    }
  }

  absl::StatusOr<Node> ParseStatement() {
    const Token& t = Cur();
    int line = t.line;
    std::string keyword = t.text;
    Advance();
    if (keyword == "if") return ParseIf(line);
    if (keyword == "for") return ParseFor(line);
    if (keyword == "set") return ParseSet(line);
    if (Contains(kUnsupportedStatements, keyword)) {
      return Error(line, absl::StrCat("unsupported statement '{% ", keyword,
                                      " %}' (outside the chat-template Jinja subset)"));
    }
    if (keyword.rfind("end", 0) == 0 || keyword == "elif" || keyword == "else") {
      return Error(line, absl::StrCat("unexpected '{% ", keyword, " %}'"));
    }
    return Error(line, absl::StrCat("unknown statement '{% ", keyword, " %}'"));
  }

  absl::StatusOr<Node> ParseIf(int line) {
    Node n;
    n.kind = Node::Kind::kIf;
    n.line = line;
    ASSIGN_OR_RETURN(ExprPtr cond, ParseExpression());
    RETURN_IF_ERROR(ExpectStmtClose());
    while (true) {
      std::string end;
      ASSIGN_OR_RETURN(std::vector<Node> body, ParseBody({"elif", "else", "endif"}, &end));
      n.branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        ASSIGN_OR_RETURN(cond, ParseExpression());
        RETURN_IF_ERROR(ExpectStmtClose());
        continue;
      }
      RETURN_IF_ERROR(ExpectStmtClose());
      if (end == "else") {
        ASSIGN_OR_RETURN(n.else_body, ParseBody({"endif"}, &end));
        RETURN_IF_ERROR(ExpectStmtClose());
      }
      return n;
    }
  }

  absl::StatusOr<Node> ParseFor(int line) {
    Node n;
    n.kind = Node::Kind::kFor;
    n.line = line;
    while (true) {
      ASSIGN_OR_RETURN(std::string target, ExpectName());
      n.targets.push_back(std::move(target));
      if (!IsOp(",")) break;
      Advance();
    }
    if (!IsName("in")) return Unexpected("'in'");
    Advance();
    ASSIGN_OR_RETURN(n.expr, ParseOr());
    if (IsName("if")) {
      return Error(Cur().line, "unsupported 'for ... if' loop filter (outside the subset)");
    }
    if (IsName("recursive")) {
      return Error(Cur().line, "unsupported recursive for loop (outside the subset)");
    }
    RETURN_IF_ERROR(ExpectStmtClose());
    std::string end;
    ASSIGN_OR_RETURN(n.body, ParseBody({"else", "endfor"}, &end));
    RETURN_IF_ERROR(ExpectStmtClose());
    if (end == "else") {
      ASSIGN_OR_RETURN(n.else_body, ParseBody({"endfor"}, &end));
      RETURN_IF_ERROR(ExpectStmtClose());
    }
    return n;
  }

  absl::StatusOr<Node> ParseSet(int line) {
    Node n;
    n.kind = Node::Kind::kSet;
    n.line = line;
    ASSIGN_OR_RETURN(std::string target, ExpectName());
    n.targets.push_back(std::move(target));
    if (IsOp(".")) {
      Advance();
      ASSIGN_OR_RETURN(std::string attr, ExpectName());
      n.targets.push_back(std::move(attr));
    }
    if (IsOp(",")) return Error(Cur().line, "unsupported tuple assignment in '{% set %}'");
    if (Cur().type == TokenType::kStmtClose) {
      return Error(line, "unsupported block '{% set %}...{% endset %}' (outside the subset)");
    }
    RETURN_IF_ERROR(ExpectOp("="));
    ASSIGN_OR_RETURN(n.expr, ParseExpression());
    RETURN_IF_ERROR(ExpectStmtClose());
    return n;
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // expression := or ['if' or ['else' expression]]
  absl::StatusOr<ExprPtr> ParseExpression() {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxNesting) return Error(Cur().line, "expression nested too deeply");
    ASSIGN_OR_RETURN(ExprPtr value, ParseOr());
    if (!IsName("if")) return value;
    int line = Cur().line;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
    ExprPtr otherwise;
    if (IsName("else")) {
      Advance();
      ASSIGN_OR_RETURN(otherwise, ParseExpression());
    }
    ExprPtr e = Make(Expr::Kind::kCond, line);
    e->args.push_back(std::move(cond));
    e->args.push_back(std::move(value));
    e->args.push_back(std::move(otherwise));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    ChainGuard chain(&depth_);
    while (IsName("or")) {
      if (!chain.Link()) return TooDeep();
      int line = Cur().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      ExprPtr e = Make(Expr::Kind::kOr, line);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    ChainGuard chain(&depth_);
    while (IsName("and")) {
      if (!chain.Link()) return TooDeep();
      int line = Cur().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      ExprPtr e = Make(Expr::Kind::kAnd, line);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxNesting) return Error(Cur().line, "expression nested too deeply");
    if (IsName("not")) {
      int line = Cur().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      ExprPtr e = Make(Expr::Kind::kNot, line);
      e->args.push_back(std::move(operand));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr e;
    ChainGuard chain(&depth_);
    while (true) {
      if (!chain.Link()) return TooDeep();
      std::string op;
      if (Cur().type == TokenType::kOp &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == ">" ||
           Cur().text == "<=" || Cur().text == ">=")) {
        op = Cur().text;
        Advance();
      } else if (IsName("in")) {
        op = "in";
        Advance();
      } else if (IsName("not") && Peek().type == TokenType::kName && Peek().text == "in") {
        op = "not in";
        Advance();
        Advance();
      } else {
        break;
      }
      if (!e) {
        e = Make(Expr::Kind::kCompare, line);
        e->args.push_back(std::move(first));
      }
      ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      e->ops.push_back(op);
      e->args.push_back(std::move(operand));
    }
    return e ? std::move(e) : std::move(first);
  }

  absl::StatusOr<ExprPtr> Binary(ExprPtr left, std::string op, ExprPtr right, int line) {
    ExprPtr e = Make(Expr::Kind::kBinary, line);
    e->name = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    ChainGuard chain(&depth_);
    while (IsOp("+") || IsOp("-")) {
      if (!chain.Link()) return TooDeep();
      std::string op = Cur().text;
      int line = Cur().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      ASSIGN_OR_RETURN(left, Binary(std::move(left), op, std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    ChainGuard chain(&depth_);
    while (IsOp("~")) {
      if (!chain.Link()) return TooDeep();
      int line = Cur().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      ASSIGN_OR_RETURN(left, Binary(std::move(left), "~", std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    ChainGuard chain(&depth_);
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      if (!chain.Link()) return TooDeep();
      std::string op = Cur().text;
      int line = Cur().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      ASSIGN_OR_RETURN(left, Binary(std::move(left), op, std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    ChainGuard chain(&depth_);
    while (IsOp("**")) {
      if (!chain.Link()) return TooDeep();
      int line = Cur().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      ASSIGN_OR_RETURN(left, Binary(std::move(left), "**", std::move(right), line));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxNesting) return Error(Cur().line, "expression nested too deeply");
    int line = Cur().line;
    ExprPtr node;
    if (IsOp("-")) {
      Advance();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node = Make(Expr::Kind::kNeg, line);
      node->args.push_back(std::move(operand));
    } else if (IsOp("+")) {
      Advance();
      ASSIGN_OR_RETURN(node, ParseUnary(false));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    int line = t.line;
    switch (t.type) {
      case TokenType::kName: {
        std::string name = t.text;
        Advance();
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        if (name == "true" || name == "True") {
          e->literal = Value::Bool(true);
        } else if (name == "false" || name == "False") {
          e->literal = Value::Bool(false);
        } else if (name == "none" || name == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = std::move(name);
        }
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (Cur().type == TokenType::kString) {  // adjacent literals concatenate
          s += Cur().text;
          Advance();
        }
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::String(std::move(s));
        return e;
      }
      case TokenType::kInt: {
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::Int(t.int_value);
        Advance();
        return e;
      }
      case TokenType::kFloat: {
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::Float(t.float_value);
        Advance();
        return e;
      }
      case TokenType::kOp:
        if (t.text == "(") {
          Advance();
          if (IsOp(")")) {  // empty tuple
            Advance();
            return Make(Expr::Kind::kList, line);
          }
          ASSIGN_OR_RETURN(ExprPtr inner, ParseExpression());
          if (IsOp(",")) {  // tuple
            ExprPtr list = Make(Expr::Kind::kList, line);
            list->args.push_back(std::move(inner));
            while (IsOp(",")) {
              Advance();
              if (IsOp(")")) break;
              ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
              list->args.push_back(std::move(item));
            }
            inner = std::move(list);
          }
          RETURN_IF_ERROR(ExpectOp(")"));
          return inner;
        }
        if (t.text == "[") {
          Advance();
          ExprPtr list = Make(Expr::Kind::kList, line);
          while (!IsOp("]")) {
            ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
            list->args.push_back(std::move(item));
            if (!IsOp(",")) break;
            Advance();
          }
          RETURN_IF_ERROR(ExpectOp("]"));
          return list;
        }
        if (t.text == "{") {
          Advance();
          ExprPtr dict = Make(Expr::Kind::kDict, line);
          while (!IsOp("}")) {
            ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
            RETURN_IF_ERROR(ExpectOp(":"));
            ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
            dict->args.push_back(std::move(key));
            dict->args.push_back(std::move(value));
            if (!IsOp(",")) break;
            Advance();
          }
          RETURN_IF_ERROR(ExpectOp("}"));
          return dict;
        }
        break;
      default:
        break;
    }
    return Unexpected("an expression");
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    ChainGuard chain(&depth_);
    while (true) {
      if (!chain.Link()) return TooDeep();
      int line = Cur().line;
      if (IsOp(".")) {
        Advance();
        if (Cur().type == TokenType::kInt) {  // foo.0 is foo[0]
          ExprPtr index = Make(Expr::Kind::kLiteral, line);
          index->literal = Value::Int(Cur().int_value);
          Advance();
          ExprPtr e = Make(Expr::Kind::kItem, line);
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(index));
          node = std::move(e);
          continue;
        }
        ASSIGN_OR_RETURN(std::string attr, ExpectName());
        ExprPtr e = Make(Expr::Kind::kAttr, line);
        e->name = std::move(attr);
        e->args.push_back(std::move(node));
        node = std::move(e);
      } else if (IsOp("[")) {
        Advance();
        ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node), line));
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node), line));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr object, int line) {
    std::array<ExprPtr, 3> parts;
    int colons = 0;
    if (!IsOp(":")) {
      ASSIGN_OR_RETURN(parts[0], ParseExpression());
    }
    while (IsOp(":") && colons < 2) {
      Advance();
      ++colons;
      if (!IsOp(":") && !IsOp("]")) {
        ASSIGN_OR_RETURN(parts[static_cast<size_t>(colons)], ParseExpression());
      }
    }
    RETURN_IF_ERROR(ExpectOp("]"));
    ExprPtr e = Make(colons == 0 ? Expr::Kind::kItem : Expr::Kind::kSlice, line);
    e->args.push_back(std::move(object));
    if (colons == 0) {
      e->args.push_back(std::move(parts[0]));
    } else {
      for (auto& p : parts) e->args.push_back(std::move(p));
    }
    return e;
  }

  // Parses `(args, name=kwargs)` into e->args (after those already there) and e->kwargs.
  absl::Status ParseArgs(Expr* e) {
    RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (IsOp("*") || IsOp("**")) return Error(Cur().line, "unsupported '*' argument unpacking");
      if (Cur().type == TokenType::kName && Peek().type == TokenType::kOp && Peek().text == "=") {
        std::string key = Cur().text;
        Advance();
        Advance();
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        e->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e->kwargs.empty()) {
          return Error(Cur().line, "positional argument follows keyword argument");
        }
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        e->args.push_back(std::move(value));
      }
      if (!IsOp(",")) break;
      Advance();
    }
    return ExpectOp(")");
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee, int line) {
    if (callee->kind == Expr::Kind::kName) {
      if (!IsSupportedFunction(callee->name)) {
        return Error(line, absl::StrCat("unsupported function '", callee->name,
                                        "()' (outside the chat-template subset)"));
      }
    } else if (callee->kind == Expr::Kind::kAttr) {
      if (!IsSupportedMethod(callee->name)) {
        return Error(line, absl::StrCat("unsupported method '.", callee->name,
                                        "()' (outside the chat-template subset)"));
      }
    } else {
      return Error(line, "only named functions and methods can be called");
    }
    ExprPtr e = Make(Expr::Kind::kCall, line);
    e->args.push_back(std::move(callee));
    RETURN_IF_ERROR(ParseArgs(e.get()));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    ChainGuard chain(&depth_);
    while (true) {
      if (!chain.Link()) return TooDeep();
      int line = Cur().line;
      if (IsOp("|")) {
        Advance();
        ASSIGN_OR_RETURN(std::string name, ExpectName());
        if (!IsSupportedFilter(name)) {
          return Error(line, absl::StrCat("unsupported filter '", name,
                                          "' (outside the chat-template subset)"));
        }
        ExprPtr e = Make(Expr::Kind::kFilter, line);
        e->name = std::move(name);
        e->args.push_back(std::move(node));
        if (IsOp("(")) RETURN_IF_ERROR(ParseArgs(e.get()));
        node = std::move(e);
      } else if (IsName("is")) {
        Advance();
        ExprPtr e = Make(Expr::Kind::kTest, line);
        if (IsName("not")) {
          e->negated = true;
          Advance();
        }
        if (Cur().type != TokenType::kName) return Unexpected("a test name");
        e->name = Cur().text;
        Advance();
        if (!IsSupportedTest(e->name)) {
          return Error(line, absl::StrCat("unsupported test '", e->name,
                                          "' (outside the chat-template subset)"));
        }
        e->args.push_back(std::move(node));
        if (IsOp("(")) {
          RETURN_IF_ERROR(ParseArgs(e.get()));
        } else if ((Cur().type == TokenType::kName || Cur().type == TokenType::kString ||
                    Cur().type == TokenType::kInt || Cur().type == TokenType::kFloat || IsOp("[") ||
                    IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and") && !IsName("if")) {
          if (IsName("is")) return Error(Cur().line, "cannot chain multiple tests with 'is'");
          ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          e->args.push_back(std::move(arg));
        }
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  struct DepthGuard {
    explicit DepthGuard(int* depth) : depth(depth) { ++*depth; }
    ~DepthGuard() { --*depth; }
    int* depth;
  };
  // A left-associative chain (a + b + c ..., a.b.c ...) deepens the tree by one per link.
  struct ChainGuard {
    explicit ChainGuard(int* depth) : depth(depth) {}
    ~ChainGuard() { *depth -= links; }
    bool Link() {
      ++*depth;
      ++links;
      return *depth <= kMaxNesting;
    }
    int* depth;
    int links = 0;
  };
  absl::Status TooDeep() const { return Error(Cur().line, "expression nested too deeply"); }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

bool IsSupportedFilter(std::string_view name) { return Contains(kFilters, name); }
bool IsSupportedTest(std::string_view name) { return Contains(kTests, name); }
bool IsSupportedMethod(std::string_view name) { return Contains(kMethods, name); }
bool IsSupportedFunction(std::string_view name) { return Contains(kFunctions, name); }

absl::StatusOr<std::vector<Node>> Parse(const std::vector<Token>& tokens) {
  return Parser(tokens).Run();
}

}  // namespace tandem::jinja

#pragma once
// Parser of the chat-template Jinja subset (see jinja_template.h for what the subset is): turns
// lexer tokens into a tree of Nodes and Exprs. Anything outside the subset (an unknown statement,
// filter, test, method or function, macros, `for ... if`, block `set`, ...) is rejected here, at
// compile time, with the construct and its line, so a template never renders half-supported.
//
// The tree is immutable after parsing and owns all its children.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/jinja_lexer.h"
#include "runtime/model/jinja_value.h"

namespace tandem::jinja {

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]]; absent bounds are null
    kCall,     // args[0](args[1:], kwargs); args[0] is a kName (function) or kAttr (method)
    kFilter,   // args[0] | name(args[1:], kwargs)
    kTest,     // args[0] is [not] name(args[1:])
    kNot,      // not args[0]
    kNeg,      // -args[0]
    kBinary,   // args[0] op args[1]: + - * / // % ** ~
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...: == != < > <= >= in, "not in"
    kAnd,      // args[0] and args[1]
    kOr,       // args[0] or args[1]
    kCond,     // args[1] if args[0] else args[2] (args[2] null: undefined)
    kList,     // [args...] (also tuples)
    kDict,     // {kwargs...} with keys in args[2i], values in args[2i+1]
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;  // name, attribute, filter, test, or binary operator
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Node {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // branches (condition, body) in order, then else_body
    kFor,     // for targets in expr: body, else: else_body
    kSet,     // set targets[0] = expr, or set targets[0].targets[1] = expr (namespace)
  };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;
  std::unique_ptr<Expr> expr;
  std::vector<std::pair<std::unique_ptr<Expr>, std::vector<Node>>> branches;
  std::vector<Node> body;
  std::vector<Node> else_body;
  std::vector<std::string> targets;
};

// Names the interpreter implements; the parser rejects any other.
bool IsSupportedFilter(std::string_view name);
bool IsSupportedTest(std::string_view name);
bool IsSupportedMethod(std::string_view name);
bool IsSupportedFunction(std::string_view name);

absl::StatusOr<std::vector<Node>> Parse(const std::vector<Token>& tokens);

}  // namespace tandem::jinja

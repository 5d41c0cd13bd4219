#include "runtime/model/jinja_template.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"

namespace tandem::jinja {
namespace {

constexpr int64_t kMaxRangeLength = 1 << 20;
constexpr uint64_t kMaxRepeatedSize = 64 << 20;  // bytes or items produced by `*` repetition

absl::Status Err(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

absl::Status UndefinedErr(int line, const Value& v) {
  return Err(line, v.string_value().empty()
                       ? std::string("undefined value used")
                       : absl::StrCat("'", v.string_value(), "' is undefined"));
}

// A string as (code point, byte offset) pairs, for Python's code-point indexing and stripping.
struct CodePoints {
  std::vector<uint32_t> cps;
  std::vector<size_t> offsets;  // offsets[i] = byte start of cps[i]; offsets[size] = end
};

CodePoints Decode(std::string_view s) {
  CodePoints out;
  size_t pos = 0;
  while (pos < s.size()) {
    out.offsets.push_back(pos);
    out.cps.push_back(NextUtf8CodePoint(s, &pos));
  }
  out.offsets.push_back(s.size());
  return out;
}

// Python str.strip/lstrip/rstrip; `chars` null means whitespace.
std::string Strip(std::string_view s, const std::string* chars, bool left, bool right) {
  CodePoints text = Decode(s);
  CodePoints set;
  if (chars != nullptr) set = Decode(*chars);
  auto strippable = [&](uint32_t c) {
    if (chars == nullptr) return IsPythonSpace(c);
    return std::find(set.cps.begin(), set.cps.end(), c) != set.cps.end();
  };
  size_t begin = 0;
  size_t end = text.cps.size();
  if (left) {
    while (begin < end && strippable(text.cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strippable(text.cps[end - 1])) --end;
  }
  return std::string(s.substr(text.offsets[begin], text.offsets[end] - text.offsets[begin]));
}

std::vector<std::string> SplitWhitespace(std::string_view s, int64_t maxsplit) {
  CodePoints text = Decode(s);
  std::vector<std::string> parts;
  size_t i = 0;
  size_t n = text.cps.size();
  while (true) {
    while (i < n && IsPythonSpace(text.cps[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      size_t end = n;
      while (end > i && IsPythonSpace(text.cps[end - 1])) --end;
      parts.emplace_back(s.substr(text.offsets[i], text.offsets[end] - text.offsets[i]));
      break;
    }
    size_t start = i;
    while (i < n && !IsPythonSpace(text.cps[i])) ++i;
    parts.emplace_back(s.substr(text.offsets[start], text.offsets[i] - text.offsets[start]));
  }
  return parts;
}

std::vector<std::string> SplitSep(std::string_view s, std::string_view sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    size_t found = s.find(sep, start);
    if (found == std::string_view::npos) break;
    parts.emplace_back(s.substr(start, found - start));
    start = found + sep.size();
  }
  parts.emplace_back(s.substr(start));
  return parts;
}

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to,
                       int64_t count) {
  if (from.empty()) return std::string(s);
  std::string out;
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t found = s.find(from, start);
    if (found == std::string_view::npos) break;
    out.append(s.substr(start, found - start));
    out.append(to);
    start = found + from.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

std::string Title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    if (absl::ascii_isalpha(u)) {
      c = prev_cased ? absl::ascii_tolower(u) : absl::ascii_toupper(u);
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

std::string Capitalize(std::string_view s) {
  std::string out = absl::AsciiStrToLower(std::string(s));
  if (!out.empty()) out[0] = absl::ascii_toupper(static_cast<unsigned char>(out[0]));
  return out;
}

// Python slice index normalization for a sequence of length n.
std::vector<int64_t> SliceIndices(int64_t n, const Value& start_v, const Value& stop_v,
                                  int64_t step) {
  auto given = [](const Value& v) { return !v.is_undefined() && !v.is_none(); };
  int64_t start;
  int64_t stop;
  if (step > 0) {
    start = given(start_v) ? start_v.int_value() : 0;
    stop = given(stop_v) ? stop_v.int_value() : n;
    if (start < 0) start = std::max<int64_t>(start + n, 0);
    if (stop < 0) stop = std::max<int64_t>(stop + n, 0);
    start = std::min(start, n);
    stop = std::min(stop, n);
  } else {
    start = given(start_v) ? start_v.int_value() : n - 1;
    stop = given(stop_v) ? stop_v.int_value() : -1;
    bool stop_given = given(stop_v);
    if (start < 0) start = std::max<int64_t>(start + n, -1);
    if (start >= n) start = n - 1;
    if (stop_given) {
      if (stop < 0) stop = std::max<int64_t>(stop + n, -1);
      if (stop >= n) stop = n - 1;
    }
  }
  std::vector<int64_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
  return out;
}

bool IsIntLike(const Value& v) {
  return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool;
}
int64_t AsInt(const Value& v) {
  return v.kind() == Value::Kind::kBool ? static_cast<int64_t>(v.bool_value()) : v.int_value();
}
bool IsNumeric(const Value& v) { return IsIntLike(v) || v.kind() == Value::Kind::kFloat; }
double AsDouble(const Value& v) {
  return v.kind() == Value::Kind::kFloat ? v.float_value() : static_cast<double>(AsInt(v));
}

class Renderer {
 public:
  explicit Renderer(const Object& variables) {
    scopes_.emplace_back();
    for (std::string_view fn : {"raise_exception", "strftime_now", "namespace", "range"}) {
      scopes_[0][std::string(fn)] = Value::Builtin(std::string(fn));
    }
    for (const auto& [name, value] : variables) scopes_[0][name] = value;
    scopes_.emplace_back();  // template-level `set`s
  }

  absl::Status RenderNodes(const std::vector<Node>& nodes, std::string* out) {
    for (const Node& node : nodes) {
      RETURN_IF_ERROR(RenderNode(node, out));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status RenderNode(const Node& node, std::string* out) {
    switch (node.kind) {
      case Node::Kind::kText:
        out->append(node.text);
        return absl::OkStatus();
      case Node::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
        out->append(v.ToString());
        return absl::OkStatus();
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : node.branches) {
          ASSIGN_OR_RETURN(Value c, Eval(*cond));
          if (c.Truthy()) return RenderNodes(body, out);
        }
        return RenderNodes(node.else_body, out);
      case Node::Kind::kFor:
        return RenderFor(node, out);
      case Node::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
        if (node.targets.size() == 1) {
          scopes_.back()[node.targets[0]] = std::move(v);
          return absl::OkStatus();
        }
        Value ns = Lookup(node.targets[0]);
        Object* entries = ns.mutable_namespace();
        if (entries == nullptr) {
          return Err(node.line, absl::StrCat("cannot set attribute '", node.targets[1], "' of '",
                                             node.targets[0], "': not a namespace()"));
        }
        for (auto& [k, existing] : *entries) {
          if (k == node.targets[1]) {
            existing = std::move(v);
            return absl::OkStatus();
          }
        }
        entries->emplace_back(node.targets[1], std::move(v));
        return absl::OkStatus();
      }
    }
    return absl::InternalError("unknown node kind");
  }

  absl::Status RenderFor(const Node& node, std::string* out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr));
    ASSIGN_OR_RETURN(Array items, Iterate(iterable, node.line));
    if (items.empty()) {
      scopes_.emplace_back();
      absl::Status status = RenderNodes(node.else_body, out);
      scopes_.pop_back();
      return status;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      scopes_.emplace_back();
      auto& scope = scopes_.back();
      const Value& item = items[static_cast<size_t>(i)];
      if (node.targets.size() == 1) {
        scope[node.targets[0]] = item;
      } else {
        if (item.kind() != Value::Kind::kArray || item.array().size() != node.targets.size()) {
          scopes_.pop_back();
          return Err(node.line, absl::StrCat("cannot unpack ", item.TypeName(), " into ",
                                             node.targets.size(), " loop variables"));
        }
        for (size_t t = 0; t < node.targets.size(); ++t) scope[node.targets[t]] = item.array()[t];
      }
      Object loop = {
          {"index", Value::Int(i + 1)},
          {"index0", Value::Int(i)},
          {"revindex", Value::Int(n - i)},
          {"revindex0", Value::Int(n - i - 1)},
          {"first", Value::Bool(i == 0)},
          {"last", Value::Bool(i == n - 1)},
          {"length", Value::Int(n)},
          {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::Undefined("previtem")},
          {"nextitem",
           i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::Undefined("nextitem")},
      };
      scope["loop"] = Value::MakeObject(std::move(loop));
      absl::Status status = RenderNodes(node.body, out);
      scopes_.pop_back();
      RETURN_IF_ERROR(status);
    }
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value::Undefined(name);
  }

  absl::StatusOr<Array> Iterate(const Value& v, int line) const {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return Array();
      case Value::Kind::kArray:
        return v.array();
      case Value::Kind::kObject: {
        Array keys;
        for (const auto& [k, unused] : v.object()) keys.push_back(Value::String(k));
        return keys;
      }
      case Value::Kind::kString: {
        Array chars;
        CodePoints cps = Decode(v.string_value());
        for (size_t i = 0; i < cps.cps.size(); ++i) {
          chars.push_back(Value::String(
              v.string_value().substr(cps.offsets[i], cps.offsets[i + 1] - cps.offsets[i])));
        }
        return chars;
      }
      default:
        return Err(line, absl::StrCat("'", v.TypeName(), "' object is not iterable"));
    }
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        if (obj.is_undefined()) return UndefinedErr(e.line, obj);
        if (obj.kind() == Value::Kind::kObject || obj.kind() == Value::Kind::kNamespace) {
          const Value* found = obj.Find(e.name);
          if (found != nullptr) return *found;
        }
        return Value::Undefined(e.name);
      }
      case Expr::Kind::kItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(obj, key, e.line);
      }
      case Expr::Kind::kSlice:
        return EvalSlice(e);
      case Expr::Kind::kCall:
        return EvalCall(e);
      case Expr::Kind::kFilter:
        return EvalFilter(e);
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
        Array args;
        for (size_t i = 1; i < e.args.size(); ++i) {
          ASSIGN_OR_RETURN(Value a, Eval(*e.args[i]));
          args.push_back(std::move(a));
        }
        ASSIGN_OR_RETURN(bool result, ApplyTest(e.name, subject, args, e.line));
        return Value::Bool(result != e.negated);
      }
      case Expr::Kind::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value::Bool(!v.Truthy());
      }
      case Expr::Kind::kNeg: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (v.is_undefined()) return UndefinedErr(e.line, v);
        if (IsIntLike(v)) {
          if (AsInt(v) == INT64_MIN) return Err(e.line, "integer overflow");
          return Value::Int(-AsInt(v));
        }
        if (v.kind() == Value::Kind::kFloat) return Value::Float(-v.float_value());
        return Err(e.line, absl::StrCat("bad operand type for unary -: '", v.TypeName(), "'"));
      }
      case Expr::Kind::kBinary: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
        return BinaryOp(e.name, a, b, e.line);
      }
      case Expr::Kind::kCompare: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
          ASSIGN_OR_RETURN(bool ok, Compare(e.ops[i], left, right, e.line));
          if (!ok) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kAnd: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (!a.Truthy()) return a;
        return Eval(*e.args[1]);
      }
      case Expr::Kind::kOr: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (a.Truthy()) return a;
        return Eval(*e.args[1]);
      }
      case Expr::Kind::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.args[0]));
        if (c.Truthy()) return Eval(*e.args[1]);
        if (e.args[2] == nullptr) return Value::Undefined();
        return Eval(*e.args[2]);
      }
      case Expr::Kind::kList: {
        Array items;
        for (const auto& a : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*a));
          items.push_back(std::move(v));
        }
        return Value::MakeArray(std::move(items));
      }
      case Expr::Kind::kDict: {
        Object entries;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
          ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
          if (!k.is_string()) return Err(e.line, "dict literal keys must be strings");
          bool replaced = false;
          for (auto& [ek, ev] : entries) {
            if (ek == k.string_value()) {
              ev = v;
              replaced = true;
            }
          }
          if (!replaced) entries.emplace_back(k.string_value(), std::move(v));
        }
        return Value::MakeObject(std::move(entries));
      }
    }
    return absl::InternalError("unknown expression kind");
  }

  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key, int line) {
    switch (obj.kind()) {
      case Value::Kind::kUndefined:
        return UndefinedErr(line, obj);
      case Value::Kind::kObject:
      case Value::Kind::kNamespace: {
        if (key.is_string()) {
          const Value* found = obj.Find(key.string_value());
          if (found != nullptr) return *found;
          return Value::Undefined(key.string_value());
        }
        return Value::Undefined();
      }
      case Value::Kind::kArray: {
        if (!IsIntLike(key)) return Value::Undefined();
        int64_t n = static_cast<int64_t>(obj.array().size());
        int64_t i = AsInt(key);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::Undefined();
        return obj.array()[static_cast<size_t>(i)];
      }
      case Value::Kind::kString: {
        if (!IsIntLike(key)) return Value::Undefined();
        CodePoints cps = Decode(obj.string_value());
        int64_t n = static_cast<int64_t>(cps.cps.size());
        int64_t i = AsInt(key);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::Undefined();
        size_t u = static_cast<size_t>(i);
        return Value::String(
            obj.string_value().substr(cps.offsets[u], cps.offsets[u + 1] - cps.offsets[u]));
      }
      default:
        return Value::Undefined();
    }
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    std::array<Value, 3> bounds;
    for (size_t i = 0; i < 3; ++i) {
      if (e.args[i + 1] == nullptr) continue;
      ASSIGN_OR_RETURN(bounds[i], Eval(*e.args[i + 1]));
      if (!bounds[i].is_none() && !IsIntLike(bounds[i])) {
        return Err(e.line, "slice indices must be integers or none");
      }
      if (IsIntLike(bounds[i])) bounds[i] = Value::Int(AsInt(bounds[i]));
    }
    int64_t step = bounds[2].kind() == Value::Kind::kInt ? bounds[2].int_value() : 1;
    if (step == 0) return Err(e.line, "slice step cannot be zero");
    if (obj.kind() == Value::Kind::kArray) {
      Array out;
      for (int64_t i :
           SliceIndices(static_cast<int64_t>(obj.array().size()), bounds[0], bounds[1], step)) {
        out.push_back(obj.array()[static_cast<size_t>(i)]);
      }
      return Value::MakeArray(std::move(out));
    }
    if (obj.is_string()) {
      CodePoints cps = Decode(obj.string_value());
      std::string out;
      for (int64_t i :
           SliceIndices(static_cast<int64_t>(cps.cps.size()), bounds[0], bounds[1], step)) {
        size_t u = static_cast<size_t>(i);
        out.append(obj.string_value().substr(cps.offsets[u], cps.offsets[u + 1] - cps.offsets[u]));
      }
      return Value::String(std::move(out));
    }
    if (obj.is_undefined()) return UndefinedErr(e.line, obj);
    return Err(e.line, absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }

  // Evaluated positional and keyword arguments of a call, filter or test.
  struct Args {
    Array positional;
    Object keyword;
    // The i-th positional argument, else the keyword `name`, else `fallback`.
    Value Get(size_t i, std::string_view name, Value fallback = Value::Undefined()) const {
      if (i < positional.size()) return positional[i];
      for (const auto& [k, v] : keyword) {
        if (k == name) return v;
      }
      return fallback;
    }
  };

  absl::StatusOr<Args> EvalArgs(const Expr& e, size_t first) {
    Args args;
    for (size_t i = first; i < e.args.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [k, ke] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*ke));
      args.keyword.emplace_back(k, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> EvalCall(const Expr& e) {
    const Expr& callee = *e.args[0];
    ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
    if (callee.kind == Expr::Kind::kName) {
      Value fn = Lookup(callee.name);
      if (fn.is_undefined()) return UndefinedErr(e.line, fn);
      if (fn.kind() != Value::Kind::kBuiltin) {
        return Err(e.line, absl::StrCat("'", fn.TypeName(), "' object is not callable"));
      }
      return CallBuiltin(fn.string_value(), args, e.line);
    }
    ASSIGN_OR_RETURN(Value obj, Eval(*callee.args[0]));
    return CallMethod(obj, callee.name, args, e.line);
  }

  absl::StatusOr<Value> CallBuiltin(const std::string& name, const Args& args, int line) {
    if (name == "raise_exception") {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template raised an exception: ", args.Get(0, "message").ToString()));
    }
    if (name == "strftime_now") {
      Value fmt = args.Get(0, "format");
      if (!fmt.is_string()) return Err(line, "strftime_now() needs a format string");
      std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[256];
      size_t n = std::strftime(buf, sizeof(buf), fmt.string_value().c_str(), &local);
      return Value::String(std::string(buf, n));
    }
    if (name == "namespace") {
      Object entries;
      for (const Value& p : args.positional) {
        if (!p.is_mapping()) return Err(line, "namespace() positional argument must be a dict");
        entries.insert(entries.end(), p.object().begin(), p.object().end());
      }
      entries.insert(entries.end(), args.keyword.begin(), args.keyword.end());
      return Value::MakeNamespace(std::move(entries));
    }
    if (name == "range") {
      int64_t start = 0;
      int64_t stop = 0;
      int64_t step = 1;
      for (const Value& p : args.positional) {
        if (!IsIntLike(p)) return Err(line, "range() arguments must be integers");
      }
      const Array& p = args.positional;
      if (p.size() == 1) {
        stop = AsInt(p[0]);
      } else if (p.size() == 2 || p.size() == 3) {
        start = AsInt(p[0]);
        stop = AsInt(p[1]);
        if (p.size() == 3) step = AsInt(p[2]);
      } else {
        return Err(line, "range() takes 1 to 3 arguments");
      }
      if (step == 0) return Err(line, "range() step must not be zero");
      Array out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (static_cast<int64_t>(out.size()) >= kMaxRangeLength) {
          return Err(line, "range() too long");
        }
        out.push_back(Value::Int(i));
      }
      return Value::MakeArray(std::move(out));
    }
    return Err(line, absl::StrCat("unknown function '", name, "'"));
  }

  absl::StatusOr<Value> CallMethod(const Value& obj, const std::string& name, const Args& args,
                                   int line) {
    if (obj.is_undefined()) return UndefinedErr(line, obj);
    if (obj.is_string()) {
      const std::string& s = obj.string_value();
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        Value chars = args.Get(0, "chars");
        if (!chars.is_string() && !chars.is_none() && !chars.is_undefined()) {
          return Err(line, absl::StrCat(name, "() argument must be a string or none"));
        }
        const std::string* set = chars.is_string() ? &chars.string_value() : nullptr;
        return Value::String(Strip(s, set, name != "rstrip", name != "lstrip"));
      }
      if (name == "startswith" || name == "endswith") {
        Value arg = args.Get(0, "prefix");
        Array candidates = arg.kind() == Value::Kind::kArray ? arg.array() : Array{arg};
        for (const Value& c : candidates) {
          if (!c.is_string()) return Err(line, absl::StrCat(name, "() argument must be a string"));
          const std::string& a = c.string_value();
          bool match = a.size() <= s.size() &&
                       (name == "startswith" ? s.compare(0, a.size(), a) == 0
                                             : s.compare(s.size() - a.size(), a.size(), a) == 0);
          if (match) return Value::Bool(true);
        }
        return Value::Bool(false);
      }
      if (name == "split") {
        Value sep = args.Get(0, "sep", Value::None());
        Value maxsplit = args.Get(1, "maxsplit", Value::Int(-1));
        if (!IsIntLike(maxsplit)) return Err(line, "split() maxsplit must be an integer");
        std::vector<std::string> parts;
        if (sep.is_none()) {
          parts = SplitWhitespace(s, AsInt(maxsplit));
        } else if (sep.is_string() && !sep.string_value().empty()) {
          parts = SplitSep(s, sep.string_value(), AsInt(maxsplit));
        } else {
          return Err(line, "split() separator must be a non-empty string");
        }
        Array out;
        for (auto& p : parts) out.push_back(Value::String(std::move(p)));
        return Value::MakeArray(std::move(out));
      }
      if (name == "upper") return Value::String(absl::AsciiStrToUpper(s));
      if (name == "lower") return Value::String(absl::AsciiStrToLower(s));
      if (name == "title") return Value::String(Title(s));
      if (name == "capitalize") return Value::String(Capitalize(s));
      if (name == "replace") {
        Value from = args.Get(0, "old");
        Value to = args.Get(1, "new");
        Value count = args.Get(2, "count", Value::Int(-1));
        if (!from.is_string() || !to.is_string() || !IsIntLike(count)) {
          return Err(line, "replace() needs (old: str, new: str[, count: int])");
        }
        return Value::String(ReplaceAll(s, from.string_value(), to.string_value(), AsInt(count)));
      }
      if (name == "find") {
        Value sub = args.Get(0, "sub");
        if (!sub.is_string()) return Err(line, "find() argument must be a string");
        size_t at = s.find(sub.string_value());
        if (at == std::string::npos) return Value::Int(-1);
        return Value::Int(static_cast<int64_t>(Utf8Length(std::string_view(s).substr(0, at))));
      }
    }
    if (obj.is_mapping()) {
      if (name == "items") {
        Array out;
        for (const auto& [k, v] : obj.object()) {
          out.push_back(Value::MakeArray({Value::String(k), v}));
        }
        return Value::MakeArray(std::move(out));
      }
      if (name == "keys" || name == "values") {
        Array out;
        for (const auto& [k, v] : obj.object()) {
          out.push_back(name == "keys" ? Value::String(k) : v);
        }
        return Value::MakeArray(std::move(out));
      }
      if (name == "get") {
        Value key = args.Get(0, "key");
        if (key.is_string()) {
          const Value* found = obj.Find(key.string_value());
          if (found != nullptr) return *found;
        }
        return args.Get(1, "default", Value::None());
      }
    }
    return Err(line, absl::StrCat("'", obj.TypeName(), "' object has no method '", name, "'"));
  }

  absl::StatusOr<Value> BinaryOp(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") return Value::String(a.ToString() + b.ToString());
    if (a.is_undefined()) return UndefinedErr(line, a);
    if (b.is_undefined()) return UndefinedErr(line, b);
    auto type_error = [&]() {
      return Err(line, absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(),
                                    "' and '", b.TypeName(), "'"));
    };
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value::String(a.string_value() + b.string_value());
      if (a.kind() == Value::Kind::kArray && b.kind() == Value::Kind::kArray) {
        Array out = a.array();
        out.insert(out.end(), b.array().begin(), b.array().end());
        return Value::MakeArray(std::move(out));
      }
    }
    if (op == "*" && (a.is_string() || a.kind() == Value::Kind::kArray) && IsIntLike(b)) {
      int64_t times = AsInt(b);
      size_t unit = a.is_string() ? a.string_value().size() : a.array().size();
      if (times > 0 && unit > 0 && static_cast<uint64_t>(times) > kMaxRepeatedSize / unit) {
        return Err(line, "repetition result too large");
      }
      if (a.is_string()) {
        std::string out;
        for (int64_t i = 0; i < times; ++i) out += a.string_value();
        return Value::String(std::move(out));
      }
      Array out;
      for (int64_t i = 0; i < times; ++i) out.insert(out.end(), a.array().begin(), a.array().end());
      return Value::MakeArray(std::move(out));
    }
    if (!IsNumeric(a) || !IsNumeric(b)) return type_error();
    bool ints = IsIntLike(a) && IsIntLike(b);
    if (op == "/") {
      if (AsDouble(b) == 0) return Err(line, "division by zero");
      return Value::Float(AsDouble(a) / AsDouble(b));
    }
    if (ints) {
      int64_t x = AsInt(a);
      int64_t y = AsInt(b);
      int64_t r = 0;
      if (op == "+" || op == "-" || op == "*") {
        bool overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                        : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                    : __builtin_mul_overflow(x, y, &r);
        if (overflow) return Err(line, "integer overflow");
        return Value::Int(r);
      }
      if (op == "//" || op == "%") {
        if (y == 0) return Err(line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) return Err(line, "integer overflow");
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value::Int(op == "//" ? q : x - q * y);
      }
      if (op == "**" && y >= 0) {
        if (x == 0 || x == 1) return Value::Int(y == 0 ? 1 : x);
        if (x == -1) return Value::Int(y % 2 == 0 ? 1 : -1);
        r = 1;  // |x| >= 2 overflows within 64 steps
        for (int64_t i = 0; i < y; ++i) {
          if (__builtin_mul_overflow(r, x, &r)) return Err(line, "integer overflow");
        }
        return Value::Int(r);
      }
    }
    double x = AsDouble(a);
    double y = AsDouble(b);
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "**") return Value::Float(std::pow(x, y));
    if (op == "//" || op == "%") {
      if (y == 0) return Err(line, "float division or modulo by zero");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Float(op == "%" ? m : std::floor(x / y));
    }
    return type_error();
  }

  absl::StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return a.Equals(b);
    if (op == "!=") return !a.Equals(b);
    if (op == "in" || op == "not in") {
      ASSIGN_OR_RETURN(bool in, Contains(b, a, line));
      return in == (op == "in");
    }
    if (a.is_undefined()) return UndefinedErr(line, a);
    if (b.is_undefined()) return UndefinedErr(line, b);
    int cmp;
    if (IsNumeric(a) && IsNumeric(b)) {
      double x = AsDouble(a);
      double y = AsDouble(b);
      if (IsIntLike(a) && IsIntLike(b)) {
        cmp = AsInt(a) < AsInt(b) ? -1 : AsInt(a) > AsInt(b) ? 1 : 0;
      } else {
        cmp = x < y ? -1 : x > y ? 1 : 0;
      }
    } else if (a.is_string() && b.is_string()) {
      int c = a.string_value().compare(b.string_value());
      cmp = c < 0 ? -1 : c > 0 ? 1 : 0;
    } else {
      return Err(line, absl::StrCat("'", op, "' not supported between '", a.TypeName(), "' and '",
                                    b.TypeName(), "'"));
    }
    if (op == "<") return cmp < 0;
    if (op == ">") return cmp > 0;
    if (op == "<=") return cmp <= 0;
    return cmp >= 0;
  }

  absl::StatusOr<bool> Contains(const Value& container, const Value& item, int line) {
    switch (container.kind()) {
      case Value::Kind::kUndefined:
        return false;
      case Value::Kind::kString:
        if (item.is_undefined()) return UndefinedErr(line, item);
        if (!item.is_string()) {
          return Err(line, absl::StrCat("'in <string>' requires string as left operand, not ",
                                        item.TypeName()));
        }
        return container.string_value().find(item.string_value()) != std::string::npos;
      case Value::Kind::kArray:
        for (const Value& v : container.array()) {
          if (v.Equals(item)) return true;
        }
        return false;
      case Value::Kind::kObject:
      case Value::Kind::kNamespace:
        return item.is_string() && container.Find(item.string_value()) != nullptr;
      default:
        return Err(line,
                   absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
    }
  }

  absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const Array& args,
                                 int line) {
    using K = Value::Kind;
    auto arg = [&](size_t i) { return i < args.size() ? args[i] : Value::Undefined(); };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_mapping();
    if (name == "iterable") {
      return v.is_undefined() || v.is_string() || v.kind() == K::kArray || v.is_mapping();
    }
    if (name == "sequence") {
      return v.is_undefined() || v.is_string() || v.kind() == K::kArray || v.is_mapping();
    }
    if (name == "number") return IsNumeric(v);
    if (name == "integer") return v.kind() == K::kInt;
    if (name == "float") return v.kind() == K::kFloat;
    if (name == "boolean") return v.kind() == K::kBool;
    if (name == "true") return v.kind() == K::kBool && v.bool_value();
    if (name == "false") return v.kind() == K::kBool && !v.bool_value();
    if (name == "equalto" || name == "eq") return v.Equals(arg(0));
    if (name == "ne") return !v.Equals(arg(0));
    if (name == "odd" || name == "even") {
      if (!IsIntLike(v)) return Err(line, absl::StrCat("test '", name, "' needs an integer"));
      bool odd = (AsInt(v) % 2) != 0;
      return name == "odd" ? odd : !odd;
    }
    if (name == "lower")
      return v.is_string() && absl::AsciiStrToLower(v.string_value()) == v.string_value();
    if (name == "upper")
      return v.is_string() && absl::AsciiStrToUpper(v.string_value()) == v.string_value();
    if (name == "callable") return v.kind() == K::kBuiltin;
    if (name == "in") return Contains(arg(0), v, line);
    return Err(line, absl::StrCat("unknown test '", name, "'"));
  }

  absl::StatusOr<Value> EvalFilter(const Expr& e) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
    return ApplyFilter(e.name, v, args, e.line);
  }

  absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const Args& args,
                                    int line) {
    using K = Value::Kind;
    if (name == "trim") {
      Value chars = args.Get(0, "chars", Value::None());
      const std::string* set = chars.is_string() ? &chars.string_value() : nullptr;
      return Value::String(Strip(v.ToString(), set, true, true));
    }
    if (name == "length" || name == "count") {
      switch (v.kind()) {
        case K::kUndefined:
          return Value::Int(0);
        case K::kString:
          return Value::Int(static_cast<int64_t>(Utf8Length(v.string_value())));
        case K::kArray:
          return Value::Int(static_cast<int64_t>(v.array().size()));
        case K::kObject:
          return Value::Int(static_cast<int64_t>(v.object().size()));
        default:
          return Err(line, absl::StrCat("object of type '", v.TypeName(), "' has no length"));
      }
    }
    if (name == "tojson") {
      for (const auto& [k, unused] : args.keyword) {
        if (k != "indent") return Err(line, absl::StrCat("tojson: unsupported argument '", k, "'"));
      }
      Value indent = args.Get(0, "indent", Value::None());
      if (!indent.is_none() && !IsIntLike(indent)) return Err(line, "tojson: indent must be int");
      absl::StatusOr<std::string> json =
          v.ToJson(indent.is_none() ? -1 : static_cast<int>(AsInt(indent)));
      if (!json.ok()) return Err(line, std::string(json.status().message()));
      return Value::String(*std::move(json));
    }
    if (name == "upper") return Value::String(absl::AsciiStrToUpper(v.ToString()));
    if (name == "lower") return Value::String(absl::AsciiStrToLower(v.ToString()));
    if (name == "title") return Value::String(Title(v.ToString()));
    if (name == "capitalize") return Value::String(Capitalize(v.ToString()));
    if (name == "default" || name == "d") {
      Value fallback = args.Get(0, "default_value", Value::String(""));
      bool boolean = args.Get(1, "boolean", Value::Bool(false)).Truthy();
      if (v.is_undefined() || (boolean && !v.Truthy())) return fallback;
      return v;
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::MakeArray({});
      if (!v.is_mapping()) return Err(line, "items filter needs a mapping");
      Array out;
      for (const auto& [k, val] : v.object())
        out.push_back(Value::MakeArray({Value::String(k), val}));
      return Value::MakeArray(std::move(out));
    }
    if (name == "string") return Value::String(v.ToString());
    if (name == "join") {
      Value sep = args.Get(0, "d", Value::String(""));
      ASSIGN_OR_RETURN(Array items, Iterate(v, line));
      std::vector<std::string> parts;
      for (const Value& item : items) parts.push_back(item.ToString());
      return Value::String(absl::StrJoin(parts, sep.ToString()));
    }
    if (name == "select" || name == "reject") {
      ASSIGN_OR_RETURN(Array items, Iterate(v, line));
      Array out;
      Value test = args.Get(0, "");
      Array test_args(
          args.positional.size() > 1 ? args.positional.begin() + 1 : args.positional.end(),
          args.positional.end());
      if (!test.is_undefined() && (!test.is_string() || !IsSupportedTest(test.string_value()))) {
        return Err(line, absl::StrCat(name, ": unsupported test '", test.ToString(), "'"));
      }
      for (const Value& item : items) {
        bool pass;
        if (test.is_undefined()) {
          pass = item.Truthy();
        } else {
          ASSIGN_OR_RETURN(pass, ApplyTest(test.string_value(), item, test_args, line));
        }
        if (pass == (name == "select")) out.push_back(item);
      }
      return Value::MakeArray(std::move(out));
    }
    if (name == "first" || name == "last") {
      ASSIGN_OR_RETURN(Array items, Iterate(v, line));
      if (items.empty()) return Value::Undefined();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") {
      ASSIGN_OR_RETURN(Array items, Iterate(v, line));
      return Value::MakeArray(std::move(items));
    }
    if (name == "unique") {
      ASSIGN_OR_RETURN(Array items, Iterate(v, line));
      Array out;
      for (const Value& item : items) {
        bool seen = false;
        for (const Value& o : out) seen = seen || o.Equals(item);
        if (!seen) out.push_back(item);
      }
      return Value::MakeArray(std::move(out));
    }
    if (name == "int") {
      if (IsIntLike(v)) return Value::Int(AsInt(v));
      if (v.kind() == K::kFloat) return Value::Int(static_cast<int64_t>(v.float_value()));
      if (v.is_string()) {
        std::string s = Strip(v.string_value(), nullptr, true, true);
        char* end = nullptr;
        long long parsed = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end != nullptr && *end == '\0') return Value::Int(parsed);
      }
      return args.Get(0, "default", Value::Int(0));
    }
    if (name == "float") {
      if (IsNumeric(v)) return Value::Float(AsDouble(v));
      if (v.is_string()) {
        std::string s = Strip(v.string_value(), nullptr, true, true);
        char* end = nullptr;
        double parsed = std::strtod(s.c_str(), &end);
        if (!s.empty() && end != nullptr && *end == '\0') return Value::Float(parsed);
      }
      return args.Get(0, "default", Value::Float(0));
    }
    if (name == "replace") {
      Value from = args.Get(0, "old");
      Value to = args.Get(1, "new");
      Value count = args.Get(2, "count", Value::None());
      if (!from.is_string() || !to.is_string()) return Err(line, "replace needs two strings");
      return Value::String(ReplaceAll(v.ToString(), from.string_value(), to.string_value(),
                                      IsIntLike(count) ? AsInt(count) : -1));
    }
    if (name == "abs") {
      if (IsIntLike(v)) return Value::Int(std::llabs(AsInt(v)));
      if (v.kind() == K::kFloat) return Value::Float(std::fabs(v.float_value()));
      return Err(line, absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
    }
    return Err(line, absl::StrCat("unknown filter '", name, "'"));
  }

  // scopes_[0]: globals; [1]: template level; one more per for-loop iteration.
  std::vector<absl::flat_hash_map<std::string, Value>> scopes_;
};

}  // namespace

absl::StatusOr<Template> Template::Compile(std::string_view source, const LexOptions& options) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source, options));
  ASSIGN_OR_RETURN(std::vector<Node> nodes, Parse(tokens));
  return Template(std::move(nodes));
}

absl::StatusOr<std::string> Template::Render(const Object& variables) const {
  Renderer renderer(variables);
  std::string out;
  RETURN_IF_ERROR(renderer.RenderNodes(*nodes_, &out));
  return out;
}

}  // namespace tandem::jinja

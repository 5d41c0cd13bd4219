#include "runtime/model/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "runtime/base/json_string.h"
#include "runtime/base/status.h"

namespace tandem::jinja {
namespace {

// Python's float.__repr__: shortest round-trip digits, fixed notation for exponents in [-4, 16),
// scientific ("1e+16", "1.5e-05") outside, and always a ".0" on integral fixed values.
std::string PythonFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  int exponent = std::atoi(sci.c_str() + e + 1);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(static_cast<size_t>(exponent + 1) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exponent + 1)) + "." +
            digits.substr(static_cast<size_t>(exponent + 1));
    }
    return sign + out;
  }
  std::string mantissa = digits.substr(0, 1);
  if (digits.size() > 1) mantissa += "." + digits.substr(1);
  return absl::StrFormat("%s%se%c%02d", sign, mantissa, exponent < 0 ? '-' : '+',
                         std::abs(exponent));
}

void AppendCodePointEscape(uint32_t cp, std::string* out) {
  if (cp < 0x100) {
    absl::StrAppendFormat(out, "\\x%02x", cp);
  } else {
    absl::StrAppendFormat(out, "\\u%04x", cp);
  }
}

std::string PythonStringRepr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    uint32_t cp = NextUtf8CodePoint(s, &pos);
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<uint32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad || cp == 0x2028 ||
               cp == 0x2029) {
      AppendCodePointEscape(cp, &out);
    } else {
      out.append(s.substr(start, pos - start));
    }
  }
  out += quote;
  return out;
}

absl::Status AppendJson(const Value& v, int indent, int level, std::string* out) {
  auto newline = [&](int lvl) {
    *out += '\n';
    out->append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: '", v.string_value(), "' is undefined"));
    case Value::Kind::kBuiltin:
    case Value::Kind::kNamespace:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: object of type ", v.TypeName(), " is not JSON serializable"));
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.bool_value() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      *out += std::to_string(v.int_value());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      double d = v.float_value();
      if (std::isnan(d)) {
        *out += "NaN";
      } else if (std::isinf(d)) {
        *out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += PythonFloatRepr(d);
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(v.string_value(), out);
      return absl::OkStatus();
    case Value::Kind::kArray: {
      const Array& items = v.array();
      if (items.empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      *out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        RETURN_IF_ERROR(AppendJson(items[i], indent, level + 1, out));
      }
      if (indent >= 0) newline(level);
      *out += ']';
      return absl::OkStatus();
    }
    case Value::Kind::kObject: {
      const Object& entries = v.object();
      if (entries.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      *out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) *out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        AppendJsonString(entries[i].first, out);
        *out += ": ";
        RETURN_IF_ERROR(AppendJson(entries[i].second, indent, level + 1, out));
      }
      if (indent >= 0) newline(level);
      *out += '}';
      return absl::OkStatus();
    }
  }
  return absl::InternalError("tojson: unknown value kind");
}

template <typename Json>
Value FromJsonImpl(const Json& json) {
  switch (json.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value::Bool(json.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::Int(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Value::Int(static_cast<int64_t>(json.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return Value::Float(json.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::String(json.template get<std::string>());
    case nlohmann::json::value_t::binary:
      return Value::None();
    case nlohmann::json::value_t::array: {
      Array items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJsonImpl(item));
      return Value::MakeArray(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Object entries;
      entries.reserve(json.size());
      for (auto it = json.begin(); it != json.end(); ++it) {
        entries.emplace_back(it.key(), FromJsonImpl(it.value()));
      }
      return Value::MakeObject(std::move(entries));
    }
  }
  return Value::None();
}

}  // namespace

Value Value::Undefined(std::string name) {
  Value v;
  v.str_ = std::move(name);
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = d;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.str_ = std::move(s);
  return v;
}

Value Value::MakeArray(Array items) {
  Value v;
  v.kind_ = Kind::kArray;
  v.array_ = std::make_shared<const Array>(std::move(items));
  return v;
}

Value Value::MakeObject(Object entries) {
  Value v;
  v.kind_ = Kind::kObject;
  v.object_ = std::make_shared<Object>(std::move(entries));
  return v;
}

Value Value::MakeNamespace(Object entries) {
  Value v = MakeObject(std::move(entries));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::Builtin(std::string name) {
  Value v;
  v.kind_ = Kind::kBuiltin;
  v.str_ = std::move(name);
  return v;
}

const Array& Value::array() const {
  static const Array kEmpty;
  return array_ ? *array_ : kEmpty;
}

const Object& Value::object() const {
  static const Object kEmpty;
  return object_ ? *object_ : kEmpty;
}

Object* Value::mutable_namespace() const {
  return kind_ == Kind::kNamespace ? object_.get() : nullptr;
}

const Value* Value::Find(std::string_view key) const {
  if (!object_) return nullptr;
  for (const auto& [k, v] : *object_) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0;
    case Kind::kString:
      return !str_.empty();
    case Kind::kArray:
      return !array().empty();
    case Kind::kObject:
      return !object().empty();
    case Kind::kNamespace:
    case Kind::kBuiltin:
      return true;
  }
  return false;
}

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return str_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return PythonFloatRepr(float_);
    case Kind::kString:
      return PythonStringRepr(str_);
    case Kind::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < array().size(); ++i) {
        if (i > 0) out += ", ";
        out += array()[i].Repr();
      }
      return out + "]";
    }
    case Kind::kObject:
    case Kind::kNamespace: {
      std::string out = kind_ == Kind::kNamespace ? "<Namespace {" : "{";
      for (size_t i = 0; i < object().size(); ++i) {
        if (i > 0) out += ", ";
        out += PythonStringRepr(object()[i].first) + ": " + object()[i].second.Repr();
      }
      return out + (kind_ == Kind::kNamespace ? "}>" : "}");
    }
    case Kind::kBuiltin:
      return absl::StrCat("<built-in function ", str_, ">");
  }
  return "";
}

bool Value::Equals(const Value& other) const {
  auto numeric = [](const Value& v) {
    return v.kind_ == Kind::kInt || v.kind_ == Kind::kFloat || v.kind_ == Kind::kBool;
  };
  if (numeric(*this) && numeric(other)) {
    if (kind_ != Kind::kFloat && other.kind_ != Kind::kFloat) {
      int64_t a = kind_ == Kind::kBool ? static_cast<int64_t>(bool_) : int_;
      int64_t b = other.kind_ == Kind::kBool ? static_cast<int64_t>(other.bool_) : other.int_;
      return a == b;
    }
    double a = kind_ == Kind::kBool ? static_cast<double>(bool_) : float_value();
    double b = other.kind_ == Kind::kBool ? static_cast<double>(other.bool_) : other.float_value();
    return a == b;
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
    case Kind::kBuiltin:
      return str_ == other.str_;
    case Kind::kArray: {
      if (array().size() != other.array().size()) return false;
      for (size_t i = 0; i < array().size(); ++i) {
        if (!array()[i].Equals(other.array()[i])) return false;
      }
      return true;
    }
    case Kind::kObject: {
      if (object().size() != other.object().size()) return false;
      for (const auto& [k, v] : object()) {
        const Value* o = other.Find(k);
        if (o == nullptr || !v.Equals(*o)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return object_ == other.object_;
    default:
      return false;
  }
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kArray:
      return "list";
    case Kind::kObject:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kBuiltin:
      return "builtin_function_or_method";
  }
  return "object";
}

absl::StatusOr<std::string> Value::ToJson(int indent) const {
  std::string out;
  RETURN_IF_ERROR(AppendJson(*this, indent, 0, &out));
  return out;
}

Value FromJson(const nlohmann::json& json) { return FromJsonImpl(json); }
Value FromJson(const nlohmann::ordered_json& json) { return FromJsonImpl(json); }

uint32_t NextUtf8CodePoint(std::string_view s, size_t* pos) {
  unsigned char c = static_cast<unsigned char>(s[*pos]);
  int extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : -1;
  if (extra <= 0 || *pos + static_cast<size_t>(extra) >= s.size()) {
    ++*pos;
    return c;
  }
  uint32_t cp = c & (0x3fu >> extra);
  for (int i = 1; i <= extra; ++i) {
    unsigned char cc = static_cast<unsigned char>(s[*pos + static_cast<size_t>(i)]);
    if ((cc & 0xc0) != 0x80) {
      ++*pos;
      return c;
    }
    cp = (cp << 6) | (cc & 0x3fu);
  }
  *pos += static_cast<size_t>(extra) + 1;
  return cp;
}

size_t Utf8Length(std::string_view s) {
  size_t n = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    NextUtf8CodePoint(s, &pos);
    ++n;
  }
  return n;
}

bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

}  // namespace tandem::jinja

#pragma once
// Values of the chat-template Jinja interpreter (jinja_template.h), with the Python semantics that
// Hugging Face's Jinja environment gives them: truthiness, str() rendering, ==, and the `tojson`
// filter as transformers defines it (json.dumps with ensure_ascii=False).
//
// Ownership: arrays and objects are shared immutable storage (copying a Value is cheap); only a
// namespace() object is mutable, and it is shared by reference like in Python.
// Thread-safety: a Value may be read from many threads; a namespace is only written by the render
// that created it.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem::jinja {

class Value;
using Array = std::vector<Value>;
// Keys in insertion order, as Python dicts iterate.
using Object = std::vector<std::pair<std::string, Value>>;

class Value {
 public:
  enum class Kind {
    kUndefined,  // Jinja's default Undefined: falsy, renders empty, fails on most operations
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,
    kObject,
    kNamespace,  // namespace(): mutable attributes for `set ns.attr = ...`
    kBuiltin,    // a global function (raise_exception, strftime_now, namespace, range)
  };

  Value() = default;  // undefined
  static Value Undefined(std::string name = "");
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value MakeArray(Array items);
  static Value MakeObject(Object entries);
  static Value MakeNamespace(Object entries);
  static Value Builtin(std::string name);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_mapping() const { return kind_ == Kind::kObject; }

  bool bool_value() const { return bool_; }
  int64_t int_value() const { return int_; }
  double float_value() const { return kind_ == Kind::kInt ? static_cast<double>(int_) : float_; }
  // The string of a kString, the variable name of a kUndefined, the name of a kBuiltin.
  const std::string& string_value() const { return str_; }
  const Array& array() const;    // kArray only
  const Object& object() const;  // kObject or kNamespace
  // A pointer to the shared mutable entries of a kNamespace.
  Object* mutable_namespace() const;

  // Member lookup on an object/namespace; nullptr when absent.
  const Value* Find(std::string_view key) const;

  // Python truthiness (undefined, none, 0, "", [], {} are false).
  bool Truthy() const;
  // What `{{ value }}` prints: Python str() (None, True, 1.5, ['a', 1], {'k': 'v'}); undefined
  // prints nothing.
  std::string ToString() const;
  // Python repr(), used for items inside lists and dicts.
  std::string Repr() const;
  // Python == (1 == 1.0 == True; lists and dicts compare deeply).
  bool Equals(const Value& other) const;
  // Python type name for error messages ("str", "int", "list", "dict", "NoneType", ...).
  std::string TypeName() const;

  // transformers' tojson: json.dumps(value, ensure_ascii=False, indent=indent); indent < 0 means
  // none (", " and ": " separators). Fails for undefined and functions.
  absl::StatusOr<std::string> ToJson(int indent = -1) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<const Array> array_;
  std::shared_ptr<Object> object_;
};

// Converts parsed JSON (tokenizer_config values, tool schemas, test fixtures) into a Value.
// ordered_json keeps the document's key order (what Python's json.load gives); json sorts keys.
Value FromJson(const nlohmann::json& json);
Value FromJson(const nlohmann::ordered_json& json);

// Decodes the UTF-8 code point at `*pos` and advances past it; a malformed byte decodes as itself.
uint32_t NextUtf8CodePoint(std::string_view s, size_t* pos);
// Number of Unicode code points in UTF-8 text (Python len() of a str).
size_t Utf8Length(std::string_view s);
// Whether `c` (a code point) is whitespace for Python's str.isspace().
bool IsPythonSpace(uint32_t c);

}  // namespace tandem::jinja

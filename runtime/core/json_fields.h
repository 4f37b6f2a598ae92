// Typed reads of JSON fields whose errors name the input and the field. Header-only: any layer
// that parses JSON with nlohmann::json may use it.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/core/json_limits.h"

namespace mfsdp {

/// Reads typed fields of JSON objects for one input (`where`: a file, a --set, a function name).
/// Every refusal throws `Error` (any type constructible from std::string) with the message
///   "<where>: <field>: <what>"    e.g. "run/manifest.json: tensors[2].numel: must be >= 1, got 0"
/// where <field> is the dotted path below the document (`in` adds a level: "shards[2].role"), and
/// <what> is one of
///   "missing"                                     a required key is absent,
///   "expected <kind>, got <value>"                the value has the wrong JSON type (<kind>: an
///                                                 object, an integer, a number, true or false, a
///                                                 string; <value> as JSON, at most 80 characters),
///   "must be >= <lo>, got <v>" (or >, <=, <)      the value is outside its bounds,
///   "must be finite, got <v>"                     a bounded number is infinite or NaN,
///   the conversion error's reason                 `get<T>` (nlohmann's own rules, e.g. arrays),
///   or the caller's own text given to `fail`.
/// Nothing is converted silently: `integer` takes JSON integers only, `number` any JSON number.
template <class Error = std::runtime_error>
class JsonFields {
 public:
  using json = nlohmann::json;

  /// One value (referred to, not copied) and its field name; the typed reads refuse it by the
  /// rules above.
  class Field {
   public:
    Field(std::string where, const json& value, std::string name)
        : where_(std::move(where)), value_(&value), name_(std::move(name)) {}
    const json& value() const { return *value_; }
    const std::string& name() const { return name_; }
    [[noreturn]] void fail(const std::string& what) const { raise(where_, name_, what); }

    /// A JSON integer (not 1.0) in [lo, hi].
    int64_t integer(int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) const {
      if (!value_->is_number_integer()) expected("an integer");
      if (value_->is_number_unsigned() && value_->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        fail("must be <= " + std::to_string(hi) + ", got " + value_->dump());
      return within(value_->get<int64_t>(), lo, hi);
    }
    /// Any JSON number, unbounded (infinities included).
    double number() const {
      if (!value_->is_number()) expected("a number");
      return value_->get<double>();
    }
    /// A finite JSON number in [lo, hi]; an open end excludes its bound.
    double number(double lo, double hi, bool lo_open = false, bool hi_open = false) const {
      return within(number(), lo, hi, lo_open, hi_open);
    }
    bool boolean() const {
      if (!value_->is_boolean()) expected("true or false");
      return value_->get<bool>();
    }
    std::string string() const {
      if (!value_->is_string()) expected("a string");
      return value_->get<std::string>();
    }
    /// Whatever nlohmann converts to T (its rules: 2.5 and true convert to int; arrays, maps);
    /// a failed conversion is refused with its reason.
    template <class T>
    T get() const {
      try {
        return value_->get<T>();
      } catch (const json::exception& e) {
        fail(json_error_text(e.what()));
      }
    }
    /// `v` (read from this field) when lo <= v <= hi.
    int64_t within(int64_t v, int64_t lo, int64_t hi) const {
      if (v < lo) fail("must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
      if (v > hi) fail("must be <= " + std::to_string(hi) + ", got " + std::to_string(v));
      return v;
    }
    /// `v` (read from this field) when finite and inside [lo, hi] (open ends exclude the bound).
    double within(double v, double lo, double hi, bool lo_open = false, bool hi_open = false) const {
      if (!std::isfinite(v)) fail("must be finite, got " + shown(v));
      if (v < lo || (lo_open && v == lo)) fail(std::string("must be ") + (lo_open ? "> " : ">= ") + shown(lo) + ", got " + shown(v));
      if (v > hi || (hi_open && v == hi)) fail(std::string("must be ") + (hi_open ? "< " : "<= ") + shown(hi) + ", got " + shown(v));
      return v;
    }

   private:
    [[noreturn]] void expected(const std::string& kind) const { fail("expected " + kind + ", got " + shown(*value_)); }

    std::string where_;
    const json* value_;
    std::string name_;
  };

  explicit JsonFields(std::string where, std::string prefix = "") : where_(std::move(where)), prefix_(std::move(prefix)) {}

  /// The reader of the fields below `child` (a key or "list[3]" of this level).
  JsonFields in(const std::string& child) const { return JsonFields(where_, name(child)); }
  /// The field name of `key` at this level ("" names this level itself).
  std::string name(const std::string& key) const {
    return prefix_.empty() ? key : key.empty() ? prefix_ : key[0] == '[' ? prefix_ + key : prefix_ + "." + key;
  }
  /// Throws "<where>: <field of key>: <what>" ("<where>: <what>" for the top level).
  [[noreturn]] void fail(const std::string& key, const std::string& what) const { raise(where_, name(key), what); }

  /// `obj[key]`, required: refused when `obj` is not an object or lacks `key`.
  Field at(const json& obj, const std::string& key) const {
    if (auto f = find(obj, key)) return *f;
    fail(key, "missing");
  }
  /// `obj[key]` when present (null included), nothing when absent; refused when `obj` is not an object.
  std::optional<Field> find(const json& obj, const std::string& key) const {
    if (!obj.is_object()) fail("", "expected an object, got " + shown(obj));
    auto it = obj.find(key);
    if (it == obj.end()) return std::nullopt;
    return Field(where_, *it, name(key));
  }
  /// A value already in hand (an array element, a default) under the name of `key`.
  Field field(const json& value, const std::string& key) const { return Field(where_, value, name(key)); }

  /// A JSON value for a message: at most 80 characters, bytes that are not UTF-8 replaced.
  static std::string shown(const json& v) { return clip_for_message(v.dump(-1, ' ', false, json::error_handler_t::replace)); }
  /// A double for a message, as `ostream <<` prints it ("1e-30", "0.5").
  static std::string shown(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  }

 private:
  [[noreturn]] static void raise(const std::string& where, const std::string& field, const std::string& what) {
    throw Error(field.empty() ? where + ": " + what : where + ": " + field + ": " + what);
  }

  std::string where_;
  std::string prefix_;
};

}  // namespace mfsdp

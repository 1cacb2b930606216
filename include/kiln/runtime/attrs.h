// Typed op attributes, as kernels and graphs see them. An op's schema (ir::OpDef::attrs, with
// ir::AttrSpec) lists each attribute's name, kind and default; Attrs holds one value per schema
// entry, in schema order, checked by ir::OpDef::Resolve. Lookups are by name over a handful of
// entries; a misspelled name is an InternalError. Here in runtime/ so that kernels can read them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/runtime/dtype.h"
#include "kiln/runtime/shape.h"

namespace kiln {

enum class AttrKind : uint8_t { kInt, kFloat, kBool, kInts, kDType };
const char* AttrKindName(AttrKind k);

using AttrValue = std::variant<int64_t, double, bool, std::vector<int64_t>, DType>;
AttrKind KindOf(const AttrValue& v);
std::string AttrValueStr(const AttrValue& v);

/// Attribute values of one node, in its op's schema order.
class Attrs {
 public:
  Attrs() = default;
  /// Unchecked name/value pairs, as callers write them; OpDef::Resolve checks and orders them.
  Attrs(std::initializer_list<std::pair<const char*, AttrValue>> items)
      : items_(items.begin(), items.end()) {}

  int64_t Int(const char* name) const { return std::get<int64_t>(Find(name)); }
  double Float(const char* name) const { return std::get<double>(Find(name)); }
  bool Bool(const char* name) const { return std::get<bool>(Find(name)); }
  const std::vector<int64_t>& Ints(const char* name) const {
    return std::get<std::vector<int64_t>>(Find(name));
  }
  DType Type(const char* name) const { return std::get<DType>(Find(name)); }
  bool Has(const char* name) const;

  const std::vector<std::pair<const char*, AttrValue>>& items() const { return items_; }
  std::vector<std::pair<const char*, AttrValue>>& items() { return items_; }
  bool empty() const { return items_.empty(); }
  std::string str() const;  // "axes=[1], keepdims=true"
  friend bool operator==(const Attrs& a, const Attrs& b);

 private:
  const AttrValue& Find(const char* name) const;
  std::vector<std::pair<const char*, AttrValue>> items_;
};

}  // namespace kiln

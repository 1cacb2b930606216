// Attribute values: kinds, printing, lookup by name.
#include "kiln/runtime/attrs.h"

#include <cstring>
#include <sstream>

#include "kiln/runtime/error.h"

namespace kiln {

const char* AttrKindName(AttrKind k) {
  switch (k) {
    case AttrKind::kInt: return "int";
    case AttrKind::kFloat: return "float";
    case AttrKind::kBool: return "bool";
    case AttrKind::kInts: return "int list";
    case AttrKind::kDType: return "dtype";
  }
  return "?";
}

AttrKind KindOf(const AttrValue& v) { return static_cast<AttrKind>(v.index()); }

std::string AttrValueStr(const AttrValue& v) {
  std::ostringstream os;
  switch (KindOf(v)) {
    case AttrKind::kInt: os << std::get<int64_t>(v); break;
    case AttrKind::kFloat: {
      os.precision(17);
      os << std::get<double>(v);
      break;
    }
    case AttrKind::kBool: os << (std::get<bool>(v) ? "true" : "false"); break;
    case AttrKind::kInts: {
      os << "[";
      const auto& xs = std::get<std::vector<int64_t>>(v);
      for (size_t i = 0; i < xs.size(); ++i) os << (i ? ", " : "") << xs[i];
      os << "]";
      break;
    }
    case AttrKind::kDType: os << DTypeName(std::get<DType>(v)); break;
  }
  return os.str();
}

bool Attrs::Has(const char* name) const {
  for (const auto& [n, v] : items_)
    if (std::strcmp(n, name) == 0) return true;
  return false;
}

const AttrValue& Attrs::Find(const char* name) const {
  for (const auto& [n, v] : items_)
    if (std::strcmp(n, name) == 0) return v;
  KILN_CHECK(false) << "attribute '" << name << "' is not in the node's attributes (" << str() << ")";
  static AttrValue none;
  return none;
}

std::string Attrs::str() const {
  std::string s;
  for (const auto& [n, v] : items_) {
    if (!s.empty()) s += ", ";
    s += std::string(n) + "=" + AttrValueStr(v);
  }
  return s;
}

bool operator==(const Attrs& a, const Attrs& b) {
  if (a.items_.size() != b.items_.size()) return false;
  for (size_t i = 0; i < a.items_.size(); ++i)
    if (std::strcmp(a.items_[i].first, b.items_[i].first) != 0 || a.items_[i].second != b.items_[i].second)
      return false;
  return true;
}

}  // namespace kiln

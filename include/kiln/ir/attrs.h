// Op attribute schemas: each attribute's name, kind and default (OpDef::attrs). The values
// themselves (Attrs, AttrValue) are runtime types, so that kernels can read them.
#pragma once

#include <optional>

#include "kiln/runtime/attrs.h"

namespace kiln::ir {

using kiln::AttrKind;
using kiln::AttrKindName;
using kiln::Attrs;
using kiln::AttrValue;
using kiln::AttrValueStr;
using kiln::KindOf;

struct AttrSpec {
  const char* name;
  AttrKind kind;
  std::optional<AttrValue> default_value;  ///< nullopt: required
};

}  // namespace kiln::ir

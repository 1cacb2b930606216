// Op lookup by name (op_id.h), for the text and file formats. Kept apart from the kernel table so
// that the readers of those formats link without any kernel (tests/fuzz builds only them).
#include <string_view>
#include <unordered_map>

#include "kiln/runtime/op_id.h"

namespace kiln {

std::optional<OpId> OpIdOf(std::string_view name) {
  static const auto* by_name = [] {
    auto* m = new std::unordered_map<std::string_view, OpId>();
    for (OpId i = 0; i < op::kNumOps; ++i) m->emplace(op::kNames[i], i);
    return m;
  }();
  auto it = by_name->find(name);
  if (it == by_name->end()) return std::nullopt;
  return it->second;
}

}  // namespace kiln

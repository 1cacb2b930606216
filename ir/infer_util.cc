#include "infer_util.h"

#include <algorithm>

namespace kiln::ir {

std::vector<int> NormalizeAxes(const OpDef& op, const std::vector<int64_t>& axes, int rank) {
  std::vector<int> out;
  if (axes.empty()) {
    for (int i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : axes) out.push_back(NormalizeAxis(a, rank, op.name.c_str()));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    KILN_THROW(ShapeError) << op.name << ": an axis is repeated in " << AttrValueStr(axes);
  return out;
}

Shape ReducedShape(const OpDef& op, const Shape& in, const std::vector<int64_t>& axes, bool keepdims) {
  std::vector<int> ax = NormalizeAxes(op, axes, in.rank());
  Shape out;
  for (int i = 0; i < in.rank(); ++i) {
    bool reduced = std::find(ax.begin(), ax.end(), i) != ax.end();
    if (!reduced) out.push_back(in[i]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

}  // namespace kiln::ir

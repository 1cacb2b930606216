// Helpers shared by the op declarations in ir/ops_*.cc (internal to ir/).
#pragma once

#include <vector>

#include "kiln/ir/graph.h"
#include "kiln/ir/op.h"
#include "kiln/runtime/error.h"

namespace kiln::ir {

inline std::vector<TensorType> One(TensorType t) { return {t}; }

/// Throws DTypeError unless `t` is a floating dtype.
inline void RequireFloat(const OpDef& op, DType t, const char* what = "input") {
  if (!IsFloat(t))
    KILN_THROW(DTypeError) << op.name << ": expected a floating " << what << " (float32, float64, "
                           << "float16 or bfloat16), found " << DTypeName(t)
                           << "; cast it first, e.g. x.astype('float32')";
}

/// Throws DTypeError unless every input has the same dtype.
inline void RequireSameDType(const OpDef& op, std::span<const TensorType> in) {
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i].dtype != in[0].dtype)
      KILN_THROW(DTypeError) << op.name << ": inputs must have the same dtype, found "
                             << DTypeName(in[0].dtype) << " and " << DTypeName(in[i].dtype)
                             << "; cast one of them";
}

/// Output shape of a reduction over `axes` (empty: all axes).
Shape ReducedShape(const OpDef& op, const Shape& in, const std::vector<int64_t>& axes, bool keepdims);
/// Normalized, sorted, de-duplicated axes (empty input: every axis).
std::vector<int> NormalizeAxes(const OpDef& op, const std::vector<int64_t>& axes, int rank);

}  // namespace kiln::ir

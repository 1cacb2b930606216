// Copies and conversions between host tensor views (strided, any dtype).
#pragma once

#include "kiln/runtime/tensor_view.h"

namespace kiln::host {

/// dst = src converted to dst's dtype; shapes must be equal; either may be strided.
void CopyConvert(const TensorView& src, const TensorView& dst);
/// Fills `dst` with `value` converted to its dtype.
void Fill(const TensorView& dst, double value);

}  // namespace kiln::host

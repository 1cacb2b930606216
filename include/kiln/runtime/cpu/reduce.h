// CPU reduction kernels: sum, mean, max and min over any set of axes, and argmax/argmin along
// one axis. Inputs may be strided (any strides, including permuted views); outputs are
// contiguous in the order of the kept axes (so keepdims does not matter to the kernel).
// Not here: the output dtype rules and the errors for bad axes (the op table checks those).
#pragma once

#include <cstdint>
#include <span>

#include "kiln/runtime/tensor_view.h"

namespace kiln::host {

enum class ReduceKind : uint8_t { kSum, kMean, kMax, kMin };

/// out = reduction of `in` over `axes` (normalized, each in [0, rank); empty reduces nothing).
/// Sums accumulate in double for the floating dtypes (float32 blocked in float, then double)
/// and in int64 for integers; `out` may have a different dtype than `in` (bool sums to int64).
/// Max and min propagate NaN. An empty reduction gives 0 (sum) or NaN (mean).
void Reduce(ReduceKind kind, const TensorView& in, std::span<const int> axes, const TensorView& out);

/// out (int64) = index along `axis` of the first maximum (`max`) or minimum of `in`; a NaN
/// counts as the extremum. `axis` is in [0, rank) or 0 for a 0-d input.
void ArgReduce(bool max, const TensorView& in, int axis, const TensorView& out);

} // namespace kiln::host

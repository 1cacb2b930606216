// CPU elementwise kernels: unary functions, binary functions with broadcasting, where.
// Inputs may be strided; outputs are contiguous. Multithreaded over OpenMP for large tensors.
#pragma once

#include "kiln/runtime/scalar_fn.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln::host {

/// out = f(in); `out` has in's shape and in's dtype (bool for logical_not).
void Unary(UnaryFn f, const TensorView& in, const TensorView& out);
/// out = f(a, b) with NumPy broadcasting; a and b share a dtype; out has it (bool for comparisons).
void Binary(BinaryFn f, const TensorView& a, const TensorView& b, const TensorView& out);
/// out = cond ? a : b with broadcasting; cond of any dtype (non-zero is true).
void Where(const TensorView& cond, const TensorView& a, const TensorView& b, const TensorView& out);

}  // namespace kiln::host

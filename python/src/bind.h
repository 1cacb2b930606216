// Shared pieces of the kiln._C extension: each binding file registers one function that adds its
// part to the module (KILN_PY_BIND), so files can be added without touching the others.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/ir/attrs.h"
#include "kiln/runtime/dtype.h"

namespace kiln::py {

namespace pyb = pybind11;

/// Registers fn(module) to run, in the order of `priority`, when kiln._C is imported.
struct Binder {
  Binder(int priority, std::function<void(pyb::module_&)> fn);
};
#define KILN_PY_BIND_CAT2(a, b) a##b
#define KILN_PY_BIND_CAT(a, b) KILN_PY_BIND_CAT2(a, b)
#define KILN_PY_BIND(priority)                                               \
  static void KILN_PY_BIND_CAT(kiln_bind_, __LINE__)(::pybind11::module_ & m); \
  static ::kiln::py::Binder KILN_PY_BIND_CAT(kiln_binder_, __LINE__)(          \
      priority, KILN_PY_BIND_CAT(kiln_bind_, __LINE__));                     \
  static void KILN_PY_BIND_CAT(kiln_bind_, __LINE__)(::pybind11::module_ & m)

/// A dtype from a Python object: a kiln dtype name, a NumPy dtype or type, or None (default).
DType ToDType(pyb::handle h, DType default_dtype = DType::kFloat32);
/// The NumPy dtype that holds `t` on the host (bfloat16 is widened to float32).
pyb::dtype NumpyDType(DType t);
/// A shape from an int or a sequence of ints.
Shape ToShape(pyb::handle h);
std::vector<int64_t> ToInts(pyb::handle h);
/// Op attributes from keyword arguments (names are interned: Attrs keeps const char*).
ir::Attrs ToAttrs(const pyb::dict& kwargs);
/// A Tensor from a kiln NDArray, or a NumPy array / Python scalar / list converted on `device`.
Tensor ToTensor(pyb::handle h, std::optional<Device> device = std::nullopt);

}  // namespace kiln::py

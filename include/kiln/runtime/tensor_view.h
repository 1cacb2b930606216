// TensorView: what a kernel sees of a tensor: a typed pointer with shape and strides (elements).
// Kernels never own memory and never see engine variables.
#pragma once

#include "kiln/runtime/dtype.h"
#include "kiln/runtime/shape.h"

namespace kiln {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Shape shape;
  Strides strides;

  int64_t numel() const { return shape.numel(); }
  int rank() const { return shape.rank(); }
  bool is_contiguous() const {
    int64_t expect = 1;
    for (int i = shape.rank() - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expect) return false;
      expect *= shape[i];
    }
    return true;
  }
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
};

}  // namespace kiln

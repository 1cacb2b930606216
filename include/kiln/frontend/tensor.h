// Tensor (NDArray): a view (offset, shape, strides, dtype) into a Storage on one device.
// Every op on tensors is queued on the engine and returns at once; reading values (ToVector,
// Item, str) waits for the tensor's pending writers and rethrows their errors.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/runtime/dtype.h"
#include "kiln/runtime/shape.h"
#include "kiln/runtime/storage.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln {

enum class GradReq : uint8_t { kNull, kWrite, kAdd };

struct AutogradMeta;
namespace ir {
class Value;
}

struct TensorImpl {
  StoragePtr storage;
  int64_t offset = 0;  ///< in elements
  Shape shape;
  Strides strides;
  DType dtype = DType::kFloat32;
  std::shared_ptr<AutogradMeta> autograd;
  /// Set on a symbolic tensor of a trace (hybridize): its value in the traced graph; no data.
  ir::Value* symbol = nullptr;
  uint64_t trace_id = 0;  ///< the trace `symbol` belongs to
};

class Tensor;
/// True when `a` and `b` are views of one storage whose byte ranges (from the lowest to the highest
/// byte each view can reach) intersect; an empty view overlaps nothing. A copy between two such
/// views must go through a temporary, or it reads values it has already overwritten.
bool MemoryOverlaps(const Tensor& a, const Tensor& b);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  /// Uninitialized contiguous tensor (its contents are whatever the allocator returned).
  static Tensor Empty(const Shape& shape, DType dtype, Device device = cpu());
  /// As Empty, but the memory is allocated when first used (Storage::Reserve).
  static Tensor Reserved(const Shape& shape, DType dtype, Device device);
  /// Copies `nbytes = numel * DTypeSize(dtype)` bytes of host data into a new tensor.
  static Tensor FromHost(const void* data, const Shape& shape, DType dtype, Device device = cpu());
  template <class T>
  static Tensor FromVector(const std::vector<T>& v, const Shape& shape, Device device = cpu()) {
    if (static_cast<int64_t>(v.size()) != shape.numel())
      KILN_THROW(ShapeError) << "FromVector: " << v.size() << " values do not fill shape "
                             << shape.str() << " (" << shape.numel() << " elements)";
    if constexpr (std::is_same_v<T, bool>) {
      std::vector<uint8_t> b(v.begin(), v.end());
      return FromHost(b.data(), shape, DType::kBool, device);
    } else {
      return FromHost(v.data(), shape, DTypeOf<T>::value, device);
    }
  }
  /// A 0-d tensor holding `value` converted to `dtype`.
  static Tensor Scalar(double value, DType dtype = DType::kFloat32, Device device = cpu());

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Strides& strides() const { return impl_->strides; }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  int rank() const { return impl_->shape.rank(); }
  int64_t numel() const { return impl_->shape.numel(); }
  int64_t offset() const { return impl_->offset; }
  bool is_contiguous() const {  // from the layout alone: a reserved storage stays unallocated
    return TensorView{nullptr, impl_->dtype, impl_->shape, impl_->strides}.is_contiguous();
  }
  /// The kernel's view of this tensor (pointer already offset). Inline: every queued op builds
  /// one per operand.
  TensorView View() const {
    return TensorView{static_cast<char*>(impl_->storage->data()) +
                          impl_->offset * static_cast<int64_t>(DTypeSize(impl_->dtype)),
                      impl_->dtype, impl_->shape, impl_->strides};
  }
  const StoragePtr& storage() const { return impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  /// True when both tensors are views of the same storage.
  bool SharesStorage(const Tensor& o) const { return impl_->storage == o.impl_->storage; }

  // ---- sync points ----
  /// Waits for pending writes of this tensor; rethrows an error stored by a failed op.
  void WaitToRead() const;
  /// Copies the values (converted to T) to the host, waiting as needed.
  template <class T>
  std::vector<T> ToVector() const;
  /// Copies the raw values, contiguous and in this tensor's dtype, into `dst`.
  void CopyToHost(void* dst) const;
  /// The single value of a one-element tensor.
  double Item() const;
  /// NumPy-style text of the values, e.g. "[[1, 2], [3, 4]]" with dtype and device.
  std::string str() const;

  // ---- movement ----
  /// A copy on `device` (returns *this when already there and `copy` is false).
  Tensor To(Device device, bool copy = false) const;
  /// Writes this tensor's values into `dst` (same shape; any devices); queued. A source whose
  /// memory overlaps `dst` (x[:] = x[::-1]) is read whole before `dst` is written. Under
  /// autograd.record() the write is recorded (autograd::RecordWrite).
  void CopyTo(const Tensor& dst) const;
  Tensor AsType(DType dtype) const;
  Tensor Contiguous() const;

  // ---- autograd ----
  /// Makes this a leaf whose gradient `backward` writes (kWrite) or accumulates (kAdd).
  void AttachGrad(GradReq req = GradReq::kWrite);
  /// The gradient buffer (undefined when AttachGrad was not called or req is kNull).
  Tensor grad() const;
  GradReq grad_req() const;
  /// Backpropagates from this tensor (ones as head gradient when `head_grad` is undefined).
  void Backward(const Tensor& head_grad = Tensor(), bool retain_graph = false) const;
  /// A tensor sharing storage, cut from the autograd graph.
  Tensor Detach() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace kiln

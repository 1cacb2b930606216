// The kernel table: for each op id and device type, the kernel that runs the op (DESIGN.md
// section 3: "kernels register against the op's id per device in runtime/"). The CPU bindings
// live next to the CPU kernels (runtime/cpu/kernels_*.cc); a layer above may add bindings of its
// own ops before first use (AddBinder: the frontend's call_graph). Knows op ids, not op
// declarations: schema, inference and gradients are ir/'s.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/runtime/attrs.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/op_id.h"
#include "kiln/runtime/scalar_fn.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln {

/// What a kernel knows of the op it runs (ir::OpDef extends it with the op's declaration).
struct OpInfo {
  OpId id = 0;
  std::string name;
  std::optional<UnaryFn> unary_fn;    ///< scalar function of a unary elementwise op
  std::optional<BinaryFn> binary_fn;  ///< scalar function of a binary broadcast op
};

/// What a kernel receives.
struct KernelArgs {
  const OpInfo& op;
  std::span<const TensorView> in;
  std::span<const TensorView> out;
  const Attrs& attrs;
  Device device;
  uint64_t seed = 0;    ///< random ops: generator seed
  uint64_t offset = 0;  ///< random ops: counter offset of the first element
  /// Random ops in a plan captured into a CUDA graph: device memory holding the seed and the
  /// call's base offset (read when the graph replays); `offset` is then relative to that base.
  const uint64_t* random_state = nullptr;
};
using KernelFn = void (*)(const KernelArgs&);

/// Position of a view in its storage.
struct Layout {
  int64_t offset = 0;
  Shape shape;
  Strides strides;
};
/// For ops whose output can alias the input (reshape, transpose, slice, ...): computes the
/// output layout (of shape `out`) from the input's, or returns false when a copy is needed (the
/// kernel then runs).
using ViewFn = bool (*)(const Layout& in, const Attrs& attrs, const Shape& out, Layout* result);

/// The bit of `t` in KernelBinding::dtypes.
constexpr uint32_t DTypeBit(DType t) { return uint32_t{1} << static_cast<unsigned>(t); }

struct KernelBinding {
  KernelFn fn = nullptr;
  bool contiguous_inputs = false;  ///< inputs are made contiguous before the kernel runs
  ViewFn view = nullptr;
  /// The dtypes the kernel reads and writes (DTypeBit of each); 0: every dtype the op takes.
  /// Dispatch refuses other dtypes with a DTypeError before anything is queued.
  uint32_t dtypes = 0;
};

class KernelTable {
 public:
  /// The table, built on first use: the CPU kernels, then every binder added by AddBinder.
  static const KernelTable& Get();
  /// Registers a function that binds more kernels (from a layer above runtime/); must run before
  /// the first Get() (a namespace-scope initializer). Returns true, for use in such initializers.
  static bool AddBinder(void (*bind)(KernelTable&));

  const KernelBinding* Find(OpId op, DeviceType device) const;
  void Bind(OpId op, DeviceType device, KernelBinding binding);
  /// Binds by op name (which must be in op_list.h).
  void Bind(std::string_view op, DeviceType device, KernelBinding binding);

 private:
  std::vector<KernelBinding> table_[2];
};

// One binding function per group of CPU kernels (runtime/cpu/kernels_<group>.cc).
void BindElementwiseKernels(KernelTable& t);
void BindReduceKernels(KernelTable& t);
void BindMovementKernels(KernelTable& t);
void BindNNKernels(KernelTable& t);
void BindBatchNormKernels(KernelTable& t);  // runtime/cpu/batch_norm.cc
void BindCreationKernels(KernelTable& t);
/// GPU kernels on the platform's BLAS (runtime/gpu_kernels_blas.cc): matmul.
void BindGpuBlasKernels(KernelTable& t);
/// GPU kernels on the platform's cuDNN (runtime/gpu_kernels_dnn.cc): conv2d, pooling, their gradients.
void BindGpuDnnKernels(KernelTable& t);

}  // namespace kiln

// Eager dispatch: the one path by which every op runs. Invoke checks the arguments and infers
// output types on the calling thread (errors name the op, shapes, dtypes, devices), allocates
// the outputs, records the op on the autograd tape when recording, and queues the kernel.
// Kernels are bound to op ids per device type in the KernelTable (frontend/kernels_*.cc).
#pragma once

#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/ir/op.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln {

/// What a kernel receives.
struct KernelArgs {
  const ir::OpDef& op;
  std::span<const TensorView> in;
  std::span<const TensorView> out;
  const ir::Attrs& attrs;
  Device device;
  uint64_t seed = 0;    ///< random ops: generator seed
  uint64_t offset = 0;  ///< random ops: counter offset of the first element
};
using KernelFn = void (*)(const KernelArgs&);

/// Position of a view in its storage.
struct Layout {
  int64_t offset = 0;
  Shape shape;
  Strides strides;
};
/// For ops whose output can alias the input (reshape, transpose, slice, ...): computes the output
/// layout from the input's, or returns false when a copy is needed (the kernel then runs).
using ViewFn = bool (*)(const Layout& in, const ir::Attrs& attrs, const ir::TensorType& out, Layout* result);

struct KernelBinding {
  KernelFn fn = nullptr;
  bool contiguous_inputs = false;  ///< inputs are made contiguous before the kernel runs
  ViewFn view = nullptr;
};

class KernelTable {
 public:
  static const KernelTable& Get();
  const KernelBinding* Find(ir::OpId op, DeviceType device) const;
  /// Binds a kernel to the op named `op` (which must be declared) on a device type.
  void Bind(std::string_view op, DeviceType device, KernelBinding binding);

 private:
  std::vector<KernelBinding> table_[2];
};

// One binding function per group of CPU kernels (frontend/kernels_<group>.cc).
void BindElementwiseKernels(KernelTable& t);
void BindReduceKernels(KernelTable& t);
void BindMovementKernels(KernelTable& t);
void BindNNKernels(KernelTable& t);
void BindCreationKernels(KernelTable& t);
void BindGraphKernels(KernelTable& t);  // call_graph (cached_graph.cc)

/// Runs op `op` eagerly. `device` places ops without inputs (creation); for other ops it must be
/// empty or equal to the inputs' device.
std::vector<Tensor> Invoke(ir::OpId op, std::span<const Tensor> inputs, const ir::Attrs& attrs = {},
                           std::optional<Device> device = std::nullopt);
std::vector<Tensor> Invoke(std::string_view op, std::span<const Tensor> inputs,
                           const ir::Attrs& attrs = {}, std::optional<Device> device = std::nullopt);
/// Invoke for single-output ops.
Tensor Invoke1(std::string_view op, std::initializer_list<Tensor> inputs, const ir::Attrs& attrs = {},
               std::optional<Device> device = std::nullopt);
/// Invoke for single-output ops, taking the inputs by pointer (no Tensor copies). Elementwise ops
/// without attributes on inputs of one shape, dtype and device take the small-op path (see
/// dispatch.cc); every other call goes through Invoke, with the same results and errors.
Tensor Invoke1(ir::OpId op, std::span<const Tensor* const> inputs, const ir::Attrs& attrs = {});
/// Runs `op` writing into existing `outputs` (shapes and dtypes must match what `op` infers).
void InvokeInto(ir::OpId op, std::span<const Tensor> inputs, const ir::Attrs& attrs,
                std::span<const Tensor> outputs);

/// CPU ops whose inputs and outputs total at most `bytes` run on the calling thread when nothing
/// they depend on is pending (KILN_ENGINE_INLINE_BYTES; 0 queues every op). Returns the old value.
size_t SetInlineLimit(size_t bytes);

/// Seeds the generator behind random ops (kiln.random.seed).
void ManualSeed(uint64_t seed);

/// The call site the Python layer reports for the ops it is about to queue ("file.py:12").
/// Engine errors name it. Thread-local; nullptr when unknown.
void SetCallSite(const char* site);

}  // namespace kiln

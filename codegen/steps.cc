// Generated kernels as executor steps (see kiln/codegen/steps.h): the views' data pointers passed
// as the kernels' argument arrays, on the stack for up to 16 of them; on a GPU, the generated
// kernel's launch on the worker's stream.
#include "kiln/codegen/steps.h"

#include <iterator>
#include <span>
#include <vector>

#include "gpu_launch.h"

namespace kiln::codegen {

namespace {

template <class T>
struct Pointers {
  explicit Pointers(std::span<const TensorView> views) {
    if (views.size() > std::size(stack)) heap.resize(views.size()), data = heap.data();
    for (size_t k = 0; k < views.size(); ++k) data[k] = static_cast<T*>(views[k].data);
  }
  T* stack[16];
  std::vector<T*> heap;
  T** data = stack;
};

}  // namespace

std::function<void(const exec::StepArgs&)> ElementwiseStep(std::shared_ptr<const CompiledKernel> kernel, int64_t numel) {
  return [kernel = std::move(kernel), numel](const exec::StepArgs& a) {
    Pointers<const float> in(a.in);
    kernel->Run(in.data, static_cast<float*>(a.out[0].data), numel);
  };
}

std::function<void(const exec::StepArgs&)> RowStep(std::shared_ptr<const RowKernel> kernel, int64_t rows, int64_t len) {
  return [kernel = std::move(kernel), rows, len](const exec::StepArgs& a) {
    Pointers<const float> in(a.in);
    Pointers<float> out(a.out);
    kernel->Run(in.data, out.data, rows, len);
  };
}

std::function<void(const exec::StepArgs&)> GpuElementwiseStep(std::shared_ptr<const PtxKernel> kernel, int64_t numel) {
  return [kernel = std::move(kernel), numel](const exec::StepArgs& a) {
    if (numel == 0) return;
    void* fn = LoadedOnce("plan " + kernel->name, a.call.device, [&] { return *kernel; });
    std::vector<void*> ptrs(a.in.size() + 1);
    std::vector<void*> args(a.in.size() + 2);
    ptrs[0] = a.out[0].data;
    for (size_t i = 0; i < a.in.size(); ++i) ptrs[i + 1] = a.in[i].data;
    for (size_t i = 0; i < ptrs.size(); ++i) args[i] = &ptrs[i];
    int64_t n = numel;
    args.back() = &n;
    LaunchGridStride(fn, numel, args.data());
  };
}

}  // namespace kiln::codegen

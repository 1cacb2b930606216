// CPU kernels of the elementwise ops (ir/ops_elementwise.cc).
#include "kiln/frontend/dispatch.h"
#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/cpu/elementwise.h"

namespace kiln {

namespace {
void UnaryKernel(const KernelArgs& a) { host::Unary(*a.op.unary_fn, a.in[0], a.out[0]); }
void BinaryKernel(const KernelArgs& a) { host::Binary(*a.op.binary_fn, a.in[0], a.in[1], a.out[0]); }
void WhereKernel(const KernelArgs& a) { host::Where(a.in[0], a.in[1], a.in[2], a.out[0]); }
void CopyKernel(const KernelArgs& a) { host::CopyConvert(a.in[0], a.out[0]); }
}  // namespace

void BindElementwiseKernels(KernelTable& t) {
  const ir::OpTable& ops = ir::OpTable::Get();
  for (size_t i = 0; i < ops.size(); ++i) {
    const ir::OpDef& d = ops[static_cast<ir::OpId>(i)];
    if (d.name == "copy" || d.name == "stop_gradient") continue;
    if (d.unary_fn) t.Bind(d.name, DeviceType::kCPU, {UnaryKernel});
    if (d.binary_fn) t.Bind(d.name, DeviceType::kCPU, {BinaryKernel});
  }
  t.Bind("where", DeviceType::kCPU, {WhereKernel});
  t.Bind("cast", DeviceType::kCPU, {CopyKernel});
  t.Bind("copy", DeviceType::kCPU, {CopyKernel});
  t.Bind("stop_gradient", DeviceType::kCPU, {CopyKernel});
}

}  // namespace kiln

// CPU kernels of the elementwise ops (the ops of ir/ops_elementwise.cc).
#include "kiln/runtime/kernel.h"
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
  for (OpId id = op::kFirstUnary; id < op::kFirstOther; ++id)  // KILN_UNARY_OPS, KILN_BINARY_OPS
    t.Bind(id, DeviceType::kCPU, {BinaryFnOf(id) ? BinaryKernel : UnaryKernel});
  t.Bind(op::kWhere, DeviceType::kCPU, {WhereKernel});
  t.Bind(op::kCast, DeviceType::kCPU, {CopyKernel});
  t.Bind(op::kCopy, DeviceType::kCPU, {CopyKernel});
  t.Bind(op::kStopGradient, DeviceType::kCPU, {CopyKernel});
}

}  // namespace kiln

// CPU kernels of the reduction ops (the ops of ir/ops_reduce.cc).
#include <vector>

#include "kiln/runtime/kernel.h"
#include "kiln/runtime/cpu/reduce.h"

namespace kiln {

namespace {

template <host::ReduceKind K> void ReduceKernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  std::vector<int> axes;
  for (int64_t ax : a.attrs.Ints("axes")) axes.push_back(NormalizeAxis(ax, x.rank(), a.op.name.c_str()));
  if (axes.empty())
    for (int i = 0; i < x.rank(); ++i) axes.push_back(i);
  host::Reduce(K, x, axes, a.out[0]);
}

template <bool kMax> void ArgReduceKernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  host::ArgReduce(kMax, x, NormalizeAxis(a.attrs.Int("axis"), x.rank(), a.op.name.c_str()), a.out[0]);
}

} // namespace

void BindReduceKernels(KernelTable& t) {
  using K = host::ReduceKind;
  t.Bind(op::kSum, DeviceType::kCPU, {ReduceKernel<K::kSum>});
  t.Bind(op::kMean, DeviceType::kCPU, {ReduceKernel<K::kMean>});
  t.Bind(op::kMax, DeviceType::kCPU, {ReduceKernel<K::kMax>});
  t.Bind(op::kMin, DeviceType::kCPU, {ReduceKernel<K::kMin>});
  t.Bind(op::kArgmax, DeviceType::kCPU, {ArgReduceKernel<true>});
  t.Bind(op::kArgmin, DeviceType::kCPU, {ArgReduceKernel<false>});
}

} // namespace kiln

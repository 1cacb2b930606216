// CPU kernels of the neural-network ops (the ops of ir/ops_nn.cc): attributes become the parameter structs
// of runtime/cpu/onednn.h. Inputs are made contiguous by dispatch (contiguous_inputs), so the
// kernels see row-major NCHW / OIHW buffers; the attributes were validated by inference.
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/cpu/onednn.h"

namespace kiln {

namespace {

/// A two-element spatial attribute; a single value stands for both dims.
void ReadPair(const Attrs& a, const char* name, int64_t out[2]) {
  const std::vector<int64_t>& v = a.Ints(name);
  out[0] = v[0];
  out[1] = v.size() > 1 ? v[1] : v[0];
}

host::Conv2dParams ConvParams(const Attrs& a) {
  host::Conv2dParams p;
  ReadPair(a, "stride", p.stride);
  ReadPair(a, "padding", p.padding);
  ReadPair(a, "dilation", p.dilation);
  p.groups = a.Int("groups");
  return p;
}

host::Pool2dParams PoolParams(const Attrs& a) {
  host::Pool2dParams p;
  ReadPair(a, "kernel", p.kernel);
  ReadPair(a, a.Ints("stride").empty() ? "kernel" : "stride", p.stride);
  ReadPair(a, "padding", p.padding);
  if (a.Has("count_include_pad")) p.count_include_pad = a.Bool("count_include_pad");
  return p;
}

void MatmulKernel(const KernelArgs& k) {
  host::Matmul(k.in[0], k.in[1], k.out[0], {k.attrs.Bool("transpose_a"), k.attrs.Bool("transpose_b")});
}
void Conv2dKernel(const KernelArgs& k) { host::Conv2d(k.in[0], k.in[1], k.out[0], ConvParams(k.attrs)); }
void Conv2dGradDataKernel(const KernelArgs& k) {
  host::Conv2dGradData(k.in[0], k.in[1], k.out[0], ConvParams(k.attrs));
}
void Conv2dGradWeightKernel(const KernelArgs& k) {
  host::Conv2dGradWeight(k.in[0], k.in[1], k.out[0], ConvParams(k.attrs));
}
void MaxPoolKernel(const KernelArgs& k) { host::MaxPool2d(k.in[0], k.out[0], PoolParams(k.attrs)); }
void MaxPoolGradKernel(const KernelArgs& k) {
  host::MaxPool2dGrad(k.in[0], k.in[1], k.out[0], PoolParams(k.attrs));
}
void AvgPoolKernel(const KernelArgs& k) { host::AvgPool2d(k.in[0], k.out[0], PoolParams(k.attrs)); }
void AvgPoolGradKernel(const KernelArgs& k) { host::AvgPool2dGrad(k.in[0], k.out[0], PoolParams(k.attrs)); }

} // namespace

void BindNNKernels(KernelTable& t) {
  const bool contiguous = true;
  t.Bind(op::kMatmul, DeviceType::kCPU, {MatmulKernel, contiguous});
  t.Bind(op::kConv2d, DeviceType::kCPU, {Conv2dKernel, contiguous});
  t.Bind(op::kConv2dGradData, DeviceType::kCPU, {Conv2dGradDataKernel, contiguous});
  t.Bind(op::kConv2dGradWeight, DeviceType::kCPU, {Conv2dGradWeightKernel, contiguous});
  t.Bind(op::kMaxPool2d, DeviceType::kCPU, {MaxPoolKernel, contiguous});
  t.Bind(op::kMaxPool2dGrad, DeviceType::kCPU, {MaxPoolGradKernel, contiguous});
  t.Bind(op::kAvgPool2d, DeviceType::kCPU, {AvgPoolKernel, contiguous});
  t.Bind(op::kAvgPool2dGrad, DeviceType::kCPU, {AvgPoolGradKernel, contiguous});
}

} // namespace kiln

// kiln::nd wrappers over Invoke, with dtype promotion for binary ops (see ops.h).
#include "kiln/frontend/ops.h"

#include "kiln/frontend/tracer.h"

#include <cmath>

#include "kiln/frontend/dispatch.h"

namespace kiln::nd {

namespace {
Tensor Call1(ir::OpId op, std::initializer_list<Tensor> in, const ir::Attrs& attrs = {},
             std::optional<Device> dev = std::nullopt) {
  return Invoke(op, std::span<const Tensor>(in.begin(), in.size()), attrs, dev)[0];
}
// Unary and binary elementwise ops pass their operands by pointer (the small-op path of dispatch.cc).
Tensor Call1(ir::OpId op, const Tensor& x) {
  const Tensor* in[1] = {&x};
  return Invoke1(op, in);
}
Tensor Call1(ir::OpId op, const Tensor& a, const Tensor& b) {
  const Tensor* in[2] = {&a, &b};
  return Invoke1(op, in);
}

// Binary ops take one dtype: promote tensor operands, and let a scalar take the tensor's dtype
// (a non-integral scalar with an integer tensor gives float32, as in PyTorch).
std::pair<Tensor, Tensor> Promote(const Tensor& a, const Tensor& b) {
  if (a.dtype() == b.dtype()) return {a, b};
  DType t = PromoteTypes(a.dtype(), b.dtype());
  return {a.AsType(t), b.AsType(t)};
}

DType ScalarDType(const Tensor& t, double v) {
  if (!IsFloat(t.dtype()) && v != std::floor(v)) return DType::kFloat32;
  if (t.dtype() == DType::kBool && v != 0 && v != 1) return DType::kInt64;
  return t.dtype();
}

Tensor Binary(ir::OpId op, const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.dtype() == b.dtype()) return Call1(op, a, b);
  auto [x, y] = Promote(a, b);
  return Call1(op, x, y);
}
// A Python number as an operand: a 0-d tensor. While tracing it is a `full` node, so the graph
// holds the value (the compiler folds it into fused kernels) rather than a captured tensor.
Tensor ScalarOperand(double v, DType t, Device d) {
  if (trace::Active()) return Call1(op::kFull, {}, {{"shape", std::vector<int64_t>{}}, {"value", v}, {"dtype", t}}, d);
  return Tensor::Scalar(v, t, d);
}
Tensor Binary(ir::OpId op, const Tensor& a, double b) {
  DType t = ScalarDType(a, b);
  return Call1(op, a.AsType(t), ScalarOperand(b, t, a.device()));
}
Tensor Binary(ir::OpId op, double a, const Tensor& b) {
  DType t = ScalarDType(b, a);
  return Call1(op, ScalarOperand(a, t, b.device()), b.AsType(t));
}
}  // namespace

// ---- creation ----

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  return Call1(op::kFull, {}, {{"shape", shape.vec()}, {"value", value}, {"dtype", dtype}}, device);
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1, dtype, device); }
Tensor zeros_like(const Tensor& x) { return full(x.shape(), 0, x.dtype(), x.device()); }
Tensor ones_like(const Tensor& x) { return full(x.shape(), 1, x.dtype(), x.device()); }
Tensor arange(double start, double stop, double step, DType dtype, Device device) {
  return Call1(op::kArange, {}, {{"start", start}, {"stop", stop}, {"step", step}, {"dtype", dtype}}, device);
}

namespace random {
Tensor uniform(double low, double high, const Shape& shape, DType dtype, Device device) {
  return Call1(op::kRandomUniform, {},
               {{"shape", shape.vec()}, {"low", low}, {"high", high}, {"dtype", dtype}}, device);
}
Tensor normal(double mean, double std, const Shape& shape, DType dtype, Device device) {
  return Call1(op::kRandomNormal, {},
               {{"shape", shape.vec()}, {"mean", mean}, {"std", std}, {"dtype", dtype}}, device);
}
Tensor bernoulli(double p, const Shape& shape, DType dtype, Device device) {
  return Call1(op::kRandomBernoulli, {}, {{"shape", shape.vec()}, {"p", p}, {"dtype", dtype}}, device);
}
void seed(uint64_t s) { ManualSeed(s); }
}  // namespace random

// ---- elementwise ----

// The wrappers of the unary and binary ops of the op list (kiln/runtime/op_list.h).
#define KILN_X(Id, name, nd_name, domain, doc) \
  Tensor nd_name(const Tensor& x) { return Call1(op::Id, x); }
KILN_UNARY_OPS(KILN_X)
#undef KILN_X
Tensor stop_gradient(const Tensor& x) { return Call1(op::kStopGradient, x); }

#define KILN_X(Id, name, nd_name, doc)                                                  \
  Tensor nd_name(const Tensor& a, const Tensor& b) { return Binary(op::Id, a, b); } \
  Tensor nd_name(const Tensor& a, double b) { return Binary(op::Id, a, b); }        \
  Tensor nd_name(double a, const Tensor& b) { return Binary(op::Id, a, b); }
KILN_BINARY_OPS(KILN_X)
#undef KILN_X

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  auto [x, y] = Promote(a, b);
  return Call1(op::kWhere, {cond, x, y});
}
Tensor cast(const Tensor& x, DType dtype) { return x.AsType(dtype); }
Tensor clip(const Tensor& x, double lo, double hi) { return minimum(maximum(x, lo), hi); }

// ---- reductions ----

Tensor sum(const Tensor& x, const Axes& axes, bool keepdims) {
  return Call1(op::kSum, {x}, {{"axes", axes}, {"keepdims", keepdims}});
}
Tensor mean(const Tensor& x, const Axes& axes, bool keepdims) {
  return Call1(op::kMean, {x}, {{"axes", axes}, {"keepdims", keepdims}});
}
Tensor max(const Tensor& x, const Axes& axes, bool keepdims) {
  return Call1(op::kMax, {x}, {{"axes", axes}, {"keepdims", keepdims}});
}
Tensor min(const Tensor& x, const Axes& axes, bool keepdims) {
  return Call1(op::kMin, {x}, {{"axes", axes}, {"keepdims", keepdims}});
}
Tensor argmax(const Tensor& x, int64_t axis, bool keepdims) {
  return Call1(op::kArgmax, {x}, {{"axis", axis}, {"keepdims", keepdims}});
}
Tensor argmin(const Tensor& x, int64_t axis, bool keepdims) {
  return Call1(op::kArgmin, {x}, {{"axis", axis}, {"keepdims", keepdims}});
}

// ---- movement ----

Tensor reshape(const Tensor& x, const Axes& shape) { return Call1(op::kReshape, {x}, {{"shape", shape}}); }
Tensor transpose(const Tensor& x, const Axes& axes) { return Call1(op::kTranspose, {x}, {{"axes", axes}}); }
Tensor slice(const Tensor& x, const Axes& begin, const Axes& end, const Axes& step) {
  Axes s = step.empty() ? Axes(begin.size(), 1) : step;
  return Call1(op::kSlice, {x}, {{"begin", begin}, {"end", end}, {"step", s}});
}
Tensor broadcast_to(const Tensor& x, const Axes& shape) {
  return Call1(op::kBroadcastTo, {x}, {{"shape", shape}});
}
Tensor expand_dims(const Tensor& x, int64_t axis) { return Call1(op::kExpandDims, {x}, {{"axis", axis}}); }
Tensor squeeze(const Tensor& x, const Axes& axes) { return Call1(op::kSqueeze, {x}, {{"axes", axes}}); }
Tensor flatten(const Tensor& x) {
  if (x.rank() == 0) return reshape(x, {1, 1});
  // (N, -1): the -1 keeps an exported graph re-shapeable. An empty batch (N == 0) has no
  // elements to infer the -1 from: its width is the product of the trailing dimensions.
  int64_t width = 1;
  for (int i = 1; i < x.rank(); ++i) width *= x.shape()[i];
  return reshape(x, {x.shape()[0], x.shape()[0] == 0 ? width : -1});
}
Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  return Invoke(op::kConcat, xs, {{"axis", axis}})[0];
}
Tensor stack(const std::vector<Tensor>& xs, int64_t axis) {
  return Invoke(op::kStack, xs, {{"axis", axis}})[0];
}
std::vector<Tensor> split(const Tensor& x, const Axes& sections, int64_t axis) {
  Tensor in[1] = {x};
  return Invoke(op::kSplit, in, {{"sections", sections}, {"axis", axis}});
}
Tensor take(const Tensor& x, const Tensor& indices, int64_t axis) {
  return Call1(op::kTake, {x, indices}, {{"axis", axis}});
}
Tensor one_hot(const Tensor& indices, int64_t depth, double on_value, double off_value, DType dtype, bool labels) {
  return Call1(op::kOneHot, {indices},
               {{"depth", depth}, {"on_value", on_value}, {"off_value", off_value}, {"dtype", dtype}, {"labels", labels}});
}

// ---- neural network primitives ----

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  return Call1(op::kMatmul, {a, b}, {{"transpose_a", transpose_a}, {"transpose_b", transpose_b}});
}
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o) {
  Tensor y = Call1(op::kConv2d, {x, w},
                   {{"stride", o.stride}, {"padding", o.padding}, {"dilation", o.dilation}, {"groups", o.groups}});
  if (!bias.defined()) return y;
  return add(y, reshape(bias, {1, -1, 1, 1}));
}
Tensor max_pool2d(const Tensor& x, const Axes& kernel, const Axes& stride, const Axes& padding) {
  return Call1(op::kMaxPool2d, {x}, {{"kernel", kernel}, {"stride", stride}, {"padding", padding}});
}
Tensor avg_pool2d(const Tensor& x, const Axes& kernel, const Axes& stride, const Axes& padding,
                  bool count_include_pad) {
  return Call1(op::kAvgPool2d, {x},
               {{"kernel", kernel}, {"stride", stride}, {"padding", padding}, {"count_include_pad", count_include_pad}});
}

}  // namespace kiln::nd

namespace kiln {
Tensor operator+(const Tensor& a, const Tensor& b) { return nd::add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return nd::subtract(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return nd::multiply(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return nd::divide(a, b); }
Tensor operator+(const Tensor& a, double b) { return nd::add(a, b); }
Tensor operator-(const Tensor& a, double b) { return nd::subtract(a, b); }
Tensor operator*(const Tensor& a, double b) { return nd::multiply(a, b); }
Tensor operator/(const Tensor& a, double b) { return nd::divide(a, b); }
Tensor operator+(double a, const Tensor& b) { return nd::add(a, b); }
Tensor operator-(double a, const Tensor& b) { return nd::subtract(a, b); }
Tensor operator*(double a, const Tensor& b) { return nd::multiply(a, b); }
Tensor operator/(double a, const Tensor& b) { return nd::divide(a, b); }
Tensor operator-(const Tensor& a) { return nd::negative(a); }
}  // namespace kiln

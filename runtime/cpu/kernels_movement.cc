// CPU kernels of the movement ops (the ops of ir/ops_movement.cc). The layout ops bind a ViewFn, so that
// Invoke returns a view of the input without running anything, and a kernel that copies through
// the same layout, for InvokeInto and for a reshape whose input strides allow no view.
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/cpu/movement.h"

namespace kiln {

namespace {

// ---- views: output layout from input layout ------------------------------------------------------

bool IsContiguous(const Layout& l) {
  int64_t expect = 1;
  for (int i = l.shape.rank() - 1; i >= 0; --i) {
    if (l.shape[i] != 1 && l.strides[i] != expect) return false;
    expect *= l.shape[i];
  }
  return true;
}

// A view exists when each group of old axes that is contiguous in memory maps onto whole new
// axes (PyTorch's computeStride): e.g. a transposed matrix cannot be flattened without a copy.
bool ReshapeView(const Layout& in, const Attrs&, const Shape& out_shape, Layout* r) {
  r->offset = in.offset;
  r->shape = out_shape;
  const Shape& os = in.shape;
  const Strides& ost = in.strides;
  const Shape& ns = out_shape;
  if (os.numel() == 0 || os.rank() == 0 || IsContiguous(in)) {
    r->strides = ns.ContiguousStrides();
    return true;
  }
  Strides nst;
  nst.resize(ns.rank(), 1);
  int vd = ns.rank() - 1;
  int64_t chunk = ost[os.rank() - 1], tn = 1, vn = 1;
  for (int td = os.rank() - 1; td >= 0; --td) {
    tn *= os[td];
    if (td == 0 || (os[td - 1] != 1 && ost[td - 1] != tn * chunk)) {
      while (vd >= 0 && (vn < tn || ns[vd] == 1)) {
        nst[vd] = vn * chunk;
        vn *= ns[vd];
        --vd;
      }
      if (vn != tn) return false;
      if (td > 0) {
        chunk = ost[td - 1];
        tn = vn = 1;
      }
    }
  }
  if (vd != -1) return false;
  r->strides = nst;
  return true;
}

bool TransposeView(const Layout& in, const Attrs& a, const Shape& out_shape, Layout* r) {
  const auto& axes = a.Ints("axes");
  int rank = in.shape.rank();
  r->offset = in.offset;
  r->shape = out_shape;
  r->strides = in.strides;
  for (int i = 0; i < rank; ++i) {
    int64_t p = axes.empty() ? rank - 1 - i : axes[i] < 0 ? axes[i] + rank : axes[i];
    r->strides[i] = in.strides[static_cast<int>(p)];
  }
  return true;
}

bool SliceView(const Layout& in, const Attrs& a, const Shape& out_shape, Layout* r) {
  auto axes = NormalizeSlice(in.shape, a.Ints("begin"), a.Ints("end"), a.Ints("step"), "slice");
  r->offset = in.offset;
  r->shape = out_shape;
  r->strides = in.strides;
  for (int i = 0; i < in.shape.rank(); ++i) {
    r->offset += axes[i].begin * in.strides[i];
    r->strides[i] *= axes[i].step;
  }
  return true;
}

bool BroadcastView(const Layout& in, const Attrs&, const Shape& out_shape, Layout* r) {
  r->offset = in.offset;
  r->shape = out_shape;
  r->strides = host::BroadcastStrides(in.shape, in.strides, out_shape);
  return true;
}

bool ExpandDimsView(const Layout& in, const Attrs& a, const Shape& out_shape, Layout* r) {
  int axis = NormalizeAxis(a.Int("axis"), out_shape.rank(), "expand_dims");
  r->offset = in.offset;
  r->shape = out_shape;
  r->strides = in.strides;
  r->strides.insert(axis, axis < in.shape.rank() ? in.strides[axis] * in.shape[axis] : 1);
  return true;
}

bool SqueezeView(const Layout& in, const Attrs& a, const Shape& out_shape, Layout* r) {
  const auto& axes = a.Ints("axes");
  int rank = in.shape.rank();
  r->offset = in.offset;
  r->shape = out_shape;
  r->strides = Strides();
  for (int i = 0; i < rank; ++i) {
    bool drop = axes.empty() ? in.shape[i] == 1 : false;
    for (int64_t ax : axes) drop = drop || (ax < 0 ? ax + rank : ax) == i;
    if (!drop) r->strides.push_back(in.strides[i]);
  }
  return true;
}

// ---- kernels -------------------------------------------------------------------------------------

// Copies the input through the layout V gives it; when V gives none (reshape of an input whose
// strides do not allow a view), copies it element by element in row-major order.
template <ViewFn V>
void CopyThroughView(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const TensorView& y = a.out[0];
  Layout v;
  if (V(Layout{0, x.shape, x.strides}, a.attrs, y.shape, &v)) {
    TensorView src = x;
    src.data = static_cast<char*>(x.data) + v.offset * static_cast<int64_t>(DTypeSize(x.dtype));
    src.shape = v.shape;
    src.strides = v.strides;
    host::CopyStrided(src, y);
  } else {
    TensorView dst = y;  // outputs are contiguous: view it in the input's shape
    dst.shape = x.shape;
    dst.strides = x.shape.ContiguousStrides();
    host::CopyStrided(x, dst);
  }
}

void SliceGradKernel(const KernelArgs& a) {
  const TensorView& y = a.out[0];
  host::Fill(y, 0.0);
  Layout v;
  SliceView(Layout{0, y.shape, y.strides}, a.attrs, a.in[0].shape, &v);
  TensorView dst = y;
  dst.data = static_cast<char*>(y.data) + v.offset * static_cast<int64_t>(DTypeSize(y.dtype));
  dst.shape = v.shape;
  dst.strides = v.strides;
  host::CopyStrided(a.in[0], dst);
}

void ConcatKernel(const KernelArgs& a) {
  host::Concat(a.in, a.out[0], NormalizeAxis(a.attrs.Int("axis"), a.out[0].rank(), "concat"));
}

void StackKernel(const KernelArgs& a) {
  int axis = NormalizeAxis(a.attrs.Int("axis"), a.out[0].rank(), "stack");
  std::vector<TensorView> parts(a.in.begin(), a.in.end());
  for (TensorView& p : parts) {
    int64_t stride = axis < p.rank() ? p.strides[axis] * p.shape[axis] : 1;
    p.shape.insert(axis, 1);
    p.strides.insert(axis, stride);
  }
  host::Concat(parts, a.out[0], axis);
}

void SplitKernel(const KernelArgs& a) {
  host::Split(a.in[0], a.out, NormalizeAxis(a.attrs.Int("axis"), a.in[0].rank(), "split"));
}

void TakeKernel(const KernelArgs& a) {
  host::Take(a.in[0], a.in[1], a.out[0], NormalizeAxis(a.attrs.Int("axis"), a.in[0].rank(), "take"));
}

void TakeGradKernel(const KernelArgs& a) {
  host::TakeGrad(a.in[0], a.in[1], a.out[0],
                 NormalizeAxis(a.attrs.Int("axis"), a.out[0].rank(), "take_grad"));
}

void OneHotKernel(const KernelArgs& a) {
  host::OneHot(a.in[0], a.out[0], a.attrs.Float("on_value"), a.attrs.Float("off_value"), a.attrs.Bool("labels"));
}

}  // namespace

void BindMovementKernels(KernelTable& t) {
  constexpr DeviceType kCPU = DeviceType::kCPU;
  t.Bind(op::kReshape, kCPU, {CopyThroughView<ReshapeView>, false, ReshapeView});
  t.Bind(op::kTranspose, kCPU, {CopyThroughView<TransposeView>, false, TransposeView});
  t.Bind(op::kSlice, kCPU, {CopyThroughView<SliceView>, false, SliceView});
  t.Bind(op::kBroadcastTo, kCPU, {CopyThroughView<BroadcastView>, false, BroadcastView});
  t.Bind(op::kExpandDims, kCPU, {CopyThroughView<ExpandDimsView>, false, ExpandDimsView});
  t.Bind(op::kSqueeze, kCPU, {CopyThroughView<SqueezeView>, false, SqueezeView});
  t.Bind(op::kSliceGrad, kCPU, {SliceGradKernel});
  t.Bind(op::kConcat, kCPU, {ConcatKernel});
  t.Bind(op::kStack, kCPU, {StackKernel});
  t.Bind(op::kSplit, kCPU, {SplitKernel});
  t.Bind(op::kTake, kCPU, {TakeKernel, true});
  t.Bind(op::kTakeGrad, kCPU, {TakeGradKernel, true});
  t.Bind(op::kOneHot, kCPU, {OneHotKernel, true});
}

}  // namespace kiln

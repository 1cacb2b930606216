// Reduction ops: sum, mean, max, min over a set of axes, and argmax/argmin along one axis.
// Semantics follow NumPy: an empty `axes` reduces every axis; sum of bool gives int64 and sum of
// an integer keeps its dtype; mean needs a float; over an empty reduction (a zero-size reduced
// axis) sum is 0, mean is NaN and max/min/argmax/argmin are a ShapeError; argmax/argmin return
// the first index of the extremum (a NaN counts as the extremum); max/min propagate NaN.
// Not here: variance, logsumexp, softmax (composites elsewhere).
#include "infer_util.h"

namespace kiln::ir {

namespace {

enum class Kind { kSum, kMean, kMax, kMin };

/// Throws ShapeError when one of `axes` of `in` has size zero (max, min, argmax, argmin).
void RequireNonEmptyAxes(const OpDef& op, const Shape& in, const std::vector<int>& axes) {
  for (int a : axes)
    if (a < in.rank() && in[a] == 0)
      KILN_THROW(ShapeError) << op.name << ": cannot reduce over a zero-size axis (axis " << a << " of shape "
                             << in.str() << "); the result has no identity. "
                             << "Reduce over non-empty axes, or use sum";
}

/// Shape of the input with the reduced axes kept as size 1 (the shape gradients broadcast from).
Shape KeptShape(const Shape& in, const std::vector<int>& axes) {
  Shape s = in;
  for (int a : axes)
    if (a < s.rank()) s[a] = 1;
  return s;
}

int64_t ReducedCount(const Shape& in, const std::vector<int>& axes) {
  int64_t n = 1;
  for (int a : axes)
    if (a < in.rank()) n *= in[a];
  return n;
}

/// dy of a reduction, reshaped to the keepdims shape so that it broadcasts against x.
Value* KeptGrad(GradContext& g, const std::vector<int>& axes) {
  return g.Reshape(g.out_grad(), KeptShape(g.input(0)->shape(), axes));
}

std::vector<int> GradAxes(GradContext& g) {
  return NormalizeAxes(g.node().def(), g.attrs().Ints("axes"), g.input(0)->shape().rank());
}

GradFn SumGrad(bool mean) {
  return [mean](GradContext& g) {
    Value* x = g.input(0);
    if (!IsFloat(x->dtype())) return std::vector<Value*>{nullptr};
    std::vector<int> axes = GradAxes(g);
    Value* dx = g.Op(op::kBroadcastTo, {KeptGrad(g, axes)}, {{"shape", x->shape().vec()}});
    if (mean) dx = g.Div(dx, g.Scalar(static_cast<double>(ReducedCount(x->shape(), axes)), x->dtype()));
    return std::vector<Value*>{dx};
  };
}

// Ties share the gradient evenly: dx = [x == y] * dy / count([x == y]).
std::vector<Value*> ExtremumGrad(GradContext& g) {
  Value* x = g.input(0);
  if (!IsFloat(x->dtype())) return {nullptr};
  std::vector<int> axes = GradAxes(g);
  Shape kept = KeptShape(x->shape(), axes);
  Value* mask = g.Cast(g.Op(op::kEqual, {x, g.Reshape(g.output(), kept)}), x->dtype());
  std::vector<int64_t> ax(axes.begin(), axes.end());
  Value* count = g.Op(op::kSum, {mask}, {{"axes", ax}, {"keepdims", true}});
  return {g.Div(g.Mul(mask, KeptGrad(g, axes)), count)};
}

void DeclareReduce(OpTable& t, OpId id, Kind kind, const char* doc) {
  OpDef d(id);
  d.num_inputs = 1;
  d.fusion = FusionKind::kReduce;
  d.attrs = {{"axes", AttrKind::kInts, std::vector<int64_t>{}}, {"keepdims", AttrKind::kBool, false}};
  d.doc = doc;
  d.infer = [kind](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    const TensorType& x = in[0];
    Shape out = ReducedShape(op, x.shape, a.Ints("axes"), a.Bool("keepdims"));
    DType dt = x.dtype;
    if (kind == Kind::kMean) RequireFloat(op, dt);
    if (kind == Kind::kSum && dt == DType::kBool) dt = DType::kInt64;
    if (kind == Kind::kMax || kind == Kind::kMin)
      RequireNonEmptyAxes(op, x.shape, NormalizeAxes(op, a.Ints("axes"), x.shape.rank()));
    return One({out, dt});
  };
  d.grad = kind == Kind::kSum ? SumGrad(false) : kind == Kind::kMean ? SumGrad(true) : ExtremumGrad;
  t.Add(std::move(d));
}

void DeclareArgReduce(OpTable& t, OpId id, const char* doc) {
  OpDef d(id);
  d.num_inputs = 1;
  d.fusion = FusionKind::kReduce;
  d.attrs = {{"axis", AttrKind::kInt, std::nullopt}, {"keepdims", AttrKind::kBool, false}};
  d.doc = doc;
  d.differentiable = false;
  d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    const Shape& s = in[0].shape;
    std::vector<int64_t> axis{a.Int("axis")};
    Shape out = ReducedShape(op, s, axis, a.Bool("keepdims"));
    RequireNonEmptyAxes(op, s, NormalizeAxes(op, axis, s.rank()));
    return One({out, DType::kInt64});
  };
  t.Add(std::move(d));
}

} // namespace

void RegisterReduceOps(OpTable& t) {
  DeclareReduce(t, op::kSum, Kind::kSum, "sum over axes (bool sums to int64; ints keep their dtype)");
  DeclareReduce(t, op::kMean, Kind::kMean, "mean over axes (floating inputs only)");
  DeclareReduce(t, op::kMax, Kind::kMax, "maximum over axes (NaN propagates)");
  DeclareReduce(t, op::kMin, Kind::kMin, "minimum over axes (NaN propagates)");
  DeclareArgReduce(t, op::kArgmax, "int64 index of the first maximum along axis (NaN counts as maximum)");
  DeclareArgReduce(t, op::kArgmin, "int64 index of the first minimum along axis (NaN counts as minimum)");
}

} // namespace kiln::ir

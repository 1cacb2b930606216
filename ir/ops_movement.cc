// Movement ops: reshape, transpose, slice, broadcast_to, expand_dims, squeeze (views of their
// input where the layout allows), concat, stack, split (block copies), take and one_hot (gathers),
// and the two gradient helpers slice_grad and take_grad. Semantics follow NumPy; reshape's 0 is a
// literal zero size (not MXNet's "copy this dim"). Views are built in runtime/cpu/kernels_movement.cc.
#include <numeric>

#include "infer_util.h"

namespace kiln::ir {

namespace {

using K = AttrKind;
using Ints = std::vector<int64_t>;

OpDef Decl(OpId id, int num_inputs, FusionKind fusion, std::vector<AttrSpec> attrs, const char* doc) {
  OpDef d(id);
  d.num_inputs = num_inputs;
  d.fusion = fusion;
  d.attrs = std::move(attrs);
  d.doc = doc;
  return d;
}

std::string ShapeText(const Ints& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

Shape NonNegativeShape(const OpDef& op, const Ints& dims) {
  for (int64_t d : dims)
    if (d < 0)
      KILN_THROW(ShapeError) << op.name << ": shape " << ShapeText(dims)
                             << " has a negative dimension; sizes must be >= 0";
  return Shape(dims);
}

Shape ReshapeTarget(const Shape& in, const Ints& spec) {
  int infer_at = -1;
  int64_t known = 1;
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] == -1) {
      if (infer_at >= 0)
        KILN_THROW(ShapeError) << "reshape: " << ShapeText(spec)
                               << " has more than one -1; only one size can be inferred";
      infer_at = static_cast<int>(i);
    } else if (spec[i] < 0) {
      KILN_THROW(ShapeError) << "reshape: " << ShapeText(spec) << " has a negative size " << spec[i]
                             << "; sizes must be >= 0, or -1 for the one inferred size";
    } else if (spec[i] != 0 && __builtin_mul_overflow(known, spec[i], &known)) {
      KILN_THROW(ShapeError) << "reshape: the sizes of " << ShapeText(spec)
                             << " multiply to more elements than fit in 64 bits; expected a shape with "
                             << in.numel() << " elements like " << in.str();
    } else if (spec[i] == 0) {
      known = 0;
    }
  }
  Shape out(spec);
  int64_t n = in.numel();
  if (infer_at >= 0) {
    if (known == 0 || n % known != 0)
      KILN_THROW(ShapeError) << "reshape: cannot reshape " << in.str() << " (" << n << " elements) into "
                             << ShapeText(spec) << ": no size for the -1 makes the element counts match";
    out[infer_at] = n / known;
  }
  if (out.numel() != n)
    KILN_THROW(ShapeError) << "reshape: cannot reshape " << in.str() << " (" << n << " elements) into "
                           << out.str() << " (" << out.numel()
                           << " elements); the number of elements must not change";
  return out;
}

std::vector<int> Permutation(const Ints& axes, int rank) {
  std::vector<int> p(rank);
  if (axes.empty()) {
    for (int i = 0; i < rank; ++i) p[i] = rank - 1 - i;
    return p;
  }
  if (static_cast<int>(axes.size()) != rank)
    KILN_THROW(ShapeError) << "transpose: axes " << AttrValueStr(axes) << " has " << axes.size()
                           << " entries for an input of rank " << rank << "; give a permutation of all axes, "
                           << "or none to reverse them";
  std::vector<bool> seen(rank, false);
  for (int i = 0; i < rank; ++i) {
    p[i] = NormalizeAxis(axes[i], rank, "transpose");
    if (seen[p[i]])
      KILN_THROW(ShapeError) << "transpose: axes " << AttrValueStr(axes) << " is not a permutation: axis "
                             << p[i] << " appears twice";
    seen[p[i]] = true;
  }
  return p;
}

Shape SliceShape(const Shape& in, const Attrs& a, const char* op) {
  auto axes = NormalizeSlice(in, a.Ints("begin"), a.Ints("end"), a.Ints("step"), op);
  Shape out = in;
  for (int i = 0; i < in.rank(); ++i) out[i] = axes[i].len;
  return out;
}

Shape BroadcastTarget(const Shape& in, const Shape& to) {
  if (in.rank() > to.rank())
    KILN_THROW(ShapeError) << "broadcast_to: cannot broadcast " << in.str() << " to " << to.str()
                           << ": the target has fewer dimensions";
  int lead = to.rank() - in.rank();
  for (int i = 0; i < in.rank(); ++i)
    if (in[i] != 1 && in[i] != to[i + lead])
      KILN_THROW(ShapeError) << "broadcast_to: cannot broadcast " << in.str() << " to " << to.str()
                             << ": dimension " << i << " has size " << in[i] << ", which must be 1 or "
                             << to[i + lead];
  return to;
}

// Sizes of split's parts: sections = {N} is N equal parts, several values are the sizes.
Ints SplitSizes(const Ints& sections, int64_t len, int axis) {
  if (sections.empty())
    KILN_THROW(ValueError)
        << "split: sections is empty; give the number of equal parts or the size of each part";
  if (sections.size() == 1) {
    int64_t n = sections[0];
    if (n < 1) KILN_THROW(ValueError) << "split: the number of parts must be at least 1, found " << n;
    if (len % n != 0)
      KILN_THROW(ValueError) << "split: axis " << axis << " of size " << len << " cannot be split into " << n
                             << " equal parts; give the size of each part instead";
    return Ints(static_cast<size_t>(n), len / n);
  }
  for (int64_t s : sections)
    if (s < 0)
      KILN_THROW(ValueError) << "split: section sizes must be >= 0, found " << AttrValueStr(sections);
  int64_t sum = std::accumulate(sections.begin(), sections.end(), int64_t{0});
  if (sum != len)
    KILN_THROW(ValueError) << "split: section sizes " << AttrValueStr(sections) << " add up to " << sum
                           << " but axis " << axis << " has size " << len;
  return sections;
}

void RequireIndices(const OpDef& op, DType t) {
  if (t != DType::kInt32 && t != DType::kInt64)
    KILN_THROW(DTypeError) << op.name << ": indices must be int32 or int64, found " << DTypeName(t)
                           << "; cast them, e.g. idx.astype('int64')";
}

Attrs SliceAttrs(const Attrs& a) {
  return {{"begin", a.Ints("begin")}, {"end", a.Ints("end")}, {"step", a.Ints("step")}};
}

Value* ReshapeBack(GradContext& g) { return g.Reshape(g.out_grad(), g.input(0)->shape()); }

// ---- declarations ------------------------------------------------------------------------------

void DeclareViews(OpTable& t) {
  OpDef d = Decl(op::kReshape, 1, FusionKind::kInjective, {{"shape", K::kInts, std::nullopt}},
                 "the same elements in a new shape (one -1 is inferred; a view when strides allow)");
  d.infer = [](const OpDef&, std::span<const TensorType> in, const Attrs& a) {
    return One({ReshapeTarget(in[0].shape, a.Ints("shape")), in[0].dtype});
  };
  d.grad = [](GradContext& g) { return std::vector<Value*>{ReshapeBack(g)}; };
  t.Add(std::move(d));

  d = Decl(op::kTranspose, 1, FusionKind::kInjective, {{"axes", K::kInts, Ints{}}},
           "permute the axes (none given: reverse them); a view");
  d.infer = [](const OpDef&, std::span<const TensorType> in, const Attrs& a) {
    std::vector<int> p = Permutation(a.Ints("axes"), in[0].shape.rank());
    Shape out = in[0].shape;
    for (size_t i = 0; i < p.size(); ++i) out[static_cast<int>(i)] = in[0].shape[p[i]];
    return One({out, in[0].dtype});
  };
  d.grad = [](GradContext& g) {
    std::vector<int> p = Permutation(g.attrs().Ints("axes"), g.input(0)->shape().rank());
    Ints inv(p.size());
    for (size_t i = 0; i < p.size(); ++i) inv[p[i]] = static_cast<int64_t>(i);
    return std::vector<Value*>{g.Op(op::kTranspose, {g.out_grad()}, {{"axes", inv}})};
  };
  t.Add(std::move(d));

  const std::vector<AttrSpec> slice_attrs = {
      {"begin", K::kInts, Ints{}}, {"end", K::kInts, Ints{}}, {"step", K::kInts, Ints{}}};
  d = Decl(op::kSlice, 1, FusionKind::kInjective, slice_attrs,
           "x[begin:end:step] on the leading axes, NumPy semantics; a view");
  d.infer = [](const OpDef&, std::span<const TensorType> in, const Attrs& a) {
    return One({SliceShape(in[0].shape, a, "slice"), in[0].dtype});
  };
  d.grad = [](GradContext& g) {
    Attrs a = SliceAttrs(g.attrs());
    a.items().emplace_back("shape", g.input(0)->shape().vec());
    return std::vector<Value*>{g.Op(op::kSliceGrad, {g.out_grad()}, a)};
  };
  t.Add(std::move(d));

  std::vector<AttrSpec> sg_attrs = slice_attrs;
  sg_attrs.insert(sg_attrs.begin(), {"shape", K::kInts, std::nullopt});
  d = Decl(op::kSliceGrad, 1, FusionKind::kOpaque, sg_attrs,
           "zeros of `shape` with dy written at x[begin:end:step] (the gradient of slice)");
  d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    Shape shape = NonNegativeShape(op, a.Ints("shape"));
    Shape sliced = SliceShape(shape, a, "slice_grad");
    if (!(sliced == in[0].shape))
      KILN_THROW(ShapeError) << "slice_grad: the gradient has shape " << in[0].shape.str()
                             << " but the slice of " << shape.str() << " has shape " << sliced.str();
    return One({shape, in[0].dtype});
  };
  d.grad = [](GradContext& g) {
    return std::vector<Value*>{g.Op(op::kSlice, {g.out_grad()}, SliceAttrs(g.attrs()))};
  };
  t.Add(std::move(d));

  d = Decl(op::kBroadcastTo, 1, FusionKind::kBroadcast, {{"shape", K::kInts, std::nullopt}},
           "x broadcast to `shape` (NumPy rules); a view with zero strides");
  d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    return One({BroadcastTarget(in[0].shape, NonNegativeShape(op, a.Ints("shape"))), in[0].dtype});
  };
  d.grad = [](GradContext& g) { return std::vector<Value*>{g.SumTo(g.out_grad(), g.input(0)->shape())}; };
  t.Add(std::move(d));

  d = Decl(op::kExpandDims, 1, FusionKind::kInjective, {{"axis", K::kInt, std::nullopt}},
           "insert a size-1 axis at `axis` (in [-rank-1, rank]); a view");
  d.infer = [](const OpDef&, std::span<const TensorType> in, const Attrs& a) {
    Shape out = in[0].shape;
    out.insert(NormalizeAxis(a.Int("axis"), out.rank() + 1, "expand_dims"), 1);
    return One({out, in[0].dtype});
  };
  d.grad = [](GradContext& g) { return std::vector<Value*>{ReshapeBack(g)}; };
  t.Add(std::move(d));

  d = Decl(op::kSqueeze, 1, FusionKind::kInjective, {{"axes", K::kInts, Ints{}}},
           "remove size-1 axes (none given: all of them); a view");
  d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    const Shape& s = in[0].shape;
    const Ints& axes = a.Ints("axes");
    Shape out;
    if (axes.empty()) {
      for (int64_t dim : s)
        if (dim != 1) out.push_back(dim);
      return One({out, in[0].dtype});
    }
    std::vector<int> ax = NormalizeAxes(op, axes, s.rank());
    for (int i : ax)
      if (s[i] != 1)
        KILN_THROW(ShapeError) << "squeeze: axis " << i << " of " << s.str() << " has size " << s[i]
                               << "; only size-1 axes can be squeezed";
    for (int i = 0; i < s.rank(); ++i)
      if (std::find(ax.begin(), ax.end(), i) == ax.end()) out.push_back(s[i]);
    return One({out, in[0].dtype});
  };
  d.grad = [](GradContext& g) { return std::vector<Value*>{ReshapeBack(g)}; };
  t.Add(std::move(d));
}

void DeclareJoins(OpTable& t) {
  OpDef d = Decl(op::kConcat, -1, FusionKind::kInjective, {{"axis", K::kInt, int64_t{0}}},
                 "join tensors along an existing axis");
  d.infer = [](const OpDef&, std::span<const TensorType> in, const Attrs& a) {
    const Shape& s0 = in[0].shape;
    if (s0.rank() == 0)
      KILN_THROW(ShapeError) << "concat: cannot concatenate 0-d tensors (they have no axis); use stack";
    int axis = NormalizeAxis(a.Int("axis"), s0.rank(), "concat");
    Shape out = s0;
    for (size_t i = 1; i < in.size(); ++i) {
      const Shape& si = in[i].shape;
      if (in[i].dtype != in[0].dtype)
        KILN_THROW(DTypeError) << "concat: input " << i << " has dtype " << DTypeName(in[i].dtype)
                               << " but input 0 has " << DTypeName(in[0].dtype) << "; cast them to one dtype";
      bool ok = si.rank() == s0.rank();
      for (int k = 0; ok && k < s0.rank(); ++k) ok = k == axis || si[k] == s0[k];
      if (!ok)
        KILN_THROW(ShapeError) << "concat: input " << i << " has shape " << si.str() << " but input 0 has "
                               << s0.str() << "; all dimensions except axis " << axis << " must match";
      out[axis] += si[axis];
    }
    return One({out, in[0].dtype});
  };
  d.grad = [](GradContext& g) {
    if (g.num_inputs() == 1) return std::vector<Value*>{g.out_grad()};
    int axis = NormalizeAxis(g.attrs().Int("axis"), g.input(0)->shape().rank(), "concat");
    Ints sizes;
    for (int i = 0; i < g.num_inputs(); ++i) sizes.push_back(g.input(i)->shape()[axis]);
    return g.OpN(op::kSplit, {g.out_grad()}, {{"sections", sizes}, {"axis", int64_t{axis}}});
  };
  t.Add(std::move(d));

  d = Decl(op::kStack, -1, FusionKind::kInjective, {{"axis", K::kInt, int64_t{0}}},
           "join equal-shaped tensors along a new axis");
  d.infer = [](const OpDef&, std::span<const TensorType> in, const Attrs& a) {
    const Shape& s0 = in[0].shape;
    for (size_t i = 1; i < in.size(); ++i) {
      if (in[i].dtype != in[0].dtype)
        KILN_THROW(DTypeError) << "stack: input " << i << " has dtype " << DTypeName(in[i].dtype)
                               << " but input 0 has " << DTypeName(in[0].dtype) << "; cast them to one dtype";
      if (!(in[i].shape == s0))
        KILN_THROW(ShapeError) << "stack: input " << i << " has shape " << in[i].shape.str()
                               << " but input 0 has " << s0.str()
                               << "; stacked tensors must have equal shapes";
    }
    Shape out = s0;
    out.insert(NormalizeAxis(a.Int("axis"), s0.rank() + 1, "stack"), static_cast<int64_t>(in.size()));
    return One({out, in[0].dtype});
  };
  d.grad = [](GradContext& g) {
    int axis = NormalizeAxis(g.attrs().Int("axis"), g.input(0)->shape().rank() + 1, "stack");
    std::vector<Value*> parts =
        g.OpN(op::kSplit, {g.out_grad()}, {{"sections", Ints{g.num_inputs()}}, {"axis", int64_t{axis}}});
    for (Value*& p : parts) p = g.Reshape(p, g.input(0)->shape());
    return parts;
  };
  t.Add(std::move(d));

  d = Decl(op::kSplit, 1, FusionKind::kInjective,
           {{"sections", K::kInts, std::nullopt}, {"axis", K::kInt, int64_t{0}}},
           "cut along an axis into N equal parts (sections=[N]) or parts of the given sizes");
  d.num_outputs = -1;
  d.outputs_from_attrs = [](const Attrs& a, int) {
    const Ints& s = a.Ints("sections");
    return static_cast<int>(s.size() == 1 ? std::max<int64_t>(s[0], 0) : static_cast<int64_t>(s.size()));
  };
  d.infer = [](const OpDef&, std::span<const TensorType> in, const Attrs& a) {
    const Shape& s = in[0].shape;
    int axis = NormalizeAxis(a.Int("axis"), s.rank(), "split");
    std::vector<TensorType> out;
    for (int64_t size : SplitSizes(a.Ints("sections"), s[axis], axis)) {
      Shape part = s;
      part[axis] = size;
      out.push_back({part, in[0].dtype});
    }
    return out;
  };
  d.grad = [](GradContext& g) {
    int n = static_cast<int>(g.node().outputs().size());
    if (n == 1) return std::vector<Value*>{g.out_grad(0)};
    std::vector<Value*> parts;
    for (int i = 0; i < n; ++i) parts.push_back(g.out_grad(i));
    return std::vector<Value*>{g.Op(op::kConcat, parts, {{"axis", g.attrs().Int("axis")}})};
  };
  t.Add(std::move(d));
}

void DeclareGathers(OpTable& t) {
  OpDef d = Decl(op::kTake, 2, FusionKind::kInjective, {{"axis", K::kInt, int64_t{0}}},
                 "x.take(indices, axis): rows of x picked by integer indices (negative ones wrap)");
  d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    RequireIndices(op, in[1].dtype);
    const Shape& x = in[0].shape;
    if (x.rank() == 0) KILN_THROW(ShapeError) << "take: cannot index a 0-d tensor; reshape it to (1,) first";
    int axis = NormalizeAxis(a.Int("axis"), x.rank(), "take");
    Shape out;
    for (int i = 0; i < axis; ++i) out.push_back(x[i]);
    for (int64_t n : in[1].shape) out.push_back(n);
    for (int i = axis + 1; i < x.rank(); ++i) out.push_back(x[i]);
    return One({out, in[0].dtype});
  };
  d.grad = [](GradContext& g) {
    const Shape& x = g.input(0)->shape();
    int axis = NormalizeAxis(g.attrs().Int("axis"), x.rank(), "take");
    Value* dx = g.Op(op::kTakeGrad, {g.out_grad(), g.input(1)}, {{"axis", int64_t{axis}}, {"dim", x[axis]}});
    return std::vector<Value*>{dx, nullptr};
  };
  t.Add(std::move(d));

  d = Decl(op::kTakeGrad, 2, FusionKind::kOpaque,
           {{"axis", K::kInt, std::nullopt}, {"dim", K::kInt, std::nullopt}},
           "zeros with dy added at the indices along `axis` (the gradient of take; repeats accumulate)");
  d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    RequireFloat(op, in[0].dtype, "gradient");
    RequireIndices(op, in[1].dtype);
    const Shape &dy = in[0].shape, &ix = in[1].shape;
    int64_t dim = a.Int("dim");
    if (dim < 0) KILN_THROW(ValueError) << "take_grad: dim must be >= 0, found " << dim;
    int rank = dy.rank() - ix.rank() + 1;
    if (rank < 1)
      KILN_THROW(ShapeError) << "take_grad: the gradient " << dy.str() << " has fewer axes than the indices "
                             << ix.str();
    int axis = NormalizeAxis(a.Int("axis"), rank, "take_grad");
    bool ok = true;
    for (int i = 0; i < ix.rank(); ++i) ok = ok && dy[axis + i] == ix[i];
    if (!ok)
      KILN_THROW(ShapeError) << "take_grad: the gradient " << dy.str() << " does not hold the indices' shape "
                             << ix.str() << " at axis " << axis;
    Shape out;
    for (int i = 0; i < axis; ++i) out.push_back(dy[i]);
    out.push_back(dim);
    for (int i = axis + ix.rank(); i < dy.rank(); ++i) out.push_back(dy[i]);
    return One({out, in[0].dtype});
  };
  d.grad = [](GradContext& g) {
    return std::vector<Value*>{g.Op(op::kTake, {g.out_grad(), g.input(1)}, {{"axis", g.attrs().Int("axis")}}),
                               nullptr};
  };
  t.Add(std::move(d));

  d = Decl(op::kOneHot, 1, FusionKind::kOpaque,
           {{"depth", K::kInt, std::nullopt},
            {"on_value", K::kFloat, 1.0},
            {"off_value", K::kFloat, 0.0},
            {"dtype", K::kDType, DType::kFloat32},
            {"labels", K::kBool, false}},
           "out[..., k] = on_value where indices == k, else off_value (indices outside [0, depth): all off, "
           "or with labels=true, class labels of a loss, a ValueError)");
  d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    RequireIndices(op, in[0].dtype);
    int64_t depth = a.Int("depth");
    if (depth < 0) KILN_THROW(ValueError) << "one_hot: depth must be >= 0, found " << depth;
    Shape out = in[0].shape;
    out.push_back(depth);
    return One({out, a.Type("dtype")});
  };
  d.differentiable = false;
  t.Add(std::move(d));
}

}  // namespace

void RegisterMovementOps(OpTable& t) {
  DeclareViews(t);
  DeclareJoins(t);
  DeclareGathers(t);
}

}  // namespace kiln::ir

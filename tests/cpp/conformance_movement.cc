// Conformance cases of the movement ops (ir/ops_movement.cc): reshape, transpose, slice,
// slice_grad, broadcast_to, expand_dims, squeeze, concat, stack, split, take, take_grad, one_hot,
// with negative axes, rank 0, size-1 and zero-size dims, and integer and 16-bit dtypes. Every
// reference is written here by index arithmetic on row-major host data, independent of the
// kernels (the slice reference enumerates Python's range() instead of computing lengths).
#include <algorithm>
#include <limits>

#include "conformance.h"

namespace kiln::testing {

namespace {

using Ints64 = std::vector<int64_t>;
using Outs = std::vector<HostTensor>;

Ints64 Unravel(int64_t flat, const Shape& s) {
  Ints64 c(static_cast<size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    c[static_cast<size_t>(d)] = flat % s[d];
    flat /= s[d];
  }
  return c;
}

int64_t Ravel(const Ints64& c, const Shape& s) {
  int64_t f = 0;
  for (int d = 0; d < s.rank(); ++d) f = f * s[d] + c[static_cast<size_t>(d)];
  return f;
}

int Axis(int64_t a, int rank) { return static_cast<int>(a < 0 ? a + rank : a); }

HostTensor Zeros(const Shape& s) { return {s, std::vector<double>(static_cast<size_t>(s.numel()), 0.0)}; }

/// y[i] = x[src(coords of i in y)] over every element of a y of shape `ys`.
template <class F>
HostTensor Gather(const HostTensor& x, const Shape& ys, F src) {
  HostTensor y = Zeros(ys);
  for (int64_t i = 0; i < ys.numel(); ++i)
    y.data[static_cast<size_t>(i)] = x.data[static_cast<size_t>(Ravel(src(Unravel(i, ys)), x.shape))];
  return y;
}

OpCase Make(std::string op, std::string label, std::vector<HostTensor> in, ir::Attrs attrs, Reference ref) {
  OpCase c;
  c.op = std::move(op);
  c.label = c.op + " " + std::move(label);
  c.inputs = std::move(in);
  c.attrs = std::move(attrs);
  c.reference = std::move(ref);
  c.dtypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16};
  return c;
}

HostTensor A(const Shape& s) { return Arange(s, 0.5, 0.25); }

// ---- references ----------------------------------------------------------------------------------

Outs ReshapeRef(const Outs& in, const ir::Attrs& a) {
  Ints64 spec = a.Ints("shape");
  int64_t known = 1;
  for (int64_t d : spec) known *= d == -1 ? 1 : d;
  for (int64_t& d : spec)
    if (d == -1) d = in[0].shape.numel() / known;
  return {{Shape(spec), in[0].data}};
}

Outs TransposeRef(const Outs& in, const ir::Attrs& a) {
  const Shape& xs = in[0].shape;
  int r = xs.rank();
  Ints64 p = a.Ints("axes");
  if (p.empty())
    for (int i = r - 1; i >= 0; --i) p.push_back(i);
  for (int64_t& v : p) v = Axis(v, r);
  Shape ys = xs;
  for (int i = 0; i < r; ++i) ys[i] = xs[static_cast<int>(p[static_cast<size_t>(i)])];
  return {Gather(in[0], ys, [&](const Ints64& o) {
    Ints64 c(static_cast<size_t>(r));
    for (int i = 0; i < r; ++i) c[static_cast<size_t>(p[static_cast<size_t>(i)])] = o[static_cast<size_t>(i)];
    return c;
  })};
}

/// The indices Python's x[b:e:s] visits on an axis of length n (None = the entry is missing).
Ints64 PySliceIndices(int64_t n, const Ints64& begin, const Ints64& end, const Ints64& step, size_t axis) {
  int64_t s = axis < step.size() ? step[axis] : 1;
  bool has_b = axis < begin.size(), has_e = axis < end.size();
  int64_t b = has_b ? begin[axis] : 0, e = has_e ? end[axis] : 0;
  auto adjust = [&](int64_t v, int64_t lo, int64_t hi) {
    if (v < 0) v = v < -n ? lo : v + n;  // written without adding to huge negatives
    return std::min(std::max(v, lo), hi);
  };
  if (s > 0) {
    b = has_b ? adjust(b, 0, n) : 0;
    e = has_e ? adjust(e, 0, n) : n;
  } else {
    b = has_b ? adjust(b, -1, n - 1) : n - 1;
    e = has_e ? adjust(e, -1, n - 1) : -1;
  }
  Ints64 out;
  for (int64_t i = b; s > 0 ? i < e : i > e; i += s) out.push_back(i);
  return out;
}

std::vector<Ints64> SliceIndices(const Shape& xs, const ir::Attrs& a) {
  std::vector<Ints64> idx;
  for (int d = 0; d < xs.rank(); ++d)
    idx.push_back(
        PySliceIndices(xs[d], a.Ints("begin"), a.Ints("end"), a.Ints("step"), static_cast<size_t>(d)));
  return idx;
}

Shape SlicedShape(const std::vector<Ints64>& idx) {
  Shape s;
  for (const Ints64& v : idx) s.push_back(static_cast<int64_t>(v.size()));
  return s;
}

Outs SliceRef(const Outs& in, const ir::Attrs& a) {
  auto idx = SliceIndices(in[0].shape, a);
  return {Gather(in[0], SlicedShape(idx), [&](Ints64 o) {
    for (size_t d = 0; d < o.size(); ++d) o[d] = idx[d][static_cast<size_t>(o[d])];
    return o;
  })};
}

Outs SliceGradRef(const Outs& in, const ir::Attrs& a) {
  Shape xs(a.Ints("shape"));
  auto idx = SliceIndices(xs, a);
  HostTensor y = Zeros(xs);
  for (int64_t i = 0; i < in[0].shape.numel(); ++i) {
    Ints64 o = Unravel(i, in[0].shape);
    for (size_t d = 0; d < o.size(); ++d) o[d] = idx[d][static_cast<size_t>(o[d])];
    y.data[static_cast<size_t>(Ravel(o, xs))] = in[0].data[static_cast<size_t>(i)];
  }
  return {y};
}

Outs BroadcastRef(const Outs& in, const ir::Attrs& a) {
  Shape ys(a.Ints("shape"));
  const Shape& xs = in[0].shape;
  int lead = ys.rank() - xs.rank();
  return {Gather(in[0], ys, [&](const Ints64& o) {
    Ints64 c(static_cast<size_t>(xs.rank()));
    for (int i = 0; i < xs.rank(); ++i)
      c[static_cast<size_t>(i)] = xs[i] == 1 ? 0 : o[static_cast<size_t>(i + lead)];
    return c;
  })};
}

Outs ExpandDimsRef(const Outs& in, const ir::Attrs& a) {
  Shape s = in[0].shape;
  s.insert(Axis(a.Int("axis"), s.rank() + 1), 1);
  return {{s, in[0].data}};
}

Outs SqueezeRef(const Outs& in, const ir::Attrs& a) {
  const Shape& xs = in[0].shape;
  Ints64 axes = a.Ints("axes");
  Shape s;
  for (int d = 0; d < xs.rank(); ++d) {
    bool drop = axes.empty() && xs[d] == 1;
    for (int64_t ax : axes) drop = drop || Axis(ax, xs.rank()) == d;
    if (!drop) s.push_back(xs[d]);
  }
  return {{s, in[0].data}};
}

Outs ConcatRef(const Outs& in, const ir::Attrs& a) {
  int axis = Axis(a.Int("axis"), in[0].shape.rank());
  Shape ys = in[0].shape;
  ys[axis] = 0;
  for (const HostTensor& t : in) ys[axis] += t.shape[axis];
  HostTensor y = Zeros(ys);
  for (int64_t i = 0; i < ys.numel(); ++i) {
    Ints64 c = Unravel(i, ys);
    size_t k = 0;
    while (c[static_cast<size_t>(axis)] >= in[k].shape[axis])
      c[static_cast<size_t>(axis)] -= in[k++].shape[axis];
    y.data[static_cast<size_t>(i)] = in[k].data[static_cast<size_t>(Ravel(c, in[k].shape))];
  }
  return {y};
}

Outs StackRef(const Outs& in, const ir::Attrs& a) {
  Shape ys = in[0].shape;
  int axis = Axis(a.Int("axis"), ys.rank() + 1);
  ys.insert(axis, static_cast<int64_t>(in.size()));
  HostTensor y = Zeros(ys);
  for (int64_t i = 0; i < ys.numel(); ++i) {
    Ints64 c = Unravel(i, ys);
    size_t k = static_cast<size_t>(c[static_cast<size_t>(axis)]);
    c.erase(c.begin() + axis);
    y.data[static_cast<size_t>(i)] = in[k].data[static_cast<size_t>(Ravel(c, in[k].shape))];
  }
  return {y};
}

Outs SplitRef(const Outs& in, const ir::Attrs& a) {
  const Shape& xs = in[0].shape;
  int axis = Axis(a.Int("axis"), xs.rank());
  Ints64 sizes = a.Ints("sections");
  if (sizes.size() == 1) sizes = Ints64(static_cast<size_t>(sizes[0]), xs[axis] / sizes[0]);
  Outs out;
  int64_t start = 0;
  for (int64_t n : sizes) {
    Shape ps = xs;
    ps[axis] = n;
    out.push_back(Gather(in[0], ps, [&](Ints64 c) {
      c[static_cast<size_t>(axis)] += start;
      return c;
    }));
    start += n;
  }
  return out;
}

int64_t Wrap(double v, int64_t n) { return v < 0 ? static_cast<int64_t>(v) + n : static_cast<int64_t>(v); }

Outs TakeRef(const Outs& in, const ir::Attrs& a) {
  const Shape &xs = in[0].shape, &is = in[1].shape;
  int axis = Axis(a.Int("axis"), xs.rank());
  Shape ys;
  for (int d = 0; d < axis; ++d) ys.push_back(xs[d]);
  for (int64_t d : is) ys.push_back(d);
  for (int d = axis + 1; d < xs.rank(); ++d) ys.push_back(xs[d]);
  return {Gather(in[0], ys, [&](const Ints64& o) {
    Ints64 c(o.begin(), o.begin() + axis);
    Ints64 ic(o.begin() + axis, o.begin() + axis + is.rank());
    c.push_back(Wrap(in[1].data[static_cast<size_t>(Ravel(ic, is))], xs[axis]));
    c.insert(c.end(), o.begin() + axis + is.rank(), o.end());
    return c;
  })};
}

Outs TakeGradRef(const Outs& in, const ir::Attrs& a) {
  const Shape &gs = in[0].shape, &is = in[1].shape;
  int axis = Axis(a.Int("axis"), gs.rank() - is.rank() + 1);
  int64_t dim = a.Int("dim");
  Shape ys;
  for (int d = 0; d < axis; ++d) ys.push_back(gs[d]);
  ys.push_back(dim);
  for (int d = axis + is.rank(); d < gs.rank(); ++d) ys.push_back(gs[d]);
  HostTensor y = Zeros(ys);
  for (int64_t i = 0; i < gs.numel(); ++i) {
    Ints64 o = Unravel(i, gs);
    Ints64 c(o.begin(), o.begin() + axis);
    Ints64 ic(o.begin() + axis, o.begin() + axis + is.rank());
    c.push_back(Wrap(in[1].data[static_cast<size_t>(Ravel(ic, is))], dim));
    c.insert(c.end(), o.begin() + axis + is.rank(), o.end());
    y.data[static_cast<size_t>(Ravel(c, ys))] += in[0].data[static_cast<size_t>(i)];
  }
  return {y};
}

Outs OneHotRef(const Outs& in, const ir::Attrs& a) {
  int64_t depth = a.Int("depth");
  Shape ys = in[0].shape;
  ys.push_back(depth);
  HostTensor y = Zeros(ys);
  for (size_t j = 0; j < in[0].data.size(); ++j)
    for (int64_t k = 0; k < depth; ++k)
      y.data[j * static_cast<size_t>(depth) + static_cast<size_t>(k)] =
          in[0].data[j] == static_cast<double>(k) ? a.Float("on_value") : a.Float("off_value");
  return {y};
}

}  // namespace

KILN_CONFORMANCE_CASES(movement) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  std::vector<OpCase> cs;
  auto add = [&](OpCase c) { cs.push_back(std::move(c)); };
  const DType i32 = DType::kInt32, i64 = DType::kInt64;

  // reshape: -1 inferred, rank 0 both ways, zero-size, integer and bool data.
  add(Make("reshape", "(2,3)->(3,2)", {A({2, 3})}, {{"shape", Ints64{3, 2}}}, ReshapeRef));
  add(Make("reshape", "(2,3,4)->(4,-1)", {A({2, 3, 4})}, {{"shape", Ints64{4, -1}}}, ReshapeRef));
  add(Make("reshape", "(2,3)->(-1,)", {A({2, 3})}, {{"shape", Ints64{-1}}}, ReshapeRef));
  add(Make("reshape", "()->(1,1)", {A({})}, {{"shape", Ints64{1, 1}}}, ReshapeRef));
  add(Make("reshape", "(1,1)->()", {A({1, 1})}, {{"shape", Ints64{}}}, ReshapeRef));
  add(Make("reshape", "(2,0)->(0,5) zero-size", {A({2, 0})}, {{"shape", Ints64{0, 5}}}, ReshapeRef));
  add(Make("reshape", "(3,4) int32 -> (2,1,6)", {Ints({3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, i32)},
           {{"shape", Ints64{2, 1, 6}}}, ReshapeRef));
  add(Make("reshape", "(2,2) bool -> (4,)", {Ints({2, 2}, {1, 0, 0, 1}, DType::kBool)},
           {{"shape", Ints64{4}}}, ReshapeRef));

  // transpose: default reverse, explicit with negative axes, rank 0/1, zero-size.
  add(Make("transpose", "(2,3)", {A({2, 3})}, {}, TransposeRef));
  add(Make("transpose", "(2,3,4) axes=[1,-1,0]", {A({2, 3, 4})}, {{"axes", Ints64{1, -1, 0}}}, TransposeRef));
  add(Make("transpose", "(2,3,4) reversed", {A({2, 3, 4})}, {}, TransposeRef));
  add(Make("transpose", "(5,)", {A({5})}, {}, TransposeRef));
  add(Make("transpose", "()", {A({})}, {}, TransposeRef));
  add(Make("transpose", "(0,3)", {A({0, 3})}, {{"axes", Ints64{1, 0}}}, TransposeRef));
  add(Make("transpose", "(9,6) int64", {Ints({9, 6}, std::vector<double>(54, 3), i64)}, {}, TransposeRef));
  add(Make("transpose", "(2,2,3) uint8 axes=[2,0,1]",
           {Ints({2, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, DType::kUInt8)},
           {{"axes", Ints64{2, 0, 1}}}, TransposeRef));

  // slice: NumPy semantics.
  auto slice = [&](std::string label, HostTensor x, Ints64 b, Ints64 e, Ints64 s) {
    add(Make("slice", std::move(label), {std::move(x)}, {{"begin", b}, {"end", e}, {"step", s}}, SliceRef));
  };
  slice("(4,5) [1:3]", A({4, 5}), {1}, {3}, {});
  slice("(4,5) [-3:-1, 1:100:2]", A({4, 5}), {-3, 1}, {-1, 100}, {1, 2});
  slice("(5,) [::-1]", A({5}), {}, {}, {-1});
  slice("(4,5) [3:0:-2, 4:-6:-2]", A({4, 5}), {3, 4}, {0, -6}, {-2, -2});
  slice("(4,5) [min:max, max:min:-3] sentinels", A({4, 5}), {kMin, kMax}, {kMax, kMin}, {1, -3});
  slice("(4,) [3:1] empty", A({4}), {3}, {1}, {});
  slice("(2,3,4) [:, 1:, ::3]", A({2, 3, 4}), {0, 1, 0}, {2, 3, 4}, {1, 1, 3});
  slice("(0,3) [0:2]", A({0, 3}), {0}, {2}, {});
  slice("() identity", A({}), {}, {}, {});
  slice("(3,4) int32 [1:, ::-2]", Ints({3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, i32), {1, kMax},
        {3, kMin}, {1, -2});

  // slice_grad (the gradient of slice) and its own gradient (slice).
  auto slice_grad = [&](std::string label, HostTensor dy, Ints64 shape, Ints64 b, Ints64 e, Ints64 s) {
    add(Make("slice_grad", std::move(label), {std::move(dy)},
             {{"shape", shape}, {"begin", b}, {"end", e}, {"step", s}}, SliceGradRef));
  };
  slice_grad("(2,5) into (4,5) [1:3]", A({2, 5}), {4, 5}, {1}, {3}, {});
  slice_grad("(2,3) into (4,5) [3:0:-2, 4:-6:-2]", A({2, 3}), {4, 5}, {3, 4}, {0, -6}, {-2, -2});
  slice_grad("(0,) into (4,) empty", A({0}), {4}, {3}, {1}, {});
  slice_grad("() into ()", A({}), {}, {}, {}, {});

  // broadcast_to
  auto bcast = [&](std::string label, HostTensor x, Ints64 shape) {
    add(Make("broadcast_to", std::move(label), {std::move(x)}, {{"shape", shape}}, BroadcastRef));
  };
  bcast("(3,)->(2,3)", A({3}), {2, 3});
  bcast("(2,1)->(2,3)", A({2, 1}), {2, 3});
  bcast("()->(2,2)", A({}), {2, 2});
  bcast("(3,1)->(2,3,4)", A({3, 1}), {2, 3, 4});
  bcast("(1,)->(2,0)", A({1}), {2, 0});
  bcast("(2,3)->(2,3) same", A({2, 3}), {2, 3});
  bcast("(1,3) int32 ->(4,3)", Ints({1, 3}, {7, -8, 9}, i32), {4, 3});

  // expand_dims / squeeze
  auto expand = [&](std::string label, HostTensor x, int64_t axis) {
    add(Make("expand_dims", std::move(label), {std::move(x)}, {{"axis", axis}}, ExpandDimsRef));
  };
  expand("(2,3) axis=0", A({2, 3}), 0);
  expand("(2,3) axis=1", A({2, 3}), 1);
  expand("(2,3) axis=-1", A({2, 3}), -1);
  expand("(2,3) axis=-3", A({2, 3}), -3);
  expand("() axis=0", A({}), 0);
  expand("(0,2) axis=2", A({0, 2}), 2);
  auto squeeze = [&](std::string label, HostTensor x, Ints64 axes) {
    add(Make("squeeze", std::move(label), {std::move(x)}, {{"axes", axes}}, SqueezeRef));
  };
  squeeze("(1,3,1) all", A({1, 3, 1}), {});
  squeeze("(1,3,1) axes=[-1]", A({1, 3, 1}), {-1});
  squeeze("(1,3,1) axes=[0,2]", A({1, 3, 1}), {0, 2});
  squeeze("(1,1) -> ()", A({1, 1}), {});
  squeeze("(0,1) axes=[1]", A({0, 1}), {1});
  squeeze("(2,3) nothing to squeeze", A({2, 3}), {});

  // concat / stack / split
  auto concat = [&](std::string label, std::vector<HostTensor> xs, int64_t axis) {
    add(Make("concat", std::move(label), std::move(xs), {{"axis", axis}}, ConcatRef));
  };
  concat("(2,3)+(1,3) axis=0", {A({2, 3}), Arange({1, 3}, -1, 0.5)}, 0);
  concat("(2,3)+(2,1)+(2,2) axis=-1", {A({2, 3}), Arange({2, 1}, -1, 0.5), Arange({2, 2}, 3, -0.25)}, -1);
  concat("(2,0)+(2,3)+(2,0) axis=1 zero-size pieces", {A({2, 0}), A({2, 3}), A({2, 0})}, 1);
  concat("(2,1,3)+(2,2,3) axis=1", {A({2, 1, 3}), Arange({2, 2, 3}, -2, 0.5)}, 1);
  concat("(4,) alone", {A({4})}, 0);
  concat("(0,2)+(0,2) all empty", {A({0, 2}), A({0, 2})}, 0);
  concat("(2,2) int32 + (2,1) int32 axis=1", {Ints({2, 2}, {1, 2, 3, 4}, i32), Ints({2, 1}, {5, 6}, i32)}, 1);
  auto stack = [&](std::string label, std::vector<HostTensor> xs, int64_t axis) {
    add(Make("stack", std::move(label), std::move(xs), {{"axis", axis}}, StackRef));
  };
  stack("2x(2,3) axis=0", {A({2, 3}), Arange({2, 3}, -1, 0.5)}, 0);
  stack("2x(2,3) axis=-1", {A({2, 3}), Arange({2, 3}, -1, 0.5)}, -1);
  stack("3x(4,) axis=1", {A({4}), Arange({4}, -1, 0.5), Arange({4}, 2, -0.25)}, 1);
  stack("3x() axis=0", {A({}), Arange({}, -1, 1), Arange({}, 2, 1)}, 0);
  stack("2x(0,2) axis=1", {A({0, 2}), A({0, 2})}, 1);
  stack("(3,) alone axis=-1", {A({3})}, -1);
  auto split = [&](std::string label, HostTensor x, Ints64 sections, int64_t axis) {
    add(Make("split", std::move(label), {std::move(x)}, {{"sections", sections}, {"axis", axis}}, SplitRef));
  };
  split("(6,2) into 3 axis=0", A({6, 2}), {3}, 0);
  split("(2,6) sizes [1,3,2] axis=-1", A({2, 6}), {1, 3, 2}, -1);
  split("(2,6) sizes [2,0,4] axis=1", A({2, 6}), {2, 0, 4}, 1);
  split("(2,3,4) into 1 axis=1", A({2, 3, 4}), {1}, 1);
  split("(2,0) into 2 axis=1", A({2, 0}), {2}, 1);
  split("(4,3) int64 into 2", Ints({4, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, i64), {2}, 0);

  // take: repeated and negative indices, int32 and int64 indices, zero-size index tensors.
  auto take = [&](std::string label, HostTensor x, HostTensor idx, int64_t axis) {
    add(Make("take", std::move(label), {std::move(x), std::move(idx)}, {{"axis", axis}}, TakeRef));
  };
  take("(5,3) rows [4,0,-1,2,0]", A({5, 3}), Ints({5}, {4, 0, -1, 2, 0}, i64), 0);
  take("(3,4) axis=-1 (2,2) int32 idx", A({3, 4}), Ints({2, 2}, {3, 3, -4, 1}, i32), -1);
  take("(2,3,4) axis=1", A({2, 3, 4}), Ints({3}, {2, 0, 2}, i64), 1);
  take("(6,) scalar index", A({6}), Ints({}, {-2}, i64), 0);
  take("(5,3) no indices", A({5, 3}), Ints({0}, {}, i64), 0);
  take("(4,2) int32 data", Ints({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8}, i32), Ints({3}, {3, 0, 3}, i32), 0);

  // take_grad: repeated indices accumulate.
  auto take_grad = [&](std::string label, HostTensor dy, HostTensor idx, int64_t axis, int64_t dim) {
    OpCase c = Make("take_grad", std::move(label), {std::move(dy), std::move(idx)},
                    {{"axis", axis}, {"dim", dim}}, TakeGradRef);
    c.dtypes = {DType::kFloat32, DType::kFloat64};
    add(std::move(c));
  };
  take_grad("(4,3) rows [4,0,4,-1] dim=5", A({4, 3}), Ints({4}, {4, 0, 4, -1}, i64), 0, 5);
  take_grad("(3,2,2) axis=-1 (2,2) int32 idx dim=4", A({3, 2, 2}), Ints({2, 2}, {1, 1, -1, 0}, i32), -1, 4);
  take_grad("(0,3) no indices dim=2", A({0, 3}), Ints({0}, {}, i64), 0, 2);

  // one_hot: out-of-range and negative indices give all-off rows.
  auto one_hot = [&](std::string label, HostTensor idx, ir::Attrs attrs) {
    OpCase c = Make("one_hot", std::move(label), {std::move(idx)}, std::move(attrs), OneHotRef);
    c.grad = false;
    add(std::move(c));
  };
  one_hot("[0,2,5,-1] depth=4", Ints({4}, {0, 2, 5, -1}, i64), {{"depth", int64_t{4}}});
  one_hot("(2,2) int32 on=5 off=-1 float64", Ints({2, 2}, {1, 0, 2, 1}, i32),
          {{"depth", int64_t{3}}, {"on_value", 5.0}, {"off_value", -1.0}, {"dtype", DType::kFloat64}});
  one_hot("() int32 dtype", Ints({}, {2}, i64), {{"depth", int64_t{3}}, {"dtype", DType::kInt32}});
  one_hot("depth=0", Ints({2}, {0, 1}, i64), {{"depth", int64_t{0}}});
  one_hot("no indices", Ints({0}, {}, i64), {{"depth", int64_t{2}}});
  return cs;
}

}  // namespace kiln::testing

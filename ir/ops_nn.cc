// Neural-network ops backed by library kernels: matmul (batched, NumPy-broadcast batch dims,
// optional transposes), 2-D convolution (NCHW data, OIHW weights, stride/padding/dilation/groups)
// and 2-D max/average pooling (floor mode), with the gradient ops their rules build; batch norm in
// training mode over the channel axis 1 of (N, C) or (N, C, H, W) data (batch_norm_train, whose
// rule builds batch_norm_train_grad).
// Not here: bias (the caller adds it with a broadcast add), ceil-mode pooling, batch norm over other
// layouts or in inference mode (nd::batch_norm composes those), and second-order gradients of
// convolution, pooling and batch norm (their gradient ops are declared not differentiable).
#include <array>
#include <limits>
#include <string>

#include "infer_util.h"

namespace kiln::ir {

namespace {

// ---- attribute helpers --------------------------------------------------------------------------

/// A two-element spatial attribute (a single value stands for both); each entry >= `min`.
std::array<int64_t, 2> Pair(const OpDef& op, const Attrs& a, const char* name, int64_t min) {
  const std::vector<int64_t>& v = a.Ints(name);
  if (v.size() != 1 && v.size() != 2)
    KILN_THROW(ValueError) << op.name << ": attribute '" << name
                           << "' must have 2 values (height, width), found " << AttrValueStr(v);
  std::array<int64_t, 2> r{v[0], v.size() == 2 ? v[1] : v[0]};
  // oneDNN and cuDNN take window sizes as 32-bit ints; a larger value is refused here, not wrapped
  // there (and keeps the window arithmetic of OutSize far from overflow).
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  for (int64_t x : r)
    if (x < min || x > kMax)
      KILN_THROW(ValueError) << op.name << ": attribute '" << name << "' must be in [" << min << ", " << kMax
                             << "], found " << AttrValueStr(v);
  return r;
}

void RequireRank4(const OpDef& op, const Shape& s, const char* what, const char* layout) {
  if (s.rank() != 4)
    KILN_THROW(ShapeError) << op.name << ": expected " << what << " of rank 4 (" << layout
                           << "), found shape " << s.str();
}

void RequireFloatPair(const OpDef& op, std::span<const TensorType> in) {
  for (const TensorType& t : in) RequireFloat(op, t.dtype);
  RequireSameDType(op, in);
}

/// One spatial output size in floor mode; ShapeError when the (dilated) window does not fit.
int64_t OutSize(const OpDef& op, const char* axis, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  // Attributes come from users and files: a huge dilation or padding must not wrap around.
  int64_t extent, padded;
  if (__builtin_mul_overflow(k - 1, d, &extent) || __builtin_add_overflow(extent, 1, &extent) ||
      __builtin_mul_overflow(p, 2, &padded) || __builtin_add_overflow(in, padded, &padded))
    KILN_THROW(ShapeError) << op.name << ": the " << axis << " window (kernel " << k << ", dilation " << d
                           << ") over the input of size " << in << " with padding " << p
                           << " is out of range; expected a dilated window and a padded input below 2^63";
  if (padded < extent)
    KILN_THROW(ShapeError) << op.name << ": the " << axis << " window (" << extent
                           << " with dilation) is larger than the padded input (" << in << " + 2*" << p
                           << "); use a smaller kernel or more padding";
  return (padded - extent) / s + 1;
}

// ---- matmul -------------------------------------------------------------------------------------

Shape MatmulShape(const Shape& a, const Shape& b, bool ta, bool tb) {
  if (a.rank() < 2 || b.rank() < 2)
    KILN_THROW(ShapeError) << "matmul: expected inputs of rank >= 2, found a " << a.str() << " and b "
                           << b.str() << "; reshape a vector to (1, K) or (K, 1)";
  int ra = a.rank(), rb = b.rank();
  int64_t m = ta ? a[ra - 1] : a[ra - 2], ka = ta ? a[ra - 2] : a[ra - 1];
  int64_t kb = tb ? b[rb - 1] : b[rb - 2], n = tb ? b[rb - 2] : b[rb - 1];
  if (ka != kb)
    KILN_THROW(ShapeError) << "matmul: inner dimensions do not match: a " << a.str()
                           << (ta ? " (transposed)" : "") << " has K=" << ka << " but b " << b.str()
                           << (tb ? " (transposed)" : "") << " has K=" << kb
                           << "; check the operand order or the transpose_a/transpose_b flags";
  Shape out;
  int r = std::max(ra, rb);
  for (int i = 0; i < r - 2; ++i) {
    int ia = i - (r - ra), ib = i - (r - rb);
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      KILN_THROW(ShapeError) << "matmul: batch dimensions of a " << a.str() << " and b " << b.str()
                             << " do not broadcast (" << da << " vs " << db << ")";
    out.push_back(da == 1 ? db : da);
  }
  out.push_back(m);
  out.push_back(n);
  return out;
}

void DeclareMatmul(OpTable& t) {
  OpDef d(op::kMatmul);
  d.num_inputs = 2;
  d.fusion = FusionKind::kOutEwiseFusable;
  d.attrs = {{"transpose_a", AttrKind::kBool, false}, {"transpose_b", AttrKind::kBool, false}};
  d.doc = "op(a) @ op(b) over the last two dims, batch dims broadcast; op transposes when asked";
  d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    RequireFloatPair(op, in);
    return One(
        {MatmulShape(in[0].shape, in[1].shape, a.Bool("transpose_a"), a.Bool("transpose_b")), in[0].dtype});
  };
  // With C = op_a(A) op_b(B): dA = dC op_b(B)^T (transposed back when A was), dB likewise; each
  // is summed over the batch dims its input was broadcast along.
  d.grad = [](GradContext& g) {
    Value *a = g.input(0), *b = g.input(1), *dy = g.out_grad();
    bool ta = g.attrs().Bool("transpose_a"), tb = g.attrs().Bool("transpose_b");
    auto mm = [&](Value* x, Value* y, bool tx, bool ty) {
      return g.Op(op::kMatmul, {x, y}, {{"transpose_a", tx}, {"transpose_b", ty}});
    };
    Value *da, *db;
    if (!ta && !tb) {
      da = mm(dy, b, false, true);
      db = mm(a, dy, true, false);
    } else if (!ta && tb) {
      da = mm(dy, b, false, false);
      db = mm(dy, a, true, false);
    } else if (ta && !tb) {
      da = mm(b, dy, false, true);
      db = mm(a, dy, false, false);
    } else {
      da = mm(b, dy, true, true);
      db = mm(dy, a, true, true);
    }
    return std::vector<Value*>{g.SumTo(da, a->shape()), g.SumTo(db, b->shape())};
  };
  t.Add(std::move(d));
}

// ---- conv2d -------------------------------------------------------------------------------------

std::vector<AttrSpec> ConvAttrs() {
  using K = AttrKind;
  return {{"stride", K::kInts, std::vector<int64_t>{1, 1}},
          {"padding", K::kInts, std::vector<int64_t>{0, 0}},
          {"dilation", K::kInts, std::vector<int64_t>{1, 1}},
          {"groups", K::kInt, int64_t{1}}};
}

/// Checks x (N, C, H, W) against w (O, C/groups, KH, KW) and returns y's shape.
Shape ConvShape(const OpDef& op, const Shape& x, const Shape& w, const Attrs& a) {
  RequireRank4(op, x, "input x", "N, C, H, W");
  RequireRank4(op, w, "weight w", "out_channels, in_channels/groups, KH, KW");
  if (w[2] < 1 || w[3] < 1)
    KILN_THROW(ShapeError) << op.name << ": the kernel must be at least 1x1, found weight " << w.str()
                           << " with a " << w[2] << "x" << w[3] << " kernel; give the weight KH, KW >= 1";
  auto s = Pair(op, a, "stride", 1), p = Pair(op, a, "padding", 0), dl = Pair(op, a, "dilation", 1);
  int64_t groups = a.Int("groups");
  if (groups < 1) KILN_THROW(ValueError) << op.name << ": groups must be >= 1, found " << groups;
  if (x[1] % groups != 0 || w[0] % groups != 0)
    KILN_THROW(ShapeError) << op.name << ": groups=" << groups << " must divide both the input channels ("
                           << x[1] << ", x " << x.str() << ") and the output channels (" << w[0] << ", w "
                           << w.str() << ")";
  if (w[1] * groups != x[1])
    KILN_THROW(ShapeError) << op.name << ": weight " << w.str() << " expects " << w[1]
                           << " input channels per "
                           << "group (" << w[1] * groups << " in all with groups=" << groups << ") but x "
                           << x.str() << " has " << x[1] << "; weights are (out, in/groups, KH, KW)";
  return Shape{x[0], w[0], OutSize(op, "height", x[2], w[2], s[0], p[0], dl[0]),
               OutSize(op, "width", x[3], w[3], s[1], p[1], dl[1])};
}

/// A shape-valued attribute (input_shape, weight_shape) of rank 4 with non-negative sizes.
Shape ShapeAttr(const OpDef& op, const Attrs& a, const char* name) {
  const std::vector<int64_t>& v = a.Ints(name);
  bool ok = v.size() == 4;
  for (int64_t d : v) ok &= d >= 0;
  if (!ok)
    KILN_THROW(ValueError) << op.name << ": attribute '" << name << "' must be 4 sizes >= 0, found "
                           << AttrValueStr(v);
  return Shape(v);
}

void RequireGradShape(const OpDef& op, const Shape& dy, const Shape& expected) {
  if (!(dy == expected))
    KILN_THROW(ShapeError) << op.name << ": output gradient has shape " << dy.str() << " but the forward "
                           << "op produces " << expected.str();
}

Attrs WithShape(const Attrs& a, const char* name, const Shape& s) {
  Attrs r = a;
  r.items().emplace_back(name, s.vec());
  return r;
}

void DeclareConv(OpTable& t) {
  {
    OpDef d(op::kConv2d);
    d.num_inputs = 2;
    d.fusion = FusionKind::kOutEwiseFusable;
    d.attrs = ConvAttrs();
    d.doc = "2-D cross-correlation of x (N, C, H, W) with w (O, C/groups, KH, KW); no bias";
    d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
      RequireFloatPair(op, in);
      return One({ConvShape(op, in[0].shape, in[1].shape, a), in[0].dtype});
    };
    d.grad = [](GradContext& g) {
      Value *x = g.input(0), *w = g.input(1), *dy = g.out_grad();
      return std::vector<Value*>{
          g.Op(op::kConv2dGradData, {dy, w}, WithShape(g.attrs(), "input_shape", x->shape())),
          g.Op(op::kConv2dGradWeight, {dy, x}, WithShape(g.attrs(), "weight_shape", w->shape()))};
    };
    t.Add(std::move(d));
  }
  {
    OpDef d(op::kConv2dGradData);
    d.num_inputs = 2;
    d.attrs = ConvAttrs();
    d.attrs.push_back({"input_shape", AttrKind::kInts, std::nullopt});
    d.doc = "gradient of conv2d with respect to x, from (dy, w)";
    d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
      RequireFloatPair(op, in);
      Shape x = ShapeAttr(op, a, "input_shape");
      RequireGradShape(op, in[0].shape, ConvShape(op, x, in[1].shape, a));
      return One({x, in[0].dtype});
    };
    d.differentiable = false; // second-order gradients of conv are not supported
    t.Add(std::move(d));
  }
  {
    OpDef d(op::kConv2dGradWeight);
    d.num_inputs = 2;
    d.attrs = ConvAttrs();
    d.attrs.push_back({"weight_shape", AttrKind::kInts, std::nullopt});
    d.doc = "gradient of conv2d with respect to w, from (dy, x)";
    d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
      RequireFloatPair(op, in);
      Shape w = ShapeAttr(op, a, "weight_shape");
      RequireGradShape(op, in[0].shape, ConvShape(op, in[1].shape, w, a));
      return One({w, in[0].dtype});
    };
    d.differentiable = false; // second-order gradients of conv are not supported
    t.Add(std::move(d));
  }
}

// ---- pooling ------------------------------------------------------------------------------------

std::vector<AttrSpec> PoolAttrs(bool avg) {
  using K = AttrKind;
  std::vector<AttrSpec> r = {{"kernel", K::kInts, std::nullopt},
                             {"stride", K::kInts, std::vector<int64_t>{}},
                             {"padding", K::kInts, std::vector<int64_t>{0, 0}}};
  if (avg) r.push_back({"count_include_pad", K::kBool, true});
  return r;
}

/// Output shape of a pool over x (N, C, H, W); an empty stride means stride = kernel.
Shape PoolShape(const OpDef& op, const Shape& x, const Attrs& a) {
  RequireRank4(op, x, "input x", "N, C, H, W");
  auto k = Pair(op, a, "kernel", 1), p = Pair(op, a, "padding", 0);
  auto s = a.Ints("stride").empty() ? k : Pair(op, a, "stride", 1);
  for (int i = 0; i < 2; ++i)
    if (p[i] > k[i] / 2)  // 2 * p > k, without overflow for a huge p
      KILN_THROW(ValueError) << op.name << ": padding (" << p[0] << ", " << p[1] << ") must be at most half "
                             << "the kernel (" << k[0] << ", " << k[1] << ")";
  return Shape{x[0], x[1], OutSize(op, "height", x[2], k[0], s[0], p[0], 1),
               OutSize(op, "width", x[3], k[1], s[1], p[1], 1)};
}

void DeclarePool(OpTable& t, bool avg) {
  {
    OpDef d(avg ? op::kAvgPool2d : op::kMaxPool2d);
    d.num_inputs = 1;
    d.attrs = PoolAttrs(avg);
    d.doc = avg ? "2-D average pooling of x (N, C, H, W), floor mode"
                : "2-D max pooling of x (N, C, H, W), floor mode; padding never wins";
    d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
      RequireFloat(op, in[0].dtype);
      return One({PoolShape(op, in[0].shape, a), in[0].dtype});
    };
    if (avg)
      d.grad = [](GradContext& g) {
        return std::vector<Value*>{g.Op(op::kAvgPool2dGrad, {g.out_grad()},
                                        WithShape(g.attrs(), "input_shape", g.input(0)->shape()))};
      };
    else
      d.grad = [](GradContext& g) {
        return std::vector<Value*>{g.Op(op::kMaxPool2dGrad, {g.out_grad(), g.input(0)}, g.attrs())};
      };
    t.Add(std::move(d));
  }
  OpDef d(avg ? op::kAvgPool2dGrad : op::kMaxPool2dGrad);
  d.attrs = PoolAttrs(avg);
  if (avg) {
    d.num_inputs = 1;
    d.attrs.push_back({"input_shape", AttrKind::kInts, std::nullopt});
    d.doc = "gradient of avg_pool2d with respect to x, from dy";
    d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
      RequireFloat(op, in[0].dtype);
      Shape x = ShapeAttr(op, a, "input_shape");
      RequireGradShape(op, in[0].shape, PoolShape(op, x, a));
      return One({x, in[0].dtype});
    };
  } else {
    d.num_inputs = 2;
    d.doc = "gradient of max_pool2d with respect to x, from (dy, x); ties go to the first maximum";
    d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
      RequireFloatPair(op, in);
      RequireGradShape(op, in[0].shape, PoolShape(op, in[1].shape, a));
      return One(in[1]);
    };
  }
  d.differentiable = false; // second-order gradients of pooling are not supported
  t.Add(std::move(d));
}


// ---- batch norm (training mode) -----------------------------------------------------------------

std::vector<AttrSpec> BatchNormAttrs() {
  return {{"axis", AttrKind::kInt, int64_t{1}}, {"eps", AttrKind::kFloat, 1e-5}};
}

/// Checks x (N, C) or (N, C, H, W) normalized over axis 1 with eps >= 0; returns C.
int64_t BatchNormChannels(const OpDef& op, const Shape& x, const Attrs& a) {
  if (x.rank() != 2 && x.rank() != 4)
    KILN_THROW(ShapeError) << op.name << ": expected x of rank 2 (N, C) or 4 (N, C, H, W), found shape "
                           << x.str() << "; nd.batch_norm normalizes other ranks with a composite";
  int axis = NormalizeAxis(a.Int("axis"), x.rank(), op.name.c_str());
  if (axis != 1)
    KILN_THROW(ValueError) << op.name << ": the channel axis must be 1 (NCHW), found axis " << a.Int("axis")
                           << " of x " << x.str() << "; nd.batch_norm normalizes other axes with a composite";
  if (x.numel() == 0 && x[1] != 0)
    KILN_THROW(ShapeError) << op.name << ": x " << x.str()
                           << " has no values per channel to take statistics of; give it a non-empty batch";
  double eps = a.Float("eps");
  if (!(eps >= 0))
    KILN_THROW(ValueError) << op.name << ": eps must be >= 0, found " << eps;
  return x[1];
}

void RequireChannelVector(const OpDef& op, const TensorType& t, const char* what, int64_t c, const Shape& x) {
  if (!(t.shape == Shape{c}))
    KILN_THROW(ShapeError) << op.name << ": " << what << " must have shape (" << c << "), one value per channel "
                           << "of x " << x.str() << ", found " << t.shape.str();
}

void DeclareBatchNorm(OpTable& t) {
  {
    OpDef d(op::kBatchNormTrain);
    d.num_inputs = 3;
    d.num_outputs = 3;
    d.attrs = BatchNormAttrs();
    d.doc = "batch norm with the batch's statistics: (x, gamma, beta) -> (y, mean, inv_std) per channel of axis 1";
    d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
      RequireFloat(op, in[0].dtype);
      RequireSameDType(op, in);
      const Shape& x = in[0].shape;
      int64_t c = BatchNormChannels(op, x, a);
      RequireChannelVector(op, in[1], "gamma", c, x);
      RequireChannelVector(op, in[2], "beta", c, x);
      TensorType stat{Shape{c}, in[0].dtype};
      return std::vector<TensorType>{in[0], stat, stat};
    };
    // batch_norm_train_grad gives the gradient through y; gradients reaching the statistics (when
    // a caller differentiates them) add d(mean)/dx = 1/M and d(inv_std)/dx = -inv_std^3 (x - mean)/M.
    d.grad = [](GradContext& g) {
      Value *x = g.input(0), *mean = g.output(1), *inv = g.output(2);
      std::vector<Value*> r =
          g.OpN(op::kBatchNormTrainGrad, {x, g.input(1), g.out_grad(0), mean, inv}, g.attrs());
      const Shape& xs = x->shape();
      Shape bshape(std::vector<int64_t>(xs.rank(), 1));
      bshape[1] = xs[1];
      const double m = static_cast<double>(xs.numel() / std::max<int64_t>(xs[1], 1));
      const DType dt = x->dtype();
      if (g.has_out_grad(1)) r[0] = g.Add(r[0], g.Mul(g.Reshape(g.out_grad(1), bshape), g.Scalar(1.0 / m, dt)));
      if (g.has_out_grad(2)) {
        Value* k = g.Mul(g.Mul(g.out_grad(2), g.Mul(inv, g.Mul(inv, inv))), g.Scalar(-1.0 / m, dt));
        r[0] = g.Add(r[0], g.Mul(g.Reshape(k, bshape), g.Sub(x, g.Reshape(mean, bshape))));
      }
      return std::vector<Value*>{r[0], r[1], r[2]};
    };
    t.Add(std::move(d));
  }
  OpDef d(op::kBatchNormTrainGrad);
  d.num_inputs = 5;
  d.num_outputs = 3;
  d.attrs = BatchNormAttrs();
  d.doc = "gradient of batch_norm_train's y: (x, gamma, dy, mean, inv_std) -> (dx, dgamma, dbeta)";
  d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs& a) {
    RequireFloat(op, in[0].dtype);
    RequireSameDType(op, in);
    const Shape& x = in[0].shape;
    int64_t c = BatchNormChannels(op, x, a);
    RequireChannelVector(op, in[1], "gamma", c, x);
    RequireGradShape(op, in[2].shape, x);
    RequireChannelVector(op, in[3], "mean", c, x);
    RequireChannelVector(op, in[4], "inv_std", c, x);
    TensorType param{Shape{c}, in[0].dtype};
    return std::vector<TensorType>{in[0], param, param};
  };
  d.differentiable = false; // second-order gradients of batch norm are not supported
  t.Add(std::move(d));
}

} // namespace

void RegisterNNOps(OpTable& t) {
  DeclareMatmul(t);
  DeclareConv(t);
  DeclarePool(t, /*avg=*/false);
  DeclarePool(t, /*avg=*/true);
  DeclareBatchNorm(t);
}

} // namespace kiln::ir

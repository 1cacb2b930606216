// Elementwise ops: unary math, binary arithmetic and comparisons with NumPy broadcasting,
// where, cast, copy and stop_gradient. Binary ops take equal dtypes (the frontend promotes).
#include "infer_util.h"

namespace kiln::ir {

namespace {

enum class UnaryDomain { kFloatOnly, kNumeric, kAny };

void DeclareUnary(OpTable& t, const char* name, UnaryFn fn, UnaryDomain domain, GradFn grad,
                  const char* doc) {
  OpDef d;
  d.name = name;
  d.num_inputs = 1;
  d.fusion = FusionKind::kElementwise;
  d.unary_fn = fn;
  d.doc = doc;
  d.infer = [domain, fn](const OpDef& op, std::span<const TensorType> in, const Attrs&) {
    DType t = in[0].dtype;
    if (domain == UnaryDomain::kFloatOnly) RequireFloat(op, t);
    if (domain == UnaryDomain::kNumeric && t == DType::kBool)
      KILN_THROW(DTypeError) << op.name << ": not defined for bool tensors; cast to a number first";
    return One({in[0].shape, ReturnsBool(fn) ? DType::kBool : t});
  };
  d.differentiable = static_cast<bool>(grad);
  d.grad = std::move(grad);
  t.Add(std::move(d));
}

void DeclareBinary(OpTable& t, const char* name, BinaryFn fn, GradFn grad, const char* doc) {
  OpDef d;
  d.name = name;
  d.num_inputs = 2;
  d.fusion = FusionKind::kBroadcast;
  d.binary_fn = fn;
  d.doc = doc;
  d.infer = [fn](const OpDef& op, std::span<const TensorType> in, const Attrs&) {
    RequireSameDType(op, in);
    if (!ReturnsBool(fn) && in[0].dtype == DType::kBool && fn != BinaryFn::kMaximum &&
        fn != BinaryFn::kMinimum && fn != BinaryFn::kMul && fn != BinaryFn::kAdd)
      KILN_THROW(DTypeError) << op.name << ": not defined for bool tensors; cast to a number first";
    return One({BroadcastShapes(in[0].shape, in[1].shape, op.name.c_str()),
                ReturnsBool(fn) ? DType::kBool : in[0].dtype});
  };
  d.differentiable = static_cast<bool>(grad);
  d.grad = std::move(grad);
  t.Add(std::move(d));
}

// Shorthands for gradient rules.
Value* S(GradContext& g, double v) { return g.Scalar(v, g.input(0)->dtype()); }
Value* Mask(GradContext& g, const char* cmp, Value* a, Value* b) {
  return g.Cast(g.Op(cmp, {a, b}), g.out_grad()->dtype());
}

}  // namespace

void RegisterElementwiseOps(OpTable& t) {
  using D = UnaryDomain;
  using F = UnaryFn;
  DeclareUnary(t, "neg", F::kNeg, D::kNumeric, [](GradContext& g) {
    return std::vector<Value*>{g.Neg(g.out_grad())};
  }, "-x");
  DeclareUnary(t, "abs", F::kAbs, D::kNumeric, [](GradContext& g) {
    return std::vector<Value*>{g.Mul(g.out_grad(), g.Op("sign", {g.input(0)}))};
  }, "|x|");
  DeclareUnary(t, "sign", F::kSign, D::kNumeric, nullptr, "-1, 0 or 1");
  DeclareUnary(t, "square", F::kSquare, D::kNumeric, [](GradContext& g) {
    return std::vector<Value*>{g.Mul(g.out_grad(), g.Mul(S(g, 2), g.input(0)))};
  }, "x * x");
  DeclareUnary(t, "sqrt", F::kSqrt, D::kFloatOnly, [](GradContext& g) {
    return std::vector<Value*>{g.Div(g.Mul(g.out_grad(), S(g, 0.5)), g.output())};
  }, "square root");
  DeclareUnary(t, "rsqrt", F::kRsqrt, D::kFloatOnly, [](GradContext& g) {
    Value* y = g.output();
    return std::vector<Value*>{g.Mul(g.Mul(g.out_grad(), S(g, -0.5)), g.Mul(y, g.Mul(y, y)))};
  }, "1 / sqrt(x)");
  DeclareUnary(t, "reciprocal", F::kReciprocal, D::kFloatOnly, [](GradContext& g) {
    return std::vector<Value*>{g.Neg(g.Mul(g.out_grad(), g.Op("square", {g.output()})))};
  }, "1 / x");
  DeclareUnary(t, "exp", F::kExp, D::kFloatOnly, [](GradContext& g) {
    return std::vector<Value*>{g.Mul(g.out_grad(), g.output())};
  }, "e^x");
  DeclareUnary(t, "log", F::kLog, D::kFloatOnly, [](GradContext& g) {
    return std::vector<Value*>{g.Div(g.out_grad(), g.input(0))};
  }, "natural logarithm");
  DeclareUnary(t, "log1p", F::kLog1p, D::kFloatOnly, [](GradContext& g) {
    return std::vector<Value*>{g.Div(g.out_grad(), g.Add(g.input(0), S(g, 1)))};
  }, "log(1 + x)");
  DeclareUnary(t, "expm1", F::kExpm1, D::kFloatOnly, [](GradContext& g) {
    return std::vector<Value*>{g.Mul(g.out_grad(), g.Add(g.output(), S(g, 1)))};
  }, "e^x - 1");
  DeclareUnary(t, "sin", F::kSin, D::kFloatOnly, [](GradContext& g) {
    return std::vector<Value*>{g.Mul(g.out_grad(), g.Op("cos", {g.input(0)}))};
  }, "sine");
  DeclareUnary(t, "cos", F::kCos, D::kFloatOnly, [](GradContext& g) {
    return std::vector<Value*>{g.Neg(g.Mul(g.out_grad(), g.Op("sin", {g.input(0)})))};
  }, "cosine");
  DeclareUnary(t, "tanh", F::kTanh, D::kFloatOnly, [](GradContext& g) {
    Value* y = g.output();
    return std::vector<Value*>{g.Mul(g.out_grad(), g.Sub(S(g, 1), g.Mul(y, y)))};
  }, "hyperbolic tangent");
  DeclareUnary(t, "erf", F::kErf, D::kFloatOnly, [](GradContext& g) {
    Value* x = g.input(0);
    Value* e = g.Op("exp", {g.Neg(g.Mul(x, x))});
    return std::vector<Value*>{g.Mul(g.out_grad(), g.Mul(S(g, 1.1283791670955126), e))};
  }, "error function");
  // From the output: relu(x) > 0 exactly where x > 0 (NaN and -0 included), and the output is
  // what the next layer reads anyway, so training keeps no pre-activation and conv/matmul + bias
  // + relu stays one fused group.
  DeclareUnary(t, "relu", F::kRelu, D::kNumeric, [](GradContext& g) {
    return std::vector<Value*>{g.Mul(g.out_grad(), Mask(g, "greater", g.output(), S(g, 0)))};
  }, "max(x, 0)");
  DeclareUnary(t, "floor", F::kFloor, D::kNumeric, nullptr, "round down");
  DeclareUnary(t, "ceil", F::kCeil, D::kNumeric, nullptr, "round up");
  DeclareUnary(t, "round", F::kRound, D::kNumeric, nullptr, "round half away from zero");
  DeclareUnary(t, "logical_not", F::kLogicalNot, D::kAny, nullptr, "x == 0, as bool");
  DeclareUnary(t, "copy", F::kIdentity, D::kAny, [](GradContext& g) {
    return std::vector<Value*>{g.out_grad()};
  }, "a contiguous copy of x");

  using B = BinaryFn;
  DeclareBinary(t, "add", B::kAdd, [](GradContext& g) {
    Value* dy = g.out_grad();
    return std::vector<Value*>{g.SumTo(dy, g.input(0)->shape()), g.SumTo(dy, g.input(1)->shape())};
  }, "a + b");
  DeclareBinary(t, "sub", B::kSub, [](GradContext& g) {
    Value* dy = g.out_grad();
    return std::vector<Value*>{g.SumTo(dy, g.input(0)->shape()),
                               g.SumTo(g.Neg(dy), g.input(1)->shape())};
  }, "a - b");
  DeclareBinary(t, "mul", B::kMul, [](GradContext& g) {
    Value* dy = g.out_grad();
    return std::vector<Value*>{g.SumTo(g.Mul(dy, g.input(1)), g.input(0)->shape()),
                               g.SumTo(g.Mul(dy, g.input(0)), g.input(1)->shape())};
  }, "a * b");
  DeclareBinary(t, "div", B::kDiv, [](GradContext& g) {
    Value* dy = g.out_grad();
    Value* b = g.input(1);
    return std::vector<Value*>{g.SumTo(g.Div(dy, b), g.input(0)->shape()),
                               g.SumTo(g.Neg(g.Div(g.Mul(dy, g.output()), b)), b->shape())};
  }, "a / b (integer division truncates toward zero)");
  DeclareBinary(t, "pow", B::kPow, [](GradContext& g) {
    Value *a = g.input(0), *b = g.input(1), *dy = g.out_grad();
    Value* da = g.Mul(dy, g.Mul(b, g.Op("pow", {a, g.Sub(b, S(g, 1))})));
    Value* db = g.Mul(dy, g.Mul(g.output(), g.Op("log", {a})));
    return std::vector<Value*>{g.SumTo(da, a->shape()), g.SumTo(db, b->shape())};
  }, "a ** b");
  DeclareBinary(t, "maximum", B::kMaximum, [](GradContext& g) {
    Value *a = g.input(0), *b = g.input(1), *dy = g.out_grad();
    return std::vector<Value*>{g.SumTo(g.Mul(dy, Mask(g, "greater_equal", a, b)), a->shape()),
                               g.SumTo(g.Mul(dy, Mask(g, "less", a, b)), b->shape())};
  }, "elementwise max (ties send the gradient to a)");
  DeclareBinary(t, "minimum", B::kMinimum, [](GradContext& g) {
    Value *a = g.input(0), *b = g.input(1), *dy = g.out_grad();
    return std::vector<Value*>{g.SumTo(g.Mul(dy, Mask(g, "less_equal", a, b)), a->shape()),
                               g.SumTo(g.Mul(dy, Mask(g, "greater", a, b)), b->shape())};
  }, "elementwise min (ties send the gradient to a)");
  DeclareBinary(t, "equal", B::kEqual, nullptr, "a == b");
  DeclareBinary(t, "not_equal", B::kNotEqual, nullptr, "a != b");
  DeclareBinary(t, "less", B::kLess, nullptr, "a < b");
  DeclareBinary(t, "less_equal", B::kLessEqual, nullptr, "a <= b");
  DeclareBinary(t, "greater", B::kGreater, nullptr, "a > b");
  DeclareBinary(t, "greater_equal", B::kGreaterEqual, nullptr, "a >= b");

  {
    OpDef d;
    d.name = "where";
    d.num_inputs = 3;
    d.fusion = FusionKind::kBroadcast;
    d.doc = "cond ? a : b, broadcasting all three";
    d.infer = [](const OpDef& op, std::span<const TensorType> in, const Attrs&) {
      if (in[1].dtype != in[2].dtype)
        KILN_THROW(DTypeError) << "where: a and b must have the same dtype, found "
                               << DTypeName(in[1].dtype) << " and " << DTypeName(in[2].dtype);
      Shape s = BroadcastShapes(in[0].shape, in[1].shape, "where");
      return One({BroadcastShapes(s, in[2].shape, "where"), in[1].dtype});
    };
    d.grad = [](GradContext& g) {
      Value *c = g.input(0), *dy = g.out_grad();
      Value* z = g.Scalar(0, dy->dtype());
      return std::vector<Value*>{nullptr, g.SumTo(g.Op("where", {c, dy, z}), g.input(1)->shape()),
                                 g.SumTo(g.Op("where", {c, z, dy}), g.input(2)->shape())};
    };
    t.Add(std::move(d));
  }
  {
    OpDef d;
    d.name = "cast";
    d.num_inputs = 1;
    d.fusion = FusionKind::kElementwise;
    d.attrs = {{"dtype", AttrKind::kDType, std::nullopt}};
    d.doc = "convert to another dtype (float to int truncates toward zero)";
    d.infer = [](const OpDef&, std::span<const TensorType> in, const Attrs& a) {
      return One({in[0].shape, a.Type("dtype")});
    };
    d.grad = [](GradContext& g) {
      DType from = g.input(0)->dtype();
      if (!IsFloat(from) || !IsFloat(g.output()->dtype())) return std::vector<Value*>{nullptr};
      return std::vector<Value*>{g.Cast(g.out_grad(), from)};
    };
    t.Add(std::move(d));
  }
  {
    OpDef d;
    d.name = "stop_gradient";
    d.num_inputs = 1;
    d.fusion = FusionKind::kElementwise;
    d.unary_fn = UnaryFn::kIdentity;
    d.doc = "x, with no gradient flowing back";
    d.infer = [](const OpDef&, std::span<const TensorType> in, const Attrs&) { return One(in[0]); };
    d.differentiable = false;
    t.Add(std::move(d));
  }
}

}  // namespace kiln::ir

// Elementwise ops: unary math, binary arithmetic and comparisons with NumPy broadcasting,
// where, cast, copy and stop_gradient. Binary ops take equal dtypes (the frontend promotes).
#include "infer_util.h"

namespace kiln::ir {

namespace {

void DeclareUnary(OpTable& t, OpId id, UnaryDomain domain, const char* doc, GradFn grad) {
  OpDef d(id);
  d.num_inputs = 1;
  d.fusion = FusionKind::kElementwise;
  d.doc = doc;
  d.infer = [domain, fn = *d.unary_fn](const OpDef& op, std::span<const TensorType> in, const Attrs&) {
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

void DeclareBinary(OpTable& t, OpId id, const char* doc, GradFn grad) {
  OpDef d(id);
  d.num_inputs = 2;
  d.fusion = FusionKind::kBroadcast;
  d.doc = doc;
  d.infer = [fn = *d.binary_fn](const OpDef& op, std::span<const TensorType> in, const Attrs&) {
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
Value* Mask(GradContext& g, OpId cmp, Value* a, Value* b) {
  return g.Cast(g.Op(cmp, {a, b}), g.out_grad()->dtype());
}

// The gradient of each unary and binary op of the op list (kiln/runtime/op_list.h).
GradFn UnaryGrad(OpId id) {
  switch (id) {
    case op::kNeg: return [](GradContext& g) {
        return std::vector<Value*>{g.Neg(g.out_grad())};
      };
    case op::kAbs: return [](GradContext& g) {
        return std::vector<Value*>{g.Mul(g.out_grad(), g.Op(op::kSign, {g.input(0)}))};
      };
    case op::kSquare: return [](GradContext& g) {
        return std::vector<Value*>{g.Mul(g.out_grad(), g.Mul(S(g, 2), g.input(0)))};
      };
    case op::kSqrt: return [](GradContext& g) {
        return std::vector<Value*>{g.Div(g.Mul(g.out_grad(), S(g, 0.5)), g.output())};
      };
    case op::kRsqrt: return [](GradContext& g) {
        Value* y = g.output();
        return std::vector<Value*>{g.Mul(g.Mul(g.out_grad(), S(g, -0.5)), g.Mul(y, g.Mul(y, y)))};
      };
    case op::kReciprocal: return [](GradContext& g) {
        return std::vector<Value*>{g.Neg(g.Mul(g.out_grad(), g.Op(op::kSquare, {g.output()})))};
      };
    case op::kExp: return [](GradContext& g) {
        return std::vector<Value*>{g.Mul(g.out_grad(), g.output())};
      };
    case op::kLog: return [](GradContext& g) {
        return std::vector<Value*>{g.Div(g.out_grad(), g.input(0))};
      };
    case op::kLog1p: return [](GradContext& g) {
        return std::vector<Value*>{g.Div(g.out_grad(), g.Add(g.input(0), S(g, 1)))};
      };
    case op::kExpm1: return [](GradContext& g) {
        return std::vector<Value*>{g.Mul(g.out_grad(), g.Add(g.output(), S(g, 1)))};
      };
    case op::kSin: return [](GradContext& g) {
        return std::vector<Value*>{g.Mul(g.out_grad(), g.Op(op::kCos, {g.input(0)}))};
      };
    case op::kCos: return [](GradContext& g) {
        return std::vector<Value*>{g.Neg(g.Mul(g.out_grad(), g.Op(op::kSin, {g.input(0)})))};
      };
    case op::kTanh: return [](GradContext& g) {
        Value* y = g.output();
        return std::vector<Value*>{g.Mul(g.out_grad(), g.Sub(S(g, 1), g.Mul(y, y)))};
      };
    case op::kErf: return [](GradContext& g) {
        Value* x = g.input(0);
        Value* e = g.Op(op::kExp, {g.Neg(g.Mul(x, x))});
        return std::vector<Value*>{g.Mul(g.out_grad(), g.Mul(S(g, 1.1283791670955126), e))};
      };
    // From the output: relu(x) > 0 exactly where x > 0 (NaN and -0 included), and the output is
    // what the next layer reads anyway, so training keeps no pre-activation and conv/matmul + bias
    // + relu stays one fused group. The mask is sign(y): the output is never negative nor NaN, so
    // it is 1 where y > 0 and 0 elsewhere, as (y > 0) cast to the gradient's type is, but it stays
    // a float computation that fuses with the product (no boolean array in between).
    case op::kRelu: return [](GradContext& g) {
        return std::vector<Value*>{g.Mul(g.out_grad(), g.Op(op::kSign, {g.output()}))};
      };
    // sigmoid(x) = 1 - e^-softplus(x), from the output like relu: -expm1(-y) stays accurate
    // where sigmoid is tiny (very negative x) and is 1 for large x.
    case op::kSoftplus: return [](GradContext& g) {
        Value* sigmoid = g.Neg(g.Op(op::kExpm1, {g.Neg(g.output())}));
        return std::vector<Value*>{g.Mul(g.out_grad(), sigmoid)};
      };
    // tanh(sp) + x sech^2(sp) sigmoid(x) with sp = softplus(x) and sigmoid(x) = 1 - e^-sp.
    case op::kMish: return [](GradContext& g) {
        Value* x = g.input(0);
        Value* sp = g.Op(op::kSoftplus, {x});
        Value* t = g.Op(op::kTanh, {sp});
        Value* sigmoid = g.Neg(g.Op(op::kExpm1, {g.Neg(sp)}));
        Value* d = g.Add(t, g.Mul(g.Mul(x, g.Sub(S(g, 1), g.Mul(t, t))), sigmoid));
        return std::vector<Value*>{g.Mul(g.out_grad(), d)};
      };
    default: return nullptr;  // not differentiable
  }
}

GradFn BinaryGrad(OpId id) {
  switch (id) {
    case op::kAdd: return [](GradContext& g) {
        Value* dy = g.out_grad();
        return std::vector<Value*>{g.SumTo(dy, g.input(0)->shape()), g.SumTo(dy, g.input(1)->shape())};
      };
    case op::kSub: return [](GradContext& g) {
        Value* dy = g.out_grad();
        return std::vector<Value*>{g.SumTo(dy, g.input(0)->shape()),
                                   g.SumTo(g.Neg(dy), g.input(1)->shape())};
      };
    case op::kMul: return [](GradContext& g) {
        Value* dy = g.out_grad();
        return std::vector<Value*>{g.SumTo(g.Mul(dy, g.input(1)), g.input(0)->shape()),
                                   g.SumTo(g.Mul(dy, g.input(0)), g.input(1)->shape())};
      };
    case op::kDiv: return [](GradContext& g) {
        Value* dy = g.out_grad();
        Value* b = g.input(1);
        return std::vector<Value*>{g.SumTo(g.Div(dy, b), g.input(0)->shape()),
                                   g.SumTo(g.Neg(g.Div(g.Mul(dy, g.output()), b)), b->shape())};
      };
    case op::kPow: return [](GradContext& g) {
        Value *a = g.input(0), *b = g.input(1), *dy = g.out_grad();
        Value* da = g.Mul(dy, g.Mul(b, g.Op(op::kPow, {a, g.Sub(b, S(g, 1))})));
        Value* db = g.Mul(dy, g.Mul(g.output(), g.Op(op::kLog, {a})));
        return std::vector<Value*>{g.SumTo(da, a->shape()), g.SumTo(db, b->shape())};
      };
    case op::kMaximum: return [](GradContext& g) {
        Value *a = g.input(0), *b = g.input(1), *dy = g.out_grad();
        return std::vector<Value*>{g.SumTo(g.Mul(dy, Mask(g, op::kGreaterEqual, a, b)), a->shape()),
                                   g.SumTo(g.Mul(dy, Mask(g, op::kLess, a, b)), b->shape())};
      };
    case op::kMinimum: return [](GradContext& g) {
        Value *a = g.input(0), *b = g.input(1), *dy = g.out_grad();
        return std::vector<Value*>{g.SumTo(g.Mul(dy, Mask(g, op::kLessEqual, a, b)), a->shape()),
                                   g.SumTo(g.Mul(dy, Mask(g, op::kGreater, a, b)), b->shape())};
      };
    default: return nullptr;  // not differentiable
  }
}

}  // namespace

void RegisterElementwiseOps(OpTable& t) {
#define KILN_X(Id, name, nd_name, domain, doc) DeclareUnary(t, op::Id, UnaryDomain::k##domain, doc, UnaryGrad(op::Id));
  KILN_UNARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Id, name, nd_name, doc) DeclareBinary(t, op::Id, doc, BinaryGrad(op::Id));
  KILN_BINARY_OPS(KILN_X)
#undef KILN_X
  DeclareUnary(t, op::kCopy, UnaryDomain::kAny, "a contiguous copy of x", [](GradContext& g) {
    return std::vector<Value*>{g.out_grad()};
  });

  {
    OpDef d(op::kWhere);
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
      return std::vector<Value*>{nullptr, g.SumTo(g.Op(op::kWhere, {c, dy, z}), g.input(1)->shape()),
                                 g.SumTo(g.Op(op::kWhere, {c, z, dy}), g.input(2)->shape())};
    };
    t.Add(std::move(d));
  }
  {
    OpDef d(op::kCast);
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
    OpDef d(op::kStopGradient);
    d.num_inputs = 1;
    d.fusion = FusionKind::kElementwise;
    d.doc = "x, with no gradient flowing back";
    d.infer = [](const OpDef&, std::span<const TensorType> in, const Attrs&) { return One(in[0]); };
    d.differentiable = false;
    t.Add(std::move(d));
  }
}

}  // namespace kiln::ir

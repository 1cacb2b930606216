// Conformance cases of the elementwise ops (ir/ops_elementwise.cc), each against a plain std::
// double reference: unary math on inputs away from kinks and poles, special values (inf, NaN),
// binary arithmetic with NumPy broadcasting (rank-0 and empty operands included), comparisons
// with ties, where, cast, copy and stop_gradient, plus integer and bool variants. Also the two
// behaviours a table row cannot express: integer division by zero raising at the sync point, and
// stop_gradient blocking the gradient.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "conformance.h"
#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"

namespace kiln::testing {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
const std::vector<DType> kFloats = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
const std::vector<DType> kIntTypes = {DType::kInt32, DType::kInt64};

using Fn1 = std::function<double(double)>;
using FnN = std::function<double(const std::vector<double>&)>;

HostTensor Floats(const Shape& s, std::vector<double> v) { return Ints(s, std::move(v), DType::kFloat32); }

/// Pseudo-random values in (-2.5, -0.5] and [0.5, 2.5): safe divisors.
HostTensor AwayFromZero(const Shape& s, uint64_t seed) {
  HostTensor h = Uniform(s, -2, 2, seed);
  for (double& v : h.data) v += v < 0 ? -0.5 : 0.5;
  return h;
}

/// The values of `h` broadcast (NumPy rules) to `out`, row-major.
std::vector<double> BroadcastTo(const HostTensor& h, const Shape& out) {
  std::vector<double> r(static_cast<size_t>(out.numel()));
  const int lead = out.rank() - h.shape.rank();
  Strides st = h.shape.ContiguousStrides();
  for (int64_t i = 0; i < out.numel(); ++i) {
    int64_t rem = i, src = 0;
    for (int d = out.rank() - 1; d >= 0; --d) {
      int64_t idx = rem % out[d];
      rem /= out[d];
      int hd = d - lead;
      if (hd >= 0 && h.shape[hd] != 1) src += idx * st[hd];
    }
    r[static_cast<size_t>(i)] = h.data[static_cast<size_t>(src)];
  }
  return r;
}

/// Reference of an elementwise op over broadcast inputs.
Reference Map(FnN f) {
  return [f](const std::vector<HostTensor>& in, const ir::Attrs&) {
    Shape s = in[0].shape;
    for (size_t k = 1; k < in.size(); ++k) s = BroadcastShapes(s, in[k].shape, "reference");
    std::vector<std::vector<double>> b;
    for (const HostTensor& h : in) b.push_back(BroadcastTo(h, s));
    HostTensor out{s, std::vector<double>(static_cast<size_t>(s.numel())), DType::kFloat64};
    std::vector<double> args(in.size());
    for (size_t i = 0; i < out.data.size(); ++i) {
      for (size_t k = 0; k < in.size(); ++k) args[k] = b[k][i];
      out.data[i] = f(args);
    }
    return std::vector<HostTensor>{out};
  };
}

Reference Map1(Fn1 f) {
  return Map([f](const std::vector<double>& a) { return f(a[0]); });
}
Reference Map2(std::function<double(double, double)> f) {
  return Map([f](const std::vector<double>& a) { return f(a[0], a[1]); });
}

OpCase Case(std::string label, const char* op, std::vector<HostTensor> in, Reference ref) {
  OpCase c;
  c.label = std::move(label);
  c.op = op;
  c.inputs = std::move(in);
  c.reference = std::move(ref);
  c.dtypes = kFloats;
  return c;
}

std::string Shapes(const std::vector<HostTensor>& in) {
  std::string s;
  for (const HostTensor& h : in) {
    if (!s.empty()) s += ' ';
    s += h.shape.str();
  }
  return s;
}

// ---- references ----------------------------------------------------------------------------------

double Sign(double x) { return static_cast<double>((0 < x) - (x < 0)); }
double Relu(double x) { return x > 0 ? x : 0; }
double Max(double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b); }
double Min(double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b); }
double IntDiv(double a, double b) { return std::trunc(a / b); }
double IntPow(double a, double b) {
  if (b < 0) return a == 1 ? 1 : a == -1 ? (std::fmod(b, 2) != 0 ? -1 : 1) : 0;
  return std::pow(a, b);
}

// torch.nn.functional.softplus (beta 1, threshold 20): x above the threshold, else log1p(e^x).
double Softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

// Mish (Misra 2019) as torch.nn.functional.mish computes it.
double Mish(double x) { return x * std::tanh(Softplus(x)); }

struct UnarySpec {
  const char* op;
  Fn1 f;
  double lo, hi;  // input range away from kinks and poles
};

struct BinarySpec {
  const char* op;
  std::function<double(double, double)> f;
};

void AddUnary(std::vector<OpCase>& cs) {
  const std::vector<UnarySpec> specs = {
      {"neg", [](double x) { return -x; }, -2, 2},
      {"square", [](double x) { return x * x; }, -2, 2},
      {"sqrt", [](double x) { return std::sqrt(x); }, 0.1, 4},
      {"rsqrt", [](double x) { return 1 / std::sqrt(x); }, 0.2, 4},
      {"reciprocal", [](double x) { return 1 / x; }, 0.5, 3},
      {"exp", [](double x) { return std::exp(x); }, -3, 3},
      {"log", [](double x) { return std::log(x); }, 0.1, 5},
      {"log1p", [](double x) { return std::log1p(x); }, -0.5, 3},
      {"expm1", [](double x) { return std::expm1(x); }, -2, 2},
      {"sin", [](double x) { return std::sin(x); }, -4, 4},
      {"cos", [](double x) { return std::cos(x); }, -4, 4},
      {"tanh", [](double x) { return std::tanh(x); }, -3, 3},
      {"erf", [](double x) { return std::erf(x); }, -2, 2},
      {"softplus", Softplus, -4, 4},
      {"mish", Mish, -4, 4},
  };
  uint64_t seed = 100;
  for (const UnarySpec& s : specs) {
    cs.push_back(Case(std::string(s.op) + " (3, 4)", s.op, {Uniform({3, 4}, s.lo, s.hi, seed++)}, Map1(s.f)));
    cs.push_back(Case(std::string(s.op) + " rank-0", s.op, {Uniform({}, s.lo, s.hi, seed++)}, Map1(s.f)));
  }
  // Negative arguments where the function is defined there.
  cs.push_back(Case("reciprocal negative", "reciprocal", {AwayFromZero({2, 3}, 7)},
                    Map1([](double x) { return 1 / x; })));
  cs.push_back(Case("expm1 near zero", "expm1", {Uniform({5}, -1e-3, 1e-3, 8)},
                    Map1([](double x) { return std::expm1(x); })));
  cs.push_back(Case("log1p near zero", "log1p", {Uniform({5}, -1e-3, 1e-3, 9)},
                    Map1([](double x) { return std::log1p(x); })));

  // Kinks: inputs kept away from 0.
  const HostTensor off_zero = Floats({2, 3}, {-2.5, -1.25, -0.3, 0.4, 1.1, 2.2});
  cs.push_back(Case("abs (2, 3)", "abs", {off_zero}, Map1([](double x) { return std::fabs(x); })));
  cs.push_back(Case("relu (2, 3)", "relu", {off_zero}, Map1(Relu)));
  OpCase sign = Case("sign with zeros", "sign", {Floats({2, 3}, {-2.5, -0.5, 0, -0.0, 0.5, 3})}, Map1(Sign));
  cs.push_back(sign);
  // Rounding at halves: round is half away from zero.
  const HostTensor halves = Floats({3, 3}, {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -0.7, 2});
  cs.push_back(Case("floor (3, 3)", "floor", {halves}, Map1([](double x) { return std::floor(x); })));
  cs.push_back(Case("ceil (3, 3)", "ceil", {halves}, Map1([](double x) { return std::ceil(x); })));
  cs.push_back(Case("round halves", "round", {halves}, Map1([](double x) { return std::round(x); })));
  cs.push_back(Case("logical_not float", "logical_not", {Floats({2, 3}, {0, -0.0, 1.5, -2, kNaN, 1e-3})},
                    Map1([](double x) { return x == 0 ? 1.0 : 0.0; })));

  // Special values: infinities and NaN propagate as in IEEE arithmetic (no gradient check).
  auto special = [&](const char* label, const char* op, std::vector<double> v, Fn1 f) {
    const int64_t n = static_cast<int64_t>(v.size());
    OpCase c = Case(label, op, {Floats({n}, std::move(v))}, Map1(f));
    c.grad = false;
    cs.push_back(c);
  };
  special("exp special values", "exp", {kInf, -kInf, kNaN, 0}, [](double x) { return std::exp(x); });
  special("log special values", "log", {0, -1, kInf, 1, kNaN}, [](double x) { return std::log(x); });
  special("sqrt special values", "sqrt", {-1, 0, kInf, 4}, [](double x) { return std::sqrt(x); });
  special("reciprocal of zero", "reciprocal", {0, -0.0, kInf}, [](double x) { return 1 / x; });
  special("tanh saturates", "tanh", {-kInf, -30, 30, kInf}, [](double x) { return std::tanh(x); });
  special("softplus large |x|", "softplus", {-kInf, -1000, -90, -30, 30, 90, 1000, kInf, kNaN}, Softplus);
  // The gradient (sigmoid) where it saturates, and tiny where x is very negative.
  cs.push_back(Case("softplus tails", "softplus", {Floats({4}, {-30, -12, 12, 30})}, Map1(Softplus)));
  special("mish large |x|", "mish", {-kInf, -1000, -30, 30, 1000, kInf, kNaN}, Mish);
  cs.push_back(Case("mish tails", "mish", {Floats({4}, {-30, -12, 12, 30})}, Map1(Mish)));

  // Integer and bool inputs.
  for (DType t : kIntTypes) {
    const HostTensor x = Ints({2, 3}, {-7, -2, 0, 1, 5, 9}, t);
    const std::string ts = DTypeName(t);
    cs.push_back(Case("neg " + ts, "neg", {x}, Map1([](double v) { return -v; })));
    cs.push_back(Case("abs " + ts, "abs", {x}, Map1([](double v) { return std::fabs(v); })));
    cs.push_back(Case("square " + ts, "square", {x}, Map1([](double v) { return v * v; })));
    cs.push_back(Case("sign " + ts, "sign", {x}, Map1(Sign)));
    cs.push_back(Case("relu " + ts, "relu", {x}, Map1(Relu)));
    for (const char* op : {"floor", "ceil", "round"})
      cs.push_back(
          Case(std::string(op) + " " + ts + " is the identity", op, {x}, Map1([](double v) { return v; })));
    cs.push_back(
        Case("logical_not " + ts, "logical_not", {x}, Map1([](double v) { return v == 0 ? 1.0 : 0.0; })));
  }
  cs.push_back(Case("logical_not bool", "logical_not", {Ints({4}, {1, 0, 0, 1}, DType::kBool)},
                    Map1([](double v) { return v == 0 ? 1.0 : 0.0; })));
}

void AddBinary(std::vector<OpCase>& cs) {
  const std::vector<BinarySpec> arith = {
      {"add", [](double a, double b) { return a + b; }},
      {"sub", [](double a, double b) { return a - b; }},
      {"mul", [](double a, double b) { return a * b; }},
      {"maximum", Max},
      {"minimum", Min},
  };
  // Operand shapes: equal, broadcast of a row, outer broadcast, rank-0 either side, empty.
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{2, 1}, {1, 3}},    {{}, {2, 2}},
      {{2, 2}, {}},     {{0, 3}, {3}}, {{2, 3, 4}, {3, 1}},
  };
  uint64_t seed = 1000;
  for (const BinarySpec& s : arith)
    for (const auto& [sa, sb] : shapes) {
      std::vector<HostTensor> in = {Uniform(sa, -2, 2, seed++), Uniform(sb, -2, 2, seed++)};
      cs.push_back(Case(std::string(s.op) + " " + Shapes(in), s.op, in, Map2(s.f)));
    }
  auto div = [](double a, double b) { return a / b; };
  auto pow = [](double a, double b) { return std::pow(a, b); };
  for (const auto& [sa, sb] : shapes) {
    std::vector<HostTensor> in = {Uniform(sa, -2, 2, seed++), AwayFromZero(sb, seed++)};
    cs.push_back(Case("div " + Shapes(in), "div", in, Map2(div)));
    // pow: a > 0 so the gradient in b (log a) exists.
    in = {Uniform(sa, 0.5, 2, seed++), Uniform(sb, -2, 2, seed++)};
    cs.push_back(Case("pow " + Shapes(in), "pow", in, Map2(pow)));
  }
  OpCase ties = Case("maximum with ties", "maximum",
                     {Floats({2, 3}, {1, 2, 3, 4, 5, 6}), Floats({2, 3}, {1, 5, 3, 0, 5, 7})}, Map2(Max));
  ties.grad = false;  // the gradient at a tie is a convention (it goes to a), not a derivative
  cs.push_back(ties);
  ties.label = "minimum with ties", ties.op = "minimum", ties.reference = Map2(Min);
  cs.push_back(ties);
  OpCase nan = Case("maximum propagates NaN", "maximum",
                    {Floats({3}, {kNaN, 1, kNaN}), Floats({3}, {1, kNaN, kNaN})}, Map2(Max));
  nan.grad = false;
  cs.push_back(nan);
  nan.label = "minimum propagates NaN", nan.op = "minimum", nan.reference = Map2(Min);
  cs.push_back(nan);
  OpCase by_zero =
      Case("div float by zero", "div", {Floats({4}, {1, -1, 0, kInf}), Floats({4}, {0, 0, 0, 0})}, Map2(div));
  by_zero.grad = false;
  cs.push_back(by_zero);

  // Comparisons: bool output, ties included, NaN compares unequal to everything.
  const std::vector<BinarySpec> cmp = {
      {"equal", [](double a, double b) { return a == b ? 1.0 : 0.0; }},
      {"not_equal", [](double a, double b) { return a != b ? 1.0 : 0.0; }},
      {"less", [](double a, double b) { return a < b ? 1.0 : 0.0; }},
      {"less_equal", [](double a, double b) { return a <= b ? 1.0 : 0.0; }},
      {"greater", [](double a, double b) { return a > b ? 1.0 : 0.0; }},
      {"greater_equal", [](double a, double b) { return a >= b ? 1.0 : 0.0; }},
  };
  for (const BinarySpec& s : cmp) {
    const std::string op = s.op;
    cs.push_back(Case(op + " with ties", s.op,
                      {Floats({2, 3}, {1, 2, 3, 4, 5, 6}), Floats({2, 3}, {1, 3, 2, 4, 6, 5})}, Map2(s.f)));
    cs.push_back(Case(op + " broadcast", s.op, {Floats({2, 3}, {1, 2, 3, 4, 5, 6}), Floats({3}, {2, 2, 5})},
                      Map2(s.f)));
    cs.push_back(
        Case(op + " NaN", s.op, {Floats({3}, {kNaN, 1, kNaN}), Floats({3}, {1, kNaN, kNaN})}, Map2(s.f)));
    for (DType t : kIntTypes)
      cs.push_back(Case(op + " " + DTypeName(t), s.op,
                        {Ints({4}, {-3, 0, 2, 7}, t), Ints({4}, {-3, 1, 1, 8}, t)}, Map2(s.f)));
  }
  cs.push_back(Case("equal bool", "equal",
                    {Ints({4}, {1, 0, 1, 0}, DType::kBool), Ints({4}, {1, 1, 0, 0}, DType::kBool)},
                    Map2(cmp[0].f)));

  // Integers: exact arithmetic; division truncates toward zero.
  for (DType t : kIntTypes) {
    const std::string ts = DTypeName(t);
    const HostTensor a = Ints({2, 3}, {7, -7, 7, -7, 0, 9}, t), b = Ints({2, 3}, {2, 2, -2, -2, 3, -4}, t);
    for (const BinarySpec& s : arith)
      cs.push_back(Case(std::string(s.op) + " " + ts, s.op, {a, b}, Map2(s.f)));
    cs.push_back(Case("add " + ts + " broadcast", "add", {a, Ints({3}, {10, 20, 30}, t)}, Map2(arith[0].f)));
    cs.push_back(Case("div " + ts + " truncates toward zero", "div", {a, b}, Map2(IntDiv)));
    cs.push_back(
        Case("pow " + ts, "pow",
             {Ints({2, 4}, {2, 3, -2, 5, 1, -1, 2, 0}, t), Ints({2, 4}, {3, 2, 3, 0, -1, -3, -1, 0}, t)},
             Map2(IntPow)));
  }
  // Bool arithmetic: add and maximum are "or", mul and minimum are "and".
  const HostTensor p = Ints({4}, {1, 0, 1, 0}, DType::kBool), q = Ints({4}, {1, 1, 0, 0}, DType::kBool);
  auto lor = [](double a, double b) { return a != 0 || b != 0 ? 1.0 : 0.0; };
  auto land = [](double a, double b) { return a != 0 && b != 0 ? 1.0 : 0.0; };
  cs.push_back(Case("add bool is or", "add", {p, q}, Map2(lor)));
  cs.push_back(Case("maximum bool is or", "maximum", {p, q}, Map2(lor)));
  cs.push_back(Case("mul bool is and", "mul", {p, q}, Map2(land)));
  cs.push_back(Case("minimum bool is and", "minimum", {p, q}, Map2(land)));
}

void AddOthers(std::vector<OpCase>& cs) {
  auto select = [](const std::vector<double>& a) { return a[0] != 0 ? a[1] : a[2]; };
  cs.push_back(Case(
      "where (2, 3)", "where",
      {Ints({2, 3}, {1, 0, 1, 0, 0, 1}, DType::kBool), Uniform({2, 3}, -2, 2, 1), Uniform({2, 3}, -2, 2, 2)},
      Map(select)));
  cs.push_back(Case("where broadcast (2, 1) (3,) ()", "where",
                    {Ints({2, 1}, {1, 0}, DType::kBool), Uniform({3}, -2, 2, 3), Uniform({}, -2, 2, 4)},
                    Map(select)));
  cs.push_back(Case("where int32 condition", "where",
                    {Ints({3}, {0, 2, -1}, DType::kInt32), Uniform({3}, -2, 2, 5), Uniform({3}, -2, 2, 6)},
                    Map(select)));
  cs.push_back(Case("where int64 values", "where",
                    {Ints({3}, {0, 1, 1}, DType::kBool), Ints({3}, {1, 2, 3}), Ints({3}, {-1, -2, -3})},
                    Map(select)));
  cs.push_back(Case("where empty", "where",
                    {Ints({0, 2}, {}, DType::kBool), Uniform({2}, -2, 2, 7), Uniform({0, 2}, -2, 2, 8)},
                    Map(select)));

  // cast: float to integer truncates toward zero; anything to bool is "!= 0".
  auto cast = [&](std::string label, HostTensor x, DType to, Fn1 f, bool grad) {
    OpCase c = Case(std::move(label), "cast", {std::move(x)}, Map1(std::move(f)));
    c.attrs = {{"dtype", to}};
    c.grad = grad;
    cs.push_back(c);
  };
  auto same = [](double v) { return v; };
  auto trunc = [](double v) { return std::trunc(v); };
  auto nonzero = [](double v) { return v != 0 ? 1.0 : 0.0; };  // NaN is non-zero
  const HostTensor fracs = Floats({2, 3}, {-2.7, -1.5, -0.2, 0.2, 1.5, 2.7});
  cast("cast float to int32 truncates", fracs, DType::kInt32, trunc, true);
  cast("cast float to int64 truncates", fracs, DType::kInt64, trunc, true);
  cast("cast float to uint8", Floats({4}, {0, 1.9, 200.5, 255}), DType::kUInt8, trunc, true);
  cast("cast float to bool", Floats({2, 3}, {0, -0.0, 0.5, -3, kNaN, 1e-3}), DType::kBool, nonzero, true);
  cast("cast float to float64", fracs, DType::kFloat64, same, true);
  // A float32 or 16-bit output is too coarse for float64 finite differences.
  cast("cast float to float32", fracs, DType::kFloat32, same, false);
  cast("cast float to float16", fracs, DType::kFloat16, same, false);
  cast("cast float to bfloat16", fracs, DType::kBFloat16, same, false);
  cast("cast float16 overflow to inf", Floats({3}, {1e5, -1e5, 100}), DType::kFloat16, same, false);
  cast("cast int32 to float32", Ints({4}, {-3, 0, 5, 123457}, DType::kInt32), DType::kFloat32, same, false);
  cast("cast int64 to float64", Ints({3}, {-(1ll << 40) - 1, 0, 1ll << 50}), DType::kFloat64, same, false);
  cast("cast int32 to float16", Ints({3}, {-3, 2049, 1000}, DType::kInt32), DType::kFloat16, same, false);
  cast("cast int64 to int32", Ints({3}, {-5, 0, 1 << 30}), DType::kInt32, same, false);
  cast("cast int64 to bool", Ints({4}, {0, 2, -1, 0}), DType::kBool, nonzero, false);
  cast("cast bool to float32", Ints({3}, {1, 0, 1}, DType::kBool), DType::kFloat32, same, false);
  cast("cast bool to int64", Ints({3}, {1, 0, 1}, DType::kBool), DType::kInt64, same, false);

  auto id = Map1(same);
  cs.push_back(Case("copy (2, 3)", "copy", {Uniform({2, 3}, -2, 2, 9)}, id));
  cs.push_back(Case("copy rank-0", "copy", {Uniform({}, -2, 2, 10)}, id));
  cs.push_back(Case("copy empty", "copy", {Uniform({0, 3}, -2, 2, 11)}, id));
  cs.push_back(Case("copy int64", "copy", {Ints({2, 2}, {1, -2, 3, 1ll << 40})}, id));
  cs.push_back(Case("copy bool", "copy", {Ints({3}, {1, 0, 1}, DType::kBool)}, id));
  OpCase sg = Case("stop_gradient (2, 3)", "stop_gradient", {Uniform({2, 3}, -2, 2, 12)}, id);
  sg.grad = false;
  cs.push_back(sg);
}

}  // namespace

KILN_CONFORMANCE_CASES(elementwise) {
  std::vector<OpCase> cs;
  AddUnary(cs);
  AddBinary(cs);
  AddOthers(cs);
  return cs;
}

TEST_CASE("elementwise: integer division by zero raises ValueError at the sync point") {
  for (DType t : kIntTypes) {
    CAPTURE(DTypeName(t));
    Tensor a = Tensor::FromVector<int64_t>({6, 7, 8}, {3}).AsType(t);
    Tensor b = Tensor::FromVector<int64_t>({2, 0, 4}, {3}).AsType(t);
    Tensor q;
    CHECK_NOTHROW(q = Invoke1("div", {a, b}));  // queued: the error appears at the sync point
    std::string msg;
    try {
      q.WaitToRead();
    } catch (const ValueError& e) {
      msg = e.what();
    } catch (const std::exception& e) {
      FAIL_CHECK("expected kiln::ValueError, got another exception: " << e.what());
    }
    CHECK_MESSAGE(msg.find("division by zero") != std::string::npos, "message: '" << msg << "'");
    CHECK_MESSAGE(msg.find("div") != std::string::npos, "message: '" << msg << "'");
    // The engine keeps working after a failed task.
    CHECK(Invoke1("add", {a, a}).ToVector<int64_t>() == std::vector<int64_t>{12, 14, 16});
  }
}

TEST_CASE("elementwise: no gradient flows through stop_gradient") {
  Tensor x = Tensor::FromVector<double>({1, 2, 3}, {3});
  x.AttachGrad();
  Tensor y;
  {
    autograd::RecordScope record;
    y = Invoke1("mul", {Invoke1("stop_gradient", {x}), x});
  }
  y.Backward(Tensor::FromVector<double>({1, 1, 1}, {3}));
  CHECK(x.grad().ToVector<double>() == std::vector<double>{1, 2, 3});  // d/dx [c * x] with c = x held
}

}  // namespace kiln::testing

// Randomized fused-versus-unfused tests: thousands of random graphs of float32 elementwise ops
// (unary and binary functions of the op table, scalar operands, bias-like and other broadcast
// operands, values read twice, intermediate outputs, comparisons and `where` between groups),
// each run eagerly and traced twice, with fusion on and with KILN_DISABLE_PASS=fusion.
//
// The oracle is an interval reference computed in double precision: per element, each value is an
// interval widened at every op by what float32 may round (0 ulp for exact ops such as neg, floor
// or maximum, 1 for + - * / sqrt, a generous 8 for libm and libmvec transcendentals). Eager,
// unfused and fused results must all lie in it, so FMA contraction and vector math pass while a
// wrong operand, broadcast index, function, order or dropped intermediate does not. Across a
// discontinuity (floor, a comparison) the interval just widens; at a pole or a domain edge (1/x
// around 0) the element is "any" and skipped, and each test case checks that such elements are
// rare. Guards drawn from each value's static range keep operands in safe domains
// (log(abs(x) + c), exp(minimum(x, c)), ...), except a few deliberately unguarded sqrt/log whose
// NaNs must then appear at the same positions in all three results.
//
// Deliberately not here: gradients, GPUs, dtypes other than float32, the exact grouping of DAGs
// (only chains are held to "one group"), the sign of zero (but see the abs(-0.0) case at the end).
// A failure prints the graph's seed and program; MakeCase(mode, seed) rebuilds it and its inputs
// (the same ones with the same standard library: the distributions are implementation-defined).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numbers>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/ops.h"
#include "kiln/ir/graph.h"
#include "test_util.h"

namespace {

using namespace kiln;
using kiln::testing::ScopedEnv;

// ---- intervals ---------------------------------------------------------------------------------

/// What a float32 kernel may return for one element: a value in [lo, hi], NaN, or anything.
struct Iv {
  enum State : uint8_t { kRange, kNaN, kAny };
  double lo = 0, hi = 0;
  State s = kRange;
};

constexpr double kUlp = 0x1p-23;   // one float32 ulp is at most |x| * 2^-23 ...
constexpr double kTiny = 0x1p-126; // ... plus the smallest normal (subnormals may flush)
constexpr double kHuge = 1e37;     // past this a float32 result may overflow: anything
constexpr double kLibm = 8;        // ulps allowed to exp, log, sin, tanh, pow... (libm, libmvec)
constexpr double kPi = std::numbers::pi;

Iv Any() { return {0, 0, Iv::kAny}; }
Iv NaN() { return {0, 0, Iv::kNaN}; }
double F32(double v) { return static_cast<double>(static_cast<float>(v)); }
Iv Pt(double v) { return {F32(v), F32(v)}; }

/// [lo, hi] widened by `ulps` float32 roundings.
Iv Range(double lo, double hi, double ulps) {
  if (std::isnan(lo) || std::isnan(hi)) return Any();
  lo -= ulps * (std::abs(lo) * kUlp + kTiny);
  hi += ulps * (std::abs(hi) * kUlp + kTiny);
  if (std::abs(lo) > kHuge || std::abs(hi) > kHuge) return Any();
  return {lo, hi};
}
Iv Inc(Iv x, double (*f)(double), double ulps) { return Range(f(x.lo), f(x.hi), ulps); }
Iv Dec(Iv x, double (*f)(double), double ulps) { return Range(f(x.hi), f(x.lo), ulps); }
Iv AbsIv(Iv x) {
  if (x.lo >= 0) return x;
  if (x.hi <= 0) return {-x.hi, -x.lo};
  return {0, std::max(-x.lo, x.hi)};
}
// sin or cos: the endpoints, or +-1 where the interval holds a crest (max_at + 2 pi k) or a trough.
Iv Wave(Iv x, double (*f)(double), double max_at, double min_at) {
  auto hits = [&](double at) { return at + 2 * kPi * std::ceil((x.lo - at) / (2 * kPi)) <= x.hi; };
  double a = f(x.lo), b = f(x.hi), lo = std::min(a, b), hi = std::max(a, b);
  if (x.hi - x.lo >= 2 * kPi || hits(max_at)) hi = 1;
  if (x.hi - x.lo >= 2 * kPi || hits(min_at)) lo = -1;
  return Range(lo, hi, kLibm);
}
Iv Hull(Iv a, Iv b) {
  if (a.s == Iv::kNaN && b.s == Iv::kNaN) return NaN();
  if (a.s != Iv::kRange || b.s != Iv::kRange) return Any();
  return {std::min(a.lo, b.lo), std::max(a.hi, b.hi)};
}

// ---- the ops -----------------------------------------------------------------------------------

enum Unary {
  kNeg, kAbs, kSign, kSquare, kSqrt, kRsqrt, kRecip, kExp, kLog, kLog1p, kExpm1, kSin, kCos, kTanh,
  kErf, kRelu, kFloor, kCeil, kRound, kNot, kStop, kSigmoid, kGelu, kNumUnary
};
enum Binary { kAdd, kSub, kMul, kDiv, kPow, kMax, kMin, kEq, kNe, kLt, kLe, kGt, kGe, kNumBinary };

Iv UnaryIv(int f, Iv x);
Iv BinaryIv(int f, Iv a, Iv b);

using T = const Tensor&;
struct UnaryDef {
  const char* name;
  Tensor (*eager)(T);
  bool chain;  // reads x once and fuses: may appear in a chain held to one group
};
// Comparisons and logical_not return bool: cast back to float32, as user code does.
Tensor F(T x) { return nd::cast(x, DType::kFloat32); }
const UnaryDef kUnaryDefs[kNumUnary] = {
    {"negative", nd::negative, true}, {"abs", nd::abs, true}, {"sign", nd::sign, true},
    {"square", nd::square, true}, {"sqrt", nd::sqrt, true}, {"rsqrt", nd::rsqrt, true},
    {"reciprocal", nd::reciprocal, true}, {"exp", nd::exp, true}, {"log", nd::log, true},
    {"log1p", nd::log1p, true}, {"expm1", nd::expm1, true}, {"sin", nd::sin, true},
    {"cos", nd::cos, true}, {"tanh", nd::tanh, true}, {"erf", nd::erf, true},
    {"relu", nd::relu, true}, {"floor", nd::floor, true}, {"ceil", nd::ceil, true},
    {"round", nd::round, true},
    {"logical_not", [](T x) { return F(nd::logical_not(x)); }, false},
    {"stop_gradient", nd::stop_gradient, true}, {"sigmoid", nd::sigmoid, true}, {"gelu", nd::gelu, false},
};

#define KILN_ARITH(fn)                                            \
  [](T a, T b) { return fn(a, b); }, [](T a, double b) { return fn(a, b); }, \
      [](double a, T b) { return fn(a, b); }
#define KILN_CMP(fn) [](T a, T b) { return F(fn(a, b)); }, [](T a, double b) { return F(fn(a, b)); }, \
                     [](double a, T b) { return F(fn(a, b)); }, fn
struct BinaryDef {
  const char* name;
  Tensor (*tt)(T, T);
  Tensor (*ts)(T, double);
  Tensor (*st)(double, T);
  Tensor (*raw)(T, T) = nullptr;  // comparisons: the bool result, for `where`
};
const BinaryDef kBinaryDefs[kNumBinary] = {
    {"add", KILN_ARITH(nd::add)},          {"subtract", KILN_ARITH(nd::subtract)},
    {"multiply", KILN_ARITH(nd::multiply)}, {"divide", KILN_ARITH(nd::divide)},
    {"power", KILN_ARITH(nd::power)},      {"maximum", KILN_ARITH(nd::maximum)},
    {"minimum", KILN_ARITH(nd::minimum)},  {"equal", KILN_CMP(nd::equal)},
    {"not_equal", KILN_CMP(nd::not_equal)}, {"less", KILN_CMP(nd::less)},
    {"less_equal", KILN_CMP(nd::less_equal)}, {"greater", KILN_CMP(nd::greater)},
    {"greater_equal", KILN_CMP(nd::greater_equal)},
};
#undef KILN_ARITH
#undef KILN_CMP

Iv UnaryIv(int f, Iv x) {
  if (x.s == Iv::kAny) return Any();
  if (x.s == Iv::kNaN) return f == kSign || f == kRelu || f == kNot ? Pt(0) : NaN();
  switch (f) {
    case kNeg: return {-x.hi, -x.lo};
    case kAbs: return AbsIv(x);
    case kSign: return {x.lo > 0 ? 1. : x.lo < 0 ? -1. : 0., x.hi > 0 ? 1. : x.hi < 0 ? -1. : 0.};
    case kSquare: {
      Iv a = AbsIv(x);
      return Range(a.lo * a.lo, a.hi * a.hi, 1);
    }
    case kSqrt: return x.hi < 0 ? NaN() : x.lo < 0 ? Any() : Inc(x, std::sqrt, 1);
    case kRsqrt:
      return x.hi < 0 ? NaN() : x.lo <= 0 ? Any() : Dec(x, [](double v) { return 1 / std::sqrt(v); }, 2);
    case kRecip: return x.lo <= 0 && x.hi >= 0 ? Any() : Dec(x, [](double v) { return 1 / v; }, 1);
    case kExp: return Inc(x, std::exp, kLibm);
    case kLog: return x.hi < 0 ? NaN() : x.lo <= 0 ? Any() : Inc(x, std::log, kLibm);
    case kLog1p: return x.hi < -1 ? NaN() : x.lo <= -1 ? Any() : Inc(x, std::log1p, kLibm);
    case kExpm1: return Inc(x, std::expm1, kLibm);
    case kSin: return Wave(x, std::sin, kPi / 2, -kPi / 2);
    case kCos: return Wave(x, std::cos, 0, kPi);
    case kTanh: return Inc(x, std::tanh, kLibm);
    case kErf: return Inc(x, std::erf, kLibm);
    case kRelu: return {std::max(x.lo, 0.), std::max(x.hi, 0.)};
    case kFloor: return Inc(x, std::floor, 0);
    case kCeil: return Inc(x, std::ceil, 0);
    case kRound: return Inc(x, std::round, 0);
    case kNot: return x.lo == 0 && x.hi == 0 ? Pt(1) : x.lo <= 0 && x.hi >= 0 ? Iv{0, 1} : Pt(0);
    case kStop: return x;
    case kSigmoid:  // composites.cc: tanh(x * 0.5) * 0.5 + 0.5
      return BinaryIv(kAdd, BinaryIv(kMul, UnaryIv(kTanh, BinaryIv(kMul, x, Pt(0.5))), Pt(0.5)), Pt(0.5));
    case kGelu:  // composites.cc: (x * 0.5) * (erf(x * 0.7071067811865476) + 1)
      return BinaryIv(kMul, BinaryIv(kMul, x, Pt(0.5)),
                      BinaryIv(kAdd, UnaryIv(kErf, BinaryIv(kMul, x, Pt(0.7071067811865476))), Pt(1)));
  }
  return Any();
}

template <class F>
Iv Corners(Iv a, Iv b, F f, double ulps) {
  double c[4] = {f(a.lo, b.lo), f(a.lo, b.hi), f(a.hi, b.lo), f(a.hi, b.hi)};
  return Range(*std::min_element(c, c + 4), *std::max_element(c, c + 4), ulps);
}

Iv PowIv(Iv a, Iv b) {
  bool point = b.lo == b.hi;
  if (point && b.lo == std::round(b.lo) && std::abs(b.lo) <= 16) {  // an integer exponent
    double n = b.lo, x = std::pow(a.lo, n), y = std::pow(a.hi, n);
    if (n == 0) return Pt(1);
    if (a.lo <= 0 && a.hi >= 0) {
      if (n < 0) return Any();
      return std::fmod(n, 2) == 0 ? Range(0, std::max(x, y), kLibm) : Range(x, y, kLibm);
    }
    return Range(std::min(x, y), std::max(x, y), kLibm);
  }
  if (a.lo <= 0) return a.hi < 0 && point ? NaN() : Any();
  return Corners(a, b, [](double u, double v) { return std::pow(u, v); }, kLibm);
}

Iv CompareIv(int f, Iv a, Iv b) {
  if (a.s == Iv::kNaN || b.s == Iv::kNaN) return Pt(f == kNe ? 1 : 0);
  if (a.s == Iv::kAny || b.s == Iv::kAny) return {0, 1};
  auto lt = [](Iv x, Iv y) { return x.hi < y.lo ? Pt(1) : x.lo >= y.hi ? Pt(0) : Iv{0, 1}; };
  auto le = [](Iv x, Iv y) { return x.hi <= y.lo ? Pt(1) : x.lo > y.hi ? Pt(0) : Iv{0, 1}; };
  bool same_point = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
  Iv eq = same_point ? Pt(1) : a.hi < b.lo || b.hi < a.lo ? Pt(0) : Iv{0, 1};
  switch (f) {
    case kEq: return eq;
    case kNe: return {1 - eq.hi, 1 - eq.lo};
    case kLt: return lt(a, b);
    case kLe: return le(a, b);
    case kGt: return lt(b, a);
    default: return le(b, a);
  }
}

Iv BinaryIv(int f, Iv a, Iv b) {
  if (f >= kEq) return CompareIv(f, a, b);
  if (a.s == Iv::kNaN || b.s == Iv::kNaN) return f == kPow ? Any() : NaN();  // pow(NaN, 0) is 1
  if (a.s == Iv::kAny || b.s == Iv::kAny) return Any();
  switch (f) {
    case kAdd: return Range(a.lo + b.lo, a.hi + b.hi, 1);
    case kSub: return Range(a.lo - b.hi, a.hi - b.lo, 1);
    case kMul: return Corners(a, b, [](double u, double v) { return u * v; }, 1);
    case kDiv:
      if (b.lo <= 0 && b.hi >= 0) return Any();
      return Corners(a, b, [](double u, double v) { return u / v; }, 1);
    case kPow: return PowIv(a, b);
    case kMax: return {std::max(a.lo, b.lo), std::max(a.hi, b.hi)};
    default: return {std::min(a.lo, b.lo), std::min(a.hi, b.hi)};
  }
}

Iv WhereIv(Iv cond, Iv x, Iv y) { return cond.lo == 1 ? x : cond.hi == 0 ? y : Hull(x, y); }

// ---- programs ----------------------------------------------------------------------------------

/// A value, or a Python number (v < 0).
struct Operand {
  int v = -1;
  double c = 0;
};

struct Step {
  enum Kind : uint8_t { kUnary, kBinary, kWhere, kClip } kind = kUnary;
  int fn = 0;       // Unary, Binary, or the comparison of `where`
  Operand a, b;     // where(fn(a, b), x, y); clip(a, lo, hi)
  int x = -1, y = -1;
  double lo = 0, hi = 0;
};

/// Values 0..num_inputs-1 are the graph's data inputs; step k defines value num_inputs + k.
struct Program {
  int num_inputs = 0;
  std::vector<Shape> shapes;  // per value
  std::vector<Step> steps;
  std::vector<int> outputs;

  std::vector<Tensor> Run(const std::vector<Tensor>& in) const {
    std::vector<Tensor> v(in);
    auto at = [&](Operand o) -> const Tensor& { return v[o.v]; };
    for (const Step& s : steps) {
      const BinaryDef& b = kBinaryDefs[s.kind == Step::kBinary || s.kind == Step::kWhere ? s.fn : 0];
      switch (s.kind) {
        case Step::kUnary: v.push_back(kUnaryDefs[s.fn].eager(at(s.a))); break;
        case Step::kBinary:
          if (s.a.v < 0) v.push_back(b.st(s.a.c, at(s.b)));
          else if (s.b.v < 0) v.push_back(b.ts(at(s.a), s.b.c));
          else v.push_back(b.tt(at(s.a), at(s.b)));
          break;
        case Step::kWhere: v.push_back(nd::where(b.raw(at(s.a), at(s.b)), v[s.x], v[s.y])); break;
        case Step::kClip: v.push_back(nd::clip(at(s.a), s.lo, s.hi)); break;
      }
    }
    std::vector<Tensor> out;
    for (int k : outputs) out.push_back(v[k]);
    return out;
  }

  std::string str() const {
    std::ostringstream os;
    os.precision(9);
    auto name = [](Operand o) {
      std::ostringstream n;
      n.precision(9);
      if (o.v < 0) n << o.c;
      else n << "v" << o.v;
      return n.str();
    };
    for (int i = 0; i < num_inputs; ++i) os << "v" << i << " = input " << shapes[i].str() << "\n";
    for (size_t k = 0; k < steps.size(); ++k) {
      const Step& s = steps[k];
      os << "v" << num_inputs + static_cast<int>(k) << " = ";
      switch (s.kind) {
        case Step::kUnary: os << kUnaryDefs[s.fn].name << "(" << name(s.a) << ")"; break;
        case Step::kBinary:
          os << kBinaryDefs[s.fn].name << "(" << name(s.a) << ", " << name(s.b) << ")";
          break;
        case Step::kWhere:
          os << "where(" << kBinaryDefs[s.fn].name << "(" << name(s.a) << ", " << name(s.b) << "), v" << s.x
             << ", v" << s.y << ")";
          break;
        case Step::kClip: os << "clip(" << name(s.a) << ", " << s.lo << ", " << s.hi << ")"; break;
      }
      os << " " << shapes[num_inputs + k].str() << "\n";
    }
    os << "outputs:";
    for (int o : outputs) os << " v" << o;
    return os.str();
  }
};

/// The interval of step `s` from the intervals of its operands (a, b, x, y; unused ones ignored).
Iv StepIv(const Step& s, Iv a, Iv b, Iv x, Iv y) {
  switch (s.kind) {
    case Step::kUnary: return UnaryIv(s.fn, a);
    case Step::kBinary: return BinaryIv(s.fn, a, b);
    case Step::kWhere: return WhereIv(CompareIv(s.fn, a, b), x, y);
    case Step::kClip: return BinaryIv(kMin, BinaryIv(kMax, a, Pt(s.lo)), Pt(s.hi));
  }
  return Any();
}

/// For each element of `out`, the flat index of the element of `in` (NumPy broadcasting) it reads.
std::vector<int64_t> Gather(const Shape& in, const Shape& out) {
  const int r = out.rank(), pad = r - in.rank();
  std::vector<int64_t> stride(r, 0), pos(r, 0);
  for (int d = in.rank() - 1, s = 1; d >= 0; s *= static_cast<int>(in[d]), --d)
    if (in[d] != 1) stride[d + pad] = s;
  std::vector<int64_t> idx(static_cast<size_t>(out.numel()));
  for (size_t i = 0; i < idx.size(); ++i) {
    int64_t k = 0;
    for (int d = 0; d < r; ++d) k += pos[d] * stride[d];
    idx[i] = k;
    for (int d = r - 1; d >= 0 && ++pos[d] == out[d]; --d) pos[d] = 0;
  }
  return idx;
}

/// The interval reference of every value of `p` on the inputs `in`.
std::vector<std::vector<Iv>> Reference(const Program& p, const std::vector<std::vector<float>>& in) {
  std::vector<std::vector<Iv>> v;
  for (const auto& x : in) {
    v.emplace_back();
    for (float e : x) v.back().push_back(Pt(e));
  }
  for (size_t k = 0; k < p.steps.size(); ++k) {
    const Step& s = p.steps[k];
    const Shape& out = p.shapes[p.num_inputs + k];
    auto spread = [&](Operand o) {
      if (o.v < 0) return std::vector<Iv>(static_cast<size_t>(out.numel()), Pt(o.c));
      std::vector<Iv> r;
      for (int64_t i : Gather(p.shapes[o.v], out)) r.push_back(v[o.v][i]);
      return r;
    };
    bool two = s.kind == Step::kBinary || s.kind == Step::kWhere, where = s.kind == Step::kWhere;
    std::vector<Iv> a = spread(s.a), b = two ? spread(s.b) : a;
    std::vector<Iv> x = where ? spread({s.x, 0}) : a, y = where ? spread({s.y, 0}) : a;
    std::vector<Iv> r(a.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = StepIv(s, a[i], b[i], x[i], y[i]);
    v.push_back(std::move(r));
  }
  return v;
}

// ---- the generator -----------------------------------------------------------------------------

enum class Mode { kChains, kDags, kOutputs, kLarge };
const std::string kModeNames[] = {"Mode::kChains", "Mode::kDags", "Mode::kOutputs", "Mode::kLarge"};

struct Case {
  Program p;
  std::vector<std::vector<float>> data;  // per input
};

/// Builds a random program, keeping a static range of each value over the input domains so that
/// guards keep operands where the ops are defined and values stay far from float32 overflow.
class Gen {
 public:
  Gen(Mode mode, uint64_t seed) : mode_(mode), rng_(static_cast<std::mt19937::result_type>(seed)) {}

  /// The program and its input data, both drawn from the seed.
  Case Make() {
    full_ = RandomShape();
    int n_in = mode_ == Mode::kChains ? 1 : Int(1, 3);
    std::vector<bool> positive;
    for (int i = 0; i < n_in; ++i) {
      p_.shapes.push_back(i == 0 && (mode_ == Mode::kChains || Coin(0.8)) ? full_ : SubShape());
      positive.push_back(Coin(0.25));
      range_.push_back(positive.back() ? Iv{0.25, 4} : Iv{-3, 3});
      read_.push_back(false);
    }
    p_.num_inputs = n_in;
    last_ = 0;
    for (int k = Int(2, 12); k > 0; --k) RandomStep();
    for (int v = p_.num_inputs, joins = 0; !chains() && v < last_ && joins < 3; ++v)
      if (!read_[v] && Coin(0.7)) {  // a branch nothing reads joins the result, so it is not dead
        static const int kJoin[] = {kAdd, kSub, kMul, kMax, kMin};
        int f = Choose(kJoin), a = Tame(last_), b = Tame(v);  // in this order: one seed, one graph
        Bin(f, a, b);
        ++joins;
      }
    p_.outputs.push_back(last_);
    if (mode_ == Mode::kOutputs || (mode_ != Mode::kChains && Coin(0.15))) {
      // An intermediate (or an input, or the result a second time) as another output.
      p_.outputs.push_back(Coin(0.1) ? last_ : Int(0, static_cast<int>(p_.shapes.size()) - 1));
      if (Coin(0.3)) std::swap(p_.outputs[0], p_.outputs[1]);
    }
    // Uniform in each input's domain, with exact zeros (of both signs), halves and integers.
    static const float kSigned[] = {0.f, -0.f, 0.5f, -0.5f, 1.5f, -2.5f, 1.f, -1.f, 2.f};
    static const float kPositive[] = {0.5f, 1.f, 1.5f, 2.5f, 3.f};
    std::vector<std::vector<float>> data;
    for (int i = 0; i < n_in; ++i) {
      bool pos = positive[i];
      data.emplace_back();
      for (int64_t k = p_.shapes[i].numel(); k > 0; --k)
        data.back().push_back(Coin(0.08) ? (pos ? Choose(kPositive) : Choose(kSigned))
                                         : static_cast<float>(pos ? Real(0.25, 4) : Real(-3, 3)));
    }
    return {std::move(p_), std::move(data)};
  }

 private:
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  double Real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  bool Coin(double p) { return std::bernoulli_distribution(p)(rng_); }
  template <class V, size_t N>
  V Choose(const V (&xs)[N]) { return xs[Int(0, static_cast<int>(N) - 1)]; }

  Shape RandomShape() {
    static const int64_t kDims[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 31};
    Shape s;
    int rank = Coin(0.2) ? 1 : Int(2, 4);
    for (int d = 0; d < rank; ++d) s.push_back(Choose(kDims));
    while (s.numel() > 2048) s[Int(0, rank - 1)] = Int(1, 4);
    if (mode_ == Mode::kLarge) {  // past the 32K-element grain: the kernel runs in chunks
      int d = Int(0, rank - 1);
      s[d] = 1;
      s[d] = (40000 + Int(0, 40000)) / std::max<int64_t>(s.numel(), 1);
    }
    return s;
  }

  /// A shape that broadcasts to full_: a bias-like block, a general mask, a suffix or a scalar.
  Shape SubShape() {
    const int r = full_.rank();
    Shape s;
    switch (Int(0, 5)) {
      case 0: return full_;
      case 1: case 2: {  // a block of full_'s dims, others 1: (C, 1, 1) against (N, C, H, W)
        int lo = Int(0, r - 1), hi = Coin(0.5) ? lo : Int(lo, r - 1), start = Int(0, lo);
        for (int d = start; d < r; ++d) s.push_back(d >= lo && d <= hi ? full_[d] : 1);
        return s;
      }
      case 3:  // dims kept alternately: (N, 1, H, 1) is not bias-like
        for (int d = 0, keep = Int(0, 1); d < r; ++d) s.push_back((d + keep) % 2 || Coin(0.2) ? full_[d] : 1);
        return s;
      case 4:  // a suffix: (H, W) against (N, C, H, W)
        for (int d = Int(0, r - 1); d < r; ++d) s.push_back(full_[d]);
        return s;
      default: return Coin(0.5) ? Shape{} : Shape{1};
    }
  }

  int Emit(Step s) {
    auto iv = [&](Operand o) { return o.v < 0 ? Pt(o.c) : range_[o.v]; };
    auto shape = [&](Operand o) { return o.v < 0 ? Shape{} : p_.shapes[o.v]; };
    Shape out = shape(s.a);
    if (s.kind == Step::kBinary || s.kind == Step::kWhere) out = BroadcastShapes(out, shape(s.b), "gen");
    Iv x = Any(), y = Any();
    if (s.kind == Step::kWhere) {
      x = range_[s.x], y = range_[s.y];
      out = BroadcastShapes(BroadcastShapes(out, p_.shapes[s.x], "gen"), p_.shapes[s.y], "gen");
    }
    Iv a = iv(s.a);
    Iv r = StepIv(s, a, iv(s.b), x, y);
    if (r.s != Iv::kRange && s.kind == Step::kUnary) {  // an unguarded sqrt / log: its defined part
      double edge = s.fn == kLog1p ? -1 + 1e-7 : s.fn == kSqrt ? 0 : 1e-30;
      r = a.hi > edge ? StepIv(s, {std::max(a.lo, edge), a.hi}, a, x, y) : Any();
    }
    if (r.s != Iv::kRange) r = {-kHuge, kHuge};  // not expected: guards below tame it
    for (int v : {s.a.v, s.b.v, s.x, s.y})
      if (v >= 0) read_[v] = true;
    p_.steps.push_back(s);
    p_.shapes.push_back(out);
    read_.push_back(false);
    range_.push_back(r);
    return last_ = static_cast<int>(p_.shapes.size()) - 1;
  }
  int Un(int f, int x) { return Emit({.kind = Step::kUnary, .fn = f, .a = {x, 0}, .b = {}}); }
  int Bin(int f, Operand a, Operand b) { return Emit({.kind = Step::kBinary, .fn = f, .a = a, .b = b}); }
  int Bin(int f, int x, double c) { return Bin(f, {x, 0}, {-1, c}); }
  int Bin(int f, double c, int x) { return Bin(f, {-1, c}, {x, 0}); }
  int Bin(int f, int x, int y) { return Bin(f, {x, 0}, {y, 0}); }
  int Clip(int x, double lo, double hi) {
    return Emit({.kind = Step::kClip, .a = {x, 0}, .b = {}, .lo = lo, .hi = hi});
  }
  const Iv& R(int v) const { return range_[v]; }
  double Mag(int v) const { return std::max(std::abs(R(v).lo), std::abs(R(v).hi)); }
  bool chains() const { return mode_ == Mode::kChains; }

  // Guards. Chains use only guards that read their operand once.
  int Tame(int v) {  // |v| <= 1e4, so a square or a product stays far from overflow
    if (Mag(v) <= 1e4) return v;
    switch (Int(0, chains() ? 1 : 2)) {
      case 0: return Un(kTanh, v);
      case 1: return Clip(v, -100, 100);
      default: return Bin(kDiv, v, Bin(kAdd, Un(kAbs, v), 1.0));  // x / (|x| + 1)
    }
  }
  int Positive(int v) {  // >= 0.25
    if (R(v).lo >= 0.25) return v;
    static const double kC[] = {0.25, 0.5, 1.0, 2.0};
    switch (Int(0, 3)) {
      case 0: return Bin(kAdd, Un(kAbs, v), Choose(kC));
      case 1: return Bin(kAdd, Choose(kC), Un(kSquare, v));
      case 2: return Bin(kMax, v, Choose(kC));
      default: return Un(kExp, Un(kTanh, v));
    }
  }
  int NonZero(int v) {
    if (R(v).lo >= 0.25 || R(v).hi <= -0.25) return v;
    return Coin(0.3) ? Un(kNeg, Positive(v)) : Positive(v);
  }
  int Below(int v, double b) {  // <= b
    if (R(v).hi <= b) return v;
    switch (Int(0, 2)) {
      case 0: return Bin(kMin, v, b);
      case 1: return Bin(kMul, Un(kTanh, v), b);
      default: return Clip(v, -b, b);
    }
  }
  int Bounded(int v, double b) {  // |v| <= b
    if (Mag(v) <= b) return v;
    return Coin(0.5) ? Bin(kMul, Un(kTanh, v), b) : Clip(v, -b, b);
  }

  // The last value (a chain), a value nothing reads yet (joining branches of a DAG), or any.
  int Pick() {
    int n = static_cast<int>(p_.shapes.size());
    if (chains() || Coin(0.5)) return Tame(last_);
    std::vector<int> unread;
    for (int v = 0; v < n; ++v)
      if (!read_[v] && v != last_) unread.push_back(v);
    if (!unread.empty() && Coin(0.5)) return Tame(unread[Int(0, static_cast<int>(unread.size()) - 1)]);
    return Tame(Int(0, n - 1));
  }
  // The second operand of a binary op: often a data input other than the first, whose shape may
  // broadcast (a bias).
  int PickOther() { return p_.num_inputs > 1 && Coin(0.5) ? Int(1, p_.num_inputs - 1) : Pick(); }
  double Scalar() {
    static const double kC[] = {0, 1, -1, 0.5, -0.5, 2, -3, 0.1, 1e-3, 10};
    return Coin(0.6) ? Choose(kC) : F32(Real(-3, 3));
  }

  void RandomUnary() {
    int f;
    do f = Int(0, kNumUnary - 1);
    while (chains() && !kUnaryDefs[f].chain);
    int x = Pick();
    bool guard = !Coin(0.1);  // sometimes a sqrt or log of anything: NaNs where it is negative
    switch (f) {
      case kSqrt: if (guard && R(x).lo < 0) x = Coin(0.5) ? Un(kAbs, x) : Positive(x); break;
      case kLog: if (guard) x = Positive(x); break;
      case kLog1p: if (guard && R(x).lo < -0.75) x = Coin(0.5) ? Un(kAbs, x) : Un(kRelu, x); break;
      case kRsqrt: x = Positive(x); break;
      case kRecip: x = NonZero(x); break;
      case kExp: case kExpm1: x = Below(x, 10); break;
      case kSin: case kCos: x = Bounded(x, 100); break;
      default: break;
    }
    Un(f, x);
  }

  void RandomBinary(bool scalar) {
    int f = !chains() && Coin(0.2) ? Int(kEq, kGe) : Int(kAdd, kMin);  // comparisons end groups
    int a = Pick();
    if (f == kPow) {  // a positive base and a bounded exponent, or an integer power
      static const double kBases[] = {2.0, 0.5, 1.5};
      if (scalar && Coin(0.3)) {
        double base = Choose(kBases);
        Bin(kPow, base, Bounded(a, 10));
      } else if (scalar) {
        static const double kExps[] = {2, 3, 0.5, -1, 1.5, -0.5};
        double e = Choose(kExps);
        Bin(kPow, e == std::round(e) && e > 0 ? a : Positive(a), e);
      } else {
        int b = Bounded(Pick(), 3);
        Bin(kPow, Positive(a), b);
      }
      return;
    }
    if (scalar) {
      double c = Scalar();
      if (f == kDiv && Coin(0.5)) Bin(kDiv, c, NonZero(a));
      else if (f == kDiv) Bin(kDiv, a, c == 0 ? 4.0 : c);
      else if (Coin(0.5)) Bin(f, a, c);
      else Bin(f, c, a);
      return;
    }
    int b = PickOther();
    if (Coin(0.5)) std::swap(a, b);
    Bin(f, a, f == kDiv ? NonZero(b) : b);
  }

  void RandomClip() {
    int x = Pick();
    double lo = -F32(Real(0, 2)), hi = F32(Real(0, 2));
    Clip(x, lo, hi);
  }

  void RandomStep() {
    double r = Real(0, 1);
    if (chains()) {
      if (r < 0.55) RandomUnary();
      else if (r < 0.95) RandomBinary(true);
      else RandomClip();
      return;
    }
    if (r < 0.4) RandomUnary();
    else if (r < 0.6) RandomBinary(true);
    else if (r < 0.88) RandomBinary(false);
    else if (r < 0.93) {  // where(p <op> q, x, y)
      int p = Pick(), q = Pick(), x = Pick(), y = Pick();
      Emit({.kind = Step::kWhere, .fn = Int(kEq, kGe), .a = {p, 0}, .b = {q, 0}, .x = x, .y = y});
    } else {
      RandomClip();
    }
  }

  Mode mode_;
  std::mt19937 rng_;
  Program p_;
  Shape full_;
  std::vector<Iv> range_;
  std::vector<bool> read_;  // per value: some step reads it
  int last_ = 0;
};

/// The program of a seed and its input data: what a failure's message names.
Case MakeCase(Mode mode, uint64_t seed) { return Gen(mode, seed).Make(); }

// ---- the check ---------------------------------------------------------------------------------

std::shared_ptr<CachedGraph> Trace(const Program& p) {
  trace::TraceScope scope;
  std::vector<Tensor> in;
  for (int i = 0; i < p.num_inputs; ++i)
    in.push_back(scope.Input("data" + std::to_string(i), p.shapes[i], DType::kFloat32, cpu()));
  return scope.Finish(p.Run(in));
}

const std::string kImpl[] = {"eager", "unfused", "fused"};

/// A program run eagerly, traced unfused and traced fused: the graphs and each one's outputs.
struct Runs {
  std::shared_ptr<CachedGraph> unfused, fused;
  std::vector<std::vector<float>> got[3];  // per kImpl, per output
};

Runs RunThreeWays(const Case& c) {
  Runs r;
  {
    ScopedEnv off("KILN_DISABLE_PASS", "fusion");  // read while Finish plans the graph
    r.unfused = Trace(c.p);
  }
  r.fused = Trace(c.p);
  std::vector<Tensor> in;
  for (int i = 0; i < c.p.num_inputs; ++i) in.push_back(Tensor::FromVector<float>(c.data[i], c.p.shapes[i]));
  std::vector<Tensor> results[] = {c.p.Run(in), r.unfused->Call(in), r.fused->Call(in)};
  for (int k = 0; k < 3; ++k) {
    REQUIRE(results[k].size() == c.p.outputs.size());
    for (size_t o = 0; o < results[k].size(); ++o) {
      INFO(kImpl[k] << " output " << o);
      CHECK(results[k][o].shape() == c.p.shapes[c.p.outputs[o]]);
      r.got[k].push_back(results[k][o].ToVector<float>());
    }
  }
  return r;
}

#if KILN_WITH_CODEGEN
/// Nodes of a float32 unary or binary elementwise function: what fusion may take.
int FusableNodes(const ir::Graph& g) {
  int n = 0;
  for (const auto& node : g.nodes())
    n += (node->def().unary_fn || node->def().binary_fn) && node->output()->dtype() == DType::kFloat32;
  return n;
}
#endif

struct Stats {
  int graphs = 0, failures = 0, fused_groups = 0, fused_ops = 0;
  int64_t elements = 0, unchecked = 0, nans = 0;
};

/// Runs the graph of one seed eagerly, unfused and fused; checks all three against the reference.
void RunOne(Mode mode, uint64_t seed, Stats& st) {
  Case c = MakeCase(mode, seed);
  INFO("the graph of MakeCase(" << kModeNames[static_cast<int>(mode)] << ", " << seed << "):\n" << c.p.str());
  ++st.graphs;
  Runs r = RunThreeWays(c);
  INFO("fused graph:\n" << r.fused->graph().str());
  std::vector<std::vector<Iv>> ref = Reference(c.p, c.data);
  for (size_t o = 0; o < c.p.outputs.size(); ++o) {
    const std::vector<Iv>& want = ref[c.p.outputs[o]];
    for (size_t i = 0; i < want.size(); ++i) {
      const Iv& w = want[i];
      ++st.elements;
      st.unchecked += w.s == Iv::kAny;
      st.nans += w.s == Iv::kNaN;
      for (int k = 0; k < 3 && w.s != Iv::kAny; ++k) {
        float v = r.got[k][o].at(i);
        if (w.s == Iv::kNaN ? std::isnan(v) : v >= w.lo && v <= w.hi) continue;
        std::ostringstream os;
        os.precision(9);
        os << kImpl[k] << " output " << o << " element " << i << " of " << want.size() << " is " << v
           << " (eager " << r.got[0][o][i] << ", unfused " << r.got[1][o][i] << ", fused " << r.got[2][o][i]
           << "); the reference ";
        if (w.s == Iv::kNaN) os << "is NaN";
        else os << "allows [" << w.lo << ", " << w.hi << "]";
        FAIL_CHECK(os.str());
        ++st.failures;
        return;
      }
    }
  }
  CHECK(r.unfused->num_fused_groups() == 0);
  int groups = r.fused->num_fused_groups(), ops = r.fused->num_fused_ops();
  st.fused_groups += groups;
  st.fused_ops += ops;
#if KILN_WITH_CODEGEN
  int n = FusableNodes(r.fused->graph());
  CHECK((ops >= 2 * groups && ops <= n));
  if (mode == Mode::kChains) {  // a chain of fusable ops on one shape is one kernel
    CHECK(groups == (n >= 2 ? 1 : 0));
    CHECK(ops == (n >= 2 ? n : 0));
  }
#endif
}

void RunMany(Mode mode, uint64_t first_seed, int count) {
  // Not the disk cache: it has tests of its own, and storing a thousand cold kernels in it costs
  // a third of this test's time.
  ScopedEnv no_disk_cache("KILN_CACHE_DIR", "off");
  Stats st;
  for (int i = 0; i < count && st.failures < 5; ++i) RunOne(mode, first_seed + static_cast<uint64_t>(i), st);
  INFO(st.graphs << " graphs, " << st.fused_groups << " fused groups of " << st.fused_ops << " ops, "
                 << st.elements << " elements, " << st.unchecked << " unchecked, " << st.nans << " NaN");
  // Elements the reference cannot bound (poles, domain edges) must stay rare, or the test is vacuous.
  CHECK(st.unchecked * 50 <= st.elements);
#if KILN_WITH_CODEGEN
  CHECK(st.fused_groups > 0);  // the comparison is not unfused against unfused
#endif
}

// Nearly all the time is the LLVM compile of each graph's fused groups: 5 to 10 ms of CPU a graph
// (40 with large tensors), about 30 s in all, split into test cases that CTest runs in parallel.
constexpr int kGraphs = 1000;

TEST_CASE("fusion random: chains") { RunMany(Mode::kChains, 1'000'000, kGraphs); }

TEST_CASE("fusion random: dags with broadcast operands") { RunMany(Mode::kDags, 2'000'000, kGraphs); }

TEST_CASE("fusion random: multiple outputs and intermediates") {
  RunMany(Mode::kOutputs, 3'000'000, kGraphs);
}

TEST_CASE("fusion random: large tensors run in chunks") { RunMany(Mode::kLarge, 4'000'000, kGraphs / 10); }

// The sign of zero, which the interval reference cannot see (both zeros lie in [0, 0]): abs(-0.0)
// is +0.0 in the fused kernel (llvm.fabs), as IEEE and NumPy have it, so the CPU kernel of eager
// and unfused runs must give +0.0 too, or 1 / abs(-0.0) is +inf fused and -inf unfused.
TEST_CASE("fusion random: abs(-0.0) is +0.0 eager, unfused and fused") {
  Case c;
  c.p.num_inputs = 1;
  c.p.shapes = {Shape{2}, Shape{2}, Shape{2}};
  c.p.steps = {{.kind = Step::kUnary, .fn = kAbs, .a = {0, 0}, .b = {}},
               {.kind = Step::kUnary, .fn = kRecip, .a = {1, 0}, .b = {}}};
  c.p.outputs = {2};  // reciprocal(abs(x))
  c.data = {{-0.0f, 2.0f}};
  Runs r = RunThreeWays(c);
#if KILN_WITH_CODEGEN
  CHECK(r.fused->num_fused_groups() == 1);
#endif
  for (int k = 0; k < 3; ++k) {
    INFO(kImpl[k] << ": 1 / abs(-0.0) is " << r.got[k][0][0]);
    CHECK(r.got[k][0][0] == std::numeric_limits<float>::infinity());
    CHECK(r.got[k][0][1] == 0.5f);
  }
}

}  // namespace

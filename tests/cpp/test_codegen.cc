// codegen/: fused elementwise kernels JIT-compiled through LLVM, checked against a scalar reference
// computed in double: the chain relu(a*b + c) * 0.5 + a, every unary and binary function alone,
// odd lengths (tails of the vector loop, ranges split across threads) and the kernel cache.
// Compiled only when kiln_tests links kiln_codegen (LLVM found): KILN_WITH_CODEGEN.
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kiln/codegen/elementwise.h"
#include "kiln/codegen/row.h"
#include "test_util.h"

namespace {

using kiln::BinaryFn;
using kiln::UnaryFn;
using kiln::codegen::CompileElementwise;
using kiln::codegen::Expr;

double RefBinary(BinaryFn f, double a, double b);

double RefUnary(UnaryFn f, double x) {
  switch (f) {
    case UnaryFn::kNeg: return -x;
    case UnaryFn::kAbs: return std::fabs(x);
    case UnaryFn::kSign: return (0 < x) - (x < 0);
    case UnaryFn::kSquare: return x * x;
    case UnaryFn::kSqrt: return std::sqrt(x);
    case UnaryFn::kRsqrt: return 1 / std::sqrt(x);
    case UnaryFn::kReciprocal: return 1 / x;
    case UnaryFn::kExp: return std::exp(x);
    case UnaryFn::kLog: return std::log(x);
    case UnaryFn::kLog1p: return std::log1p(x);
    case UnaryFn::kExpm1: return std::expm1(x);
    case UnaryFn::kSin: return std::sin(x);
    case UnaryFn::kCos: return std::cos(x);
    case UnaryFn::kTanh: return std::tanh(x);
    case UnaryFn::kErf: return std::erf(x);
    case UnaryFn::kRelu: return x > 0 ? x : 0;
    case UnaryFn::kFloor: return std::floor(x);
    case UnaryFn::kCeil: return std::ceil(x);
    case UnaryFn::kRound: return std::round(x);
    case UnaryFn::kLogicalNot: return x == 0;
    case UnaryFn::kIdentity: return x;
    default: break;
  }
  // A composite function (scalar_fn.h) in double precision through these references; its
  // formula itself is checked against an independent reference by its conformance case.
  struct Double {
    double Unary(UnaryFn g, double v) { return RefUnary(g, v); }
    double Binary(BinaryFn g, double a, double b) { return RefBinary(g, a, b); }
    double Const(double v) { return v; }
  } algebra;
  if (kiln::IsComposite(f)) return kiln::ExpandUnary(algebra, f, x);
  return NAN;
}

double RefBinary(BinaryFn f, double a, double b) {
  switch (f) {
    case BinaryFn::kAdd: return a + b;
    case BinaryFn::kSub: return a - b;
    case BinaryFn::kMul: return a * b;
    case BinaryFn::kDiv: return a / b;
    case BinaryFn::kPow: return std::pow(a, b);
    case BinaryFn::kMaximum: return (a != a || a > b) ? a : b;
    case BinaryFn::kMinimum: return (a != a || a < b) ? a : b;
    case BinaryFn::kEqual: return a == b;
    case BinaryFn::kNotEqual: return a != b;
    case BinaryFn::kLess: return a < b;
    case BinaryFn::kLessEqual: return a <= b;
    case BinaryFn::kGreater: return a > b;
    case BinaryFn::kGreaterEqual: return a >= b;
  }
  return NAN;
}

/// The expression evaluated in double on float inputs: the reference for the generated kernel.
double RefEval(const Expr& e, const std::vector<std::vector<float>>& ins, size_t i) {
  std::vector<double> v(e.nodes.size());
  for (size_t n = 0; n < e.nodes.size(); ++n) {
    const Expr::Node& node = e.nodes[n];
    switch (node.kind) {
      case Expr::Kind::kInput: {
        size_t at = node.outer > 0 ? i / static_cast<size_t>(node.inner) % static_cast<size_t>(node.outer) : i;
        v[n] = ins[static_cast<size_t>(node.input)][at];
        break;
      }
      case Expr::Kind::kConst: v[n] = static_cast<float>(node.value); break;
      case Expr::Kind::kUnary: v[n] = RefUnary(node.unary, v[static_cast<size_t>(node.a)]); break;
      case Expr::Kind::kBinary:
        v[n] = RefBinary(node.binary, v[static_cast<size_t>(node.a)], v[static_cast<size_t>(node.b)]);
        break;
    }
  }
  return v[static_cast<size_t>(e.Output())];
}

using kiln::testing::Random;

/// Runs the compiled `e` on `ins` and checks every element against RefEval within
/// atol + rtol * |ref|; returns the number of mismatches (reported for the first few).
/// n: the output's length (by default the first input's).
int CheckKernel(const Expr& e, const std::vector<std::vector<float>>& ins, double rtol = 1e-5, double atol = 1e-6,
                size_t n = SIZE_MAX) {
  auto kernel = CompileElementwise(e);
  if (n == SIZE_MAX) n = ins.empty() ? 0 : ins[0].size();
  std::vector<const float*> ptrs;
  for (const auto& in : ins) ptrs.push_back(in.data());
  std::vector<float> out(n, -12345.f);
  kernel->Run(ptrs.data(), out.data(), static_cast<int64_t>(n));
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    double ref = RefEval(e, ins, i);
    double got = out[i];
    bool ok = std::isnan(ref) ? std::isnan(got) : std::fabs(got - ref) <= atol + rtol * std::fabs(ref);
    if (!ok && ++bad <= 3)
      MESSAGE(e.ToString() << " at " << i << " of " << n << ": got " << got << ", expected " << ref);
  }
  return bad;
}

Expr Chain() {  // relu(a*b + c) * 0.5 + a
  Expr e;
  int a = e.Input(0), b = e.Input(1), c = e.Input(2);
  e.Add(e.Mul(e.Relu(e.Add(e.Mul(a, b), c)), e.Const(0.5)), a);
  return e;
}

/// Inputs in the domain of f; values that hit rounding boundaries exactly are kept for round/floor.
std::vector<float> DomainOf(UnaryFn f, size_t n, uint32_t seed) {
  switch (f) {
    case UnaryFn::kSqrt:
    case UnaryFn::kRsqrt:
    case UnaryFn::kLog: return Random(n, 0.01f, 100.f, seed);
    case UnaryFn::kLog1p: return Random(n, -0.9f, 10.f, seed);
    case UnaryFn::kReciprocal: return Random(n, 0.1f, 10.f, seed);
    case UnaryFn::kExp:
    case UnaryFn::kExpm1: return Random(n, -20.f, 20.f, seed);
    default: break;
  }
  auto v = Random(n, -6.f, 6.f, seed);
  for (size_t i = 0; i < n; i += 5) v[i] = std::round(v[i] * 2) / 2;  // exact halves, integers and zeros
  return v;
}

}  // namespace

TEST_CASE("codegen: relu(a*b + c) * 0.5 + a matches the double reference at odd lengths") {
  Expr e = Chain();
  CHECK(e.ToString() == "add(mul(relu(add(mul(in0, in1), in2)), 0.5), in0)");
  CHECK(e.NumInputs() == 3);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{1000003}}) {
    CAPTURE(n);
    std::vector<std::vector<float>> ins = {Random(n, -2, 2, 1), Random(n, -2, 2, 2), Random(n, -2, 2, 3)};
    CHECK(CheckKernel(e, ins) == 0);
  }
}

TEST_CASE("codegen: the chain kernel is vectorized for the host") {
  // Compile a fresh variant (different constant) so that LastOptimizedIR is its IR.
  Expr e;
  int a = e.Input(0), b = e.Input(1), c = e.Input(2);
  e.Add(e.Mul(e.Relu(e.Add(e.Mul(a, b), c)), e.Const(0.375)), a);
  auto kernel = CompileElementwise(e);
  std::string ir = kiln::codegen::LastOptimizedIR();
  CHECK(ir.find("x float>") != std::string::npos);
  MESSAGE("chain kernel compiled in " << kernel->compile_ms() << " ms");
}

TEST_CASE("codegen: every unary function alone") {
  for (int k = 0; k <= static_cast<int>(UnaryFn::kIdentity); ++k) {
    auto f = static_cast<UnaryFn>(k);
    Expr e;
    e.Unary(f, e.Input(0));
    CAPTURE(e.ToString());
    for (size_t n : {size_t{1}, size_t{7}, size_t{100003}}) {
      CAPTURE(n);
      // libm / libmvec float functions are within a few ulp of the double result.
      CHECK(CheckKernel(e, {DomainOf(f, n, 10 + k)}, 2e-6, 1e-6) == 0);
    }
  }
}

TEST_CASE("codegen: every binary function alone") {
  for (int k = 0; k <= static_cast<int>(BinaryFn::kGreaterEqual); ++k) {
    auto f = static_cast<BinaryFn>(k);
    Expr e;
    e.Binary(f, e.Input(0), e.Input(1));
    CAPTURE(e.ToString());
    for (size_t n : {size_t{1}, size_t{7}, size_t{100003}}) {
      CAPTURE(n);
      bool pow = f == BinaryFn::kPow;
      std::vector<float> a = pow ? Random(n, 0.1f, 4, 20 + k) : Random(n, -3, 3, 20 + k);
      std::vector<float> b = f == BinaryFn::kDiv ? Random(n, 0.5f, 3, 40 + k) : Random(n, -3, 3, 40 + k);
      for (size_t i = 0; i < n; i += 4) b[i] = a[i];  // ties for comparisons, maximum, minimum
      if (!pow && n > 3) a[3] = NAN;                  // NaN propagation of maximum / minimum
      CHECK(CheckKernel(e, {a, b}, pow ? 4e-6 : 1e-6, 1e-6) == 0);
    }
  }
}

TEST_CASE("codegen: a DAG with a shared subexpression and a root that is not last") {
  Expr e;
  int x = e.Input(0), y = e.Input(1);
  int t = e.Unary(UnaryFn::kTanh, e.Sub(x, y));  // shared
  int r = e.Binary(BinaryFn::kMaximum, e.Mul(t, t), e.Unary(UnaryFn::kExp, t));
  e.Add(r, e.Const(1));  // a trailing node that the root skips
  e.root = r;
  CHECK(CheckKernel(e, {Random(4099, -2, 2, 7), Random(4099, -2, 2, 8)}) == 0);
}

TEST_CASE("codegen: the second compile of an equal expression hits the cache") {
  Expr e;
  e.Mul(e.Add(e.Input(0), e.Const(3.25)), e.Input(1));
  auto before = kiln::codegen::GetCodegenStats();
  auto k1 = CompileElementwise(e);
  auto mid = kiln::codegen::GetCodegenStats();
  Expr same;
  same.Mul(same.Add(same.Input(0), same.Const(3.25)), same.Input(1));
  CHECK(same.Hash() == e.Hash());
  auto k2 = CompileElementwise(same);
  auto after = kiln::codegen::GetCodegenStats();
  CHECK(k1 == k2);
  CHECK(mid.compiles == before.compiles + 1);
  CHECK(after.compiles == mid.compiles);
  CHECK(after.cache_hits == mid.cache_hits + 1);
  Expr other;  // a different constant is a different kernel
  other.Mul(other.Add(other.Input(0), other.Const(3.5)), other.Input(1));
  CHECK(other.Hash() != e.Hash());
  CHECK(CompileElementwise(other) != k1);
}

TEST_CASE("codegen: malformed expressions throw UnsupportedError") {
  Expr empty;
  CHECK_THROWS_AS(CompileElementwise(empty), kiln::codegen::UnsupportedError);
  Expr forward;
  forward.Unary(UnaryFn::kExp, 1);  // refers to a node that does not exist yet
  forward.Input(0);
  CHECK_THROWS_WITH_AS(CompileElementwise(forward),
                       doctest::Contains("topological order"), kiln::codegen::UnsupportedError);
  Expr bad_fn;
  bad_fn.Unary(static_cast<UnaryFn>(200), bad_fn.Input(0));
  CHECK_THROWS_WITH_AS(CompileElementwise(bad_fn), doctest::Contains("no LLVM lowering"),
                       kiln::codegen::UnsupportedError);
}

TEST_CASE("codegen: in place (out is an input) gives the same result") {
  Expr e = Chain();
  const size_t n = 70001;
  std::vector<std::vector<float>> ins = {Random(n, -2, 2, 4), Random(n, -2, 2, 5), Random(n, -2, 2, 6)};
  std::vector<float> expect(n), a = ins[0];
  const float* ptrs[] = {a.data(), ins[1].data(), ins[2].data()};
  CompileElementwise(e)->Run(ptrs, expect.data(), static_cast<int64_t>(n));
  CompileElementwise(e)->Run(ptrs, a.data(), static_cast<int64_t>(n));
  CHECK(a == expect);
}

TEST_CASE("codegen: broadcast inputs (biases) at every alignment of the range") {
  struct Case {
    int64_t inner, outer, n;
  };
  // inner > 1: a (C, 1, 1) bias on (N, C, H, W); inner == 1: a (C,) bias on (N, C); odd sizes so
  // that stretches are cut by the range's ends.
  for (Case c : {Case{7, 5, 7 * 5 * 3 + 4}, Case{1, 13, 13 * 40 + 6}, Case{676, 20, 676 * 20 * 2}, Case{1, 1000, 2500},
                 Case{3, 1, 50}}) {
    CAPTURE(c.inner);
    CAPTURE(c.outer);
    Expr e;  // relu(x * scale[bias] + shift[bias]) + y
    int x = e.Input(0), scale = e.InputBroadcast(1, c.inner, c.outer), shift = e.InputBroadcast(2, c.inner, c.outer);
    e.Add(e.Relu(e.Add(e.Mul(x, scale), shift)), e.Input(3));
    auto n = static_cast<size_t>(c.n), m = static_cast<size_t>(c.outer);
    std::vector<std::vector<float>> ins = {Random(n, -2, 2, 1), Random(m, -2, 2, 2), Random(m, -1, 1, 3), Random(n, -1, 1, 4)};
    CHECK(CheckKernel(e, ins, 1e-5, 1e-6, n) == 0);
    // The raw function on sub-ranges that start and end inside stretches.
    auto kernel = CompileElementwise(e);
    std::vector<const float*> ptrs = {ins[0].data(), ins[1].data(), ins[2].data(), ins[3].data()};
    std::vector<float> out(n, -7.f);
    for (int64_t b = 0; b < c.n;) {
      int64_t end = std::min<int64_t>(c.n, b + 1 + (b * 7919) % 97);
      kernel->fn()(ptrs.data(), out.data(), b, end);
      b = end;
    }
    int bad = 0;
    for (size_t i = 0; i < n; ++i) bad += std::fabs(out[i] - RefEval(e, ins, i)) > 1e-6 + 1e-5 * std::fabs(RefEval(e, ins, i));
    CHECK(bad == 0);
  }
  // Two different broadcast patterns in one kernel: still correct (read by division).
  Expr mixed;
  mixed.Add(mixed.Mul(mixed.Input(0), mixed.InputBroadcast(1, 4, 3)), mixed.InputBroadcast(2, 1, 12));
  CHECK(CheckKernel(mixed, {Random(120, -1, 1, 5), Random(3, -1, 1, 6), Random(12, -1, 1, 7)}, 1e-5, 1e-6, 120) == 0);
}

TEST_CASE("codegen: a kernel with a bias broadcast is vectorized") {
  Expr e;
  e.Relu(e.Add(e.Input(0), e.InputBroadcast(1, 676, 20)));
  CompileElementwise(e);
  std::string ir = kiln::codegen::LastOptimizedIR();
  CHECK(ir.find("<8 x float>") != std::string::npos);  // AVX2 or wider
  CHECK(ir.find("udiv <") == std::string::npos);       // no vector division by the bias stride
}

// ---- row kernels (kiln/codegen/row.h) ----------------------------------------------------------
// A reduction over each row with its elementwise producers and consumers, checked against a
// double-precision reference: softmax and log-softmax on odd row lengths, NaN and -inf, the
// semantics of max (NaN, -0.0) and of sum/mean over empty rows, vectorization and the cache.

namespace {

using kiln::codegen::CompileRow;
using kiln::codegen::RowProgram;

/// v0 = max(x); v1 = sum(exp(x - v0)); out0 = exp(x - v0) / v1 (softmax), or with `log`:
/// v2 = log(v1) once per row, out0 = (x - v0) - v2 (log-softmax). out1 = v0 when `write_max`.
RowProgram Softmax(bool log, bool write_max = false) {
  RowProgram p;
  p.inputs = {RowProgram::kElement};
  Expr m;
  m.Input(0);
  int v0 = p.AddReduce(RowProgram::kMax, m);
  Expr s;
  s.Unary(UnaryFn::kExp, s.Sub(s.Input(0), s.Input(v0)));
  int v1 = p.AddReduce(RowProgram::kSum, s);
  Expr o;
  if (log) {
    Expr l;
    l.Unary(UnaryFn::kLog, l.Input(v1));
    int v2 = p.AddReduce(RowProgram::kPerRow, l);
    o.Sub(o.Sub(o.Input(0), o.Input(v0)), o.Input(v2));
  } else {
    o.Div(o.Unary(UnaryFn::kExp, o.Sub(o.Input(0), o.Input(v0))), o.Input(v1));
  }
  p.AddOutput(o);
  if (write_max) p.AddRowOutput(0);
  return p;
}

/// Softmax or log-softmax of each row of x in double, NaN-propagating like the kernels.
std::vector<double> RefSoftmax(const std::vector<float>& x, int64_t rows, int64_t len, bool log) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * len;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < len; ++j) m = (row[j] > m || row[j] != row[j] || m != m) ? (m != m ? m : row[j]) : m;
    for (int64_t j = 0; j < len; ++j) s += std::exp(row[j] - m);
    for (int64_t j = 0; j < len; ++j) out[r * len + j] = log ? (row[j] - m) - std::log(s) : std::exp(row[j] - m) / s;
  }
  return out;
}

/// Mismatches of `got` against `ref` (atol + rtol * |ref|; NaN must meet NaN), the first few reported.
int Compare(const std::vector<float>& got, const std::vector<double>& ref, double rtol, double atol, const char* what) {
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    bool ok = std::isnan(ref[i]) ? std::isnan(got[i])
                                  : got[i] == ref[i] || std::fabs(got[i] - ref[i]) <= atol + rtol * std::fabs(ref[i]);
    if (!ok && ++bad <= 3) MESSAGE(std::string(what) << " at " << i << ": got " << got[i] << ", expected " << ref[i]);
  }
  return bad;
}

}  // namespace

TEST_CASE("row kernel: softmax and log-softmax on odd row lengths, split across threads") {
  for (bool log : {false, true}) {
    auto kernel = CompileRow(Softmax(log));
    for (int64_t len : {1, 3, 10, 1000, 1001}) {
      const int64_t rows = len >= 1000 ? 67 : 1003;  // several threads' worth either way
      CAPTURE(log);
      CAPTURE(len);
      std::vector<float> x = Random(static_cast<size_t>(rows * len), -20, 20, static_cast<uint32_t>(len));
      std::vector<float> out(x.size(), -12345.f);
      const float* ins[] = {x.data()};
      float* outs[] = {out.data()};
      kernel->Run(ins, outs, rows, len);
      // exp and log within a few ulp; the sum reassociated in float lanes: about len * 2^-24.
      CHECK(Compare(out, RefSoftmax(x, rows, len, log), 2e-5, log ? 2e-5 : 1e-9, "softmax") == 0);
    }
  }
}

TEST_CASE("row kernel: NaN propagates through max to the whole row, -inf is an ordinary value") {
  const int64_t rows = 4, len = 37;
  std::vector<float> x = Random(static_cast<size_t>(rows * len), -3, 3, 5);
  x[0 * len + 20] = NAN;                                            // row 0: NaN everywhere
  for (int64_t j = 0; j < len; ++j) x[1 * len + j] = -INFINITY;     // row 1: all -inf: NaN (-inf - -inf)
  x[2 * len + 3] = -INFINITY;                                       // row 2: one -inf: a zero
  x[3 * len + 36] = INFINITY;                                       // row 3: +inf: NaN where x - m is inf - inf
  for (bool log : {false, true}) {
    std::vector<float> out(x.size()), m(rows);
    const float* ins[] = {x.data()};
    float* outs[] = {out.data(), m.data()};
    CompileRow(Softmax(log, /*write_max=*/true))->Run(ins, outs, rows, len);
    CHECK(Compare(out, RefSoftmax(x, rows, len, log), 1e-5, 1e-6, "softmax with NaN and inf") == 0);
    CHECK(std::isnan(m[0]));
    CHECK(m[1] == -INFINITY);
    CHECK(m[3] == INFINITY);
    CHECK(out[2 * len + 3] == (log ? -INFINITY : 0.0f));
  }
}

TEST_CASE("row kernel: max of -0.0 is -0.0, sum of an empty row is 0 and mean NaN") {
  RowProgram p;
  p.inputs = {RowProgram::kElement};
  for (auto kind : {RowProgram::kMax, RowProgram::kMin, RowProgram::kSum, RowProgram::kMean}) {
    Expr e;
    e.Input(0);
    p.AddReduce(kind, e);
  }
  for (int v = 0; v < 4; ++v) p.AddRowOutput(v);
  auto kernel = CompileRow(p);
  std::vector<float> zeros(9, -0.0f), mx(3), mn(3), sum(3), mean(3);
  const float* ins[] = {zeros.data()};
  float* outs[] = {mx.data(), mn.data(), sum.data(), mean.data()};
  kernel->Run(ins, outs, 3, 3);
  CHECK(std::signbit(mx[0]));
  CHECK(std::signbit(mn[2]));
  CHECK(sum[1] == 0.0f);
  kernel->Run(ins, outs, 3, 0);  // rows of length zero (only sum and mean accept them upstream)
  CHECK(sum[0] == 0.0f);
  CHECK(std::isnan(mean[2]));
  std::vector<float> x = {1, 2, 3, 4, NAN, 6};
  const float* ins2[] = {x.data()};
  kernel->Run(ins2, outs, 2, 3);
  CHECK(mx[0] == 3.0f);
  CHECK(mn[0] == 1.0f);
  CHECK(mean[0] == doctest::Approx(2.0));
  CHECK(std::isnan(mx[1]));
  CHECK(std::isnan(mn[1]));
}

TEST_CASE("row kernel: row, column and scalar operands, per-row steps") {
  // out = (x * col + row) - mean(x * col + row) * s, with s = 2 per row scaled by a scalar.
  RowProgram p;
  p.inputs = {RowProgram::kElement, RowProgram::kColumn, RowProgram::kRow, RowProgram::kScalar};
  auto y = [](Expr& e) { return e.Add(e.Mul(e.Input(0), e.Input(1)), e.Input(2)); };
  Expr me;
  y(me);
  int v0 = p.AddReduce(RowProgram::kMean, me);
  Expr se;
  se.Mul(se.Input(v0), se.Input(3));
  int v1 = p.AddReduce(RowProgram::kPerRow, se);
  Expr o;
  o.Sub(y(o), o.Input(v1));
  p.AddOutput(o);
  p.AddRowOutput(1);
  const int64_t rows = 5, len = 11;
  std::vector<float> x = Random(rows * len, -1, 1, 1), col = Random(len, -1, 1, 2), row = Random(rows, -1, 1, 3);
  std::vector<float> sc = {2.0f}, out(x.size()), rv(rows);
  const float* ins[] = {x.data(), col.data(), row.data(), sc.data()};
  float* outs[] = {out.data(), rv.data()};
  CompileRow(p)->Run(ins, outs, rows, len);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0;
    for (int64_t j = 0; j < len; ++j) mean += double(x[r * len + j]) * col[j] + row[r];
    mean /= len;
    CHECK(rv[r] == doctest::Approx(2 * mean).epsilon(1e-5));
    for (int64_t j = 0; j < len; ++j)
      CHECK(out[r * len + j] == doctest::Approx(double(x[r * len + j]) * col[j] + row[r] - 2 * mean).epsilon(1e-5));
  }
  CHECK(p.ToString() == "v0 = mean(add(mul(in0, in1), in2)); v1 = mul(v0, in3); out0 = sub(add(mul(in0, in1), in2), v1); out1 = v1");
}

TEST_CASE("row kernel: both reductions and the output pass are vectorized, the cache answers twice") {
  RowProgram p = Softmax(false);
  p.steps[0].expr.Mul(0, p.steps[0].expr.Const(0.75));  // a program no other test compiles: max(x * 0.75)
  CompileRow(p);
  std::string ir = kiln::codegen::LastRowIR();
  CHECK(ir.find("<8 x float>") != std::string::npos);  // AVX2 or wider
  CHECK(ir.find("llvm.vector.reduce.fmaximum") != std::string::npos);
  CHECK(ir.find("llvm.vector.reduce.fadd") != std::string::npos);
  auto a = CompileRow(Softmax(false));
  auto hits = kiln::codegen::GetRowStats().cache_hits;
  CHECK(CompileRow(Softmax(false)) == a);
  CHECK(kiln::codegen::GetRowStats().cache_hits == hits + 1);
  CHECK(a->text() == "v0 = max(in0); v1 = sum(exp(sub(in0, v0))); out0 = div(exp(sub(in0, v0)), v1)");
}

TEST_CASE("row kernel: a reduction stashes its elements in an output, which reads them back") {
  // softmax with exp(x - v0) computed once: stored into out0 by the sum's pass, divided in place.
  RowProgram p;
  p.inputs = {RowProgram::kElement};
  Expr m;
  m.Input(0);
  int v0 = p.AddReduce(RowProgram::kMax, m);
  Expr s;
  s.Unary(UnaryFn::kExp, s.Sub(s.Input(0), s.Input(v0)));
  int v1 = p.AddReduce(RowProgram::kSum, s);
  p.steps[1].stash = 0;
  Expr o;
  o.Div(o.Input(v1 + 1), o.Input(v1));  // v1 + 1: the first stash (inputs + steps + output 0)
  p.AddOutput(o);
  Expr o2;  // a second output reading the stash too: it sees the stashed value, not out0's result
  o2.Mul(o2.Input(v1 + 1), o2.Const(2));
  p.AddOutput(o2);
  CHECK(p.ToString() == "v0 = max(in0); v1 = sum(exp(sub(in0, v0))) -> out0; out0 = div(out0, v1); out1 = mul(out0, 2)");
  auto kernel = CompileRow(p);
  std::string ir = kiln::codegen::LastRowIR();
  CHECK(ir.find("llvm.vector.reduce.fadd") != std::string::npos);  // the stashing pass still vectorizes
  for (int64_t len : {1, 7, 1001}) {
    const int64_t rows = 45;
    std::vector<float> x = Random(static_cast<size_t>(rows * len), -10, 10, 77), out(x.size()), out2(x.size());
    const float* ins[] = {x.data()};
    float* outs[] = {out.data(), out2.data()};
    kernel->Run(ins, outs, rows, len);
    std::vector<double> ref = RefSoftmax(x, rows, len, false), ref2(ref.size());
    CHECK(Compare(out, ref, 2e-5, 1e-9, "stashed softmax") == 0);
    for (int64_t r = 0; r < rows; ++r) {
      double mx = -INFINITY;
      for (int64_t j = 0; j < len; ++j) mx = std::max<double>(mx, x[r * len + j]);
      for (int64_t j = 0; j < len; ++j) ref2[r * len + j] = 2 * std::exp(x[r * len + j] - mx);
    }
    CHECK(Compare(out2, ref2, 2e-6, 0, "the stash read by another output") == 0);
  }
  p.steps[1].stash = 1;
  p.steps[0].stash = 1;  // two stashes in one output
  CHECK_THROWS_AS(CompileRow(p), kiln::codegen::UnsupportedError);
}

TEST_CASE("row kernel: a per-row step reading the row's elements is refused") {
  RowProgram p;
  p.inputs = {RowProgram::kElement};
  Expr e;
  e.Unary(UnaryFn::kExp, e.Input(0));
  p.AddReduce(RowProgram::kPerRow, e);
  p.AddRowOutput(0);
  CHECK_THROWS_AS(CompileRow(p), kiln::codegen::UnsupportedError);
  RowProgram none;
  CHECK_THROWS_AS(CompileRow(none), kiln::codegen::UnsupportedError);
}
#endif  // KILN_WITH_CODEGEN

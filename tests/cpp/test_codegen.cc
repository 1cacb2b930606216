// codegen/: fused elementwise kernels JIT-compiled through LLVM, checked against a scalar reference
// computed in double: the chain relu(a*b + c) * 0.5 + a, every unary and binary function alone,
// odd lengths (tails of the vector loop, ranges split across threads) and the kernel cache.
// Compiled only when kiln_tests links kiln_codegen (LLVM found): KILN_WITH_CODEGEN.
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "kiln/codegen/elementwise.h"
#include "test_util.h"

namespace {

using kiln::BinaryFn;
using kiln::UnaryFn;
using kiln::codegen::CompileElementwise;
using kiln::codegen::Expr;
using kiln::testing::ScopedEnv;
namespace fs = std::filesystem;

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
  }
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

std::vector<float> Random(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

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

// ---- the disk cache ----------------------------------------------------------------------------
// A kernel stored by one process is loaded by the next: tests/python/test_codegen_cache.py runs
// two processes. Here: what is written, corrupt files, unwritable directories, eviction.

namespace {

/// A fresh, empty directory under the test run's cache directory (tests/cpp/main.cc sets one).
fs::path FreshDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("kiln-cache-test-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// An expression no other test compiles: x * c + 1 for a constant unique to the caller.
Expr Unique(double c) {
  Expr e;
  e.Add(e.Mul(e.Input(0), e.Const(c)), e.Const(1));
  return e;
}

bool Computes(const Expr& e, double c) {
  std::vector<float> x = Random(1001, -2, 2, 9), out(x.size());
  const float* ins[] = {x.data()};
  CompileElementwise(e)->Run(ins, out.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i)
    if (std::fabs(out[i] - static_cast<float>(x[i] * c + 1)) > 1e-5f) return false;
  return true;
}

}  // namespace

TEST_CASE("codegen disk cache: a compiled kernel is written to KILN_CACHE_DIR") {
  fs::path dir = FreshDir("write");
  ScopedEnv env("KILN_CACHE_DIR", dir.string());
  CHECK(kiln::codegen::DiskCacheDir() == dir.string());
  Expr e = Unique(1.0625);
  std::string file = kiln::codegen::DiskCacheFile(e);
  CHECK(fs::path(file).parent_path() == dir);
  auto before = kiln::codegen::GetCodegenStats();
  CHECK(Computes(e, 1.0625));
  auto after = kiln::codegen::GetCodegenStats();
  CHECK(after.compiles == before.compiles + 1);
  CHECK(after.disk_writes == before.disk_writes + 1);
  CHECK(after.disk_hits == before.disk_hits);
  std::string bytes = ReadAll(file);
  CHECK(bytes.rfind("kiln-kernel 1\ntarget llvm ", 0) == 0);
  CHECK(bytes.find("\x7f" "ELF") != std::string::npos);  // the object file follows the header
  // No temporary file is left behind.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) files += entry.path().extension() == ".kobj" ? 1 : 100;
  CHECK(files == 1);
  fs::remove_all(dir);
}

TEST_CASE("codegen disk cache: a corrupt or foreign file is a miss and is rewritten") {
  fs::path dir = FreshDir("corrupt");
  ScopedEnv env("KILN_CACHE_DIR", dir.string());
  for (double c : {2.0625, 3.0625}) {
    Expr e = Unique(c);
    std::string file = kiln::codegen::DiskCacheFile(e);
    // 2.0625: garbage; 3.0625: a valid header whose object was truncated (checksum fails).
    std::string text = c == 2.0625 ? std::string("not a kernel")
                                   : "kiln-kernel 1\ntarget x\nexpr y\nsymbol z\nobject 100 0\nshort";
    std::ofstream(file, std::ios::binary) << text;
    auto before = kiln::codegen::GetCodegenStats();
    CHECK(Computes(e, c));
    auto after = kiln::codegen::GetCodegenStats();
    CHECK(after.compiles == before.compiles + 1);  // compiled, not loaded
    CHECK(after.disk_hits == before.disk_hits);
    CHECK(ReadAll(file).rfind("kiln-kernel 1\ntarget llvm", 0) == 0);  // rewritten
  }
  fs::remove_all(dir);
}

TEST_CASE("codegen disk cache: an unusable directory costs a compile, never an answer") {
  fs::path dir = FreshDir("blocked");
  fs::path blocked = dir / "file";
  std::ofstream(blocked) << "a file where the cache directory should be";
  ScopedEnv env("KILN_CACHE_DIR", blocked.string());
  auto before = kiln::codegen::GetCodegenStats();
  CHECK(Computes(Unique(4.0625), 4.0625));
  auto after = kiln::codegen::GetCodegenStats();
  CHECK(after.compiles == before.compiles + 1);
  CHECK(after.disk_writes == before.disk_writes);
  fs::remove_all(dir);
}

TEST_CASE("codegen disk cache: KILN_CACHE_DIR=off writes nothing") {
  ScopedEnv env("KILN_CACHE_DIR", "off");
  CHECK(kiln::codegen::DiskCacheDir().empty());
  CHECK(kiln::codegen::DiskCacheFile(Unique(5.0625)).empty());
  auto before = kiln::codegen::GetCodegenStats();
  CHECK(Computes(Unique(5.0625), 5.0625));
  CHECK(kiln::codegen::GetCodegenStats().disk_writes == before.disk_writes);
}

TEST_CASE("codegen disk cache: beyond KILN_CACHE_MAX_MB the least recently used files go") {
  fs::path dir = FreshDir("evict");
  ScopedEnv env("KILN_CACHE_DIR", dir.string());
  ScopedEnv bound("KILN_CACHE_MAX_MB", "1");
  // Three old 450 KB files (1.35 MB with the new kernel's: over the bound), the oldest first.
  auto now = fs::file_time_type::clock::now();
  for (int k = 0; k < 3; ++k) {
    fs::path f = dir / ("old" + std::to_string(k) + ".kobj");
    std::ofstream(f, std::ios::binary) << std::string(450 << 10, 'x');
    fs::last_write_time(f, now - std::chrono::hours(10 - k));
  }
  std::ofstream(dir / "notes.txt") << "not a cache file: never deleted";
  Expr e = Unique(6.0625);
  CHECK(Computes(e, 6.0625));
  CHECK(fs::exists(kiln::codegen::DiskCacheFile(e)));  // the newest stays
  CHECK_FALSE(fs::exists(dir / "old0.kobj"));          // the oldest went first
  CHECK_FALSE(fs::exists(dir / "old1.kobj"));          // down to 80% of the bound
  CHECK(fs::exists(dir / "old2.kobj"));
  CHECK(fs::exists(dir / "notes.txt"));
  fs::remove_all(dir);
}
#endif  // KILN_WITH_CODEGEN

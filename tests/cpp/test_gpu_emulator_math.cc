// The kernel emulator on kiln's own GPU kernels: the NVPTX IR GeneratePtx makes PTX of
// (PtxKernel::ir, libdevice linked in), run on the host. Every libdevice function kiln's kernels
// call is compared with double precision over many inputs (the maximum error is reported, in
// float ulps and relative), and the elementwise chain and transcendental kernels of test_ptx.cc
// must give the CPU kernels' numbers.
// Measured once against an H100 (driver 580, CUDA 13's expf, logf, ... over the same kind of
// 100k inputs): log, log1p, expm1, sin, cos and round bit-identical; exp, erf and pow within
// 1 ulp, tanh within 2 (the GPU's ex2.approx and rcp.approx are hardware approximations that the
// emulator computes exactly).
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "kiln/codegen/elementwise.h"
#include "kiln/codegen/gpu_emulator.h"
#include "kiln/codegen/ptx.h"

namespace {

using kiln::BinaryFn;
using kiln::UnaryFn;
using kiln::codegen::Expr;
using kiln::gpusim::Dim3;

/// Runs GeneratePtx(e)'s IR on the emulator over n elements: out = e(ins...).
std::vector<float> Emulate(const Expr& e, const std::vector<const std::vector<float>*>& ins, size_t n,
                           std::string* ir_out = nullptr) {
  kiln::codegen::PtxKernel k = kiln::codegen::GeneratePtx(e, "sm_80");
  REQUIRE(!k.ir.empty());
  if (ir_out) *ir_out = k.ir;
  kiln::codegen::EmulatorOptions opts;
  opts.checked = false;
  auto m = kiln::codegen::CompileEmulatedModule(k.ir, opts);
  kiln::gpusim::EmulatedKernel* kernel = m->Function(k.name);
  REQUIRE(kernel != nullptr);
  std::vector<float> out(n, -7.0f);
  float* po = out.data();
  std::vector<const float*> pin;
  for (const auto* v : ins) pin.push_back(v->data());
  int64_t count = static_cast<int64_t>(n);
  std::vector<void*> args = {&po};
  for (const float*& p : pin) args.push_back(&p);
  args.push_back(&count);
  // Fewer threads than elements: the grid-stride loop covers the rest, as on a GPU.
  auto fault = kernel->Run(Dim3{40, 1, 1}, Dim3{128, 1, 1}, 0, args.data());
  REQUIRE(fault == nullptr);
  return out;
}

/// The distance of `got` from the exact `want` in units of the float spacing at `want`.
double Ulps(float got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0 : 1e9;
  if (std::isinf(want)) return got == static_cast<float>(want) ? 0 : 1e9;
  float w = static_cast<float>(std::abs(want));
  double ulp = std::isinf(w)
                   ? std::ldexp(1.0, 104)
                   : static_cast<double>(std::nextafter(w, std::numeric_limits<float>::infinity())) - w;
  if (ulp == 0 || w < std::numeric_limits<float>::min()) ulp = std::numeric_limits<float>::denorm_min();
  return std::abs(static_cast<double>(got) - want) / ulp;
}

struct MathCase {
  const char* name;
  std::function<int(Expr&, int, int)> build; // the expression of inputs x, y
  std::function<double(double, double)> exact;
  double lo, hi; // x drawn uniformly from [lo, hi] (and a log-uniform spread where lo > 0)
  double ylo = 0, yhi = 0;
  double max_ulps = 4;
};

std::vector<MathCase> Cases() {
  auto un = [](UnaryFn f) { return [f](Expr& e, int x, int) { return e.Unary(f, x); }; };
  return {
      {"exp", un(UnaryFn::kExp), [](double x, double) { return std::exp(x); }, -87, 88},
      {"log", un(UnaryFn::kLog), [](double x, double) { return std::log(x); }, 1e-30, 1e30},
      {"log1p", un(UnaryFn::kLog1p), [](double x, double) { return std::log1p(x); }, -0.999, 1e6},
      {"expm1", un(UnaryFn::kExpm1), [](double x, double) { return std::expm1(x); }, -20, 20},
      {"sin", un(UnaryFn::kSin), [](double x, double) { return std::sin(x); }, -1e4, 1e4},
      // beyond 105615 libdevice reduces the argument with 96-bit products in inline PTX (mad.lo.cc)
      {"sin of large x", un(UnaryFn::kSin), [](double x, double) { return std::sin(x); }, 1e5, 1e30},
      {"cos", un(UnaryFn::kCos), [](double x, double) { return std::cos(x); }, -1e4, 1e4},
      {"tanh", un(UnaryFn::kTanh), [](double x, double) { return std::tanh(x); }, -12, 12},
      {"erf", un(UnaryFn::kErf), [](double x, double) { return std::erf(x); }, -5, 5},
      {"round", un(UnaryFn::kRound), [](double x, double) { return std::round(x); }, -1e3, 1e3, 0, 0, 0},
      {"sqrt", un(UnaryFn::kSqrt), [](double x, double) { return std::sqrt(x); }, 1e-30, 1e30, 0, 0, 0.5},
      {"rsqrt", un(UnaryFn::kRsqrt), [](double x, double) { return 1 / std::sqrt(x); }, 1e-30, 1e30, 0, 0,
       1.5},
      {"reciprocal", un(UnaryFn::kReciprocal), [](double x, double) { return 1 / x; }, -1e3, 1e3, 0, 0, 0.5},
      {"pow", [](Expr& e, int x, int y) { return e.Binary(BinaryFn::kPow, x, y); },
       [](double x, double y) { return std::pow(x, y); }, 1e-3, 30, -8, 8},
  };
}

} // namespace

TEST_CASE("gpu emulator: every libdevice function kiln's kernels use matches double precision") {
  if (kiln::codegen::FindLibdevice().empty()) {
    MESSAGE("no libdevice.10.bc: kiln's GPU kernels with transcendental functions cannot be built here");
    CHECK_THROWS_AS(kiln::codegen::GeneratePtx(
                        [] {
                          Expr e;
                          e.Unary(UnaryFn::kExp, e.Input(0));
                          return e;
                        }(),
                        "sm_80"),
                    kiln::codegen::UnsupportedError);
    return;
  }
  constexpr size_t kN = 100000;
  std::set<std::string> intrinsics;
  for (const MathCase& c : Cases()) {
    CAPTURE(c.name);
    std::mt19937 rng(42);
    std::vector<float> x(kN), y(kN, 0.0f);
    for (size_t i = 0; i < kN; ++i) {
      double u = std::uniform_real_distribution<double>(0, 1)(rng);
      // Half uniform, half log-uniform for positive ranges (small and large magnitudes both).
      x[i] = static_cast<float>(c.lo > 0 && i % 2
                                    ? std::exp(std::log(c.lo) + u * (std::log(c.hi) - std::log(c.lo)))
                                    : c.lo + u * (c.hi - c.lo));
      y[i] = static_cast<float>(c.ylo + std::uniform_real_distribution<double>(0, 1)(rng) * (c.yhi - c.ylo));
    }
    // Edge values: zeros, halves (round), infinities and NaN.
    const float edges[] = {0.0f,
                           -0.0f,
                           0.5f,
                           -0.5f,
                           1.5f,
                           2.5f,
                           -2.5f,
                           1.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
    for (size_t k = 0; k < std::size(edges); ++k) x[k] = edges[k];
    Expr e;
    int in0 = e.Input(0), in1 = c.ylo != c.yhi ? e.Input(1) : -1;
    c.build(e, in0, in1);
    std::string ir;
    std::vector<float> got = in1 >= 0 ? Emulate(e, {&x, &y}, kN, &ir) : Emulate(e, {&x}, kN, &ir);
    static const std::regex nvvm(R"(@llvm\.nvvm\.[a-z0-9.]+)");
    for (auto it = std::sregex_iterator(ir.begin(), ir.end(), nvvm); it != std::sregex_iterator(); ++it)
      intrinsics.insert(it->str());
    double worst_ulps = 0, worst_rel = 0;
    float worst_x = 0;
    for (size_t i = 0; i < kN; ++i) {
      double want = c.exact(x[i], y[i]);
      double u = Ulps(got[i], want);
      if (u > worst_ulps) worst_ulps = u, worst_x = x[i];
      if (std::isfinite(want) && std::abs(want) > 1e-30)
        worst_rel = std::max(worst_rel, std::abs(got[i] - want) / std::abs(want));
    }
    MESSAGE(std::string(c.name) << ": max error " << worst_ulps << " ulp (at x = " << worst_x
                                << "), max relative error " << worst_rel << " over " << kN << " inputs");
    CHECK(worst_ulps <= c.max_ulps);
  }
  std::string names;
  for (const auto& s : intrinsics) names += s + " ";
  MESSAGE("nvvm intrinsics in these kernels, all translated: " << names);
}

TEST_CASE("gpu emulator: kiln's chain and transcendental kernels give the CPU kernels' numbers") {
  Expr chain; // relu(a*b + c) * 0.5 + a
  {
    int a = chain.Input(0), b = chain.Input(1), c = chain.Input(2);
    chain.Add(chain.Mul(chain.Relu(chain.Add(chain.Mul(a, b), c)), chain.Const(0.5)), a);
  }
  Expr trans; // tanh(x) + exp(-x*x) + erf(x) + log1p(|x|) + pow(|x|+1, y) + bias[(i/4)%3]
  {
    int x = trans.Input(0), y = trans.Input(1), bias = trans.InputBroadcast(2, 4, 3);
    int ax = trans.Unary(UnaryFn::kAbs, x);
    int t = trans.Add(trans.Unary(UnaryFn::kTanh, x),
                      trans.Unary(UnaryFn::kExp, trans.Unary(UnaryFn::kNeg, trans.Mul(x, x))));
    t = trans.Add(t, trans.Add(trans.Unary(UnaryFn::kErf, x), trans.Unary(UnaryFn::kLog1p, ax)));
    t = trans.Add(t, trans.Binary(BinaryFn::kPow, trans.Add(ax, trans.Const(1)), y));
    trans.Add(t, bias);
  }
  constexpr size_t kN = 10007; // not a multiple of the block
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-3, 3);
  std::vector<float> a(kN), b(kN), c(3);
  for (float& v : a) v = d(rng);
  for (float& v : b) v = d(rng);
  for (float& v : c) v = d(rng);
  std::vector<float> c_full(kN);
  for (size_t i = 0; i < kN; ++i) c_full[i] = d(rng);
  for (bool transcendental : {false, true}) {
    CAPTURE(transcendental);
    if (transcendental && kiln::codegen::FindLibdevice().empty()) continue; // the test above says so
    const Expr& e = transcendental ? trans : chain;
    const std::vector<float>& third = transcendental ? c : c_full;
    std::vector<float> gpu = Emulate(e, {&a, &b, &third}, kN);
    std::vector<float> cpu(kN);
    const float* ins[] = {a.data(), b.data(), third.data()};
    kiln::codegen::CompileElementwise(e)->Run(ins, cpu.data(), static_cast<int64_t>(kN));
    double worst = 0;
    for (size_t i = 0; i < kN; ++i)
      worst = std::max(worst, std::abs(static_cast<double>(gpu[i]) - cpu[i]) /
                                  std::max(1.0, std::abs(double{cpu[i]})));
    MESSAGE(std::string(transcendental ? "transcendental" : "chain")
            << " kernel: emulated GPU vs CPU max error " << worst);
    CHECK(worst < 2e-6);
  }
}

TEST_CASE("gpu emulator: a kernel's registers are ptxas's count for the same IR's PTX") {
  Expr e;
  e.Add(e.Unary(UnaryFn::kTanh, e.Input(0)), e.Input(1));
  if (kiln::codegen::FindLibdevice().empty()) return; // the libdevice test above says so
  kiln::codegen::PtxKernel k = kiln::codegen::GeneratePtx(e, "sm_80");
  auto m = kiln::codegen::CompileEmulatedModule(k.ir);
  int regs = m->Function(k.name)->attributes().num_regs;
  CHECK(regs >= 4);
  CHECK(regs <= 255);
  std::string ptxas = kiln::codegen::FindPtxas();
  if (ptxas.empty()) {
    MESSAGE("no ptxas: the emulator estimated " << regs << " registers");
    return;
  }
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("kiln-emu-regs-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "k.ptx") << k.ptx;
  std::string cmd = ptxas + " -arch=sm_80 -v " + (dir / "k.ptx").string() + " -o " +
                    (dir / "k.cubin").string() + " > " + (dir / "log").string() + " 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream log(dir / "log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  fs::remove_all(dir);
  std::smatch s;
  REQUIRE(std::regex_search(text, s, std::regex(R"(Used (\d+) registers)")));
  MESSAGE("ptxas -v: " << s[1] << " registers; the emulator's kernel attributes: " << regs);
  CHECK(regs == std::stoi(s[1]));
}

#endif // KILN_WITH_CODEGEN

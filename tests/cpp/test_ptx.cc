// codegen/ PTX: kernels generated through LLVM's NVPTX backend for several GPU architectures,
// assembled with the CUDA toolkit's ptxas when it is installed (no GPU needed), and run on a GPU
// when there is one (kiln::cuda::LoadKernel/LaunchKernel, as an engine task) against the CPU kernels.
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "kiln/codegen/elementwise.h"
#include "kiln/codegen/ptx.h"
#include "kiln/frontend/tensor.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/engine.h"
#include "test_util.h"

namespace {

using kiln::BinaryFn;
using kiln::UnaryFn;
using kiln::codegen::Expr;
using kiln::codegen::GeneratePtx;
namespace fs = std::filesystem;

Expr Chain() {  // relu(a*b + c) * 0.5 + a
  Expr e;
  int a = e.Input(0), b = e.Input(1), c = e.Input(2);
  e.Add(e.Mul(e.Relu(e.Add(e.Mul(a, b), c)), e.Const(0.5)), a);
  return e;
}

Expr Transcendental() {  // tanh(x) + exp(-x*x) + erf(x) + log1p(|x|) + pow(|x|+1, y) + bias[(i/4)%3]
  Expr e;
  int x = e.Input(0), y = e.Input(1), bias = e.InputBroadcast(2, 4, 3);
  int ax = e.Unary(UnaryFn::kAbs, x);
  int t = e.Add(e.Unary(UnaryFn::kTanh, x), e.Unary(UnaryFn::kExp, e.Unary(UnaryFn::kNeg, e.Mul(x, x))));
  t = e.Add(t, e.Add(e.Unary(UnaryFn::kErf, x), e.Unary(UnaryFn::kLog1p, ax)));
  t = e.Add(t, e.Binary(BinaryFn::kPow, e.Add(ax, e.Const(1)), y));
  e.Add(t, bias);
  return e;
}

/// Runs ptxas on `ptx` for `arch`; returns its exit status and messages.
std::pair<int, std::string> Ptxas(const std::string& ptxas, const std::string& ptx, const std::string& arch) {
  fs::path dir = fs::temp_directory_path() / ("kiln-ptx-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "k.ptx") << ptx;
  std::string cmd = ptxas + " -arch=" + arch + " " + (dir / "k.ptx").string() + " -o " + (dir / "k.cubin").string() +
                    " > " + (dir / "log").string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream log(dir / "log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  fs::remove_all(dir);
  return {rc, text};
}

}  // namespace

TEST_CASE("ptx: kernels for sm_75, sm_80 and sm_90 are PTX entries that ptxas accepts") {
  std::string ptxas = kiln::codegen::FindPtxas();
  for (const Expr& e : {Chain(), Transcendental()}) {
    for (std::string arch : {"sm_75", "sm_80", "sm_90"}) {
      CAPTURE(arch);
      CAPTURE(e.ToString());
      if (e.nodes.size() > 10 && kiln::codegen::FindLibdevice().empty()) {
        CHECK_THROWS_WITH_AS(GeneratePtx(e, arch), doctest::Contains("libdevice"), kiln::codegen::UnsupportedError);
        continue;
      }
      kiln::codegen::PtxKernel k = GeneratePtx(e, arch);
      CHECK(k.arch == arch);
      CHECK(k.num_inputs == 3);
      CHECK(k.ptx.find(".target " + arch) != std::string::npos);
      CHECK(k.ptx.find(".visible .entry " + k.name) != std::string::npos);
      CHECK(k.ptx.find("call.uni") == std::string::npos);  // libdevice is inlined, nothing external
      CHECK(k.ptx.find(".extern") == std::string::npos);
      if (ptxas.empty()) continue;
      auto [rc, log] = Ptxas(ptxas, k.ptx, arch);
      CAPTURE(log);
      CHECK(rc == 0);
    }
  }
  if (ptxas.empty()) std::cout << "[kiln-skip] no ptxas (CUDA toolkit) here: PTX generated but not assembled\n";
}

TEST_CASE("ptx: the reduction kernels (sum, max, min) are PTX entries that ptxas accepts") {
  std::string ptxas = kiln::codegen::FindPtxas();
  using kiln::codegen::GpuReduce;
  for (GpuReduce kind : {GpuReduce::kSum, GpuReduce::kMax, GpuReduce::kMin}) {
    for (std::string arch : {"sm_75", "sm_90"}) {
      CAPTURE(arch);
      kiln::codegen::PtxKernel k = kiln::codegen::GenerateReducePtx(kind, arch);
      CHECK(k.ptx.find(".visible .entry " + k.name) != std::string::npos);
      CHECK(k.ptx.find(".shared") != std::string::npos);  // the tree lives in shared memory
      CHECK(k.ptx.find("bar.sync") != std::string::npos);
      CHECK(k.ir.find("nvvm.annotations") != std::string::npos);  // the IR the simulator runs marks the kernel
      CHECK(kiln::codegen::GenerateReducePtx(kind, arch).ptx == k.ptx);  // cached
      if (ptxas.empty()) continue;
      auto [rc, log] = Ptxas(ptxas, k.ptx, arch);
      CAPTURE(log);
      CHECK(rc == 0);
    }
  }
  CHECK_THROWS_AS(kiln::codegen::GenerateReducePtx(GpuReduce::kSum, "sm_12"), kiln::ValueError);
}

TEST_CASE("ptx: an equal expression is generated once, an unknown architecture is a ValueError") {
  auto a = GeneratePtx(Chain(), "sm_80");
  auto b = GeneratePtx(Chain(), "sm_80");
  CHECK(a.ptx == b.ptx);
  CHECK(kiln::testing::Contains(kiln::testing::ErrorOf<kiln::ValueError>([] { GeneratePtx(Chain(), "sm_12"); }),
                                "unknown GPU architecture 'sm_12'; expected one of sm_"));
  Expr bad;
  bad.Unary(static_cast<UnaryFn>(200), bad.Input(0));
  CHECK_THROWS_AS(GeneratePtx(bad, "sm_80"), kiln::codegen::UnsupportedError);
}

// ---- on a GPU: loaded and launched through kiln::cuda (the driver API by entry point) ----

#ifdef KILN_WITH_CUDA
TEST_CASE("ptx: generated kernels run on the GPU as engine tasks and match the CPU kernels") {
  KILN_REQUIRE_GPU();  // a real GPU runs the PTX, a simulated one the NVPTX IR it came from
  const kiln::Device dev = kiln::gpu(0);
  std::string arch = "sm_" + std::to_string(kiln::cuda::ComputeCapability(dev));
  if (kiln::cuda::ComputeCapability(dev) > 90) arch = "sm_90";  // PTX is forward compatible: the driver compiles it
  MESSAGE("ptx: running " << arch << " PTX on " << kiln::cuda::DeviceDescription(dev));
  for (const Expr& e : {Chain(), Transcendental()}) {
    CAPTURE(e.ToString());
    auto k = GeneratePtx(e, arch);
    void* fn = kiln::cuda::LoadKernel(dev, k.ir, k.ptx, k.name);
    CHECK(kiln::cuda::LoadKernel(dev, k.ir, k.ptx, k.name) == fn);  // loaded once
    const int64_t n = 1000003;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-2, 2);
    std::vector<std::vector<float>> ins(3, std::vector<float>(static_cast<size_t>(n)));
    for (auto& v : ins)
      for (float& x : v) x = u(rng);
    std::vector<float> expect(static_cast<size_t>(n));
    const float* ptrs[] = {ins[0].data(), ins[1].data(), ins[2].data()};
    kiln::codegen::CompileElementwise(e)->Run(ptrs, expect.data(), n);
    std::vector<kiln::Tensor> din;
    for (const auto& v : ins) din.push_back(kiln::Tensor::FromVector(v, kiln::Shape({n})).To(dev));
    kiln::Tensor dout = kiln::Tensor::Empty(kiln::Shape({n}), kiln::DType::kFloat32, dev);
    // The launch is a task on the device's compute stream, ordered after the copies by the engine.
    kiln::engine::Var* reads[] = {din[0].storage()->var(), din[1].storage()->var(), din[2].storage()->var()};
    kiln::engine::Var* writes[] = {dout.storage()->var()};
    kiln::engine::TaskOptions o;
    o.device = dev;
    o.stream = kiln::engine::StreamKind::kCompute;
    o.name = "ptx_test_kernel";
    kiln::engine::Engine::Get().Push(
        [fn, din, dout, n] {
          void* out = dout.View().data;
          void* in[3] = {din[0].View().data, din[1].View().data, din[2].View().data};
          int64_t count = n;
          void* args[] = {&out, &in[0], &in[1], &in[2], &count};
          kiln::cuda::LaunchKernel(fn, 256, 256, 0, args);  // fewer threads than n: the grid-stride loop
        },
        reads, writes, o);
    std::vector<float> got = dout.ToVector<float>();
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      bad += !(std::fabs(got[i] - expect[i]) <= 1e-5f + 1e-5f * std::fabs(expect[i]));
    CHECK(bad == 0);
  }
}
#endif  // KILN_WITH_CUDA

#endif  // KILN_WITH_CODEGEN

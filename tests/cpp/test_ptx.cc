// codegen/ PTX: kernels generated through LLVM's NVPTX backend for several GPU architectures,
// assembled with the CUDA toolkit's ptxas when it is installed (no GPU needed), and run on a GPU
// when there is one (through the CUDA driver API, loaded with dlopen) against the CPU kernels.
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>

#include <dlfcn.h>
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

// ---- on a GPU: the CUDA driver API, loaded at run time (no link-time dependency on libcuda) ----

namespace {

struct Driver {
  using CUresult = int;
  using CUdevice = int;
  using CUcontext = void*;
  using CUmodule = void*;
  using CUfunction = void*;
  using CUdeviceptr = unsigned long long;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             void*, void**, void**) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;

  bool Load() {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    auto sym = [&](auto& f, const char* a, const char* b = nullptr) {
      void* p = dlsym(h, a);
      if (!p && b) p = dlsym(h, b);
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(p);
      return p != nullptr;
    };
    return sym(cuInit, "cuInit") && sym(cuDeviceGet, "cuDeviceGet") &&
           sym(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") && sym(cuCtxSetCurrent, "cuCtxSetCurrent") &&
           sym(cuModuleLoadData, "cuModuleLoadData") && sym(cuModuleGetFunction, "cuModuleGetFunction") &&
           sym(cuMemAlloc, "cuMemAlloc_v2", "cuMemAlloc") && sym(cuMemFree, "cuMemFree_v2", "cuMemFree") &&
           sym(cuMemcpyHtoD, "cuMemcpyHtoD_v2", "cuMemcpyHtoD") && sym(cuMemcpyDtoH, "cuMemcpyDtoH_v2", "cuMemcpyDtoH") &&
           sym(cuLaunchKernel, "cuLaunchKernel") && sym(cuCtxSynchronize, "cuCtxSynchronize") &&
           sym(cuDeviceGetAttribute, "cuDeviceGetAttribute");
  }
};

}  // namespace

TEST_CASE("ptx: generated kernels run on the GPU and match the CPU kernels") {
  KILN_REQUIRE_GPU();
  Driver d;
  REQUIRE(d.Load());
  REQUIRE(d.cuInit(0) == 0);
  Driver::CUdevice dev = 0;
  REQUIRE(d.cuDeviceGet(&dev, 0) == 0);
  int major = 0, minor = 0;
  d.cuDeviceGetAttribute(&major, 75, dev);  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
  d.cuDeviceGetAttribute(&minor, 76, dev);
  std::string arch = "sm_" + std::to_string(major * 10 + minor);
  if (major * 10 + minor > 90) arch = "sm_90";  // PTX is forward compatible: the driver compiles it
  Driver::CUcontext ctx = nullptr;
  REQUIRE(d.cuDevicePrimaryCtxRetain(&ctx, dev) == 0);
  REQUIRE(d.cuCtxSetCurrent(ctx) == 0);
  for (const Expr& e : {Chain(), Transcendental()}) {
    CAPTURE(e.ToString());
    auto k = GeneratePtx(e, arch);
    Driver::CUmodule mod = nullptr;
    Driver::CUfunction fn = nullptr;
    REQUIRE(d.cuModuleLoadData(&mod, k.ptx.c_str()) == 0);
    REQUIRE(d.cuModuleGetFunction(&fn, mod, k.name.c_str()) == 0);
    const int64_t n = 1000003;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-2, 2);
    std::vector<std::vector<float>> ins(3, std::vector<float>(static_cast<size_t>(n)));
    for (auto& v : ins)
      for (float& x : v) x = u(rng);
    std::vector<float> expect(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    const float* ptrs[] = {ins[0].data(), ins[1].data(), ins[2].data()};
    kiln::codegen::CompileElementwise(e)->Run(ptrs, expect.data(), n);
    Driver::CUdeviceptr dout = 0, din[3] = {};
    REQUIRE(d.cuMemAlloc(&dout, n * sizeof(float)) == 0);
    for (int j = 0; j < 3; ++j) {
      REQUIRE(d.cuMemAlloc(&din[j], n * sizeof(float)) == 0);
      REQUIRE(d.cuMemcpyHtoD(din[j], ins[static_cast<size_t>(j)].data(), n * sizeof(float)) == 0);
    }
    int64_t count = n;
    void* args[] = {&dout, &din[0], &din[1], &din[2], &count};
    REQUIRE(d.cuLaunchKernel(fn, 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr) == 0);  // fewer threads than n
    REQUIRE(d.cuCtxSynchronize() == 0);
    REQUIRE(d.cuMemcpyDtoH(got.data(), dout, n * sizeof(float)) == 0);
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      bad += !(std::fabs(got[i] - expect[i]) <= 1e-5f + 1e-5f * std::fabs(expect[i]));
    CHECK(bad == 0);
    d.cuMemFree(dout);
    for (auto p : din) d.cuMemFree(p);
  }
}
#endif  // KILN_WITH_CODEGEN

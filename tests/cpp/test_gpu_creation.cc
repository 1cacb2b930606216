// GPU kernels of the creation ops (codegen/gpu_kernels_creation.cc, hand-written in
// codegen/cu/creation.cu): random draws from the CPU's counter-based stream give the same numbers
// on a GPU as on the CPU for one seed (float64 normals to the last bit or so: libdevice's
// transcendental functions are not glibc's); arange matches; the hand-written modules are PTX that
// ptxas accepts.
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "kiln/codegen/cu_modules.h"
#include "kiln/codegen/ptx.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/tensor.h"
#include "kiln/runtime/error.h"
#include "test_util.h"

namespace {

using namespace kiln;

/// Draws the same sequence of ops on `dev` after seeding with `seed`, as float64 host vectors.
std::vector<std::vector<double>> Draws(Device dev, uint64_t seed, DType dt) {
  nd::random::seed(seed);
  std::vector<Tensor> t = {
      nd::random::uniform(-2, 3, Shape({1001}), dt, dev),  // not a multiple of 4: a partial block
      nd::random::normal(1, 2, Shape({3, 333}), dt, dev),
      nd::random::bernoulli(0.3, Shape({77}), dt, dev),
      nd::random::uniform(0, 1, Shape({0}), dt, dev),  // empty: draws nothing
      nd::random::normal(0, 1, Shape({6}), dt, dev),
  };
  std::vector<std::vector<double>> out;
  for (const Tensor& x : t) out.push_back(nd::cast(x.To(cpu()), DType::kFloat64).ToVector<double>());
  return out;
}

}  // namespace

TEST_CASE("gpu: one seed gives the same random numbers on a GPU as on the CPU") {
  KILN_REQUIRE_GPU();
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    CAPTURE(std::string(DTypeName(dt)));
    auto cpu_draws = Draws(cpu(), 1234, dt);
    auto gpu_draws = Draws(gpu(0), 1234, dt);
    REQUIRE(cpu_draws.size() == gpu_draws.size());
    for (size_t k = 0; k < cpu_draws.size(); ++k) {
      CAPTURE(k);
      REQUIRE(gpu_draws[k].size() == cpu_draws[k].size());
      if (dt != DType::kFloat64) {
        CHECK(gpu_draws[k] == cpu_draws[k]);  // bit for bit
        continue;
      }
      // float64 normals: libdevice's log, sin and cos and glibc's may differ in the last bit.
      for (size_t i = 0; i < cpu_draws[k].size(); ++i)
        REQUIRE(std::fabs(gpu_draws[k][i] - cpu_draws[k][i]) <= 1e-14 * (1 + std::fabs(cpu_draws[k][i])));
    }
    if (NumGPUs() > 1) CHECK(Draws(gpu(1), 1234, dt) == gpu_draws);  // every GPU draws the same stream
    CHECK(Draws(gpu(0), 99, dt)[0] != gpu_draws[0]);  // another seed, other numbers
  }
  for (DType dt : {DType::kInt32, DType::kUInt8, DType::kBool}) {  // bernoulli takes every dtype
    CAPTURE(std::string(DTypeName(dt)));
    nd::random::seed(5);
    auto c = nd::cast(nd::random::bernoulli(0.4, Shape({301}), dt, cpu()), DType::kFloat64).ToVector<double>();
    nd::random::seed(5);
    auto g = nd::cast(nd::random::bernoulli(0.4, Shape({301}), dt, gpu(0)).To(cpu()), DType::kFloat64).ToVector<double>();
    CHECK(g == c);
  }
}

TEST_CASE("gpu: random draws on a GPU keep their ranges and refuse what the CPU refuses") {
  KILN_REQUIRE_GPU();
  nd::random::seed(5);
  std::vector<float> u = nd::random::uniform(0.5, 0.75, Shape({4096}), DType::kFloat32, gpu(0)).ToVector<float>();
  for (float x : u) REQUIRE((x >= 0.5f && x < 0.75f));
  std::vector<float> b = nd::random::bernoulli(1.0, Shape({33}), DType::kFloat32, gpu(0)).ToVector<float>();
  CHECK(b == std::vector<float>(33, 1.0f));
  CHECK(testing::Has(testing::ErrorOf<ValueError>([] { nd::random::bernoulli(1.5, Shape({4}), DType::kFloat32, gpu(0)).ToVector<float>(); }),
                     "p must be in [0, 1]"));
  std::string e = testing::ErrorOf<DTypeError>([] { nd::random::uniform(0, 1, Shape({4}), DType::kInt32, gpu(0)); });
  CHECK(testing::Has(e, "int32"));
}

TEST_CASE("gpu: arange on a GPU equals the CPU's, for each dtype") {
  KILN_REQUIRE_GPU();
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kInt64,
                   DType::kUInt8}) {
    CAPTURE(std::string(DTypeName(dt)));
    for (auto [start, stop, step] : {std::tuple{0.0, 10.0, 1.0}, {3.0, 50.0, 0.7}, {5.0, -5.0, -1.5}, {0.0, 0.0, 1.0}}) {
      if (dt == DType::kUInt8 && stop < 0) continue;  // a negative value converts to uint8 undefined in C++
      auto c = nd::cast(nd::arange(start, stop, step, dt, cpu()), DType::kFloat64).ToVector<double>();
      auto g = nd::cast(nd::arange(start, stop, step, dt, gpu(0)).To(cpu()), DType::kFloat64).ToVector<double>();
      CHECK(g == c);
    }
  }
}

TEST_CASE("ptx: the hand-written GPU kernels (codegen/cu) are built in and are PTX that ptxas accepts") {
  std::span<const codegen::CuModule> modules = codegen::CuModules();
  REQUIRE(codegen::FindCuModule("creation") != nullptr);  // install-deps installs clang-19
  CHECK(codegen::FindCuModule("no such module") == nullptr);
  const std::string ptxas = codegen::FindPtxas();
  if (ptxas.empty()) {
    MESSAGE("ptx: no ptxas (CUDA toolkit) here: the modules' PTX was not assembled");
    return;
  }
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("kiln-cu-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const codegen::CuModule& m : modules) {
    CAPTURE(m.name);
    CHECK(std::string(m.ir).find("target triple = \"nvptx64-nvidia-cuda\"") != std::string::npos);
    std::ofstream(dir / "m.ptx") << m.ptx;
    for (const char* arch : {"sm_80", "sm_90"}) {
      std::string cmd = ptxas + " -arch=" + arch + " " + (dir / "m.ptx").string() + " -o " + (dir / "m.cubin").string() +
                        " > " + (dir / "log").string() + " 2>&1";
      CHECK_MESSAGE(std::system(cmd.c_str()) == 0, "ptxas -arch=" << arch << " refused codegen/cu/" << m.name << ".cu");
    }
  }
  fs::remove_all(dir);
}

#endif  // KILN_WITH_CODEGEN

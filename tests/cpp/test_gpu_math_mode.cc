// The float32 math policy of GPU convolutions and matmuls (kiln/runtime/math_mode.h), as PyTorch's:
// convolutions may use TF32 tensor cores by default, matmuls stay in full float32; the switches
// and the override change what cuDNN and cuBLAS are asked for. On simulated GPUs TF32 rounds the
// inputs' mantissas to 10 bits, as tensor cores read them, so the choice shows in the numbers.
// (The test runner sets KILN_CONV_TF32=0 for the other tests: tests/cpp/main.cc.)
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/tensor.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/math_mode.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// An environment variable unset for the life of the object (the switch's default shows).
class ScopedUnset {
 public:
  explicit ScopedUnset(const char* name) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    unsetenv(name);
  }
  ~ScopedUnset() {
    if (old_) setenv(name_, old_->c_str(), 1);
  }
  ScopedUnset(const ScopedUnset&) = delete;
  ScopedUnset& operator=(const ScopedUnset&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// An override of SetTf32 for the life of the object.
struct ScopedTf32 {
  gpurt::MathOp op;
  ScopedTf32(gpurt::MathOp op, int allowed) : op(op) { gpurt::SetTf32(op, allowed); }
  ~ScopedTf32() { gpurt::SetTf32(op, -1); }
};

float Tf32(float f) {  // the mantissa rounded to its top 10 bits, to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0xfffu + ((u >> 13) & 1u);
  u &= ~0x1fffu;
  std::memcpy(&f, &u, 4);
  return f;
}

Tensor RoundedTf32(const Tensor& t) {
  std::vector<float> v = t.ToVector<float>();
  for (float& f : v) f = Tf32(f);
  return Tensor::FromVector(v, t.shape());
}

double WorstRelative(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0, scale = 0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / scale);
  return worst;
}

}  // namespace

TEST_CASE("gpu math mode: convolutions may use TF32 by default, matmuls may not, as PyTorch's defaults") {
  ScopedUnset conv("KILN_CONV_TF32"), matmul("KILN_MATMUL_TF32");
  CHECK(gpurt::Tf32Allowed(gpurt::MathOp::kConv));
  CHECK_FALSE(gpurt::Tf32Allowed(gpurt::MathOp::kMatmul));
  {
    ScopedEnv off("KILN_CONV_TF32", "0"), on("KILN_MATMUL_TF32", "1");
    CHECK_FALSE(gpurt::Tf32Allowed(gpurt::MathOp::kConv));
    CHECK(gpurt::Tf32Allowed(gpurt::MathOp::kMatmul));
    // the override beats the environment, and -1 gives it back
    ScopedTf32 c(gpurt::MathOp::kConv, 1);
    CHECK(gpurt::Tf32Allowed(gpurt::MathOp::kConv));
    gpurt::SetTf32(gpurt::MathOp::kConv, -1);
    CHECK_FALSE(gpurt::Tf32Allowed(gpurt::MathOp::kConv));
  }
  ScopedEnv bad("KILN_CONV_TF32", "yes");
  CHECK_THROWS_AS(gpurt::Tf32Allowed(gpurt::MathOp::kConv), ValueError);
  ScopedEnv two("KILN_CONV_TF32", "2");
  CHECK_THROWS_WITH_AS(gpurt::Tf32Allowed(gpurt::MathOp::kConv), doctest::Contains("KILN_CONV_TF32=2: expected 0"),
                       ValueError);
}

TEST_CASE("gpu math mode: a TF32 convolution reads its inputs as tensor cores do, and float32 matches the CPU") {
  KILN_REQUIRE_GPU();
  nd::random::seed(5);
  Tensor x = nd::random::normal(0, 1, {2, 8, 9, 9}), w = nd::random::normal(0, 0.3, {6, 8, 3, 3});
  nd::Conv2dOptions o;
  o.padding = {1, 1};
  const std::vector<float> cpu_full = nd::conv2d(x, w, Tensor(), o).ToVector<float>();
  const std::vector<float> cpu_rounded = nd::conv2d(RoundedTf32(x), RoundedTf32(w), Tensor(), o).ToVector<float>();
  auto on_gpu = [&] { return nd::conv2d(x.To(gpu(0)), w.To(gpu(0)), Tensor(), o).ToVector<float>(); };
  std::vector<float> strict, tf32;
  {
    ScopedTf32 m(gpurt::MathOp::kConv, 0);
    strict = on_gpu();
  }
  {
    ScopedTf32 m(gpurt::MathOp::kConv, 1);
    tf32 = on_gpu();
  }
  CHECK(WorstRelative(strict, cpu_full) < 1e-5);
  const double tf32_err = WorstRelative(tf32, cpu_full);
  MESSAGE("worst relative error against float32 on the CPU: float32 " << WorstRelative(strict, cpu_full)
                                                                       << ", TF32 " << tf32_err);
  CHECK(tf32_err < 5e-3);
  if (std::string(gpurt::Get().Name()) != "cuda") {  // the simulator: exactly the rounded inputs' convolution
    CHECK(tf32_err > 1e-5);
    CHECK(WorstRelative(tf32, cpu_rounded) < 1e-5);
  }
}

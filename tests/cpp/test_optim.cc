// Fused optimizer updates (frontend/optim.cc) against a plain scalar reference over several steps,
// with parameters small and large (a chunk of the flat range spans several of them), plus the
// argument errors and the one-task-per-call contract.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "gpu_skip.h"
#include "test_util.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/optim.h"
#include "kiln/runtime/engine.h"

using namespace kiln;

namespace {
using kiln::testing::ErrorOf;
using kiln::testing::Has;
using kiln::testing::Contains;


// Sizes chosen so one ParallelFor chunk covers several parameters and one parameter several chunks.
const std::vector<int64_t> kSizes = {3, 1, 70001, 0, 17};

std::vector<double> Random(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

template <class T>
std::vector<Tensor> ToTensors(const std::vector<std::vector<double>>& vs, Device dev = cpu()) {
  std::vector<Tensor> out;
  for (const auto& v : vs)
    out.push_back(
        Tensor::FromVector(std::vector<T>(v.begin(), v.end()), Shape({static_cast<int64_t>(v.size())})).To(dev));
  return out;
}

// Largest difference between tensors and reference values, relative to 1 + |reference|.
double MaxDiff(const std::vector<Tensor>& ts, const std::vector<std::vector<double>>& ref) {
  double worst = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    std::vector<double> got = ts[i].ToVector<double>();
    for (size_t k = 0; k < got.size(); ++k)
      worst = std::max(worst, std::abs(got[k] - ref[i][k]) / (1 + std::abs(ref[i][k])));
  }
  return worst;
}

// Weights and gradients for `steps` steps, rounded to T so that the reference starts from the
// kernel's inputs; states start at zero.
template <class T>
struct Problem {
  std::vector<std::vector<double>> w, m, v;
  std::vector<std::vector<std::vector<double>>> grads;  // [step][param][k]
  explicit Problem(int steps) {
    std::mt19937 rng(7);
    for (int64_t n : kSizes) {
      w.push_back(Random(n, rng));
      m.emplace_back(n, 0.0), v.emplace_back(n, 0.0);
    }
    for (int s = 0; s < steps; ++s) {
      grads.emplace_back();
      for (int64_t n : kSizes) {
        grads.back().push_back(Random(n, rng));
        for (double& g : grads.back().back()) g *= 3;  // some beyond the clip bound
      }
    }
    for (auto& x : w) Round(x);
    for (auto& step : grads)
      for (auto& x : step) Round(x);
  }
  static void Round(std::vector<double>& x) {
    for (double& e : x) e = static_cast<T>(e);
  }
};

double Clip(double g, double c) { return c > 0 ? std::min(std::max(g, -c), c) : g; }

template <class T>
void CheckSGD(double momentum, double clip, Device dev = cpu()) {
  const int steps = 4;
  Problem<T> p(steps);
  optim::SGDOptions o;
  o.lr = 0.1, o.momentum = momentum, o.wd = 0.01, o.rescale_grad = 0.5, o.clip_gradient = clip;
  o.lr_mult = {1, 2, 0.5, 1, 0}, o.wd_mult = {1, 0, 3, 1, 1};
  std::vector<Tensor> w = ToTensors<T>(p.w, dev), m = ToTensors<T>(p.m, dev);
  for (int s = 0; s < steps; ++s) {
    std::vector<Tensor> g = ToTensors<T>(p.grads[s], dev);
    optim::SGDUpdate(w, g, momentum != 0 ? std::span<const Tensor>(m) : std::span<const Tensor>(), o);
    for (size_t i = 0; i < kSizes.size(); ++i)
      for (int64_t k = 0; k < kSizes[i]; ++k) {
        double lr = o.lr * o.lr_mult[i], wd = o.wd * o.wd_mult[i];
        double gk = Clip(o.rescale_grad * p.grads[s][i][k], clip) + wd * p.w[i][k];
        if (momentum != 0) {
          p.m[i][k] = momentum * p.m[i][k] - lr * gk;
          p.w[i][k] += p.m[i][k];
        } else {
          p.w[i][k] -= lr * gk;
        }
      }
  }
  double tol = std::is_same_v<T, float> ? 1e-6 : 1e-13;
  CHECK(MaxDiff(w, p.w) < tol);
  if (momentum != 0) CHECK(MaxDiff(m, p.m) < tol);
}

template <class T>
void CheckAdam(bool decoupled, double clip, Device dev = cpu()) {
  const int steps = 5;
  Problem<T> p(steps);
  optim::AdamOptions o;
  o.lr = 0.01, o.wd = 0.1, o.rescale_grad = 0.5, o.clip_gradient = clip, o.decoupled = decoupled;
  o.lr_mult = {1, 2, 0.5, 1, 0}, o.wd_mult = {1, 0, 3, 1, 1};
  std::vector<Tensor> w = ToTensors<T>(p.w, dev), m = ToTensors<T>(p.m, dev), v = ToTensors<T>(p.v, dev);
  for (int s = 0; s < steps; ++s) {
    o.t = s + 1;
    std::vector<Tensor> g = ToTensors<T>(p.grads[s], dev);
    optim::AdamUpdate(w, g, m, v, o);
    double bc1 = 1 - std::pow(o.beta1, o.t), bc2 = 1 - std::pow(o.beta2, o.t);
    for (size_t i = 0; i < kSizes.size(); ++i)
      for (int64_t k = 0; k < kSizes[i]; ++k) {
        double lr = o.lr * o.lr_mult[i], wd = o.wd * o.wd_mult[i];
        double& wk = p.w[i][k];
        double gk = decoupled ? Clip(o.rescale_grad * p.grads[s][i][k], clip)
                              : Clip(o.rescale_grad * p.grads[s][i][k] + wd * wk, clip);
        double& mk = p.m[i][k];
        double& vk = p.v[i][k];
        mk = o.beta1 * mk + (1 - o.beta1) * gk;
        vk = o.beta2 * vk + (1 - o.beta2) * gk * gk;
        if (decoupled) wk -= lr * wd * wk;
        wk -= lr * (mk / bc1) / (std::sqrt(vk / bc2) + o.epsilon);
      }
  }
  double tol = std::is_same_v<T, float> ? 1e-6 : 1e-13;
  CHECK(MaxDiff(w, p.w) < tol);
  CHECK(MaxDiff(m, p.m) < tol);
  CHECK(MaxDiff(v, p.v) < tol);
}

}  // namespace

TEST_CASE("optim: SGD without momentum matches the scalar reference over several steps") {
  CheckSGD<float>(0, -1);
  CheckSGD<float>(0, 0.4);
  CheckSGD<double>(0, 0.4);
}

TEST_CASE("optim: SGD with momentum matches MXNet's formulation over several steps") {
  CheckSGD<float>(0.9, -1);
  CheckSGD<float>(0.9, 0.4);
  CheckSGD<double>(0.9, -1);
}

TEST_CASE("optim: Adam matches the scalar reference with bias correction over several steps") {
  CheckAdam<float>(false, -1);
  CheckAdam<float>(false, 0.3);
  CheckAdam<double>(false, 0.3);
}

TEST_CASE("optim: AdamW decays weights decoupled from the gradient") {
  CheckAdam<float>(true, -1);
  CheckAdam<double>(true, 0.3);
}

TEST_CASE("optim: one engine task per call whatever the number of parameters") {
  std::vector<Tensor> w, g, m;
  for (int i = 0; i < 20; ++i)
    w.push_back(nd::ones({4, 3})), g.push_back(nd::ones({4, 3})), m.push_back(nd::zeros({4, 3}));
  engine::Engine& e = engine::Engine::Get();
  e.WaitForAll();
  int64_t before = e.Stats().pushed;
  optim::SGDOptions o;
  o.momentum = 0.9;
  optim::SGDUpdate(w, g, m, o);
  optim::SGDUpdate({}, {}, {}, o);  // nothing to do: nothing queued
  CHECK(e.Stats().pushed - before == 1);
  CHECK(w[19].ToVector<float>()[0] == doctest::Approx(1 - 0.01));
}

TEST_CASE("optim: mismatched arguments are typed errors naming the parameter") {
  std::vector<Tensor> w = {nd::ones({2}), nd::ones({3})};
  optim::SGDOptions o;
  optim::AdamOptions a;
  SUBCASE("shape") {
    std::vector<Tensor> g = {nd::ones({2}), nd::ones({4})};
    std::string msg = ErrorOf<ShapeError>([&] { optim::SGDUpdate(w, g, {}, o); });
    CHECK(Has(msg, "sgd_update"));
    CHECK(Has(msg, "parameter 1"));
    CHECK(Has(msg, "(4,)"));
    CHECK(Has(msg, "(3,)"));
  }
  SUBCASE("dtype") {
    std::vector<Tensor> g = {nd::ones({2}), nd::ones({3}, DType::kFloat64)};
    std::string msg = ErrorOf<DTypeError>([&] { optim::AdamUpdate(w, g, w, w, a); });
    CHECK(Has(msg, "adam_update"));
    CHECK(Has(msg, "parameter 1"));
    CHECK(Has(msg, "float64"));
    std::vector<Tensor> wi = {nd::ones({2}, DType::kInt32)};
    msg = ErrorOf<DTypeError>([&] { optim::SGDUpdate(wi, wi, {}, o); });
    CHECK(Has(msg, "int32"));
  }
  SUBCASE("device") {
    std::vector<Tensor> g = {nd::ones({2}), nd::ones({3}, DType::kFloat32, cpu(1))};
    std::string msg = ErrorOf<DeviceError>([&] { optim::SGDUpdate(w, g, {}, o); });
    CHECK(Has(msg, "parameter 1"));
    CHECK(Has(msg, "cpu(1)"));
  }
  SUBCASE("layout and counts") {
    std::vector<Tensor> wt = {nd::transpose(nd::ones({2, 3}))}, gt = {nd::ones({3, 2})};
    CHECK(Has(ErrorOf<ValueError>([&] { optim::SGDUpdate(wt, gt, {}, o); }), "not contiguous"));
    std::string msg = ErrorOf<ValueError>([&] { optim::SGDUpdate(w, std::span(w).first(1), {}, o); });
    CHECK(Has(msg, "2 weights but 1 gradient"));
    o.momentum = 0.9;
    CHECK(Has(ErrorOf<ValueError>([&] { optim::SGDUpdate(w, w, {}, o); }), "momentum"));
    o.momentum = 0, o.lr_mult = {1};
    CHECK(Has(ErrorOf<ValueError>([&] { optim::SGDUpdate(w, w, {}, o); }), "lr_mult"));
    std::vector<Tensor> same = {w[0], w[0]};
    o.lr_mult = {};
    CHECK(Has(ErrorOf<ValueError>([&] { optim::SGDUpdate(same, same, {}, o); }), "same array"));
    a.t = 0;
    CHECK(Has(ErrorOf<ValueError>([&] { optim::AdamUpdate(w, w, w, w, a); }), "step"));
  }
}

TEST_CASE("optim: GPU updates (SGD, momentum, Adam, AdamW) match the scalar reference") {
  KILN_REQUIRE_GPU();
  for (Device dev : {gpu(0), gpu(NumGPUs() - 1)}) {
    CAPTURE(dev.str());
    CheckSGD<float>(0, 0.4, dev);
    CheckSGD<float>(0.9, -1, dev);
    CheckSGD<double>(0.9, 0.4, dev);
    CheckAdam<float>(false, 0.3, dev);
    CheckAdam<float>(true, -1, dev);
    CheckAdam<double>(true, 0.3, dev);
  }
}

TEST_CASE("optim: GPU updates are one engine task per call, and parameters must share the GPU") {
  KILN_REQUIRE_GPU();
  std::vector<Tensor> w, g, m;
  for (int i = 0; i < 20; ++i)
    w.push_back(nd::ones({4, 3}, DType::kFloat32, gpu(0))), g.push_back(nd::ones({4, 3}, DType::kFloat32, gpu(0))),
        m.push_back(nd::zeros({4, 3}, DType::kFloat32, gpu(0)));
  engine::Engine& e = engine::Engine::Get();
  e.WaitForAll();
  int64_t before = e.Stats().pushed;
  optim::SGDOptions o;
  o.momentum = 0.9;
  optim::SGDUpdate(w, g, m, o);
  CHECK(e.Stats().pushed - before == 1);
  CHECK(w[19].ToVector<float>()[0] == doctest::Approx(1 - 0.01));
  std::vector<Tensor> mixed = {w[0], nd::ones({4, 3})};
  std::string msg = ErrorOf<DeviceError>([&] { optim::SGDUpdate(mixed, mixed, {}, optim::SGDOptions{}); });
  CHECK(Has(msg, "cpu(0)"));
  CHECK(Has(msg, "gpu(0)"));
}

// Batch norm in training mode on a GPU (runtime/gpu_kernels_dnn.cc: batch_norm_train and its
// gradient on cuDNN's spatial batch norm): the GPU's y, mean, inv_std, dx, dgamma and dbeta equal
// the CPU kernel's for (N, C, H, W) and (N, C) data, N = 1 and C = 1 included; nd::batch_norm's
// running statistics, output and gradients after one step through the op equal those of its
// composite (which runs for the same values viewed as (N, C, H*W)); float16 is refused with a
// DTypeError, and float64 (which the GPU kernel does not take) runs the composite.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/tensor.h"
#include "kiln/runtime/error.h"

namespace {

using namespace kiln;

std::vector<float> Values(int64_t n, double lo, double hi, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (float& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<float>(lo + (hi - lo) * static_cast<double>(s >> 11) / 9007199254740992.0);
  }
  return v;
}

std::vector<double> F64(const Tensor& t) { return nd::cast(t.To(cpu()), DType::kFloat64).ToVector<double>(); }

// |got - want| <= tol (1 + |want|) + rounding[i]: `rounding` (empty: none) is float32's rounding
// error of a value computed from much larger terms, which no fixed tolerance covers.
void CheckClose(const Tensor& got, const Tensor& want, double tol, const std::string& what,
                const std::vector<double>& rounding = {}) {
  CAPTURE(what);
  REQUIRE(got.shape() == want.shape());
  std::vector<double> g = F64(got), w = F64(want);
  for (size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    REQUIRE(std::fabs(g[i] - w[i]) <= tol * (1.0 + std::fabs(w[i])) + (rounding.empty() ? 0.0 : rounding[i]));
  }
}

// Float32 rounding allowances of the GPU's batch norm against the CPU's, from the CPU's values.
// cuDNN may fold y = x * (gamma inv_std) + (beta - mean gamma inv_std) and compute the variance
// another way. Where a channel has one value (N = 1, H = W = 1) its variance is 0 and inv_std is
// 1/sqrt(eps) = 316: x - mean is 0 on the CPU but a rounding error times 316 on the GPU (seen on
// an H200: 3.2e-5 in y), and the variance's rounding error moves inv_std by a relative
// 2u mean(x^2) / (var + eps). u is float32's unit roundoff, 2^-24; each term gets a factor 8.
struct Rounding {
  std::vector<double> y, inv_std, dx, dgamma;
};
Rounding BatchNormRounding(const Shape& s, const Tensor& x, const Tensor& gamma, const Tensor& dy, const Tensor& mean,
                           const Tensor& inv_std) {
  const double u = std::ldexp(1.0, -24);
  const int64_t C = s[1], inner = s.numel() / (s[0] * C);
  const std::vector<double> xv = F64(x), gv = F64(gamma), dyv = F64(dy), mv = F64(mean), iv = F64(inv_std);
  auto channel = [&](size_t i) { return static_cast<size_t>((static_cast<int64_t>(i) / inner) % C); };
  std::vector<double> mean_sq(static_cast<size_t>(C)), max_dy(static_cast<size_t>(C)), max_xhat(static_cast<size_t>(C));
  Rounding r;
  r.dgamma.assign(static_cast<size_t>(C), 0.0);
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t c = channel(i);
    mean_sq[c] += xv[i] * xv[i] * static_cast<double>(C) / static_cast<double>(xv.size());
    max_dy[c] = std::max(max_dy[c], std::fabs(dyv[i]));
    max_xhat[c] = std::max(max_xhat[c], std::fabs(xv[i] - mv[c]) * iv[c]);
    r.dgamma[c] += 4 * u * iv[c] * std::fabs(dyv[i]) * (std::fabs(xv[i]) + std::fabs(mv[c]));
  }
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t c = channel(i);
    const double scale = std::fabs(gv[c]) * iv[c];
    r.y.push_back(8 * u * scale * (std::fabs(xv[i]) + std::fabs(mv[c])));
    r.dx.push_back(8 * u * scale * (std::fabs(dyv[i]) + max_dy[c] * (1 + max_xhat[c])));
  }
  for (int64_t c = 0; c < C; ++c) {
    const double inv = iv[static_cast<size_t>(c)];
    r.inv_std.push_back(8 * u * mean_sq[static_cast<size_t>(c)] * inv * inv * inv);
  }
  return r;
}

const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> s = {Shape{4, 3, 5, 6}, Shape{1, 4, 3, 3},  Shape{5, 1, 2, 3},
                                       Shape{2, 8, 1, 1}, Shape{16, 5},       Shape{7, 1},
                                       Shape{1, 6}};
  return s;
}

}  // namespace

TEST_CASE("gpu: batch_norm_train and its gradient on a GPU equal the CPU's") {
  KILN_REQUIRE_GPU();
  uint64_t seed = 1;
  for (const Shape& s : Shapes()) {
    CAPTURE(s.str());
    const int64_t C = s[1];
    Tensor x = Tensor::FromVector(Values(s.numel(), 1.0, 3.0, seed++), s);
    Tensor gamma = Tensor::FromVector(Values(C, 0.5, 1.5, seed++), Shape{C});
    Tensor beta = Tensor::FromVector(Values(C, -1.0, 1.0, seed++), Shape{C});
    Tensor dy = Tensor::FromVector(Values(s.numel(), -1.0, 1.0, seed++), s);
    const ir::Attrs attrs = {{"axis", int64_t{1}}, {"eps", 1e-5}};
    Tensor cin[3] = {x, gamma, beta}, gin[3] = {x.To(gpu(0)), gamma.To(gpu(0)), beta.To(gpu(0))};
    std::vector<Tensor> c = Invoke(op::kBatchNormTrain, cin, attrs);
    std::vector<Tensor> g = Invoke(op::kBatchNormTrain, gin, attrs);
    REQUIRE(g.size() == 3);
    CHECK(g[0].device() == gpu(0));
    // (1, 6) has one value per channel (MXNet takes it; PyTorch refuses it in training).
    const Rounding r = BatchNormRounding(s, x, gamma, dy, c[1], c[2]);
    CheckClose(g[0], c[0], 1e-5, "y", r.y);
    CheckClose(g[1], c[1], 1e-5, "mean");
    CheckClose(g[2], c[2], 1e-4, "inv_std", r.inv_std);

    Tensor cb[5] = {x, gamma, dy, c[1], c[2]};
    Tensor gb[5] = {gin[0], gin[1], dy.To(gpu(0)), g[1], g[2]};
    std::vector<Tensor> cg = Invoke(op::kBatchNormTrainGrad, cb, attrs);
    std::vector<Tensor> gg = Invoke(op::kBatchNormTrainGrad, gb, attrs);
    CheckClose(gg[0], cg[0], 1e-4, "dx", r.dx);
    CheckClose(gg[1], cg[1], 1e-4, "dgamma", r.dgamma);
    CheckClose(gg[2], cg[2], 1e-4, "dbeta");
  }
}

namespace {

struct Step {
  Tensor y, dx, dgamma, dbeta, running_mean, running_var;
};

// One training step of nd::batch_norm on `dev` with x viewed as `view` (rank 4 or 2: the op; rank
// 3: the composite); the outputs and gradients come back in x's shape.
Step BatchNormStep(const Shape& s, const Shape& view, Device dev, DType dt, bool affine) {
  const int64_t C = s[1];
  Tensor x = nd::cast(Tensor::FromVector(Values(s.numel(), -2.0, 4.0, 7), s), dt).To(dev);
  Tensor w = nd::cast(Tensor::FromVector(Values(s.numel(), -1.0, 1.0, 8), s), dt).To(dev);
  Tensor gamma, beta;
  if (affine) {
    gamma = nd::cast(Tensor::FromVector(Values(C, 0.5, 1.5, 9), Shape{C}), dt).To(dev);
    beta = nd::cast(Tensor::FromVector(Values(C, -1.0, 1.0, 10), Shape{C}), dt).To(dev);
    gamma.AttachGrad(), beta.AttachGrad();
  }
  Step r;
  r.running_mean = nd::cast(Tensor::FromVector(Values(C, -0.5, 0.5, 11), Shape{C}), dt).To(dev);
  r.running_var = nd::cast(Tensor::FromVector(Values(C, 0.5, 2.0, 12), Shape{C}), dt).To(dev);
  x.AttachGrad();
  nd::BatchNormOptions o;
  o.momentum = 0.8, o.eps = 1e-2;  // large enough that a running variance off by eps shows
  Tensor y;
  {
    autograd::RecordScope record;
    y = nd::reshape(nd::batch_norm(nd::reshape(x, view.vec()), gamma, beta, r.running_mean, r.running_var, o),
                    s.vec());
  }
  std::vector<Tensor> vars = {x};
  if (affine) vars.push_back(gamma), vars.push_back(beta);
  std::vector<Tensor> grads = autograd::Grad({y}, vars, {w});
  r.y = y, r.dx = grads[0];
  if (affine) r.dgamma = grads[1], r.dbeta = grads[2];
  return r;
}

void CheckSteps(const Step& got, const Step& want, double tol, bool affine) {
  CheckClose(got.y, want.y, tol, "y");
  CheckClose(got.dx, want.dx, 10 * tol, "dx");
  if (affine) {
    CheckClose(got.dgamma, want.dgamma, 10 * tol, "dgamma");
    CheckClose(got.dbeta, want.dbeta, 10 * tol, "dbeta");
  }
  CheckClose(got.running_mean, want.running_mean, tol, "running_mean");
  CheckClose(got.running_var, want.running_var, tol, "running_var (unbiased)");
}

}  // namespace

TEST_CASE("gpu: nd::batch_norm through the op on a GPU matches its composite after a training step") {
  KILN_REQUIRE_GPU();
  for (bool affine : {true, false}) {
    CAPTURE(affine);
    for (const Shape& s : {Shape{4, 3, 5, 6}, Shape{1, 2, 4, 4}, Shape{6, 1, 2, 2}}) {
      CAPTURE(s.str());
      const Shape composite_view{s[0], s[1], s[2] * s[3]};
      Step op = BatchNormStep(s, s, gpu(0), DType::kFloat32, affine);
      Step composite = BatchNormStep(s, composite_view, gpu(0), DType::kFloat32, affine);
      CheckSteps(op, composite, 1e-5, affine);
      // And the CPU's op agrees with the GPU's.
      CheckSteps(BatchNormStep(s, s, cpu(), DType::kFloat32, affine), op, 1e-5, affine);
    }
    // (N, C): the op against the composite of the same values as (N, C, 1).
    const Shape nc{9, 4};
    Step op = BatchNormStep(nc, nc, gpu(0), DType::kFloat32, affine);
    CheckSteps(op, BatchNormStep(nc, Shape{9, 4, 1}, gpu(0), DType::kFloat32, affine), 1e-5, affine);
  }
}

TEST_CASE("gpu: batch_norm_train takes float32 only on a GPU, and nd::batch_norm runs float64 as its composite") {
  KILN_REQUIRE_GPU();
  const Shape s{2, 3, 2, 2};
  Tensor x = Tensor::FromVector(Values(s.numel(), -1.0, 1.0, 3), s);
  Tensor gamma = nd::ones(Shape{3}), beta = nd::zeros(Shape{3});
  for (DType dt : {DType::kFloat16, DType::kFloat64}) {
    CAPTURE(std::string(DTypeName(dt)));
    Tensor in[3] = {nd::cast(x, dt).To(gpu(0)), nd::cast(gamma, dt).To(gpu(0)), nd::cast(beta, dt).To(gpu(0))};
    CHECK_THROWS_AS(Invoke(op::kBatchNormTrain, in, {{"axis", int64_t{1}}, {"eps", 1e-5}}), DTypeError);
  }
  // float64 on the GPU: the composite, with the CPU op's numbers.
  Step g = BatchNormStep(s, s, gpu(0), DType::kFloat64, true);
  Step c = BatchNormStep(s, s, cpu(), DType::kFloat64, true);
  CHECK(g.y.dtype() == DType::kFloat64);
  CheckSteps(g, c, 1e-9, true);
}

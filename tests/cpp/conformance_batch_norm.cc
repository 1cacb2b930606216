// Conformance cases of batch norm in training mode (ir/ops_nn.cc): batch_norm_train (x, gamma, beta)
// -> (y, mean, inv_std) and batch_norm_train_grad (x, gamma, dy, mean, inv_std) -> (dx, dgamma,
// dbeta), over (N, C) and (N, C, H, W) with axis 1, against double-precision loops written here
// (two passes per channel, the textbook formulas). The harness differentiates every floating output
// of batch_norm_train, so its gradient check covers the rule's terms for mean and inv_std as well.
#include <cmath>

#include "conformance.h"

namespace kiln::testing {
namespace {

struct BnDims {
  explicit BnDims(const Shape& s) : N(s[0]), C(s[1]), HW(s.rank() == 4 ? s[2] * s[3] : 1) {}
  int64_t N, C, HW;
  int64_t At(int64_t n, int64_t c, int64_t i) const { return (n * C + c) * HW + i; }
};

double Eps(const ir::Attrs& a) { return a.Has("eps") ? a.Float("eps") : 1e-5; }

/// The batch mean and 1 / sqrt(biased variance + eps) of each channel of x.
void Stats(const HostTensor& x, double eps, std::vector<double>& mean, std::vector<double>& inv) {
  const BnDims d(x.shape);
  const double M = static_cast<double>(d.N * d.HW);
  mean.assign(d.C, 0.0), inv.assign(d.C, 0.0);
  for (int64_t c = 0; c < d.C; ++c) {
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.HW; ++i) mean[c] += x.data[d.At(n, c, i)];
    mean[c] /= M;
    double var = 0;
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.HW; ++i) var += std::pow(x.data[d.At(n, c, i)] - mean[c], 2);
    inv[c] = 1.0 / std::sqrt(var / M + eps);
  }
}

std::vector<HostTensor> ForwardRef(const std::vector<HostTensor>& in, const ir::Attrs& a) {
  const HostTensor &x = in[0], &gamma = in[1], &beta = in[2];
  const BnDims d(x.shape);
  std::vector<double> mean, inv;
  Stats(x, Eps(a), mean, inv);
  HostTensor y{x.shape, std::vector<double>(x.data.size())};
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < d.C; ++c)
      for (int64_t i = 0; i < d.HW; ++i) {
        const int64_t at = d.At(n, c, i);
        y.data[at] = (x.data[at] - mean[c]) * inv[c] * gamma.data[c] + beta.data[c];
      }
  return {y, HostTensor{Shape{d.C}, mean}, HostTensor{Shape{d.C}, inv}};
}

// With xhat = (x - mean) * inv_std: dbeta = sum(dy), dgamma = sum(dy * xhat),
// dx = gamma * inv_std / M * (M * dy - dbeta - xhat * dgamma).
std::vector<HostTensor> GradRef(const std::vector<HostTensor>& in, const ir::Attrs&) {
  const HostTensor &x = in[0], &gamma = in[1], &dy = in[2], &mean = in[3], &inv = in[4];
  const BnDims d(x.shape);
  const double M = static_cast<double>(d.N * d.HW);
  std::vector<double> db(d.C, 0.0), dg(d.C, 0.0);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < d.C; ++c)
      for (int64_t i = 0; i < d.HW; ++i) {
        const int64_t at = d.At(n, c, i);
        db[c] += dy.data[at];
        dg[c] += dy.data[at] * (x.data[at] - mean.data[c]) * inv.data[c];
      }
  HostTensor dx{x.shape, std::vector<double>(x.data.size())};
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < d.C; ++c)
      for (int64_t i = 0; i < d.HW; ++i) {
        const int64_t at = d.At(n, c, i);
        const double xhat = (x.data[at] - mean.data[c]) * inv.data[c];
        dx.data[at] = gamma.data[c] * inv.data[c] / M * (M * dy.data[at] - db[c] - xhat * dg[c]);
      }
  return {dx, HostTensor{Shape{d.C}, dg}, HostTensor{Shape{d.C}, db}};
}

// The forward case on x of `shape` (values around `shift`, to show the two-pass statistics keep
// their precision off zero) and the gradient op's case with x's own statistics.
void AddCases(std::vector<OpCase>& cs, const std::string& label, const Shape& shape, double shift, double eps,
              uint64_t seed) {
  const int64_t C = shape[1];
  OpCase f;
  f.label = "batch_norm_train " + label;
  f.op = "batch_norm_train";
  f.inputs = {Uniform(shape, shift - 1, shift + 1, seed), Uniform(Shape{C}, 0.5, 1.5, seed + 1),
              Uniform(Shape{C}, -1, 1, seed + 2)};
  f.attrs = {{"axis", int64_t{1}}, {"eps", eps}};
  f.reference = ForwardRef;
  f.rtol = 1e-4;
  f.atol = 1e-5;
  f.grad_tol = 1e-4;
  cs.push_back(f);

  std::vector<double> mean, inv;
  Stats(f.inputs[0], eps, mean, inv);
  OpCase g = f;
  g.label = "batch_norm_train_grad " + label;
  g.op = "batch_norm_train_grad";
  g.inputs = {f.inputs[0], f.inputs[1], Uniform(shape, -1, 1, seed + 3), HostTensor{Shape{C}, mean},
              HostTensor{Shape{C}, inv}};
  g.reference = GradRef;
  g.grad = false;
  cs.push_back(g);
}

} // namespace

KILN_CONFORMANCE_CASES(batch_norm) {
  std::vector<OpCase> cs;
  AddCases(cs, "NCHW (2,3,4,5)", Shape{2, 3, 4, 5}, 0.0, 1e-5, 300);
  AddCases(cs, "NCHW N=1 (1,4,3,3)", Shape{1, 4, 3, 3}, 0.5, 1e-5, 310);
  AddCases(cs, "NCHW C=1 (3,1,2,4)", Shape{3, 1, 2, 4}, -2.0, 1e-3, 320);
  AddCases(cs, "NC (6,4)", Shape{6, 4}, 3.0, 1e-5, 330);
  AddCases(cs, "NC C=1 (5,1)", Shape{5, 1}, 0.0, 0.1, 340);
  return cs;
}

} // namespace kiln::testing

// CPU kernels of batch norm in training mode (ir/ops_nn.cc): batch_norm_train (x, gamma, beta) ->
// (y, mean, inv_std) and batch_norm_train_grad (x, gamma, dy, mean, inv_std) -> (dx, dgamma, dbeta),
// float32 and float64, over contiguous (N, C) or (N, C, H, W) data (dispatch makes the inputs
// contiguous), channel axis 1. Each channel's M = N*H*W values are read in two passes (the mean,
// then the biased variance about it, summed in double), so the statistics do not suffer the
// cancellation of a one-pass E[x^2] - E[x]^2. Channels are split across the fork-join pool; each
// task walks its channel range sample by sample, so (N, C) rows and NCHW planes are read in order.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/kernel.h"

namespace kiln {

namespace {

// x viewed as N samples of C channels of HW values each.
struct Dims {
  explicit Dims(const Shape& s) : N(s[0]), C(s[1]), HW(s.rank() == 4 ? s[2] * s[3] : 1) {}
  int64_t N, C, HW;
  int64_t Count() const { return N * HW; }
  // Channels per task: at least ~32K values of work each.
  int64_t Grain() const { return std::max<int64_t>(1, 32768 / std::max<int64_t>(Count(), 1)); }
};

// Sums over n values in 8 independent double lanes: the additions pipeline (and vectorize) instead
// of waiting on one another, and double keeps float32's rounding out of the statistics.
constexpr int kLanes = 8;
template <class F> double LaneSum(int64_t n, F&& term) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(i + l);
  for (; i < n; ++i) acc[0] += term(i);
  double s = 0;
  for (double v : acc) s += v;
  return s;
}

// Calls f(c - c0, p) for each plane p (HW values) of channels [c0, c1), sample-major.
template <class T, class F> void Planes(T* base, const Dims& d, int64_t c0, int64_t c1, F&& f) {
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = c0; c < c1; ++c) f(c - c0, base + (n * d.C + c) * d.HW);
}

template <class T> void Forward(const KernelArgs& k) {
  const Dims d(k.in[0].shape);
  const T *x = k.in[0].ptr<T>(), *gamma = k.in[1].ptr<T>(), *beta = k.in[2].ptr<T>();
  T *y = k.out[0].ptr<T>(), *mean = k.out[1].ptr<T>(), *inv_std = k.out[2].ptr<T>();
  const double eps = k.attrs.Float("eps"), M = static_cast<double>(d.Count());
  host::ParallelFor(d.C, d.Grain(), [&](int64_t c0, int64_t c1) {
    std::vector<double> sum(c1 - c0, 0.0), sq(c1 - c0, 0.0);
    Planes(x, d, c0, c1, [&](int64_t j, const T* p) {
      sum[j] += LaneSum(d.HW, [p](int64_t i) { return static_cast<double>(p[i]); });
    });
    for (double& s : sum) s /= M;  // the means
    Planes(x, d, c0, c1, [&](int64_t j, const T* p) {
      const double m = sum[j];
      sq[j] += LaneSum(d.HW, [p, m](int64_t i) {
        const double v = p[i] - m;
        return v * v;
      });
    });
    std::vector<double> inv(c1 - c0);
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t j = c - c0;
      inv[j] = 1.0 / std::sqrt(sq[j] / M + eps);
      mean[c] = static_cast<T>(sum[j]);
      inv_std[c] = static_cast<T>(inv[j]);
    }
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t at = (n * d.C + c) * d.HW, j = c - c0;
        // In double, rounded once: cuDNN's rounding, so that a CPU and a GPU agree to the last bit
        // or so (batch norm over few values amplifies rounding differences in training).
        const double mj = sum[j], k = inv[j], g = gamma[c], b = beta[c];
        for (int64_t i = 0; i < d.HW; ++i) y[at + i] = static_cast<T>(g * (x[at + i] - mj) * k + b);
      }
  });
}

// With xhat = (x - mean) * inv_std and sums over each channel's M values:
//   dbeta = sum(dy), dgamma = sum(dy * xhat),
//   dx = gamma * inv_std / M * (M * dy - dbeta - xhat * dgamma).
template <class T> void Backward(const KernelArgs& k) {
  const Dims d(k.in[0].shape);
  const T *x = k.in[0].ptr<T>(), *gamma = k.in[1].ptr<T>(), *dy = k.in[2].ptr<T>();
  const T *mean = k.in[3].ptr<T>(), *inv_std = k.in[4].ptr<T>();
  T *dx = k.out[0].ptr<T>(), *dgamma = k.out[1].ptr<T>(), *dbeta = k.out[2].ptr<T>();
  const double M = static_cast<double>(d.Count());
  host::ParallelFor(d.C, d.Grain(), [&](int64_t c0, int64_t c1) {
    std::vector<double> sdy(c1 - c0, 0.0), sdyx(c1 - c0, 0.0);
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t at = (n * d.C + c) * d.HW, j = c - c0;
        const double m = mean[c];
        const T *g = dy + at, *p = x + at;
        sdy[j] += LaneSum(d.HW, [g](int64_t i) { return static_cast<double>(g[i]); });
        sdyx[j] += LaneSum(d.HW, [g, p, m](int64_t i) { return g[i] * (p[i] - m); });
      }
    std::vector<double> ds(c1 - c0);  // sum(dy * xhat)
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t j = c - c0;
      ds[j] = sdyx[j] * inv_std[c];
      dbeta[c] = static_cast<T>(sdy[j]);
      dgamma[c] = static_cast<T>(ds[j]);
    }
    // In double, rounded once, as the forward pass.
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t at = (n * d.C + c) * d.HW, j = c - c0;
        const double m = mean[c], inv = inv_std[c], k = gamma[c] * inv / M, sd = sdy[j], sx = ds[j];
        for (int64_t i = 0; i < d.HW; ++i) {
          const double xhat = (x[at + i] - m) * inv;
          dx[at + i] = static_cast<T>(k * (M * dy[at + i] - sd - xhat * sx));
        }
      }
  });
}

template <template <class> class K> void ByDType(const KernelArgs& k) {
  switch (k.in[0].dtype) {
    case DType::kFloat32: return K<float>::Run(k);
    case DType::kFloat64: return K<double>::Run(k);
    default:
      KILN_CHECK(false) << k.op.name << ": dispatch let " << DTypeName(k.in[0].dtype)
                        << " reach a float32/float64 CPU kernel (KernelBinding::dtypes)";
  }
}
template <class T> struct ForwardK {
  static void Run(const KernelArgs& k) { Forward<T>(k); }
};
template <class T> struct BackwardK {
  static void Run(const KernelArgs& k) { Backward<T>(k); }
};

void BatchNormTrainKernel(const KernelArgs& k) {
  if (k.in[0].numel() == 0) return;  // no channels (inference refuses channels without values)
  ByDType<ForwardK>(k);
}
void BatchNormTrainGradKernel(const KernelArgs& k) {
  if (k.in[0].numel() == 0) return;
  ByDType<BackwardK>(k);
}

} // namespace

void BindBatchNormKernels(KernelTable& t) {
  const uint32_t dtypes = DTypeBit(DType::kFloat32) | DTypeBit(DType::kFloat64);
  t.Bind(op::kBatchNormTrain, DeviceType::kCPU, {BatchNormTrainKernel, /*contiguous_inputs=*/true, nullptr, dtypes});
  t.Bind(op::kBatchNormTrainGrad, DeviceType::kCPU,
         {BatchNormTrainGradKernel, /*contiguous_inputs=*/true, nullptr, dtypes});
}

} // namespace kiln

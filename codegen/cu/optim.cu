// The optimizers' fused updates on GPUs (frontend/optim.cc on a GPU device): SGD with momentum,
// Adam and AdamW in MXNet's formulation (include/kiln/frontend/optim.h), per element, in the
// parameter's dtype as the CPU loops compute. One grid-stride launch per parameter.
#include "cu_common.h"

namespace {

template <class T> __device__ T Clip(T x, T c) { return x < -c ? -c : (x > c ? c : x); }
__device__ float Sqrt(float x) { return __builtin_sqrtf(x); }
__device__ double Sqrt(double x) { return __builtin_sqrt(x); }

template <class T>
__device__ void Sgd(T* w, const T* g, T* mom, long long n, double lr_, double wd_, double rescale_, double clip_,
                    double momentum_, int clip_on) {
  const T lr = T(lr_), wd = T(wd_), rescale = T(rescale_), clip = T(clip_), momentum = T(momentum_);
  for (long long k = GlobalThread(); k < n; k += GridThreads()) {
    T gk = rescale * g[k];
    if (clip_on) gk = Clip(gk, clip);
    gk += wd * w[k];
    if (mom) {
      mom[k] = momentum * mom[k] - lr * gk;
      w[k] += mom[k];
    } else {
      w[k] -= lr * gk;
    }
  }
}

template <class T>
__device__ void Adam(T* w, const T* g, T* m, T* v, long long n, double lr_, double wd_, double rescale_,
                     double clip_, double beta1, double beta2, double eps_, double step_scale, double bc2_sqrt,
                     int clip_on, int decoupled) {
  const T lr = T(lr_), wd = T(wd_);
  const T rescale = T(rescale_), clip = T(clip_), b1 = T(beta1), b2 = T(beta2), eps = T(eps_);
  const T c1 = T(1) - b1, c2 = T(1) - b2, inv_bc2 = T(1 / bc2_sqrt);
  const T step = T(static_cast<double>(lr) * step_scale), decay = lr * wd;
  for (long long k = GlobalThread(); k < n; k += GridThreads()) {
    T gk = rescale * g[k];
    if (!decoupled) gk += wd * w[k];
    if (clip_on) gk = Clip(gk, clip);
    const T mk = b1 * m[k] + c1 * gk;
    const T vk = b2 * v[k] + c2 * gk * gk;
    m[k] = mk;
    v[k] = vk;
    T wk = w[k];
    if (decoupled) wk -= decay * wk;
    w[k] = wk - step * mk / (Sqrt(vk) * inv_bc2 + eps);
  }
}

}  // namespace

#define KILN_OPTIM(T, suffix)                                                                                  \
  extern "C" __global__ void kiln_sgd_##suffix(T* w, const T* g, T* mom, long long n, double lr, double wd,    \
                                               double rescale, double clip, double momentum, int clip_on) {    \
    Sgd(w, g, mom, n, lr, wd, rescale, clip, momentum, clip_on);                                              \
  }                                                                                                            \
  extern "C" __global__ void kiln_adam_##suffix(T* w, const T* g, T* m, T* v, long long n, double lr, double wd, \
                                                double rescale, double clip, double beta1, double beta2,       \
                                                double eps, double step_scale, double bc2_sqrt, int clip_on,   \
                                                int decoupled) {                                               \
    Adam(w, g, m, v, n, lr, wd, rescale, clip, beta1, beta2, eps, step_scale, bc2_sqrt, clip_on, decoupled);  \
  }

KILN_OPTIM(float, f32)
KILN_OPTIM(double, f64)

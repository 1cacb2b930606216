// Plain-loop kernels of the neural-network ops (see onednn.h): the float64 and float16 path, the
// fallback where oneDNN has no kernel for a dtype, and the reference the oneDNN path is tested
// against. Accumulation is in double for float64 and in float otherwise. Parallel over
// independent output slices only (no atomics); no blocking or vectorization beyond what the
// compiler finds in the innermost loops.
#include <limits>
#include <type_traits>
#include <vector>

#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/cpu/onednn.h"
#include "kiln/runtime/error.h"

namespace kiln::host::reference {

namespace {

template <class T> using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T> acc_t<T> Load(const T* p, int64_t i) { return static_cast<acc_t<T>>(p[i]); }

/// Element strides of an operand's batch dims against the output batch shape (0 where broadcast).
Strides BatchStrides(const Shape& s, const Shape& batch) {
  Strides cs = s.ContiguousStrides(), r;
  int lead = batch.rank() - (s.rank() - 2);
  for (int i = 0; i < batch.rank(); ++i) {
    int j = i - lead;
    r.push_back(j < 0 || s[j] == 1 ? 0 : cs[j]);
  }
  return r;
}

int64_t BatchOffset(int64_t index, const Shape& batch, const Strides& strides) {
  int64_t off = 0;
  for (int d = batch.rank() - 1; d >= 0; --d) {
    off += (index % batch[d]) * strides[d];
    index /= batch[d];
  }
  return off;
}

template <class T>
void MatmulT(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p) {
  using A = acc_t<T>;
  int r = out.rank();
  int64_t M = out.shape[r - 2], N = out.shape[r - 1];
  int64_t K = p.transpose_a ? a.shape[a.rank() - 2] : a.shape[a.rank() - 1];
  int64_t am = p.transpose_a ? 1 : K, ak = p.transpose_a ? M : 1;
  int64_t bk = p.transpose_b ? 1 : N, bn = p.transpose_b ? K : 1;
  Shape batch;
  for (int i = 0; i < r - 2; ++i) batch.push_back(out.shape[i]);
  Strides sa = BatchStrides(a.shape, batch), sb = BatchStrides(b.shape, batch);
  const T *pa = a.ptr<T>(), *pb = b.ptr<T>();
  T* po = out.ptr<T>();
  ParallelFor(batch.numel() * M, std::max<int64_t>(1, 4096 / std::max<int64_t>(N * K, 1)),
              [&](int64_t lo, int64_t hi) {
                std::vector<A> acc(N);
                for (int64_t row = lo; row < hi; ++row) {
                  int64_t bi = row / M, i = row % M;
                  const T* arow = pa + BatchOffset(bi, batch, sa) + i * am;
                  const T* bmat = pb + BatchOffset(bi, batch, sb);
                  std::fill(acc.begin(), acc.end(), A(0));
                  for (int64_t k = 0; k < K; ++k) {
                    A av = Load(arow, k * ak);
                    const T* brow = bmat + k * bk;
                    for (int64_t j = 0; j < N; ++j) acc[j] += av * Load(brow, j * bn);
                  }
                  T* orow = po + row * N;
                  for (int64_t j = 0; j < N; ++j) orow[j] = static_cast<T>(acc[j]);
                }
              });
}

/// Geometry shared by the convolution kernels.
struct ConvDims {
  int64_t N, C, H, W, O, Ig, Og, KH, KW, OH, OW;
  ConvDims(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p)
      : N(x[0]), C(x[1]), H(x[2]), W(x[3]), O(w[0]), Ig(w[1]), Og(w[0] / p.groups), KH(w[2]), KW(w[3]),
        OH(y[2]), OW(y[3]) {}
};

/// Calls f(input index in the H*W plane, weight index in the KH*KW plane) for every tap of output
/// position (oh, ow) that falls inside the input.
template <class F>
inline void ForTaps(const ConvDims& d, const Conv2dParams& p, int64_t oh, int64_t ow, F&& f) {
  for (int64_t kh = 0; kh < d.KH; ++kh) {
    int64_t ih = oh * p.stride[0] - p.padding[0] + kh * p.dilation[0];
    if (ih < 0 || ih >= d.H) continue;
    for (int64_t kw = 0; kw < d.KW; ++kw) {
      int64_t iw = ow * p.stride[1] - p.padding[1] + kw * p.dilation[1];
      if (iw < 0 || iw >= d.W) continue;
      f(ih * d.W + iw, kh * d.KW + kw);
    }
  }
}

template <class T>
void Conv2dT(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p) {
  ConvDims d(x.shape, w.shape, y.shape, p);
  const T *px = x.ptr<T>(), *pw = w.ptr<T>();
  T* py = y.ptr<T>();
  ParallelFor(d.N * d.O, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t no = lo; no < hi; ++no) {
      int64_t n = no / d.O, o = no % d.O, g = o / d.Og;
      for (int64_t oh = 0; oh < d.OH; ++oh)
        for (int64_t ow = 0; ow < d.OW; ++ow) {
          acc_t<T> acc = 0;
          for (int64_t ic = 0; ic < d.Ig; ++ic) {
            const T* xp = px + (n * d.C + g * d.Ig + ic) * d.H * d.W;
            const T* wp = pw + (o * d.Ig + ic) * d.KH * d.KW;
            ForTaps(d, p, oh, ow, [&](int64_t xi, int64_t wi) { acc += Load(xp, xi) * Load(wp, wi); });
          }
          py[(no * d.OH + oh) * d.OW + ow] = static_cast<T>(acc);
        }
    }
  });
}

template <class T>
void Conv2dGradDataT(const TensorView& dy, const TensorView& w, const TensorView& dx, const Conv2dParams& p) {
  ConvDims d(dx.shape, w.shape, dy.shape, p);
  const T *pdy = dy.ptr<T>(), *pw = w.ptr<T>();
  T* pdx = dx.ptr<T>();
  ParallelFor(d.N, 1, [&](int64_t lo, int64_t hi) {
    std::vector<acc_t<T>> acc(d.C * d.H * d.W);
    for (int64_t n = lo; n < hi; ++n) {
      std::fill(acc.begin(), acc.end(), acc_t<T>(0));
      for (int64_t o = 0; o < d.O; ++o) {
        int64_t g = o / d.Og;
        for (int64_t oh = 0; oh < d.OH; ++oh)
          for (int64_t ow = 0; ow < d.OW; ++ow) {
            acc_t<T> gy = Load(pdy, ((n * d.O + o) * d.OH + oh) * d.OW + ow);
            for (int64_t ic = 0; ic < d.Ig; ++ic) {
              acc_t<T>* ap = acc.data() + (g * d.Ig + ic) * d.H * d.W;
              const T* wp = pw + (o * d.Ig + ic) * d.KH * d.KW;
              ForTaps(d, p, oh, ow, [&](int64_t xi, int64_t wi) { ap[xi] += gy * Load(wp, wi); });
            }
          }
      }
      T* out = pdx + n * d.C * d.H * d.W;
      for (size_t i = 0; i < acc.size(); ++i) out[i] = static_cast<T>(acc[i]);
    }
  });
}

template <class T>
void Conv2dGradWeightT(const TensorView& dy, const TensorView& x, const TensorView& dw,
                       const Conv2dParams& p) {
  ConvDims d(x.shape, dw.shape, dy.shape, p);
  const T *pdy = dy.ptr<T>(), *px = x.ptr<T>();
  T* pdw = dw.ptr<T>();
  ParallelFor(d.O, 1, [&](int64_t lo, int64_t hi) {
    std::vector<acc_t<T>> acc(d.Ig * d.KH * d.KW);
    for (int64_t o = lo; o < hi; ++o) {
      int64_t g = o / d.Og;
      std::fill(acc.begin(), acc.end(), acc_t<T>(0));
      for (int64_t n = 0; n < d.N; ++n)
        for (int64_t oh = 0; oh < d.OH; ++oh)
          for (int64_t ow = 0; ow < d.OW; ++ow) {
            acc_t<T> gy = Load(pdy, ((n * d.O + o) * d.OH + oh) * d.OW + ow);
            for (int64_t ic = 0; ic < d.Ig; ++ic) {
              const T* xp = px + (n * d.C + g * d.Ig + ic) * d.H * d.W;
              acc_t<T>* ap = acc.data() + ic * d.KH * d.KW;
              ForTaps(d, p, oh, ow, [&](int64_t xi, int64_t wi) { ap[wi] += gy * Load(xp, xi); });
            }
          }
      T* out = pdw + o * d.Ig * d.KH * d.KW;
      for (size_t i = 0; i < acc.size(); ++i) out[i] = static_cast<T>(acc[i]);
    }
  });
}

/// One pooling window clipped to the input, with the divisor average pooling uses.
struct Window {
  int64_t h0, h1, w0, w1, divisor;
};

inline Window PoolWindow(const Pool2dParams& p, int64_t H, int64_t W, int64_t oh, int64_t ow) {
  int64_t h0 = oh * p.stride[0] - p.padding[0], w0 = ow * p.stride[1] - p.padding[1];
  int64_t h1 = std::min(h0 + p.kernel[0], H + p.padding[0]),
          w1 = std::min(w0 + p.kernel[1], W + p.padding[1]);
  int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0);
  w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, H);
  w1 = std::min(w1, W);
  return {h0, h1, w0, w1, p.count_include_pad ? padded : (h1 - h0) * (w1 - w0)};
}

/// Index (in the H*W plane) of the first maximum of a window; -1 when the window is empty.
template <class T> inline int64_t ArgMax(const T* plane, int64_t W, const Window& win) {
  int64_t best = -1;
  acc_t<T> bv = 0;
  for (int64_t h = win.h0; h < win.h1; ++h)
    for (int64_t w = win.w0; w < win.w1; ++w) {
      acc_t<T> v = Load(plane, h * W + w);
      if (best < 0 || v > bv) best = h * W + w, bv = v;
    }
  return best;
}

/// Runs f(plane index) over the N*C planes of a pooling op in parallel.
template <class F> void ForPlanes(const Shape& x, F&& f) {
  ParallelFor(x[0] * x[1], 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) f(i);
  });
}

template <class T> void MaxPool2dT(const TensorView& x, const TensorView& y, const Pool2dParams& p) {
  int64_t H = x.shape[2], W = x.shape[3], OH = y.shape[2], OW = y.shape[3];
  ForPlanes(x.shape, [&](int64_t c) {
    const T* xp = x.ptr<T>() + c * H * W;
    T* yp = y.ptr<T>() + c * OH * OW;
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t i = ArgMax(xp, W, PoolWindow(p, H, W, oh, ow));
        yp[oh * OW + ow] = i < 0 ? static_cast<T>(-std::numeric_limits<float>::infinity()) : xp[i];
      }
  });
}

template <class T>
void MaxPool2dGradT(const TensorView& dy, const TensorView& x, const TensorView& dx, const Pool2dParams& p) {
  int64_t H = x.shape[2], W = x.shape[3], OH = dy.shape[2], OW = dy.shape[3];
  ForPlanes(x.shape, [&](int64_t c) {
    const T* xp = x.ptr<T>() + c * H * W;
    const T* gp = dy.ptr<T>() + c * OH * OW;
    std::vector<acc_t<T>> acc(H * W, acc_t<T>(0));
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t i = ArgMax(xp, W, PoolWindow(p, H, W, oh, ow));
        if (i >= 0) acc[i] += Load(gp, oh * OW + ow);
      }
    T* out = dx.ptr<T>() + c * H * W;
    for (int64_t i = 0; i < H * W; ++i) out[i] = static_cast<T>(acc[i]);
  });
}

template <class T> void AvgPool2dT(const TensorView& x, const TensorView& y, const Pool2dParams& p) {
  int64_t H = x.shape[2], W = x.shape[3], OH = y.shape[2], OW = y.shape[3];
  ForPlanes(x.shape, [&](int64_t c) {
    const T* xp = x.ptr<T>() + c * H * W;
    T* yp = y.ptr<T>() + c * OH * OW;
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        Window win = PoolWindow(p, H, W, oh, ow);
        acc_t<T> s = 0;
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) s += Load(xp, h * W + w);
        yp[oh * OW + ow] = static_cast<T>(win.divisor > 0 ? s / static_cast<acc_t<T>>(win.divisor) : s);
      }
  });
}

template <class T> void AvgPool2dGradT(const TensorView& dy, const TensorView& dx, const Pool2dParams& p) {
  int64_t H = dx.shape[2], W = dx.shape[3], OH = dy.shape[2], OW = dy.shape[3];
  ForPlanes(dx.shape, [&](int64_t c) {
    const T* gp = dy.ptr<T>() + c * OH * OW;
    std::vector<acc_t<T>> acc(H * W, acc_t<T>(0));
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        Window win = PoolWindow(p, H, W, oh, ow);
        if (win.divisor <= 0) continue;
        acc_t<T> g = Load(gp, oh * OW + ow) / static_cast<acc_t<T>>(win.divisor);
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) acc[h * W + w] += g;
      }
    T* out = dx.ptr<T>() + c * H * W;
    for (int64_t i = 0; i < H * W; ++i) out[i] = static_cast<T>(acc[i]);
  });
}

} // namespace

// Each entry point dispatches on the output's dtype (inputs share it; inference checked that).

void Matmul(const TensorView& a, const TensorView& b, const TensorView& out, const MatmulParams& p) {
  KILN_DISPATCH_FLOAT(out.dtype, "matmul", MatmulT<scalar_t>(a, b, out, p));
}
void Conv2d(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p) {
  KILN_DISPATCH_FLOAT(y.dtype, "conv2d", Conv2dT<scalar_t>(x, w, y, p));
}
void Conv2dGradData(const TensorView& dy, const TensorView& w, const TensorView& dx, const Conv2dParams& p) {
  KILN_DISPATCH_FLOAT(dx.dtype, "conv2d_grad_data", Conv2dGradDataT<scalar_t>(dy, w, dx, p));
}
void Conv2dGradWeight(const TensorView& dy, const TensorView& x, const TensorView& dw,
                      const Conv2dParams& p) {
  KILN_DISPATCH_FLOAT(dw.dtype, "conv2d_grad_weight", Conv2dGradWeightT<scalar_t>(dy, x, dw, p));
}
void MaxPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p) {
  KILN_DISPATCH_FLOAT(y.dtype, "max_pool2d", MaxPool2dT<scalar_t>(x, y, p));
}
void MaxPool2dGrad(const TensorView& dy, const TensorView& x, const TensorView& dx, const Pool2dParams& p) {
  KILN_DISPATCH_FLOAT(dx.dtype, "max_pool2d_grad", MaxPool2dGradT<scalar_t>(dy, x, dx, p));
}
void AvgPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p) {
  KILN_DISPATCH_FLOAT(y.dtype, "avg_pool2d", AvgPool2dT<scalar_t>(x, y, p));
}
void AvgPool2dGrad(const TensorView& dy, const TensorView& dx, const Pool2dParams& p) {
  KILN_DISPATCH_FLOAT(dx.dtype, "avg_pool2d_grad", AvgPool2dGradT<scalar_t>(dy, dx, p));
}

} // namespace kiln::host::reference

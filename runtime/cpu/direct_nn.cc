// Hand-written float32 NN kernels (direct_nn.h) for cases oneDNN serves badly on plain NCHW:
//   1. convolution with one input channel (stride 1, no dilation), forward and weight gradient:
//      oneDNN's plain-layout kernel for it is im2col + GEMM with a 9-long reduction, and its fast
//      kernels want the 20-channel output in another layout, whose reorder costs more than the
//      convolution (LeNet's first layer, batch 256, one core: 3.9 -> 1.4 ms forward, 3.0 -> 2.0
//      weight gradient). The data gradient stays on oneDNN: a hand-written one was no faster;
//   2. average pooling whose windows tile the input (stride = kernel, no padding): 2.3-2.8x
//      faster than oneDNN's NCHW kernels there.
// The convolutions copy one image at a time into a zero-bordered plane (and its gradient into
// a [row][vector][channel] layout), so that inner loops read whole vectors with no
// bounds tests, and keep several independent accumulators (a block of channels or taps) so
// that multiply-adds do not wait on each other. Parallel over images or planes; sums that span
// images are made per thread and added in double at the end.
// Not here: other dtypes, strides, dilation or groups (nn_dispatch.cc keeps oneDNN for those).
#include "kiln/runtime/cpu/direct_nn.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kiln/runtime/cpu/loops.h"

namespace kiln::host::direct {

namespace {

// One vector register of floats: 16 lanes with AVX-512, 8 with AVX, 4 otherwise (GCC and Clang
// vector extensions). Loads and stores go through memcpy: any alignment.
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#elif defined(__AVX__)
constexpr int64_t kLanes = 8;
#else
constexpr int64_t kLanes = 4;
#endif
typedef float V __attribute__((vector_size(kLanes * sizeof(float))));
inline V Load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
/// Stores the first n lanes (a row's last, partial vector: lane by lane, not a byte loop).
inline void Store(float* p, V v, int64_t n = kLanes) {
  if (n == kLanes) {
    std::memcpy(p, &v, sizeof v);
    return;
  }
  for (int64_t l = 0; l < n; ++l) p[l] = v[l];
}
/// Copies a short row (libc's memcpy call costs as much as the copy at these lengths).
inline void CopyRow(float* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store(dst + i, Load(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}
inline float Sum(V v) {
  float s = 0.f;
  for (int64_t l = 0; l < kLanes; ++l) s += v[l];
  return s;
}
constexpr int64_t RoundUp(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

/// The geometry of a one-input-channel convolution. An image is copied into a zero plane of HP
/// rows and WS columns: the padding, then enough zero columns that an output row's last vector
/// reads zeros, not the next row, for the lanes past the row's end.
struct Geometry {
  int64_t N, O, H, W, KH, KW, OH, OW, PH, PW, HP, WP, WS;
  Geometry(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p)
      : N(x[0]), O(w[0]), H(x[2]), W(x[3]), KH(w[2]), KW(w[3]), OH(y[2]), OW(y[3]), PH(p.padding[0]),
        PW(p.padding[1]), HP(H + 2 * PH), WP(W + 2 * PW), WS(RoundUp(OW) + KW - 1) {}
};

bool Handles(const Shape& x, const Shape& w, DType t, const Conv2dParams& p) {
  return t == DType::kFloat32 && x[1] == 1 && w[1] == 1 && p.groups == 1 && p.stride[0] == 1 &&
         p.stride[1] == 1 && p.dilation[0] == 1 && p.dilation[1] == 1;
}

/// Image n of x copied into `plane` (HP x WS) inside its zero border.
void PadImage(const Geometry& g, const float* x, int64_t n, std::vector<float>& plane) {
  plane.assign(static_cast<size_t>(g.HP * g.WS), 0.f);
  const float* src = x + n * g.H * g.W;
  for (int64_t h = 0; h < g.H; ++h) CopyRow(plane.data() + (h + g.PH) * g.WS + g.PW, src + h * g.W, g.W);
}

/// Images per parallel chunk: enough multiply-adds that waking a helper thread pays.
int64_t ImageGrain(const Geometry& g) {
  return std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, g.O * g.OH * g.OW * g.KH * g.KW));
}

/// Image n's dy planes gathered as [oh][c][o][lane]: for output row oh and vector c of it, the
/// lanes of every output channel o in turn (zero past OW), so that a block of channels is read
/// at fixed offsets from one pointer.
void GatherGrad(const Geometry& g, const float* dy, int64_t n, std::vector<float>& grad) {
  typedef int32_t VI __attribute__((vector_size(kLanes * sizeof(int32_t))));
  const int64_t NC = RoundUp(g.OW) / kLanes, tail = g.OW - (NC - 1) * kLanes;
  VI keep; // lanes of a row's last vector that lie inside the row
  for (int l = 0; l < kLanes; ++l) keep[l] = l < tail ? -1 : 0;
  grad.resize(static_cast<size_t>(g.OH * NC * g.O * kLanes));
  const float* end = dy + g.N * g.O * g.OH * g.OW;
  for (int64_t o = 0; o < g.O; ++o)
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const float* src = dy + ((n * g.O + o) * g.OH + oh) * g.OW;
      float* dst = grad.data() + (oh * NC * g.O + o) * kLanes;
      for (int64_t c = 0; c + 1 < NC; ++c) Store(dst + c * g.O * kLanes, Load(src + c * kLanes));
      // The last vector: a whole load masked to the row (the next row's values are dropped),
      // lane by lane at the very end of dy.
      const float* last = src + (NC - 1) * kLanes;
      V v = {};
      if (end - last >= kLanes)
        v = (V)((VI)Load(last) & keep);
      else
        for (int64_t l = 0; l < tail; ++l) v[l] = last[l];
      Store(dst + (NC - 1) * g.O * kLanes, v);
    }
}

// The kernels below keep several independent vector accumulators (a block of output channels,
// of taps, or both): with one, every multiply-add would wait for the previous one's result.

/// Calls block.template operator()<B>(first) over [0, count) in blocks of Max, then of halves.
template <int Max, class F> void ForBlocks(int64_t count, const F& block) {
  int64_t c = 0;
  for (; c + Max <= count; c += Max) block.template operator()<Max>(c);
  if constexpr (Max > 1) {
    if (c < count)
      ForBlocks<Max / 2>(count - c, [&]<int B>(int64_t i) { block.template operator()<B>(c + i); });
  }
}

} // namespace

bool Conv2d(const TensorView& x, const TensorView& w, const TensorView& y, const Conv2dParams& p) {
  if (!Handles(x.shape, w.shape, y.dtype, p)) return false;
  const Geometry g(x.shape, w.shape, y.shape, p);
  const float *px = x.ptr<float>(), *pw = w.ptr<float>();
  float* py = y.ptr<float>();
  const int64_t taps = g.KH * g.KW;
  // The weights of each block of B output channels tap-major, [tap][b], at the block's offset.
  constexpr int kBlock = 8;
  std::vector<float> packed(static_cast<size_t>(g.O * taps));
  ForBlocks<kBlock>(g.O, [&]<int B>(int64_t o0) {
    for (int64_t t = 0; t < taps; ++t)
      for (int b = 0; b < B; ++b) packed[o0 * taps + t * B + b] = pw[(o0 + b) * taps + t];
  });
  // A row's vectors start every kLanes columns, the last one at OW - kLanes (overlapping the one
  // before rather than storing part of a vector); a row narrower than a vector stores what it has.
  const int64_t lanes = std::min(kLanes, g.OW);
  ParallelFor(g.N, ImageGrain(g), [&](int64_t n0, int64_t n1) {
    std::vector<float> plane;
    for (int64_t n = n0; n < n1; ++n) {
      PadImage(g, px, n, plane);
      ForBlocks<kBlock>(g.O, [&]<int B>(int64_t o0) {
        for (int64_t oh = 0; oh < g.OH; ++oh)
          for (int64_t c = 0; c < g.OW; c += kLanes) {
            const int64_t ow = std::max<int64_t>(0, std::min(c, g.OW - kLanes));
            V acc[B] = {};
            const float* wt = packed.data() + o0 * taps;
            for (int64_t kh = 0; kh < g.KH; ++kh) {
              const float* xr = plane.data() + (oh + kh) * g.WS + ow;
              for (int64_t kw = 0; kw < g.KW; ++kw, wt += B) {
                const V xv = Load(xr + kw);
                for (int b = 0; b < B; ++b) acc[b] += wt[b] * xv;
              }
            }
            float* yr = py + ((n * g.O + o0) * g.OH + oh) * g.OW + ow;
            for (int b = 0; b < B; ++b) Store(yr + b * g.OH * g.OW, acc[b], lanes);
          }
      });
    }
  });
  return true;
}

bool Conv2dGradWeight(const TensorView& dy, const TensorView& x, const TensorView& dw,
                      const Conv2dParams& p) {
  if (!Handles(x.shape, dw.shape, dw.dtype, p)) return false;
  const Geometry g(x.shape, dw.shape, dy.shape, p);
  const float *px = x.ptr<float>(), *pdy = dy.ptr<float>();
  const int64_t taps = g.KH * g.KW, NC = RoundUp(g.OW) / kLanes;
  const int64_t chunks = std::min<int64_t>(NumThreads(), (g.N + ImageGrain(g) - 1) / ImageGrain(g));
  // Per chunk of images, per image, the float sums of one (output channel, tap) go into double.
  std::vector<std::vector<double>> sums(static_cast<size_t>(chunks), std::vector<double>(g.O * taps, 0.0));
  RunChunks(chunks, [&](int64_t chunk) {
    std::vector<float> plane, grad;
    std::vector<double>& sum = sums[static_cast<size_t>(chunk)];
    for (int64_t n = g.N * chunk / chunks; n < g.N * (chunk + 1) / chunks; ++n) {
      PadImage(g, px, n, plane);
      GatherGrad(g, pdy, n, grad);
      // T taps times B output channels at a time: T + B loads for T * B multiply-adds (T * B
      // accumulators, B + 1 more registers: 21 fit AVX-512's 32, 13 the 16 of narrower ISAs).
      ForBlocks<kLanes == 16 ? 4 : 2>(taps, [&]<int T>(int64_t t0) {
        const float* xt[T];
        for (int k = 0; k < T; ++k) xt[k] = plane.data() + ((t0 + k) / g.KW) * g.WS + (t0 + k) % g.KW;
        ForBlocks<4>(g.O, [&]<int B>(int64_t o0) {
          V acc[B][T] = {};
          for (int64_t oh = 0; oh < g.OH; ++oh)
            for (int64_t c = 0; c < NC; ++c) {
              const float* gr = grad.data() + ((oh * NC + c) * g.O + o0) * kLanes;
              V gv[B];
              for (int b = 0; b < B; ++b) gv[b] = Load(gr + b * kLanes);
              for (int k = 0; k < T; ++k) {
                const V xv = Load(xt[k] + oh * g.WS + c * kLanes);
                for (int b = 0; b < B; ++b) acc[b][k] += gv[b] * xv;
              }
            }
          for (int b = 0; b < B; ++b)
            for (int k = 0; k < T; ++k) sum[(o0 + b) * taps + t0 + k] += Sum(acc[b][k]);
        });
      });
    }
  });
  float* out = dw.ptr<float>();
  for (int64_t i = 0; i < g.O * taps; ++i) {
    double s = 0;
    for (const std::vector<double>& part : sums) s += part[i];
    out[i] = static_cast<float>(s);
  }
  return true;
}

// ---- average pooling over tiling windows ---------------------------------------------------------

namespace {

bool Tiles(const Pool2dParams& p, DType t) {
  return t == DType::kFloat32 && p.stride[0] == p.kernel[0] && p.stride[1] == p.kernel[1] &&
         p.padding[0] == 0 && p.padding[1] == 0;
}

/// Calls f(first plane, end plane) over the N*C planes of an H x W tensor, in parallel.
template <class F> void ForPlanes(const Shape& s, F&& f) {
  ParallelFor(s[0] * s[1], std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, s[2] * s[3])), f);
}

} // namespace

bool AvgPool2d(const TensorView& x, const TensorView& y, const Pool2dParams& p) {
  if (!Tiles(p, y.dtype)) return false;
  const int64_t H = x.shape[2], W = x.shape[3], OH = y.shape[2], OW = y.shape[3];
  const int64_t KH = p.kernel[0], KW = p.kernel[1];
  const float scale = 1.f / static_cast<float>(KH * KW);
  const float* px = x.ptr<float>();
  float* py = y.ptr<float>();
  ForPlanes(x.shape, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t oh = 0; oh < OH; ++oh) {
        const float* r = px + (c * H + oh * KH) * W;
        float* out = py + (c * OH + oh) * OW;
        if (KH == 2 && KW == 2) {
#pragma omp simd
          for (int64_t ow = 0; ow < OW; ++ow)
            out[ow] = (r[2 * ow] + r[2 * ow + 1] + r[W + 2 * ow] + r[W + 2 * ow + 1]) * scale;
          continue;
        }
        for (int64_t ow = 0; ow < OW; ++ow) {
          float s = 0.f;
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) s += r[kh * W + ow * KW + kw];
          out[ow] = s * scale;
        }
      }
  });
  return true;
}

bool AvgPool2dGrad(const TensorView& dy, const TensorView& dx, const Pool2dParams& p) {
  if (!Tiles(p, dx.dtype)) return false;
  const int64_t H = dx.shape[2], W = dx.shape[3], OH = dy.shape[2], OW = dy.shape[3];
  const int64_t KH = p.kernel[0], KW = p.kernel[1];
  const float scale = 1.f / static_cast<float>(KH * KW);
  const float* pdy = dy.ptr<float>();
  float* pdx = dx.ptr<float>();
  ForPlanes(dx.shape, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* plane = pdx + c * H * W;
      for (int64_t oh = 0; oh < OH; ++oh) {
        const float* g = pdy + (c * OH + oh) * OW;
        float* r = plane + oh * KH * W;
        if (KW == 2) {
#pragma omp simd
          for (int64_t ow = 0; ow < OW; ++ow) r[2 * ow] = r[2 * ow + 1] = g[ow] * scale;
        } else {
          for (int64_t ow = 0; ow < OW; ++ow)
            for (int64_t kw = 0; kw < KW; ++kw) r[ow * KW + kw] = g[ow] * scale;
        }
        for (int64_t iw = OW * KW; iw < W; ++iw) r[iw] = 0.f; // columns no window covers
        for (int64_t kh = 1; kh < KH; ++kh) CopyRow(r + kh * W, r, W);
      }
      std::memset(plane + OH * KH * W, 0,
                  static_cast<size_t>((H - OH * KH) * W) * sizeof(float)); // rows no window covers
    }
  });
  return true;
}

} // namespace kiln::host::direct

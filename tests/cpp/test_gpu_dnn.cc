// The platform's cuDNN calls on simulated GPUs (runtime/gpusim/sim_dnn.cc): convolution forward
// against a plain loop (strides, pads, dilations, groups, both modes, NHWC strides, alpha/beta),
// pooling, batch norm's statistics and running averages; every argument check with cuDNN's
// status and a message that says what to do; the handle's stream binding, host pointers, device 1,
// stream order and capture. In CUDA builds, kiln's descriptor checks against cuDNN's own answers.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_sim_util.h"
#include "kiln/runtime/gpu_dnn.h"

using namespace kiln;
using namespace kiln::testing;
using gpurt::DnnFormat;
using gpurt::DnnTensorDesc;

namespace {

std::vector<float> Random(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

// Device memory of the current device holding `v`.
void* Upload(gpurt::Platform& p, const std::vector<float>& v, gpurt::Stream s) {
  void* d = p.Malloc(v.size() * sizeof(float));
  p.MemcpyAsync(d, v.data(), v.size() * sizeof(float), gpurt::CopyKind::kHostToDevice, s);
  return d;
}
std::vector<float> Download(gpurt::Platform& p, const void* d, size_t n, gpurt::Stream s) {
  std::vector<float> v(n);
  p.MemcpyAsync(v.data(), d, n * sizeof(float), gpurt::CopyKind::kDeviceToHost, s);
  p.StreamSynchronize(s);
  return v;
}

// The status and message of the DnnError `f` throws (status 0 when none).
struct Outcome {
  int status = 0;
  std::string message;
};
template <class F>
Outcome DnnOutcome(F&& f) {
  try {
    f();
  } catch (const gpurt::DnnError& e) {
    return {e.code(), e.what()};
  }
  return {};
}

// Element (n, c, h, w) of a tensor stored with `t`'s strides.
float At(const std::vector<float>& v, const DnnTensorDesc& t, int n, int c, int h, int w) {
  return v[n * t.n_stride + c * t.c_stride + h * t.h_stride + w * t.w_stride];
}

// Plain-loop convolution of packed-or-strided x by a KCRS filter, into packed NCHW.
std::vector<float> ConvRef(const std::vector<float>& x, const DnnTensorDesc& xd, const std::vector<float>& w,
                           const gpurt::DnnFilterDesc& f, const gpurt::DnnConvDesc& c, int oh, int ow) {
  std::vector<float> y(static_cast<size_t>(xd.n) * f.k * oh * ow);
  const int kpg = f.k / c.groups;
  for (int n = 0; n < xd.n; ++n)
    for (int k = 0; k < f.k; ++k)
      for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j) {
          double acc = 0;
          const int g = k / kpg;
          for (int ci = 0; ci < f.c; ++ci)
            for (int r = 0; r < f.h; ++r)
              for (int q = 0; q < f.w; ++q) {
                int h = i * c.stride_h - c.pad_h + r * c.dilation_h, ww = j * c.stride_w - c.pad_w + q * c.dilation_w;
                if (h < 0 || h >= xd.h || ww < 0 || ww >= xd.w) continue;
                int rr = c.mode == gpurt::DnnConvMode::kConvolution ? f.h - 1 - r : r;
                int qq = c.mode == gpurt::DnnConvMode::kConvolution ? f.w - 1 - q : q;
                float wv = f.format == DnnFormat::kNHWC ? w[((static_cast<size_t>(k) * f.h + rr) * f.w + qq) * f.c + ci]
                                                        : w[((static_cast<size_t>(k) * f.c + ci) * f.h + rr) * f.w + qq];
                acc += double(At(x, xd, n, g * f.c + ci, h, ww)) * wv;
              }
          y[((static_cast<size_t>(n) * f.k + k) * oh + i) * ow + j] = static_cast<float>(acc);
        }
  return y;
}

struct ConvCase {
  const char* name;
  int n, c, h, w, k, r, s;
  gpurt::DnnConvDesc conv;
  DnnFormat x_format = DnnFormat::kNCHW, w_format = DnnFormat::kNCHW, y_format = DnnFormat::kNCHW;
  float alpha = 1.0f, beta = 0.0f;
};

gpurt::DnnConvDesc Conv(int ph, int pw, int sh, int sw, int dh, int dw, int groups,
                        gpurt::DnnConvMode mode = gpurt::DnnConvMode::kCrossCorrelation) {
  gpurt::DnnConvDesc c;
  c.pad_h = ph, c.pad_w = pw, c.stride_h = sh, c.stride_w = sw, c.dilation_h = dh, c.dilation_w = dw;
  c.groups = groups, c.mode = mode;
  return c;
}

// A valid convolution's arguments (2x4x9x7 by 6x2x3x3, 2 groups) over placeholder pointers.
gpurt::ConvForwardArgs ValidConv(void* x, void* w, void* y) {
  gpurt::ConvForwardArgs a;
  a.x = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 4, 9, 7);
  a.w = {gpurt::DnnDataType::kFloat, DnnFormat::kNCHW, 6, 2, 3, 3};
  a.conv = Conv(1, 2, 2, 1, 2, 1, 2);
  a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 6, 4, 9);
  a.x_data = x, a.w_data = w, a.y_data = y;
  return a;
}

}  // namespace

TEST_CASE("gpu dnn: convolution forward matches a plain loop (strides, pads, dilations, groups, modes, NHWC)") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s = p.StreamCreate();
  const ConvCase cases[] = {
      {"3x3 stride 2x1 pad 1x2 dilation 2x1, 2 groups", 2, 4, 9, 7, 6, 3, 3, Conv(1, 2, 2, 1, 2, 1, 2)},
      {"1x1 dense", 3, 5, 4, 4, 7, 1, 1, Conv(0, 0, 1, 1, 1, 1, 1)},
      {"depthwise 3x3 pad 1", 1, 6, 8, 8, 6, 3, 3, Conv(1, 1, 1, 1, 1, 1, 6)},
      {"true convolution (flipped filter) 3x2", 2, 3, 6, 5, 4, 3, 2,
       Conv(1, 0, 1, 2, 1, 1, 1, gpurt::DnnConvMode::kConvolution)},
      {"NHWC data and KRSC filter through strides", 2, 4, 7, 6, 8, 3, 3, Conv(1, 1, 2, 2, 1, 1, 2), DnnFormat::kNHWC,
       DnnFormat::kNHWC, DnnFormat::kNHWC},
      {"alpha 2, beta 0.5 blend into y", 2, 3, 5, 5, 4, 3, 3, Conv(1, 1, 1, 1, 1, 1, 1), DnnFormat::kNCHW,
       DnnFormat::kNCHW, DnnFormat::kNCHW, 2.0f, 0.5f},
  };
  unsigned seed = 1;
  for (const ConvCase& cc : cases) {
    CAPTURE(std::string(cc.name));
    DnnTensorDesc xd = DnnTensorDesc::Packed(cc.x_format, cc.n, cc.c, cc.h, cc.w);
    gpurt::DnnFilterDesc fd{gpurt::DnnDataType::kFloat, cc.w_format, cc.k, cc.c / cc.conv.groups, cc.r, cc.s};
    int out[4];
    gpurt::ConvForwardOutputDim(xd, fd, cc.conv, out);
    DnnTensorDesc yd = DnnTensorDesc::Packed(cc.y_format, out[0], out[1], out[2], out[3]);
    std::vector<float> x = Random(static_cast<size_t>(xd.Span()), seed++);
    std::vector<float> w = Random(static_cast<size_t>(fd.k) * fd.c * fd.h * fd.w, seed++);
    std::vector<float> y0 = Random(static_cast<size_t>(yd.Span()), seed++);
    void *dx = Upload(p, x, s), *dw = Upload(p, w, s), *dy = Upload(p, y0, s);
    gpurt::ConvForwardArgs a;
    a.alpha = cc.alpha, a.beta = cc.beta;
    a.x = xd, a.x_data = dx, a.w = fd, a.w_data = dw, a.conv = cc.conv, a.y = yd, a.y_data = dy;
    p.DnnConvolutionForward(p.LibraryHandle(gpurt::Library::kDnn, s), s, a);
    std::vector<float> y = Download(p, dy, y0.size(), s);
    std::vector<float> ref = ConvRef(x, xd, w, fd, cc.conv, out[2], out[3]);
    double worst = 0;
    for (int n = 0; n < out[0]; ++n)
      for (int k = 0; k < out[1]; ++k)
        for (int i = 0; i < out[2]; ++i)
          for (int j = 0; j < out[3]; ++j) {
            float r = ref[((static_cast<size_t>(n) * out[1] + k) * out[2] + i) * out[3] + j];
            float expect = cc.alpha * r + cc.beta * At(y0, yd, n, k, i, j);
            worst = std::max(worst, double(std::fabs(At(y, yd, n, k, i, j) - expect)));
          }
    CHECK(worst < 1e-4);
    for (void* d : {dx, dw, dy}) p.Free(d);
  }
  p.StreamDestroy(s);
}

// The gradients of ConvRef: dx (strided like xd) and dw (KCRS or KRSC like f) of sum(y * dy).
void ConvGradRef(const std::vector<float>& x, const DnnTensorDesc& xd, const std::vector<float>& w,
                 const gpurt::DnnFilterDesc& f, const gpurt::DnnConvDesc& c, const std::vector<float>& dy, int oh,
                 int ow, std::vector<double>& dx, std::vector<double>& dw) {
  dx.assign(static_cast<size_t>(xd.Span()), 0.0);
  dw.assign(w.size(), 0.0);
  const int kpg = f.k / c.groups;
  for (int n = 0; n < xd.n; ++n)
    for (int k = 0; k < f.k; ++k)
      for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j) {
          const double g = dy[((static_cast<size_t>(n) * f.k + k) * oh + i) * ow + j];
          for (int ci = 0; ci < f.c; ++ci)
            for (int r = 0; r < f.h; ++r)
              for (int q = 0; q < f.w; ++q) {
                int h = i * c.stride_h - c.pad_h + r * c.dilation_h, ww = j * c.stride_w - c.pad_w + q * c.dilation_w;
                if (h < 0 || h >= xd.h || ww < 0 || ww >= xd.w) continue;
                int rr = c.mode == gpurt::DnnConvMode::kConvolution ? f.h - 1 - r : r;
                int qq = c.mode == gpurt::DnnConvMode::kConvolution ? f.w - 1 - q : q;
                size_t wi = f.format == DnnFormat::kNHWC ? ((static_cast<size_t>(k) * f.h + rr) * f.w + qq) * f.c + ci
                                                         : ((static_cast<size_t>(k) * f.c + ci) * f.h + rr) * f.w + qq;
                size_t xi = n * xd.n_stride + (k / kpg * f.c + ci) * xd.c_stride + h * xd.h_stride + ww * xd.w_stride;
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
        }
}

TEST_CASE("gpu dnn: convolution backward data and filter are the gradients of the forward convolution") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s = p.StreamCreate();
  void* h = p.LibraryHandle(gpurt::Library::kDnn, s);
  const ConvCase cases[] = {
      {"3x3 stride 2x1 pad 1x2 dilation 2x1, 2 groups", 2, 4, 9, 7, 6, 3, 3, Conv(1, 2, 2, 1, 2, 1, 2)},
      {"true convolution 3x2, alpha 2 beta 0.5", 2, 3, 6, 5, 4, 3, 2,
       Conv(1, 0, 1, 2, 1, 1, 1, gpurt::DnnConvMode::kConvolution), DnnFormat::kNCHW, DnnFormat::kNCHW,
       DnnFormat::kNCHW, 2.0f, 0.5f},
      {"NHWC data and KRSC filter, depthwise", 2, 4, 7, 6, 4, 3, 3, Conv(1, 1, 2, 2, 1, 1, 4), DnnFormat::kNHWC,
       DnnFormat::kNHWC, DnnFormat::kNHWC},
  };
  unsigned seed = 100;
  for (const ConvCase& cc : cases) {
    CAPTURE(std::string(cc.name));
    DnnTensorDesc xd = DnnTensorDesc::Packed(cc.x_format, cc.n, cc.c, cc.h, cc.w);
    gpurt::DnnFilterDesc fd{gpurt::DnnDataType::kFloat, cc.w_format, cc.k, cc.c / cc.conv.groups, cc.r, cc.s};
    int out[4];
    gpurt::ConvForwardOutputDim(xd, fd, cc.conv, out);
    DnnTensorDesc yd = DnnTensorDesc::Packed(DnnFormat::kNCHW, out[0], out[1], out[2], out[3]);
    std::vector<float> x = Random(static_cast<size_t>(xd.Span()), seed++);
    std::vector<float> w = Random(static_cast<size_t>(fd.k) * fd.c * fd.h * fd.w, seed++);
    std::vector<float> dy = Random(static_cast<size_t>(yd.Span()), seed++);
    std::vector<float> dx0 = Random(x.size(), seed++), dw0 = Random(w.size(), seed++);
    void *ddy = Upload(p, dy, s), *dx = Upload(p, x, s), *dw = Upload(p, w, s);
    void *gx = Upload(p, dx0, s), *gw = Upload(p, dw0, s);
    gpurt::ConvBackwardDataArgs bd;
    bd.alpha = cc.alpha, bd.beta = cc.beta;
    bd.w = fd, bd.w_data = dw, bd.dy = yd, bd.dy_data = ddy, bd.conv = cc.conv, bd.dx = xd, bd.dx_data = gx;
    p.DnnConvolutionBackwardData(h, s, bd);
    gpurt::ConvBackwardFilterArgs bf;
    bf.alpha = cc.alpha, bf.beta = cc.beta;
    bf.x = xd, bf.x_data = dx, bf.dy = yd, bf.dy_data = ddy, bf.conv = cc.conv, bf.dw = fd, bf.dw_data = gw;
    p.DnnConvolutionBackwardFilter(h, s, bf);
    std::vector<float> got_dx = Download(p, gx, x.size(), s), got_dw = Download(p, gw, w.size(), s);
    std::vector<double> ref_dx, ref_dw;
    ConvGradRef(x, xd, w, fd, cc.conv, dy, out[2], out[3], ref_dx, ref_dw);
    double worst_dx = 0, worst_dw = 0;
    for (size_t i = 0; i < x.size(); ++i)
      worst_dx = std::max(worst_dx, std::fabs(got_dx[i] - (cc.alpha * ref_dx[i] + cc.beta * dx0[i])));
    for (size_t i = 0; i < w.size(); ++i)
      worst_dw = std::max(worst_dw, std::fabs(got_dw[i] - (cc.alpha * ref_dw[i] + cc.beta * dw0[i])));
    CHECK(worst_dx < 1e-4);
    CHECK(worst_dw < 1e-4);
    for (void* d : {ddy, dx, dw, gx, gw}) p.Free(d);
  }
  // The backward calls check the forward geometry, naming their own operands.
  void* buf = p.Malloc(4096 * sizeof(float));
  gpurt::ConvBackwardDataArgs bd;
  bd.w = {gpurt::DnnDataType::kFloat, DnnFormat::kNCHW, 6, 2, 3, 3}, bd.conv = Conv(1, 2, 2, 1, 2, 1, 2);
  bd.dx = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 4, 9, 7), bd.dy = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 6, 4, 8);
  bd.w_data = bd.dy_data = bd.dx_data = buf;
  Outcome o = DnnOutcome([&] { p.DnnConvolutionBackwardData(h, s, bd); });
  CHECK(o.status == gpurt::kDnnNotSupported);
  CHECK(o.message.find("dy (the output's gradient) is [2, 6, 4, 8]") != std::string::npos);
  CHECK(o.message.find("gives [2, 6, 4, 9]") != std::string::npos);
  bd.dy.w = 9, bd.dy.n_stride = 6 * 4 * 9, bd.dy.c_stride = 4 * 9;
  bd.dx.c_stride = 1;  // dx is written: overlapping strides are rejected
  o = DnnOutcome([&] { p.DnnConvolutionBackwardData(h, s, bd); });
  CHECK(o.status == gpurt::kDnnBadParam);
  CHECK(o.message.find("dx (the input's gradient) is") != std::string::npos);
  gpurt::ConvBackwardFilterArgs bf;
  bf.x = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 4, 9, 7), bf.dy = bd.dy, bf.conv = bd.conv;
  bf.dw = {gpurt::DnnDataType::kFloat, DnnFormat::kNCHW, 6, 4, 3, 3};  // C of the whole input, not per group
  bf.x_data = bf.dy_data = bf.dw_data = buf;
  o = DnnOutcome([&] { p.DnnConvolutionBackwardFilter(h, s, bf); });
  CHECK(o.status == gpurt::kDnnBadParam);
  CHECK(o.message.find("the filter's C is the input channels per group") != std::string::npos);
  CHECK(o.message.find("cudnnConvolutionBackwardFilter: ") == 0);
  p.StreamSynchronize(s);
  p.Free(buf);
  p.StreamDestroy(s);
}

TEST_CASE("gpu dnn: pooling forward, max and average with and without the padding") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s = p.StreamCreate();
  for (auto mode : {gpurt::DnnPoolingMode::kMax, gpurt::DnnPoolingMode::kAverageCountIncludePadding,
                    gpurt::DnnPoolingMode::kAverageCountExcludePadding}) {
    for (DnnFormat fmt : {DnnFormat::kNCHW, DnnFormat::kNHWC}) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(static_cast<int>(fmt));
      gpurt::PoolingForwardArgs a;
      a.pool = {mode, 3, 2, 1, 1, 2, 1};  // window 3x2, pads 1x1, strides 2x1
      a.x = DnnTensorDesc::Packed(fmt, 2, 3, 7, 6);
      int out[4];
      gpurt::PoolingForwardOutputDim(a.pool, a.x, out);
      CHECK(out[2] == 4);
      CHECK(out[3] == 7);
      a.y = DnnTensorDesc::Packed(fmt, out[0], out[1], out[2], out[3]);
      std::vector<float> x = Random(static_cast<size_t>(a.x.Span()), 7);
      a.x_data = Upload(p, x, s);
      a.y_data = p.Malloc(static_cast<size_t>(a.y.Span()) * sizeof(float));
      p.DnnPoolingForward(p.LibraryHandle(gpurt::Library::kDnn, s), s, a);
      std::vector<float> y = Download(p, a.y_data, static_cast<size_t>(a.y.Span()), s);
      double worst = 0;
      for (int n = 0; n < 2; ++n)
        for (int c = 0; c < 3; ++c)
          for (int i = 0; i < out[2]; ++i)
            for (int j = 0; j < out[3]; ++j) {
              float mx = -INFINITY;
              double sum = 0;
              int inside = 0;
              for (int r = 0; r < 3; ++r)
                for (int q = 0; q < 2; ++q) {
                  int h = i * 2 - 1 + r, w = j - 1 + q;
                  if (h < 0 || h >= 7 || w < 0 || w >= 6) continue;
                  mx = std::max(mx, At(x, a.x, n, c, h, w)), sum += At(x, a.x, n, c, h, w), ++inside;
                }
              double expect = mode == gpurt::DnnPoolingMode::kMax ? mx
                              : mode == gpurt::DnnPoolingMode::kAverageCountIncludePadding ? sum / 6
                                                                                            : sum / inside;
              worst = std::max(worst, std::fabs(At(y, a.y, n, c, i, j) - expect));
            }
      CHECK(worst < 1e-5);
      p.Free(const_cast<void*>(a.x_data));
      p.Free(a.y_data);
    }
  }
  p.StreamDestroy(s);
}

TEST_CASE("gpu dnn: batch norm training gives the batch statistics and updates the running ones as cuDNN does") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s = p.StreamCreate();
  for (auto mode : {gpurt::DnnBatchNormMode::kSpatial, gpurt::DnnBatchNormMode::kPerActivation}) {
    const bool spatial = mode == gpurt::DnnBatchNormMode::kSpatial;
    CAPTURE(spatial);
    const int N = 4, C = 3, H = 5, W = 2, np = spatial ? C : C * H * W, count = spatial ? N * H * W : N;
    std::vector<float> x = Random(static_cast<size_t>(N) * C * H * W, 11);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 3.0f * x[i] + 1.5f;  // mean and variance far from 0 and 1
    std::vector<float> scale = Random(np, 12), bias = Random(np, 13), rmean(np, 0.25f), rvar(np, 2.0f);
    gpurt::BatchNormArgs a;
    a.mode = mode;
    a.x = a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, N, C, H, W);
    a.param = DnnTensorDesc::Packed(DnnFormat::kNCHW, 1, C, spatial ? 1 : H, spatial ? 1 : W);
    a.x_data = Upload(p, x, s);
    a.y_data = p.Malloc(x.size() * sizeof(float));
    a.scale = Upload(p, scale, s), a.bias = Upload(p, bias, s);
    a.running_mean = Upload(p, rmean, s), a.running_var = Upload(p, rvar, s);
    a.save_mean = p.Malloc(np * sizeof(float)), a.save_inv_variance = p.Malloc(np * sizeof(float));
    a.exponential_average_factor = 0.1;
    a.epsilon = 1e-3;
    p.DnnBatchNormForwardTraining(p.LibraryHandle(gpurt::Library::kDnn, s), s, a);
    std::vector<float> y = Download(p, a.y_data, x.size(), s), sm = Download(p, a.save_mean, np, s),
                       si = Download(p, a.save_inv_variance, np, s), rm = Download(p, a.running_mean, np, s),
                       rv = Download(p, a.running_var, np, s);
    auto param = [&](int c, int hw) { return spatial ? c : c * H * W + hw; };
    std::vector<double> mean(np), var(np);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c)
        for (int i = 0; i < H * W; ++i) mean[param(c, i)] += x[(n * C + c) * H * W + i] / double(count);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c)
        for (int i = 0; i < H * W; ++i) {
          double d = x[(n * C + c) * H * W + i] - mean[param(c, i)];
          var[param(c, i)] += d * d / count;
        }
    for (int j = 0; j < np; ++j) {
      CHECK(sm[j] == doctest::Approx(mean[j]).epsilon(1e-5));
      CHECK(si[j] == doctest::Approx(1.0 / std::sqrt(var[j] + 1e-3)).epsilon(1e-5));  // saved inverse std
      CHECK(rm[j] == doctest::Approx(0.9 * 0.25 + 0.1 * mean[j]).epsilon(1e-5));
      CHECK(rv[j] == doctest::Approx(0.9 * 2.0 + 0.1 * var[j] * count / (count - 1)).epsilon(1e-5));  // unbiased
    }
    double worst = 0;
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c)
        for (int i = 0; i < H * W; ++i) {
          int j = param(c, i), at = (n * C + c) * H * W + i;
          double expect = scale[j] * (x[at] - mean[j]) / std::sqrt(var[j] + 1e-3) + bias[j];
          worst = std::max(worst, std::fabs(y[at] - expect));
        }
    CHECK(worst < 1e-4);

    // Inference normalizes with the running statistics just updated.
    p.DnnBatchNormForwardInference(p.LibraryHandle(gpurt::Library::kDnn, s), s, a);
    y = Download(p, a.y_data, x.size(), s);
    worst = 0;
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c)
        for (int i = 0; i < H * W; ++i) {
          int j = param(c, i), at = (n * C + c) * H * W + i;
          double expect = scale[j] * (x[at] - rm[j]) / std::sqrt(rv[j] + 1e-3) + bias[j];
          worst = std::max(worst, std::fabs(y[at] - expect));
        }
    CHECK(worst < 1e-4);
    for (const void* d : {a.x_data, a.scale, a.bias}) p.Free(const_cast<void*>(d));
    for (void* d : {a.y_data, a.running_mean, a.running_var, a.save_mean, a.save_inv_variance}) p.Free(d);
  }
  p.StreamDestroy(s);
}

TEST_CASE("gpu dnn: every argument check fails with cuDNN's status and says what was expected and found") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s = p.StreamCreate();
  void* h = p.LibraryHandle(gpurt::Library::kDnn, s);
  void *x = p.Malloc(4096 * sizeof(float)), *w = p.Malloc(4096 * sizeof(float)), *y = p.Malloc(4096 * sizeof(float));
  using A = gpurt::ConvForwardArgs;
  struct Case {
    const char* name;
    std::function<void(A&)> mutate;
    int status;
    const char* says;  // a part of the message that tells what to do
  };
  const Case conv_cases[] = {
      {"valid", [](A&) {}, 0, ""},
      {"output of the wrong spatial size", [](A& a) { a.y.h = 5; a.y.n_stride = 6 * 5 * 9, a.y.c_stride = 5 * 9; },
       gpurt::kDnnNotSupported, "cudnnGetConvolution2dForwardOutputDim gives [2, 6, 4, 9]"},
      {"output with the wrong channels", [](A& a) { a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 4, 4, 9); },
       gpurt::kDnnBadParam, "channels from the filter's K"},
      {"NHWC data described as NCHW", [](A& a) { a.x = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 7, 4, 9); },
       gpurt::kDnnBadParam, "describe it with NHWC strides"},
      {"negative pad", [](A& a) { a.conv.pad_h = -1; }, gpurt::kDnnBadParam, "pads must be >= 0"},
      {"stride 0", [](A& a) { a.conv.stride_w = 0; }, gpurt::kDnnBadParam, "strides and dilations >= 1"},
      {"dilation 0", [](A& a) { a.conv.dilation_h = 0; }, gpurt::kDnnBadParam, "strides and dilations >= 1"},
      {"group count 0", [](A& a) { a.conv.groups = 0; }, gpurt::kDnnBadParam, "at least 1"},
      {"filters not a multiple of the groups", [](A& a) { a.w.k = 5; a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 5, 4, 9); },
       gpurt::kDnnBadParam, "not a multiple of the 2 groups"},
      {"filter larger than the padded input", [](A& a) { a.w.h = 7; }, gpurt::kDnnBadParam, "pad the input more"},
      {"bad convolution mode", [](A& a) { a.conv.mode = static_cast<gpurt::DnnConvMode>(5); }, gpurt::kDnnBadParam,
       "CUDNN_CROSS_CORRELATION"},
      {"null input", [](A& a) { a.x_data = nullptr; }, gpurt::kDnnBadParamNullPointer, "pass device memory"},
      {"double data", [](A& a) { a.x.dtype = a.y.dtype = a.w.dtype = gpurt::DnnDataType::kDouble; },
       gpurt::kDnnNotSupportedDataType, "convert the tensor to float32"},
      {"mixed data types", [](A& a) { a.w.dtype = gpurt::DnnDataType::kHalf; }, gpurt::kDnnBadParam,
       "cuDNN needs them to match"},
      {"zero stride", [](A& a) { a.x.w_stride = 0; }, gpurt::kDnnBadParam, "strides must be at least 1"},
      {"output strides that overlap", [](A& a) { a.y.h_stride = 1; }, gpurt::kDnnBadParam, "share an address"},
      {"empty input", [](A& a) { a.x.n = 0; }, gpurt::kDnnBadParam, "at least 1"},
      {"NCHW_VECT_C filter", [](A& a) { a.w.format = DnnFormat::kNCHWVectC; }, gpurt::kDnnBadParam, "int8 data only"},
      {"misaligned pointer", [](A& a) { a.y_data = static_cast<char*>(a.y_data) + 2; },
       gpurt::kDnnBadParamMisalignedPointer, "aligned"},
  };
  for (const Case& c : conv_cases) {
    CAPTURE(std::string(c.name));
    A a = ValidConv(x, w, y);
    c.mutate(a);
    Outcome o = DnnOutcome([&] { p.DnnConvolutionForward(h, s, a); });
    CHECK(o.status == c.status);
    CHECK(o.message.find(c.says) != std::string::npos);
    if (c.status) CHECK(o.message.find("cudnnConvolutionForward: ") == 0);  // names the call
  }

  using PA = gpurt::PoolingForwardArgs;
  struct PoolCase {
    const char* name;
    std::function<void(PA&)> mutate;
    int status;
    const char* says;
  };
  const PoolCase pool_cases[] = {
      {"valid", [](PA&) {}, 0, ""},
      {"window 0", [](PA& a) { a.pool.window_w = 0; }, gpurt::kDnnBadParam, "at least 1"},
      {"bad mode", [](PA& a) { a.pool.mode = static_cast<gpurt::DnnPoolingMode>(9); }, gpurt::kDnnBadParam,
       "CUDNN_POOLING_MAX"},
      {"window larger than the padded input", [](PA& a) { a.pool.window_h = 12; }, gpurt::kDnnBadParam,
       "larger than the padded input"},
      {"output of the wrong size", [](PA& a) { a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 4); },
       gpurt::kDnnBadParam, "gives [2, 3, 4, 3]"},
      {"output with other channels", [](PA& a) { a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 4, 4, 3); },
       gpurt::kDnnBadParam, "must match"},
      {"null output", [](PA& a) { a.y_data = nullptr; }, gpurt::kDnnBadParamNullPointer, "y (the output) is null"},
  };
  for (const PoolCase& c : pool_cases) {
    CAPTURE(std::string(c.name));
    PA a;
    a.pool = {gpurt::DnnPoolingMode::kMax, 3, 3, 1, 1, 2, 2};
    a.x = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 8, 6);
    a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 3);
    a.x_data = x, a.y_data = y;
    c.mutate(a);
    Outcome o = DnnOutcome([&] { p.DnnPoolingForward(h, s, a); });
    CHECK(o.status == c.status);
    CHECK(o.message.find(c.says) != std::string::npos);
  }

  using B = gpurt::BatchNormArgs;
  struct BnCase {
    const char* name;
    std::function<void(B&)> mutate;
    int status;
    const char* says;
  };
  const BnCase bn_cases[] = {
      {"valid", [](B&) {}, 0, ""},
      {"spatial parameters of per-activation shape", [](B& a) { a.param = DnnTensorDesc::Packed(DnnFormat::kNCHW, 1, 3, 4, 4); },
       gpurt::kDnnBadParam, "needs [1, 3, 1, 1]"},
      {"per-activation mode with spatial parameters", [](B& a) { a.mode = gpurt::DnnBatchNormMode::kPerActivation; },
       gpurt::kDnnBadParam, "needs [1, 3, 4, 4]"},
      {"negative epsilon", [](B& a) { a.epsilon = -1e-5; }, gpurt::kDnnBadParam, "CUDNN_BN_MIN_EPSILON"},
      {"only one of the saved statistics", [](B& a) { a.save_inv_variance = nullptr; }, gpurt::kDnnBadParam,
       "pass both (for the backward pass) or neither"},
      {"only one of the running statistics", [](B& a) { a.running_mean = nullptr; }, gpurt::kDnnBadParam,
       "pass both (to update the running statistics) or neither"},
      {"momentum given as MXNet's 0.9-style factor above 1", [](B& a) { a.exponential_average_factor = 1.5; },
       gpurt::kDnnBadParam, "lies in [0, 1]"},
      {"output of another shape", [](B& a) { a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 5); },
       gpurt::kDnnBadParam, "keeps the shape"},
      {"null scale", [](B& a) { a.scale = nullptr; }, gpurt::kDnnBadParamNullPointer, "bnScale is null"},
      {"bad mode", [](B& a) { a.mode = static_cast<gpurt::DnnBatchNormMode>(7); }, gpurt::kDnnBadParam,
       "CUDNN_BATCHNORM_PER_ACTIVATION (0)"},
  };
  for (const BnCase& c : bn_cases) {
    CAPTURE(std::string(c.name));
    B a;
    a.x = a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 4);
    a.param = DnnTensorDesc::Packed(DnnFormat::kNCHW, 1, 3, 1, 1);
    a.x_data = x, a.y_data = y, a.scale = w, a.bias = w;
    a.running_mean = static_cast<float*>(w) + 8, a.running_var = static_cast<float*>(w) + 16;
    a.save_mean = static_cast<float*>(w) + 24, a.save_inv_variance = static_cast<float*>(w) + 32;
    c.mutate(a);
    Outcome o = DnnOutcome([&] { p.DnnBatchNormForwardTraining(h, s, a); });
    CHECK(o.status == c.status);
    CHECK(o.message.find(c.says) != std::string::npos);
  }
  // Inference reads the running statistics: they are required there.
  B a;
  a.x = a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 4);
  a.param = DnnTensorDesc::Packed(DnnFormat::kNCHW, 1, 3, 1, 1);
  a.x_data = x, a.y_data = y, a.scale = w, a.bias = w;
  CHECK(DnnOutcome([&] { p.DnnBatchNormForwardInference(h, s, a); }).status == gpurt::kDnnBadParamNullPointer);
  p.StreamSynchronize(s);
  for (void* d : {x, w, y}) p.Free(d);
  p.StreamDestroy(s);
}

#if KILN_WITH_CUDNN
TEST_CASE("dnn descriptors: kiln's checks and output dims agree with cuDNN's own descriptor functions") {
  // cuDNN's descriptor functions run without a driver: every case is asked of both.
  struct Case {
    DnnTensorDesc x;
    gpurt::DnnFilterDesc w;
    gpurt::DnnConvDesc c;
  };
  auto X = [](int n, int c, int h, int w) { return DnnTensorDesc::Packed(DnnFormat::kNCHW, n, c, h, w); };
  auto F = [](int k, int c, int h, int w, DnnFormat f = DnnFormat::kNCHW) {
    return gpurt::DnnFilterDesc{gpurt::DnnDataType::kFloat, f, k, c, h, w};
  };
  std::vector<Case> cases = {
      {X(2, 4, 9, 7), F(6, 2, 3, 3), Conv(1, 2, 2, 1, 2, 1, 2)},
      {X(1, 3, 32, 32), F(16, 3, 5, 5), Conv(2, 2, 1, 1, 1, 1, 1)},
      {X(1, 3, 32, 31), F(16, 3, 3, 3), Conv(0, 0, 3, 2, 1, 1, 1)},
      {X(4, 8, 10, 10), F(8, 1, 3, 3), Conv(1, 1, 1, 1, 3, 3, 8)},
      {X(1, 3, 5, 5), F(4, 3, 5, 5), Conv(0, 0, 1, 1, 1, 1, 1)},
      {X(1, 3, 5, 5), F(4, 3, 2, 2, DnnFormat::kNHWC), Conv(0, 0, 4, 4, 1, 1, 1)},
      {X(2, 4, 9, 7), F(6, 4, 3, 3), Conv(0, 0, 1, 1, 1, 1, 2)},          // channels x groups mismatch
      {X(2, 4, 9, 7), F(6, 2, 30, 3), Conv(1, 2, 2, 1, 2, 1, 2)},         // filter larger than the input
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 1, 1, 3, 1, 1)},          // dilated filter larger
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(-1, 0, 1, 1, 1, 1, 1)},         // negative pad
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 0, 1, 1, 1, 1)},          // stride 0
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 1, 1, 1, 0, 1)},          // dilation 0
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 1, 1, 1, 1, 0)},          // no groups
      {X(0, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 1, 1, 1, 1, 1)},          // empty batch
      {X(1, 3, 5, 5), F(0, 3, 3, 3), Conv(0, 0, 1, 1, 1, 1, 1)},          // no filters
      {X(1, 4, 5, 5), F(4, 4, 1, 1, DnnFormat::kNCHWVectC), Conv(0, 0, 1, 1, 1, 1, 1)},
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 1, 1, 1, 1, 1, static_cast<gpurt::DnnConvMode>(5))},
  };
  DnnTensorDesc zero_stride = X(1, 2, 3, 4);
  zero_stride.w_stride = 0;
  cases.push_back({zero_stride, F(4, 2, 1, 1), Conv(0, 0, 1, 1, 1, 1, 1)});
  int rejected = 0;
  for (const Case& c : cases) {
    CAPTURE(c.x.ToString());
    CAPTURE(c.w.k);
    CAPTURE(c.w.c);
    CAPTURE(c.w.h);
    CAPTURE(c.w.w);
    int ours[4] = {}, theirs[4] = {};
    Outcome o = DnnOutcome([&] {
      gpurt::CheckTensorDesc(c.x, "x", "test");
      gpurt::CheckFilterDesc(c.w, "test");
      gpurt::ConvForwardOutputDim(c.x, c.w, c.c, ours);
    });
    int status = gpurt::CudnnConvForwardOutputDim(c.x, c.w, c.c, theirs);
    CHECK(o.status == status);
    if (status == 0)
      for (int i = 0; i < 4; ++i) CHECK(ours[i] == theirs[i]);
    rejected += status != 0;
  }
  CHECK(rejected == 12);

  struct PoolCase {
    gpurt::DnnPoolingDesc p;
    DnnTensorDesc x;
  };
  const PoolCase pools[] = {
      {{gpurt::DnnPoolingMode::kMax, 3, 2, 1, 0, 2, 2}, X(2, 4, 9, 7)},
      {{gpurt::DnnPoolingMode::kAverageCountExcludePadding, 2, 2, 0, 0, 2, 2}, X(1, 1, 7, 7)},
      {{gpurt::DnnPoolingMode::kAverageCountIncludePadding, 3, 3, 1, 1, 1, 1}, X(1, 2, 4, 4)},
      {{gpurt::DnnPoolingMode::kMax, 30, 2, 1, 0, 2, 2}, X(2, 4, 9, 7)},  // window larger than the input
      {{gpurt::DnnPoolingMode::kMax, 0, 2, 0, 0, 1, 1}, X(2, 4, 9, 7)},   // window 0
      {{gpurt::DnnPoolingMode::kMax, 2, 2, 0, 0, 0, 1}, X(2, 4, 9, 7)},   // stride 0
      {{static_cast<gpurt::DnnPoolingMode>(9), 2, 2, 0, 0, 1, 1}, X(2, 4, 9, 7)},
  };
  for (const PoolCase& c : pools) {
    int ours[4] = {}, theirs[4] = {};
    Outcome o = DnnOutcome([&] { gpurt::PoolingForwardOutputDim(c.p, c.x, ours); });
    int status = gpurt::CudnnPoolingForwardOutputDim(c.p, c.x, theirs);
    CHECK(o.status == status);
    if (status == 0)
      for (int i = 0; i < 4; ++i) CHECK(ours[i] == theirs[i]);
  }
}
#endif

TEST_CASE("gpu dnn: a handle bound to another stream, or not a cuDNN handle, is rejected") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s1 = p.StreamCreate(), s2 = p.StreamCreate();
  void *x = p.Malloc(4096 * sizeof(float)), *w = p.Malloc(4096 * sizeof(float)), *y = p.Malloc(4096 * sizeof(float));
  gpurt::ConvForwardArgs a = ValidConv(x, w, y);
  void* h = p.LibraryHandle(gpurt::Library::kDnn, s1);
  Outcome o = DnnOutcome([&] { p.DnnConvolutionForward(h, s2, a); });
  CHECK(o.status == gpurt::kDnnBadParamStreamMismatch);
  CHECK(o.message.find("cudnnSetStream") != std::string::npos);
  CHECK(DnnOutcome([&] { p.DnnConvolutionForward(h, s1, a); }).status == 0);
  // Rebinding the device's handle to s2 makes s2 right and s1 wrong.
  CHECK(p.LibraryHandle(gpurt::Library::kDnn, s2) == h);
  CHECK(DnnOutcome([&] { p.DnnConvolutionForward(h, s2, a); }).status == 0);
  CHECK(DnnOutcome([&] { p.DnnConvolutionForward(h, s1, a); }).status == gpurt::kDnnBadParamStreamMismatch);
  // The default stream is a stream too.
  CHECK(DnnOutcome([&] { p.DnnConvolutionForward(h, nullptr, a); }).status == gpurt::kDnnBadParamStreamMismatch);
  CHECK(DnnOutcome([&] { p.DnnConvolutionForward(p.LibraryHandle(gpurt::Library::kDnn, nullptr), nullptr, a); })
            .status == 0);
  Outcome blas = DnnOutcome([&] { p.DnnConvolutionForward(p.LibraryHandle(gpurt::Library::kBlasLt, s1), s1, a); });
  CHECK(blas.status == gpurt::kDnnBadParam);
  CHECK(blas.message.find("cuBLASLt handle") != std::string::npos);
  CHECK(DnnOutcome([&] { p.DnnConvolutionForward(nullptr, s1, a); }).status == gpurt::kDnnBadParam);
  // A platform without cuDNN says so with cuDNN's own status.
  std::unique_ptr<gpurt::Platform> none(gpurt::CreateNoPlatform());
  CHECK(DnnOutcome([&] { none->DnnPoolingForward(nullptr, nullptr, {}); }).status == gpurt::kDnnNotInitialized);
  p.DeviceSynchronize();
  for (void* d : {x, w, y}) p.Free(d);
  p.StreamDestroy(s1), p.StreamDestroy(s2);
}

TEST_CASE("gpu dnn: a host pointer or a too small buffer faults on the stream as the GPU's kernel would") {
  struct Bad {
    const char* name;
    int which;  // 0: x is host memory, 1: y is one element short, 2: w lies on the other device
    const char* says;
  };
  for (const Bad& b : {Bad{"host input", 0, "x (the input) is host memory"},
                       Bad{"short output", 1, "y (the output) is not 1728 bytes of one live allocation"},
                       Bad{"filter of the other device", 2, "w (the filter) is memory of gpu(1)"}}) {
    CAPTURE(std::string(b.name));
    // A private simulator: the fault leaves its device unusable, as on a GPU.
    std::unique_ptr<gpurt::Platform> p(gpurt::CreateSimulatedPlatform(2, size_t{16} << 20));
    std::vector<float> host(4096);
    void* other = nullptr;
    {
      gpurt::DeviceGuard g1(1, *p);
      other = p->Malloc(4096 * sizeof(float));
    }
    gpurt::DeviceGuard guard(0, *p);
    gpurt::Stream s = p->StreamCreate();
    void *x = p->Malloc(4096 * sizeof(float)), *w = p->Malloc(4096 * sizeof(float));
    void* y = p->Malloc(256 * sizeof(float));  // 432 floats needed (allocations are rounded to 512 bytes)
    void* big_y = p->Malloc(4096 * sizeof(float));
    gpurt::ConvForwardArgs a = ValidConv(b.which == 0 ? host.data() : x, b.which == 2 ? other : w,
                                         b.which == 1 ? y : big_y);
    // cuDNN does not look at the pointers: the call is queued, the kernel faults.
    CHECK(DnnOutcome([&] { p->DnnConvolutionForward(p->LibraryHandle(gpurt::Library::kDnn, s), s, a); }).status == 0);
    int code = 0;
    std::string what;
    try {
      p->StreamSynchronize(s);
    } catch (const gpurt::GpuError& e) {
      code = e.code(), what = e.what();
    }
    CHECK(code == gpurt::kIllegalAddress);
    CHECK(what.find(b.says) != std::string::npos);
    CHECK(what.find("cudnnConvolutionForward") != std::string::npos);
    // Sticky: later calls on the device fail too.
    CHECK(CodeOf([&] { p->DnnConvolutionForward(p->LibraryHandle(gpurt::Library::kDnn, s), s, a); }) ==
          gpurt::kIllegalAddress);
  }
}

TEST_CASE("gpu dnn: calls on device 1 run in stream order, queued behind the work before them, and capture") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(1, p);
  gpurt::Stream s = p.StreamCreate();
  std::vector<float> x = Random(2 * 4 * 9 * 7, 21), w = Random(6 * 2 * 3 * 3, 22);
  // Block the stream, then queue upload -> convolution -> pooling of its output.
  void* dz = Upload(p, std::vector<float>(2 * 6 * 2 * 4, NAN), s);
  p.StreamSynchronize(s);
  std::atomic<bool> go{false};
  p.LaunchHostFunc(s, [](void* g) { while (!static_cast<std::atomic<bool>*>(g)->load()) std::this_thread::yield(); }, &go);
  void *dx = Upload(p, x, s), *dw = Upload(p, w, s);
  void* dy = p.Malloc(2 * 6 * 4 * 9 * sizeof(float));
  gpurt::ConvForwardArgs a = ValidConv(dx, dw, dy);
  void* h = p.LibraryHandle(gpurt::Library::kDnn, s);
  p.DnnConvolutionForward(h, s, a);
  gpurt::PoolingForwardArgs pa;
  pa.pool = {gpurt::DnnPoolingMode::kMax, 2, 2, 0, 0, 2, 2};
  pa.x = a.y, pa.x_data = dy;
  pa.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 6, 2, 4), pa.y_data = dz;
  p.DnnPoolingForward(h, s, pa);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(std::isnan(HostView<float>(dz)[0]));  // nothing ran yet
  CHECK(!p.StreamQuery(s));
  go = true;
  std::vector<float> z = Download(p, dz, 2 * 6 * 2 * 4, s);
  std::vector<float> ref = ConvRef(x, a.x, w, a.w, a.conv, 4, 9);
  double worst = 0;
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 6; ++k)
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) {
          float m = -INFINITY;
          for (int r = 0; r < 2; ++r)
            for (int q = 0; q < 2; ++q) m = std::max(m, ref[((n * 6 + k) * 4 + 2 * i + r) * 9 + 2 * j + q]);
          worst = std::max(worst, double(std::fabs(z[((n * 6 + k) * 2 + i) * 4 + j] - m)));
        }
  CHECK(worst < 1e-4);

  // Captured into a graph, the calls run when it is launched.
  p.MemsetAsync(dz, 0, 2 * 6 * 2 * 4 * sizeof(float), s);
  p.StreamSynchronize(s);
  p.StreamBeginCapture(s);
  p.DnnConvolutionForward(h, s, a);
  p.DnnPoolingForward(h, s, pa);
  gpurt::Graph g = p.StreamEndCapture(s);
  gpurt::GraphExec ge = p.GraphInstantiate(g);
  p.StreamSynchronize(s);
  CHECK(Download(p, dz, 1, s)[0] == 0.0f);  // capture ran nothing
  p.GraphLaunch(ge, s);
  CHECK(Download(p, dz, z.size(), s) == z);
  p.GraphExecDestroy(ge);
  p.GraphDestroy(g);
  for (void* d : {dx, dw, dy, dz}) p.Free(d);
  p.StreamDestroy(s);
}

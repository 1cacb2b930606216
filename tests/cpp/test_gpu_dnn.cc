// The platform's cuDNN calls on simulated GPUs (runtime/gpusim/sim_dnn.cc), their numbers:
// convolution forward and backward (data, filter) against plain loops (strides, pads, dilations,
// groups, both modes, NHWC strides, alpha/beta), pooling forward and backward, batch norm's
// statistics and running averages, its backward against finite differences; and their order:
// device 1, queued behind the stream's earlier work, captured in graphs.
// The argument checks are tested in test_gpu_dnn_checks.cc.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu_dnn_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// The gradients of ConvRef: dx (strided like xd) and dw (KCRS or KRSC like f) of sum(y * dy).
void ConvGradRef(const std::vector<float>& x, const DnnTensorDesc& xd, const std::vector<float>& w,
                 const gpurt::DnnFilterDesc& f, const gpurt::DnnConvDesc& c, const std::vector<float>& dy,
                 int oh, int ow, std::vector<double>& dx, std::vector<double>& dw) {
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
                int h = i * c.stride_h - c.pad_h + r * c.dilation_h,
                    ww = j * c.stride_w - c.pad_w + q * c.dilation_w;
                if (h < 0 || h >= xd.h || ww < 0 || ww >= xd.w) continue;
                int rr = c.mode == gpurt::DnnConvMode::kConvolution ? f.h - 1 - r : r;
                int qq = c.mode == gpurt::DnnConvMode::kConvolution ? f.w - 1 - q : q;
                size_t wi = f.format == DnnFormat::kNHWC
                                ? ((static_cast<size_t>(k) * f.h + rr) * f.w + qq) * f.c + ci
                                : ((static_cast<size_t>(k) * f.c + ci) * f.h + rr) * f.w + qq;
                size_t xi =
                    n * xd.n_stride + (k / kpg * f.c + ci) * xd.c_stride + h * xd.h_stride + ww * xd.w_stride;
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
        }
}

} // namespace

TEST_CASE(
    "gpu dnn: convolution forward matches a plain loop (strides, pads, dilations, groups, modes, NHWC)") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s = p.StreamCreate();
  const ConvCase cases[] = {
      {"3x3 stride 2x1 pad 1x2 dilation 2x1, 2 groups", 2, 4, 9, 7, 6, 3, 3, Conv(1, 2, 2, 1, 2, 1, 2)},
      {"1x1 dense", 3, 5, 4, 4, 7, 1, 1, Conv(0, 0, 1, 1, 1, 1, 1)},
      {"depthwise 3x3 pad 1", 1, 6, 8, 8, 6, 3, 3, Conv(1, 1, 1, 1, 1, 1, 6)},
      {"true convolution (flipped filter) 3x2", 2, 3, 6, 5, 4, 3, 2,
       Conv(1, 0, 1, 2, 1, 1, 1, gpurt::DnnConvMode::kConvolution)},
      {"NHWC data and KRSC filter through strides", 2, 4, 7, 6, 8, 3, 3, Conv(1, 1, 2, 2, 1, 1, 2),
       DnnFormat::kNHWC, DnnFormat::kNHWC, DnnFormat::kNHWC},
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
      {"NHWC data and KRSC filter, depthwise", 2, 4, 7, 6, 4, 3, 3, Conv(1, 1, 2, 2, 1, 1, 4),
       DnnFormat::kNHWC, DnnFormat::kNHWC, DnnFormat::kNHWC},
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
  bd.dx = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 4, 9, 7),
  bd.dy = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 6, 4, 8);
  bd.w_data = bd.dy_data = bd.dx_data = buf;
  Outcome o = DnnOutcome([&] { p.DnnConvolutionBackwardData(h, s, bd); });
  CHECK(o.status == gpurt::kDnnNotSupported);
  CHECK(o.message.find("dy (the output's gradient) is [2, 6, 4, 8]") != std::string::npos);
  CHECK(o.message.find("gives [2, 6, 4, 9]") != std::string::npos);
  bd.dy.w = 9, bd.dy.n_stride = 6 * 4 * 9, bd.dy.c_stride = 4 * 9;
  bd.dx.c_stride = 1; // dx is written: overlapping strides are rejected
  o = DnnOutcome([&] { p.DnnConvolutionBackwardData(h, s, bd); });
  CHECK(o.status == gpurt::kDnnBadParam);
  CHECK(o.message.find("dx (the input's gradient) is") != std::string::npos);
  gpurt::ConvBackwardFilterArgs bf;
  bf.x = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 4, 9, 7), bf.dy = bd.dy, bf.conv = bd.conv;
  bf.dw = {gpurt::DnnDataType::kFloat, DnnFormat::kNCHW, 6, 4, 3, 3}; // C of the whole input, not per group
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
      a.pool = {mode, 3, 2, 1, 1, 2, 1}; // window 3x2, pads 1x1, strides 2x1
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
              double expect = mode == gpurt::DnnPoolingMode::kMax                          ? mx
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

TEST_CASE(
    "gpu dnn: batch norm training gives the batch statistics and updates the running ones as cuDNN does") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s = p.StreamCreate();
  for (auto mode : {gpurt::DnnBatchNormMode::kSpatial, gpurt::DnnBatchNormMode::kPerActivation}) {
    const bool spatial = mode == gpurt::DnnBatchNormMode::kSpatial;
    CAPTURE(spatial);
    const int N = 4, C = 3, H = 5, W = 2, np = spatial ? C : C * H * W, count = spatial ? N * H * W : N;
    std::vector<float> x = Random(static_cast<size_t>(N) * C * H * W, 11);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 3.0f * x[i] + 1.5f; // mean and variance far from 0 and 1
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
      CHECK(si[j] == doctest::Approx(1.0 / std::sqrt(var[j] + 1e-3)).epsilon(1e-5)); // saved inverse std
      CHECK(rm[j] == doctest::Approx(0.9 * 0.25 + 0.1 * mean[j]).epsilon(1e-5));
      CHECK(rv[j] ==
            doctest::Approx(0.9 * 2.0 + 0.1 * var[j] * count / (count - 1)).epsilon(1e-5)); // unbiased
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

TEST_CASE("gpu dnn: pooling backward routes dy to the window's maximum or spreads it over the window") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s = p.StreamCreate();
  void* h = p.LibraryHandle(gpurt::Library::kDnn, s);
  for (auto mode : {gpurt::DnnPoolingMode::kMax, gpurt::DnnPoolingMode::kAverageCountIncludePadding,
                    gpurt::DnnPoolingMode::kAverageCountExcludePadding}) {
    for (DnnFormat fmt : {DnnFormat::kNCHW, DnnFormat::kNHWC}) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(static_cast<int>(fmt));
      gpurt::PoolingForwardArgs f;
      f.pool = {mode, 3, 2, 1, 1, 2, 1};
      f.x = DnnTensorDesc::Packed(fmt, 2, 3, 7, 6);
      f.y = DnnTensorDesc::Packed(fmt, 2, 3, 4, 7);
      std::vector<float> x = Random(static_cast<size_t>(f.x.Span()), 31), dy = Random(f.y.Span(), 32);
      std::vector<float> dx0 = Random(x.size(), 33);
      f.x_data = Upload(p, x, s);
      f.y_data = p.Malloc(dy.size() * sizeof(float));
      p.DnnPoolingForward(h, s, f);
      gpurt::PoolingBackwardArgs b;
      b.pool = f.pool, b.alpha = 1.5f, b.beta = 0.25f;
      b.y = b.dy = f.y, b.x = b.dx = f.x;
      b.y_data = f.y_data, b.dy_data = Upload(p, dy, s), b.x_data = f.x_data, b.dx_data = Upload(p, dx0, s);
      p.DnnPoolingBackward(h, s, b);
      std::vector<float> dx = Download(p, b.dx_data, x.size(), s);
      std::vector<double> ref(x.size());
      for (int n = 0; n < 2; ++n)
        for (int c = 0; c < 3; ++c)
          for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 7; ++j) {
              const double g = At(dy, f.y, n, c, i, j);
              int inside = 0;
              size_t arg = 0;
              float mx = -INFINITY;
              for (int r = 0; r < 3; ++r)
                for (int q = 0; q < 2; ++q) {
                  int hh = i * 2 - 1 + r, ww = j - 1 + q;
                  if (hh < 0 || hh >= 7 || ww < 0 || ww >= 6) continue;
                  ++inside;
                  size_t at = n * f.x.n_stride + c * f.x.c_stride + hh * f.x.h_stride + ww * f.x.w_stride;
                  if (x[at] > mx) mx = x[at], arg = at;
                }
              if (mode == gpurt::DnnPoolingMode::kMax) {
                ref[arg] += g;
                continue;
              }
              const double share =
                  g / (mode == gpurt::DnnPoolingMode::kAverageCountIncludePadding ? 6 : inside);
              for (int r = 0; r < 3; ++r)
                for (int q = 0; q < 2; ++q) {
                  int hh = i * 2 - 1 + r, ww = j - 1 + q;
                  if (hh < 0 || hh >= 7 || ww < 0 || ww >= 6) continue;
                  ref[n * f.x.n_stride + c * f.x.c_stride + hh * f.x.h_stride + ww * f.x.w_stride] += share;
                }
            }
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i)
        worst = std::max(worst, std::fabs(dx[i] - (1.5 * ref[i] + 0.25 * dx0[i])));
      CHECK(worst < 1e-5);
      for (const void* d : {f.x_data, b.dy_data}) p.Free(const_cast<void*>(d));
      for (void* d : {f.y_data, b.dx_data}) p.Free(d);
    }
  }
  p.StreamDestroy(s);
}

namespace {
// Batch norm's training forward in double, for finite differences: sum(y * g).
double BnLoss(const std::vector<double>& x, const std::vector<double>& scale, const std::vector<double>& bias,
              const std::vector<float>& g, int N, int C, int HW, bool spatial, double eps) {
  const int np = spatial ? C : C * HW, count = spatial ? N * HW : N;
  auto param = [&](int c, int i) { return spatial ? c : c * HW + i; };
  std::vector<double> mean(np), var(np);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < HW; ++i) mean[param(c, i)] += x[(n * C + c) * HW + i] / count;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < HW; ++i) {
        double d = x[(n * C + c) * HW + i] - mean[param(c, i)];
        var[param(c, i)] += d * d / count;
      }
  double loss = 0;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < HW; ++i) {
        int j = param(c, i), at = (n * C + c) * HW + i;
        loss += g[at] * (scale[j] * (x[at] - mean[j]) / std::sqrt(var[j] + eps) + bias[j]);
      }
  return loss;
}
} // namespace

TEST_CASE("gpu dnn: batch norm backward gives the gradients of the training forward (finite differences)") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s = p.StreamCreate();
  void* h = p.LibraryHandle(gpurt::Library::kDnn, s);
  const int N = 3, C = 2, H = 2, W = 3, HW = H * W;
  for (auto mode : {gpurt::DnnBatchNormMode::kSpatial, gpurt::DnnBatchNormMode::kPerActivation}) {
    for (bool saved : {true, false}) {
      const bool spatial = mode == gpurt::DnnBatchNormMode::kSpatial;
      CAPTURE(spatial);
      CAPTURE(saved);
      const int np = spatial ? C : C * HW;
      std::vector<float> x = Random(N * C * HW, 41), g = Random(N * C * HW, 42), scale = Random(np, 43),
                         bias = Random(np, 44);
      gpurt::BatchNormArgs f;
      f.mode = mode;
      f.x = f.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, N, C, H, W);
      f.param = DnnTensorDesc::Packed(DnnFormat::kNCHW, 1, C, spatial ? 1 : H, spatial ? 1 : W);
      f.x_data = Upload(p, x, s), f.y_data = p.Malloc(x.size() * sizeof(float));
      f.scale = Upload(p, scale, s), f.bias = Upload(p, bias, s);
      f.save_mean = p.Malloc(np * sizeof(float)), f.save_inv_variance = p.Malloc(np * sizeof(float));
      f.epsilon = 1e-3;
      p.DnnBatchNormForwardTraining(h, s, f);
      gpurt::BatchNormBackwardArgs b;
      b.mode = mode;
      b.x = b.dy = b.dx = f.x;
      b.param = f.param;
      b.x_data = f.x_data, b.dy_data = Upload(p, g, s), b.dx_data = p.Malloc(x.size() * sizeof(float));
      b.scale = f.scale, b.dscale = p.Malloc(np * sizeof(float)), b.dbias = p.Malloc(np * sizeof(float));
      b.epsilon = f.epsilon;
      if (saved) b.saved_mean = f.save_mean, b.saved_inv_variance = f.save_inv_variance;
      p.DnnBatchNormBackward(h, s, b);
      std::vector<float> dx = Download(p, b.dx_data, x.size(), s), ds = Download(p, b.dscale, np, s),
                         db = Download(p, b.dbias, np, s);
      std::vector<double> xd(x.begin(), x.end()), sd(scale.begin(), scale.end()),
          bd(bias.begin(), bias.end());
      auto loss = [&] { return BnLoss(xd, sd, bd, g, N, C, HW, spatial, 1e-3); };
      const double e = 1e-5;
      auto numeric = [&](double& v) {
        double keep = v;
        v = keep + e;
        double up = loss();
        v = keep - e;
        double down = loss();
        v = keep;
        return (up - down) / (2 * e);
      };
      for (size_t i = 0; i < xd.size(); ++i)
        CHECK(dx[i] == doctest::Approx(numeric(xd[i])).epsilon(1e-3).scale(1));
      for (int j = 0; j < np; ++j) {
        CHECK(ds[j] == doctest::Approx(numeric(sd[j])).epsilon(1e-3).scale(1));
        CHECK(db[j] == doctest::Approx(numeric(bd[j])).epsilon(1e-3).scale(1));
      }
      for (const void* d : {f.x_data, f.scale, f.bias, b.dy_data}) p.Free(const_cast<void*>(d));
      for (void* d : {f.y_data, f.save_mean, f.save_inv_variance, b.dx_data, b.dscale, b.dbias}) p.Free(d);
    }
  }
  p.StreamDestroy(s);
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
  p.LaunchHostFunc(
      s,
      [](void* g) {
        while (!static_cast<std::atomic<bool>*>(g)->load()) std::this_thread::yield();
      },
      &go);
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
  CHECK(std::isnan(HostView<float>(dz)[0])); // nothing ran yet
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
  CHECK(Download(p, dz, 1, s)[0] == 0.0f); // capture ran nothing
  p.GraphLaunch(ge, s);
  CHECK(Download(p, dz, z.size(), s) == z);
  p.GraphExecDestroy(ge);
  p.GraphDestroy(g);
  for (void* d : {dx, dw, dy, dz}) p.Free(d);
  p.StreamDestroy(s);
}

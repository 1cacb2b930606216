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
    CAPTURE(cc.name);
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

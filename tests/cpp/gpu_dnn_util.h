// Helpers of the cuDNN-call tests (test_gpu_dnn.cc, test_gpu_dnn_checks.cc): random data, uploads
// to simulated device memory, the status and message of a DnnError, a plain-loop convolution, and
// a valid convolution's arguments to mutate.
#pragma once

#include <doctest/doctest.h>

#include <atomic>  // gpu_sim_util.h uses it
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu_sim_util.h"
#include "kiln/runtime/gpu_dnn.h"

namespace kiln::testing {

using gpurt::DnnFormat;
using gpurt::DnnTensorDesc;

inline std::vector<float> Random(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

// Device memory of the current device holding `v`.
inline void* Upload(gpurt::Platform& p, const std::vector<float>& v, gpurt::Stream s) {
  void* d = p.Malloc(v.size() * sizeof(float));
  p.MemcpyAsync(d, v.data(), v.size() * sizeof(float), gpurt::CopyKind::kHostToDevice, s);
  return d;
}
inline std::vector<float> Download(gpurt::Platform& p, const void* d, size_t n, gpurt::Stream s) {
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
template <class F> Outcome DnnOutcome(F&& f) {
  try {
    f();
  } catch (const gpurt::DnnError& e) {
    return {e.code(), e.what()};
  }
  return {};
}

// Element (n, c, h, w) of a tensor stored with `t`'s strides.
inline float At(const std::vector<float>& v, const DnnTensorDesc& t, int n, int c, int h, int w) {
  return v[n * t.n_stride + c * t.c_stride + h * t.h_stride + w * t.w_stride];
}

// Plain-loop convolution of packed-or-strided x by a KCRS filter, into packed NCHW.
inline std::vector<float> ConvRef(const std::vector<float>& x, const DnnTensorDesc& xd,
                                  const std::vector<float>& w, const gpurt::DnnFilterDesc& f,
                                  const gpurt::DnnConvDesc& c, int oh, int ow) {
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
                int h = i * c.stride_h - c.pad_h + r * c.dilation_h,
                    ww = j * c.stride_w - c.pad_w + q * c.dilation_w;
                if (h < 0 || h >= xd.h || ww < 0 || ww >= xd.w) continue;
                int rr = c.mode == gpurt::DnnConvMode::kConvolution ? f.h - 1 - r : r;
                int qq = c.mode == gpurt::DnnConvMode::kConvolution ? f.w - 1 - q : q;
                float wv = f.format == DnnFormat::kNHWC
                               ? w[((static_cast<size_t>(k) * f.h + rr) * f.w + qq) * f.c + ci]
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

inline gpurt::DnnConvDesc Conv(int ph, int pw, int sh, int sw, int dh, int dw, int groups,
                               gpurt::DnnConvMode mode = gpurt::DnnConvMode::kCrossCorrelation) {
  gpurt::DnnConvDesc c;
  c.pad_h = ph, c.pad_w = pw, c.stride_h = sh, c.stride_w = sw, c.dilation_h = dh, c.dilation_w = dw;
  c.groups = groups, c.mode = mode;
  return c;
}

// A valid convolution's arguments (2x4x9x7 by 6x2x3x3, 2 groups) over placeholder pointers.
inline gpurt::ConvForwardArgs ValidConv(void* x, void* w, void* y) {
  gpurt::ConvForwardArgs a;
  a.x = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 4, 9, 7);
  a.w = {gpurt::DnnDataType::kFloat, DnnFormat::kNCHW, 6, 2, 3, 3};
  a.conv = Conv(1, 2, 2, 1, 2, 1, 2);
  a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 6, 4, 9);
  a.x_data = x, a.w_data = w, a.y_data = y;
  return a;
}

} // namespace kiln::testing

// cuDNN on the simulated GPUs (sim_dnn.h). At the call, what cuDNN itself checks: the handle is a
// cuDNN one bound to the call's stream, then the shared argument checks of gpu_dnn.h (descriptors,
// shapes, dtypes), each a DnnError with cuDNN's status. Pointers are not checked by cuDNN: on a
// GPU its kernel faults on a host pointer or one outside its buffer, so here the operation faults
// on the stream with CUDA_ERROR_ILLEGAL_ADDRESS (700), the device's sticky error, as there.
// The work runs stream-ordered on the stream's worker, over the device memory's host alias: data
// is gathered from its strides into packed NCHW, computed by the CPU kernels (kiln's oneDNN
// convolution and pooling, plain loops for batch norm), and blended into y with alpha and beta.
#include "sim_dnn.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "kiln/runtime/cpu/onednn.h"

namespace kiln::gpusim {

namespace {

using gpurt::DnnTensorDesc;
using gpurt::FailDnn;

void CheckHandle(void* handle, gpurt::Stream h, StreamImpl* s, const char* call) {
  if (!handle)
    FailDnn(gpurt::kDnnBadParam, call, "the handle is null; use LibraryHandle(Library::kDnn, stream)");
  auto* rec = static_cast<LibraryHandleRec*>(handle);
  if (rec->first != gpurt::Library::kDnn)
    FailDnn(gpurt::kDnnBadParam, call,
            "the handle is a cuBLASLt handle, not a cuDNN one; use LibraryHandle(Library::kDnn, stream)");
  if (rec->second != h) {
    auto name = [](gpurt::Stream x) {
      char b[32];
      std::snprintf(b, sizeof b, "%p", static_cast<void*>(x));
      return std::string(x ? b : "the default stream");
    };
    FailDnn(
        gpurt::kDnnBadParamStreamMismatch, call,
        "the cuDNN handle of gpu(" + std::to_string(s->device()->index) + ") is bound to stream " +
            name(rec->second) + " but the call is issued to stream " + name(h) +
            ": cuDNN would run it on the handle's stream, unordered with the work around it. Call "
            "LibraryHandle(Library::kDnn, stream) (cudnnSetStream) for this stream right before the call");
  }
  s->device()->CheckSticky(call);
}

void Aligned(const void* p, const char* what, const char* call) {
  if (reinterpret_cast<uintptr_t>(p) % sizeof(float))
    FailDnn(gpurt::kDnnBadParamMisalignedPointer, call,
            std::string(what) + " is not aligned to its element (4 bytes for float)");
}

// The reason the GPU would fault on one operand: "" when [p, p + bytes) is live memory of `device`.
std::string Fault(const Memory& m, int device, const void* p, int64_t elements, const char* what) {
  const size_t bytes = static_cast<size_t>(elements) * sizeof(float);
  const int on = m.DeviceOf(p);
  if (on < 0)
    return std::string(what) +
           " is host memory; cuDNN's kernels read and write device memory of the stream's "
           "device (copy the data to gpu(" +
           std::to_string(device) + ") first)";
  if (on != device)
    return std::string(what) + " is memory of gpu(" + std::to_string(on) + ") but the call runs on gpu(" +
           std::to_string(device) + "); copy it to this device";
  if (!m.IsLive(reinterpret_cast<uintptr_t>(p), bytes))
    return std::string(what) + " is not " + std::to_string(bytes) +
           " bytes of one live allocation, the span its descriptor covers; the buffer is too small or freed";
  return "";
}

// Queues `op` on `s`, or on its capture; if `fault` is set, the operation faults there instead.
void Issue(StreamImpl* s, const std::string& call, const std::string& fault, std::function<void()> op) {
  if (!fault.empty()) {
    std::string message = call + ": " + fault;
    op = [message] { gpurt::Fail(gpurt::kIllegalAddress, "a cuDNN kernel", message); };
  }
  if (s->capturing && s->capture_invalidated)
    gpurt::Fail(gpurt::kCaptureInvalidated, call,
                "operation failed due to a previous error during capture: the stream's capture was invalidated");
  if (s->capturing) {
    s->Capture([op](gpurt::Stream r) { reinterpret_cast<StreamImpl*>(r)->Enqueue(op); });
    return;
  }
  s->Enqueue(std::move(op));
}

// The workspace a convolution call was given (null: the platform's own): device memory of the
// stream's device, at least what its algorithm needs (what DnnConvolutionWorkspaceSize says).
template <class Args> std::string WorkspaceFault(const Memory& m, int device, const Args& a, const char* call) {
  const size_t need = AlgorithmWorkspace(ProblemOf(a), a.algo, call);
  if (!a.workspace) return "";
  if (a.workspace_bytes < need)
    return "the workspace is " + std::to_string(a.workspace_bytes) + " bytes, less than the " +
           std::to_string(need) + " the algorithm needs";
  return Fault(m, device, a.workspace, static_cast<int64_t>(a.workspace_bytes / sizeof(float)), "the workspace");
}
// The call's kernels write their workspace, so two calls sharing one at once would show.
void UseWorkspace(float* ws, size_t bytes) {
  if (ws) std::fill(ws, ws + bytes / sizeof(float), std::numeric_limits<float>::quiet_NaN());
}

int64_t Offset(const DnnTensorDesc& t, int64_t n, int64_t c, int64_t h, int64_t w) {
  return n * t.n_stride + c * t.c_stride + h * t.h_stride + w * t.w_stride;
}

// The tensor at `p` (host alias) in packed NCHW order.
std::vector<float> Gather(const float* p, const DnnTensorDesc& t) {
  std::vector<float> out(static_cast<size_t>(t.n) * t.c * t.h * t.w);
  size_t i = 0;
  for (int n = 0; n < t.n; ++n)
    for (int c = 0; c < t.c; ++c)
      for (int h = 0; h < t.h; ++h)
        for (int w = 0; w < t.w; ++w) out[i++] = p[Offset(t, n, c, h, w)];
  return out;
}

// y = alpha * r + beta * y over y's strides; beta == 0 never reads y (cuDNN's rule: NaN there is fine).
void Blend(float* p, const DnnTensorDesc& t, const std::vector<float>& r, float alpha, float beta) {
  size_t i = 0;
  for (int n = 0; n < t.n; ++n)
    for (int c = 0; c < t.c; ++c)
      for (int h = 0; h < t.h; ++h)
        for (int w = 0; w < t.w; ++w, ++i) {
          float& y = p[Offset(t, n, c, h, w)];
          y = beta == 0.0f ? alpha * r[i] : alpha * r[i] + beta * y;
        }
}

// Offset of filter element (k, c, r, q) in `f`'s packed format (KCRS or KRSC); `flip` reads the
// filter rotated by 180 degrees (CUDNN_CONVOLUTION, a true convolution).
int64_t FilterAt(const gpurt::DnnFilterDesc& f, int k, int c, int r, int q, bool flip) {
  if (flip) r = f.h - 1 - r, q = f.w - 1 - q;
  return f.format == gpurt::DnnFormat::kNHWC ? ((int64_t{k} * f.h + r) * f.w + q) * f.c + c
                                             : ((int64_t{k} * f.c + c) * f.h + r) * f.w + q;
}
// The filter as KCRS for a cross-correlation.
std::vector<float> GatherFilter(const float* p, const gpurt::DnnFilterDesc& f, bool flip) {
  std::vector<float> out(static_cast<size_t>(f.k) * f.c * f.h * f.w);
  size_t i = 0;
  for (int k = 0; k < f.k; ++k)
    for (int c = 0; c < f.c; ++c)
      for (int r = 0; r < f.h; ++r)
        for (int q = 0; q < f.w; ++q) out[i++] = p[FilterAt(f, k, c, r, q, flip)];
  return out;
}
// dw = alpha * r + beta * dw, r a KCRS cross-correlation filter gradient.
void BlendFilter(float* p, const gpurt::DnnFilterDesc& f, bool flip, const std::vector<float>& r, float alpha,
                 float beta) {
  size_t i = 0;
  for (int k = 0; k < f.k; ++k)
    for (int c = 0; c < f.c; ++c)
      for (int h = 0; h < f.h; ++h)
        for (int q = 0; q < f.w; ++q, ++i) {
          float& y = p[FilterAt(f, k, c, h, q, flip)];
          y = beta == 0.0f ? alpha * r[i] : alpha * r[i] + beta * y;
        }
}

host::Conv2dParams Params(const gpurt::DnnConvDesc& c) {
  host::Conv2dParams p;
  p.stride[0] = c.stride_h, p.stride[1] = c.stride_w;
  p.padding[0] = c.pad_h, p.padding[1] = c.pad_w;
  p.dilation[0] = c.dilation_h, p.dilation[1] = c.dilation_w;
  p.groups = c.groups;
  return p;
}

TensorView Packed(std::vector<float>& v, int64_t n, int64_t c, int64_t h, int64_t w) {
  Shape s{n, c, h, w};
  return TensorView{v.data(), DType::kFloat32, s, s.ContiguousStrides()};
}

// Batch norm's parameter j covers channel c (spatial) or element (c, hw) (per activation) of
// packed NCHW data, over `count` values.
struct BnLayout {
  BnLayout(const gpurt::DnnTensorDesc& x, gpurt::DnnBatchNormMode mode)
      : N(x.n), C(x.c), HW(int64_t{x.h} * x.w),
        per_activation(mode == gpurt::DnnBatchNormMode::kPerActivation), count(per_activation ? N : N * HW),
        params(per_activation ? C * HW : C) {}
  int64_t Param(int64_t c, int64_t hw) const { return per_activation ? c * HW + hw : c; }
  int64_t N, C, HW;
  bool per_activation;
  int64_t count, params;
};

// The batch's mean and biased variance (what normalizes it) per parameter.
void BatchStats(const std::vector<float>& xs, const BnLayout& l, std::vector<double>& mean,
                std::vector<double>& var) {
  mean.assign(static_cast<size_t>(l.params), 0.0), var.assign(static_cast<size_t>(l.params), 0.0);
  for (int64_t n = 0; n < l.N; ++n)
    for (int64_t c = 0; c < l.C; ++c)
      for (int64_t i = 0; i < l.HW; ++i) mean[l.Param(c, i)] += xs[(n * l.C + c) * l.HW + i];
  for (double& v : mean) v /= static_cast<double>(l.count);
  for (int64_t n = 0; n < l.N; ++n)
    for (int64_t c = 0; c < l.C; ++c)
      for (int64_t i = 0; i < l.HW; ++i) {
        double d = xs[(n * l.C + c) * l.HW + i] - mean[l.Param(c, i)];
        var[l.Param(c, i)] += d * d;
      }
  for (double& v : var) v /= static_cast<double>(l.count);
}

// What a convolution whose math allows TF32 reads: each value rounded as tensor cores read it.
void MaybeTf32(bool tf32, std::vector<float>& v) {
  if (tf32)
    for (float& f : v) f = RoundTf32(f);
}

} // namespace

void DnnConvolutionForward(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                           const gpurt::ConvForwardArgs& a) {
  const char* call = "cudnnConvolutionForward";
  CheckHandle(handle, h, s, call);
  gpurt::CheckConvForward(a, call);
  Aligned(a.x_data, "x", call), Aligned(a.w_data, "w", call), Aligned(a.y_data, "y", call);
  const int dev = s->device()->index;
  std::string fault = Fault(m, dev, a.x_data, a.x.Span(), "x (the input)");
  if (fault.empty())
    fault = Fault(m, dev, a.w_data, int64_t{a.w.k} * a.w.c * a.w.h * a.w.w, "w (the filter)");
  if (fault.empty()) fault = Fault(m, dev, a.y_data, a.y.Span(), "y (the output)");
  if (fault.empty()) fault = WorkspaceFault(m, dev, a, call);
  float* ws_data = a.workspace ? static_cast<float*>(m.Alias(a.workspace)) : nullptr;
  auto* x = static_cast<const float*>(m.Alias(a.x_data));
  auto* w = static_cast<const float*>(m.Alias(a.w_data));
  auto* y = static_cast<float*>(m.Alias(a.y_data));
  Issue(s, call, fault, [a, ws_data, x, w, y] {
    UseWorkspace(ws_data, a.workspace_bytes);
    std::vector<float> xs = Gather(x, a.x);
    const gpurt::DnnFilterDesc& f = a.w;
    std::vector<float> ws = GatherFilter(w, f, a.conv.mode == gpurt::DnnConvMode::kConvolution);
    MaybeTf32(a.conv.tf32, xs), MaybeTf32(a.conv.tf32, ws);
    std::vector<float> ys(static_cast<size_t>(a.y.n) * a.y.c * a.y.h * a.y.w);
    host::Conv2d(Packed(xs, a.x.n, a.x.c, a.x.h, a.x.w), Packed(ws, f.k, f.c, f.h, f.w),
                 Packed(ys, a.y.n, a.y.c, a.y.h, a.y.w), Params(a.conv));
    Blend(y, a.y, ys, a.alpha, a.beta);
  });
}

void DnnConvolutionBackwardData(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                                const gpurt::ConvBackwardDataArgs& a) {
  const char* call = "cudnnConvolutionBackwardData";
  CheckHandle(handle, h, s, call);
  gpurt::CheckConvBackwardData(a, call);
  Aligned(a.w_data, "w", call), Aligned(a.dy_data, "dy", call), Aligned(a.dx_data, "dx", call);
  const int dev = s->device()->index;
  std::string fault = Fault(m, dev, a.w_data, int64_t{a.w.k} * a.w.c * a.w.h * a.w.w, "w (the filter)");
  if (fault.empty()) fault = Fault(m, dev, a.dy_data, a.dy.Span(), "dy (the output's gradient)");
  if (fault.empty()) fault = Fault(m, dev, a.dx_data, a.dx.Span(), "dx (the input's gradient)");
  if (fault.empty()) fault = WorkspaceFault(m, dev, a, call);
  float* ws_data = a.workspace ? static_cast<float*>(m.Alias(a.workspace)) : nullptr;
  auto* w = static_cast<const float*>(m.Alias(a.w_data));
  auto* dy = static_cast<const float*>(m.Alias(a.dy_data));
  auto* dx = static_cast<float*>(m.Alias(a.dx_data));
  Issue(s, call, fault, [a, ws_data, w, dy, dx] {
    UseWorkspace(ws_data, a.workspace_bytes);
    const gpurt::DnnFilterDesc& f = a.w;
    std::vector<float> ws = GatherFilter(w, f, a.conv.mode == gpurt::DnnConvMode::kConvolution);
    std::vector<float> dys = Gather(dy, a.dy);
    MaybeTf32(a.conv.tf32, ws), MaybeTf32(a.conv.tf32, dys);
    std::vector<float> dxs(static_cast<size_t>(a.dx.n) * a.dx.c * a.dx.h * a.dx.w);
    host::Conv2dGradData(Packed(dys, a.dy.n, a.dy.c, a.dy.h, a.dy.w), Packed(ws, f.k, f.c, f.h, f.w),
                         Packed(dxs, a.dx.n, a.dx.c, a.dx.h, a.dx.w), Params(a.conv));
    Blend(dx, a.dx, dxs, a.alpha, a.beta);
  });
}

void DnnConvolutionBackwardFilter(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                                  const gpurt::ConvBackwardFilterArgs& a) {
  const char* call = "cudnnConvolutionBackwardFilter";
  CheckHandle(handle, h, s, call);
  gpurt::CheckConvBackwardFilter(a, call);
  Aligned(a.x_data, "x", call), Aligned(a.dy_data, "dy", call), Aligned(a.dw_data, "dw", call);
  const int dev = s->device()->index;
  std::string fault = Fault(m, dev, a.x_data, a.x.Span(), "x (the input)");
  if (fault.empty()) fault = Fault(m, dev, a.dy_data, a.dy.Span(), "dy (the output's gradient)");
  if (fault.empty())
    fault =
        Fault(m, dev, a.dw_data, int64_t{a.dw.k} * a.dw.c * a.dw.h * a.dw.w, "dw (the filter's gradient)");
  if (fault.empty()) fault = WorkspaceFault(m, dev, a, call);
  float* ws_data = a.workspace ? static_cast<float*>(m.Alias(a.workspace)) : nullptr;
  auto* x = static_cast<const float*>(m.Alias(a.x_data));
  auto* dy = static_cast<const float*>(m.Alias(a.dy_data));
  auto* dw = static_cast<float*>(m.Alias(a.dw_data));
  Issue(s, call, fault, [a, ws_data, x, dy, dw] {
    UseWorkspace(ws_data, a.workspace_bytes);
    const gpurt::DnnFilterDesc& f = a.dw;
    std::vector<float> xs = Gather(x, a.x), dys = Gather(dy, a.dy);
    MaybeTf32(a.conv.tf32, xs), MaybeTf32(a.conv.tf32, dys);
    std::vector<float> dws(static_cast<size_t>(f.k) * f.c * f.h * f.w);
    host::Conv2dGradWeight(Packed(dys, a.dy.n, a.dy.c, a.dy.h, a.dy.w),
                           Packed(xs, a.x.n, a.x.c, a.x.h, a.x.w), Packed(dws, f.k, f.c, f.h, f.w),
                           Params(a.conv));
    BlendFilter(dw, f, a.conv.mode == gpurt::DnnConvMode::kConvolution, dws, a.alpha, a.beta);
  });
}

void DnnPoolingForward(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                       const gpurt::PoolingForwardArgs& a) {
  const char* call = "cudnnPoolingForward";
  CheckHandle(handle, h, s, call);
  gpurt::CheckPoolingForward(a, call);
  Aligned(a.x_data, "x", call), Aligned(a.y_data, "y", call);
  const int dev = s->device()->index;
  std::string fault = Fault(m, dev, a.x_data, a.x.Span(), "x (the input)");
  if (fault.empty()) fault = Fault(m, dev, a.y_data, a.y.Span(), "y (the output)");
  auto* x = static_cast<const float*>(m.Alias(a.x_data));
  auto* y = static_cast<float*>(m.Alias(a.y_data));
  Issue(s, call, fault, [a, x, y] {
    std::vector<float> xs = Gather(x, a.x);
    std::vector<float> ys(static_cast<size_t>(a.y.n) * a.y.c * a.y.h * a.y.w);
    host::Pool2dParams p;
    p.kernel[0] = a.pool.window_h, p.kernel[1] = a.pool.window_w;
    p.stride[0] = a.pool.stride_h, p.stride[1] = a.pool.stride_w;
    p.padding[0] = a.pool.pad_h, p.padding[1] = a.pool.pad_w;
    p.count_include_pad = a.pool.mode == gpurt::DnnPoolingMode::kAverageCountIncludePadding;
    TensorView xv = Packed(xs, a.x.n, a.x.c, a.x.h, a.x.w), yv = Packed(ys, a.y.n, a.y.c, a.y.h, a.y.w);
    const bool max =
        a.pool.mode == gpurt::DnnPoolingMode::kMax || a.pool.mode == gpurt::DnnPoolingMode::kMaxDeterministic;
    if (max)
      host::MaxPool2d(xv, yv, p);
    else
      host::AvgPool2d(xv, yv, p);
    Blend(y, a.y, ys, a.alpha, a.beta);
  });
}

void DnnBatchNormForward(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                         const gpurt::BatchNormArgs& a, bool training) {
  const char* call =
      training ? "cudnnBatchNormalizationForwardTraining" : "cudnnBatchNormalizationForwardInference";
  CheckHandle(handle, h, s, call);
  gpurt::CheckBatchNormForward(a, training, call);
  const int dev = s->device()->index;
  const int64_t np = int64_t{a.param.c} * a.param.h * a.param.w; // parameters (packed)
  struct Operand {
    const void* p;
    int64_t elements;
    const char* what;
  };
  std::vector<Operand> ops{{a.x_data, a.x.Span(), "x (the input)"},
                           {a.y_data, a.y.Span(), "y (the output)"},
                           {a.scale, np, "bnScale"},
                           {a.bias, np, "bnBias"}};
  if (a.running_mean)
    ops.push_back({a.running_mean, np, "the running mean"}),
        ops.push_back({a.running_var, np, "the running variance"});
  if (training && a.save_mean)
    ops.push_back({a.save_mean, np, "resultSaveMean"}),
        ops.push_back({a.save_inv_variance, np, "resultSaveInvVariance"});
  std::string fault;
  for (const Operand& o : ops) {
    Aligned(o.p, o.what, call);
    if (fault.empty()) fault = Fault(m, dev, o.p, o.elements, o.what);
  }
  auto alias = [&m](const void* p) { return p ? static_cast<float*>(m.Alias(p)) : nullptr; };
  float *x = alias(a.x_data), *y = alias(a.y_data), *scale = alias(a.scale), *bias = alias(a.bias);
  float *rmean = alias(a.running_mean), *rvar = alias(a.running_var);
  float *smean = training ? alias(a.save_mean) : nullptr,
        *sinv = training ? alias(a.save_inv_variance) : nullptr;
  Issue(s, call, fault, [=] {
    std::vector<float> xs = Gather(x, a.x);
    const BnLayout l(a.x, a.mode);
    const int64_t N = l.N, C = l.C, HW = l.HW, count = l.count;
    auto param = [&l](int64_t c, int64_t hw) { return l.Param(c, hw); };
    std::vector<double> mean, var;
    if (training) {
      BatchStats(xs, l, mean, var);
    } else {
      mean.assign(rmean, rmean + np), var.assign(rvar, rvar + np);
    }
    std::vector<double> inv(static_cast<size_t>(np));
    for (int64_t j = 0; j < np; ++j) inv[j] = 1.0 / std::sqrt(var[j] + a.epsilon);
    std::vector<float> ys(xs.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < HW; ++i) {
          const int64_t j = param(c, i), at = (n * C + c) * HW + i;
          ys[at] = static_cast<float>(scale[j] * (xs[at] - mean[j]) * inv[j] + bias[j]);
        }
    Blend(y, a.y, ys, a.alpha, a.beta);
    if (!training) return;
    const double f = a.exponential_average_factor;
    const double unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
    for (int64_t j = 0; j < np; ++j) {
      if (rmean) {
        rmean[j] = static_cast<float>((1.0 - f) * rmean[j] + f * mean[j]);
        rvar[j] = static_cast<float>((1.0 - f) * rvar[j] + f * var[j] * unbias);
      }
      if (smean) smean[j] = static_cast<float>(mean[j]), sinv[j] = static_cast<float>(inv[j]);
    }
  });
}

void DnnPoolingBackward(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                        const gpurt::PoolingBackwardArgs& a) {
  const char* call = "cudnnPoolingBackward";
  CheckHandle(handle, h, s, call);
  gpurt::CheckPoolingBackward(a, call);
  Aligned(a.y_data, "y", call), Aligned(a.dy_data, "dy", call), Aligned(a.x_data, "x", call);
  Aligned(a.dx_data, "dx", call);
  const int dev = s->device()->index;
  std::string fault = Fault(m, dev, a.y_data, a.y.Span(), "y (the forward output)");
  if (fault.empty()) fault = Fault(m, dev, a.dy_data, a.dy.Span(), "dy (the output's gradient)");
  if (fault.empty()) fault = Fault(m, dev, a.x_data, a.x.Span(), "x (the forward input)");
  if (fault.empty()) fault = Fault(m, dev, a.dx_data, a.dx.Span(), "dx (the input's gradient)");
  auto* dy = static_cast<const float*>(m.Alias(a.dy_data));
  auto* x = static_cast<const float*>(m.Alias(a.x_data));
  auto* dx = static_cast<float*>(m.Alias(a.dx_data));
  Issue(s, call, fault, [a, dy, x, dx] {
    std::vector<float> xs = Gather(x, a.x), dys = Gather(dy, a.dy);
    std::vector<float> dxs(xs.size());
    host::Pool2dParams p;
    p.kernel[0] = a.pool.window_h, p.kernel[1] = a.pool.window_w;
    p.stride[0] = a.pool.stride_h, p.stride[1] = a.pool.stride_w;
    p.padding[0] = a.pool.pad_h, p.padding[1] = a.pool.pad_w;
    p.count_include_pad = a.pool.mode == gpurt::DnnPoolingMode::kAverageCountIncludePadding;
    TensorView xv = Packed(xs, a.x.n, a.x.c, a.x.h, a.x.w), dxv = Packed(dxs, a.x.n, a.x.c, a.x.h, a.x.w);
    TensorView dyv = Packed(dys, a.dy.n, a.dy.c, a.dy.h, a.dy.w);
    const bool max =
        a.pool.mode == gpurt::DnnPoolingMode::kMax || a.pool.mode == gpurt::DnnPoolingMode::kMaxDeterministic;
    if (max)
      host::MaxPool2dGrad(dyv, xv, dxv, p);
    else
      host::AvgPool2dGrad(dyv, dxv, p);
    Blend(dx, a.dx, dxs, a.alpha, a.beta);
  });
}

void DnnBatchNormBackward(Memory& m, void* handle, gpurt::Stream h, StreamImpl* s,
                          const gpurt::BatchNormBackwardArgs& a) {
  const char* call = "cudnnBatchNormalizationBackward";
  CheckHandle(handle, h, s, call);
  gpurt::CheckBatchNormBackward(a, call);
  const int dev = s->device()->index;
  const int64_t np = int64_t{a.param.c} * a.param.h * a.param.w;
  struct Operand {
    const void* p;
    int64_t elements;
    const char* what;
  };
  std::vector<Operand> ops{{a.x_data, a.x.Span(), "x (the forward input)"},
                           {a.dy_data, a.dy.Span(), "dy (the output's gradient)"},
                           {a.dx_data, a.dx.Span(), "dx (the input's gradient)"},
                           {a.scale, np, "bnScale"},
                           {a.dscale, np, "dBnScaleResult"},
                           {a.dbias, np, "dBnBiasResult"}};
  if (a.saved_mean)
    ops.push_back({a.saved_mean, np, "savedMean"}),
        ops.push_back({a.saved_inv_variance, np, "savedInvVariance"});
  std::string fault;
  for (const Operand& o : ops) {
    Aligned(o.p, o.what, call);
    if (fault.empty()) fault = Fault(m, dev, o.p, o.elements, o.what);
  }
  auto alias = [&m](const void* p) { return p ? static_cast<float*>(m.Alias(p)) : nullptr; };
  float *x = alias(a.x_data), *dy = alias(a.dy_data), *dx = alias(a.dx_data), *scale = alias(a.scale);
  float *dscale = alias(a.dscale), *dbias = alias(a.dbias);
  float *smean = alias(a.saved_mean), *sinv = alias(a.saved_inv_variance);
  Issue(s, call, fault, [=] {
    std::vector<float> xs = Gather(x, a.x), dys = Gather(dy, a.dy);
    const BnLayout l(a.x, a.mode);
    std::vector<double> mean, inv;
    if (smean) {
      mean.assign(smean, smean + np), inv.assign(sinv, sinv + np);
    } else {
      BatchStats(xs, l, mean, inv);
      for (double& v : inv) v = 1.0 / std::sqrt(v + a.epsilon);
    }
    std::vector<double> sum_dy(static_cast<size_t>(np)), sum_dy_xhat(static_cast<size_t>(np));
    for (int64_t n = 0; n < l.N; ++n)
      for (int64_t c = 0; c < l.C; ++c)
        for (int64_t i = 0; i < l.HW; ++i) {
          const int64_t j = l.Param(c, i), at = (n * l.C + c) * l.HW + i;
          sum_dy[j] += dys[at];
          sum_dy_xhat[j] += dys[at] * (xs[at] - mean[j]) * inv[j];
        }
    std::vector<float> dxs(xs.size());
    const double M = static_cast<double>(l.count);
    for (int64_t n = 0; n < l.N; ++n)
      for (int64_t c = 0; c < l.C; ++c)
        for (int64_t i = 0; i < l.HW; ++i) {
          const int64_t j = l.Param(c, i), at = (n * l.C + c) * l.HW + i;
          const double xhat = (xs[at] - mean[j]) * inv[j];
          dxs[at] =
              static_cast<float>(scale[j] * inv[j] / M * (M * dys[at] - sum_dy[j] - xhat * sum_dy_xhat[j]));
        }
    Blend(dx, a.dx, dxs, a.alpha_data, a.beta_data);
    for (int64_t j = 0; j < np; ++j) {
      const float ds = static_cast<float>(sum_dy_xhat[j]), db = static_cast<float>(sum_dy[j]);
      dscale[j] = a.beta_param == 0.0f ? a.alpha_param * ds : a.alpha_param * ds + a.beta_param * dscale[j];
      dbias[j] = a.beta_param == 0.0f ? a.alpha_param * db : a.alpha_param * db + a.beta_param * dbias[j];
    }
  });
}


// ---- the algorithms' model ----

namespace {

struct AlgoModel {
  double fixed_us, macs_per_ns;  // a fixed cost, and the rate of multiply-adds
  enum Kind { kGemm, kPrecomp, kIm2col, kFft, kFftTiling, kWinograd, kWinogradNonfused, kNone } kind;
  bool deterministic = true;
};

// cuDNN's enums, in order: cudnnConvolutionFwdAlgo_t, cudnnConvolutionBwdDataAlgo_t,
// cudnnConvolutionBwdFilterAlgo_t.
const std::vector<AlgoModel>& Algorithms(ConvCall c) {
  using K = AlgoModel;
  static const std::vector<AlgoModel> fwd = {{8, 4, K::kGemm},     {6, 6, K::kPrecomp},   {10, 5, K::kIm2col},
                                             {0, 0, K::kNone},     {30, 9, K::kFft},      {25, 8, K::kFftTiling},
                                             {5, 12, K::kWinograd}, {12, 14, K::kWinogradNonfused}};
  static const std::vector<AlgoModel> data = {{8, 4, K::kGemm},      {6, 6, K::kPrecomp},
                                              {30, 9, K::kFft},      {25, 8, K::kFftTiling},
                                              {5, 12, K::kWinograd}, {12, 14, K::kWinogradNonfused}};
  static const std::vector<AlgoModel> filter = {{8, 3, K::kGemm, false}, {6, 6, K::kPrecomp},
                                                {30, 9, K::kFft},        {7, 5, K::kPrecomp, false},
                                                {0, 0, K::kNone},        {12, 14, K::kWinogradNonfused},
                                                {25, 8, K::kFftTiling}};
  return c == ConvCall::kForward ? fwd : c == ConvCall::kBackwardData ? data : filter;
}

bool Plain(const ConvProblem& p) {  // unstrided, undilated, ungrouped
  const gpurt::DnnConvDesc& v = p.conv;
  return v.stride_h == 1 && v.stride_w == 1 && v.dilation_h == 1 && v.dilation_w == 1 && v.groups == 1;
}

// The workspace of algorithm model `m` on `p`; nullopt: it cannot run `p`.
std::optional<size_t> ModelWorkspace(const AlgoModel& m, const ConvProblem& p) {
  const auto f = sizeof(float);
  switch (m.kind) {
    case AlgoModel::kGemm: return size_t{0};
    case AlgoModel::kPrecomp: return kConvWorkspaceBytes;
    case AlgoModel::kIm2col:
      return static_cast<size_t>(p.c / std::max(1, p.conv.groups) * p.r * p.s * p.oh * p.ow) * f;
    case AlgoModel::kFft:
      if (!Plain(p)) return std::nullopt;
      return static_cast<size_t>(p.n * (p.c + p.k) * (p.h + p.r) * (p.w + p.s)) * 2 * f;
    case AlgoModel::kFftTiling:
      if (!Plain(p) || p.r > 32 || p.s > 32) return std::nullopt;
      return static_cast<size_t>((p.c + p.k) * 32 * 32) * 2 * f;
    case AlgoModel::kWinograd:
      if (!Plain(p) || p.r != 3 || p.s != 3) return std::nullopt;
      return size_t{0};
    case AlgoModel::kWinogradNonfused:
      if (!Plain(p) || p.r != p.s || (p.r != 3 && p.r != 5)) return std::nullopt;
      return static_cast<size_t>(p.n * (p.c + p.k) * ((p.oh + 3) / 4) * ((p.ow + 3) / 4)) * 36 * f;
    case AlgoModel::kNone: return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

ConvProblem ProblemOf(const gpurt::ConvForwardArgs& a) {
  return {ConvCall::kForward, a.x.n, a.x.c, a.x.h, a.x.w, a.w.k, a.w.h, a.w.w, a.y.h, a.y.w, a.conv};
}
ConvProblem ProblemOf(const gpurt::ConvBackwardDataArgs& a) {
  return {ConvCall::kBackwardData, a.dx.n, a.dx.c, a.dx.h, a.dx.w, a.w.k, a.w.h, a.w.w, a.dy.h, a.dy.w, a.conv};
}
ConvProblem ProblemOf(const gpurt::ConvBackwardFilterArgs& a) {
  return {ConvCall::kBackwardFilter, a.x.n, a.x.c, a.x.h, a.x.w, a.dw.k, a.dw.h, a.dw.w, a.dy.h, a.dy.w, a.conv};
}

std::vector<gpurt::DnnAlgoPerf> ModelAlgorithms(const ConvProblem& p) {
  const double macs = static_cast<double>(p.n) * static_cast<double>(p.k) *
                      static_cast<double>(p.c / std::max(1, p.conv.groups)) * static_cast<double>(p.r * p.s) *
                      static_cast<double>(p.oh * p.ow);
  std::vector<gpurt::DnnAlgoPerf> out;
  const std::vector<AlgoModel>& algos = Algorithms(p.call);
  for (size_t i = 0; i < algos.size(); ++i) {
    gpurt::DnnAlgoPerf perf;
    perf.algo = static_cast<int>(i);
    perf.deterministic = algos[i].deterministic;
    if (std::optional<size_t> ws = ModelWorkspace(algos[i], p)) {
      perf.workspace = *ws;
      perf.time_ms = static_cast<float>((algos[i].fixed_us * 1e3 + macs / algos[i].macs_per_ns) * 1e-6);
    } else {
      perf.status = gpurt::kDnnNotSupported;
    }
    out.push_back(perf);
  }
  return out;
}

size_t AlgorithmWorkspace(const ConvProblem& p, int algo, const char* call) {
  if (algo < 0) return kConvWorkspaceBytes;
  const std::vector<AlgoModel>& algos = Algorithms(p.call);
  if (static_cast<size_t>(algo) >= algos.size())
    FailDnn(gpurt::kDnnBadParam, call,
            "algorithm " + std::to_string(algo) + " is not one of cuDNN's " + std::to_string(algos.size()));
  std::optional<size_t> ws = ModelWorkspace(algos[static_cast<size_t>(algo)], p);
  if (!ws) FailDnn(gpurt::kDnnNotSupported, call, "algorithm " + std::to_string(algo) + " cannot run this problem");
  return *ws;
}

} // namespace kiln::gpusim

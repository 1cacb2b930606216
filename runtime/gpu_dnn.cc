// What every platform's cuDNN calls share (gpu_dnn.h): the names of cuDNN's status codes, the
// DnnError they travel in, the default Platform methods (no GPU library: they fail), and cuDNN's
// argument checks, written from cuDNN 9's documented conditions and, for the descriptor functions,
// checked against cuDNN's own answers in CUDA builds (tests/cpp/test_gpu_dnn.cc). Where kiln is
// stricter than cuDNN (a pooling output of another size than cuDNN's formula gives) it says so.
#include "kiln/runtime/gpu_dnn.h"

#include <algorithm>
#include <array>
#include <string>

namespace kiln::gpurt {

const char* DnnStatusName(int status) {
  switch (status) {
  case kDnnSuccess: return "CUDNN_STATUS_SUCCESS";
  case kDnnNotInitialized: return "CUDNN_STATUS_NOT_INITIALIZED";
  case kDnnBadParam: return "CUDNN_STATUS_BAD_PARAM";
  case kDnnBadParamNullPointer: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
  case kDnnBadParamMisalignedPointer: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
  case kDnnBadParamStreamMismatch: return "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH";
  case kDnnNotSupported: return "CUDNN_STATUS_NOT_SUPPORTED";
  case kDnnNotSupportedDataType: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
  case kDnnNotSupportedLayout: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
  case kDnnExecutionFailed: return "CUDNN_STATUS_EXECUTION_FAILED";
  default: return "CUDNN_STATUS";
  }
}

void FailDnn(int status, const std::string& call, const std::string& detail) {
  throw DnnError(status,
                 call + ": " + DnnStatusName(status) + " (" + std::to_string(status) + "): " + detail);
}

// ---- the defaults: a platform without cuDNN ----
void Platform::DnnConvolutionForward(void*, Stream, const ConvForwardArgs&) {
  FailDnn(kDnnNotInitialized, "cudnnConvolutionForward",
          std::string("the ") + Name() + " platform has no cuDNN");
}
void Platform::DnnConvolutionBackwardData(void*, Stream, const ConvBackwardDataArgs&) {
  FailDnn(kDnnNotInitialized, "cudnnConvolutionBackwardData",
          std::string("the ") + Name() + " platform has no cuDNN");
}
void Platform::DnnConvolutionBackwardFilter(void*, Stream, const ConvBackwardFilterArgs&) {
  FailDnn(kDnnNotInitialized, "cudnnConvolutionBackwardFilter",
          std::string("the ") + Name() + " platform has no cuDNN");
}
// A platform whose convolutions need no scratch memory.
size_t Platform::DnnConvolutionWorkspaceSize(void*, Stream, const ConvForwardArgs&) { return 0; }
size_t Platform::DnnConvolutionWorkspaceSize(void*, Stream, const ConvBackwardDataArgs&) { return 0; }
size_t Platform::DnnConvolutionWorkspaceSize(void*, Stream, const ConvBackwardFilterArgs&) { return 0; }
std::vector<DnnAlgoPerf> Platform::DnnFindConvolutionAlgorithms(void*, Stream, const ConvForwardArgs&) { return {}; }
std::vector<DnnAlgoPerf> Platform::DnnFindConvolutionAlgorithms(void*, Stream, const ConvBackwardDataArgs&) {
  return {};
}
std::vector<DnnAlgoPerf> Platform::DnnFindConvolutionAlgorithms(void*, Stream, const ConvBackwardFilterArgs&) {
  return {};
}
std::string Platform::DnnLibraryKey(int) { return ""; }
void Platform::DnnPoolingForward(void*, Stream, const PoolingForwardArgs&) {
  FailDnn(kDnnNotInitialized, "cudnnPoolingForward", std::string("the ") + Name() + " platform has no cuDNN");
}
void Platform::DnnBatchNormForwardTraining(void*, Stream, const BatchNormArgs&) {
  FailDnn(kDnnNotInitialized, "cudnnBatchNormalizationForwardTraining",
          std::string("the ") + Name() + " platform has no cuDNN");
}
void Platform::DnnBatchNormForwardInference(void*, Stream, const BatchNormArgs&) {
  FailDnn(kDnnNotInitialized, "cudnnBatchNormalizationForwardInference",
          std::string("the ") + Name() + " platform has no cuDNN");
}

void Platform::DnnPoolingBackward(void*, Stream, const PoolingBackwardArgs&) {
  FailDnn(kDnnNotInitialized, "cudnnPoolingBackward",
          std::string("the ") + Name() + " platform has no cuDNN");
}
void Platform::DnnBatchNormBackward(void*, Stream, const BatchNormBackwardArgs&) {
  FailDnn(kDnnNotInitialized, "cudnnBatchNormalizationBackward",
          std::string("the ") + Name() + " platform has no cuDNN");
}

// ---- descriptors ----
namespace {

const char* TypeName(DnnDataType t) {
  switch (t) {
  case DnnDataType::kFloat: return "CUDNN_DATA_FLOAT";
  case DnnDataType::kDouble: return "CUDNN_DATA_DOUBLE";
  case DnnDataType::kHalf: return "CUDNN_DATA_HALF";
  case DnnDataType::kInt8: return "CUDNN_DATA_INT8";
  case DnnDataType::kInt32: return "CUDNN_DATA_INT32";
  case DnnDataType::kBFloat16: return "CUDNN_DATA_BFLOAT16";
  }
  return "an unknown cudnnDataType_t";
}
std::string Dims(int n, int c, int h, int w) {
  return "[" + std::to_string(n) + ", " + std::to_string(c) + ", " + std::to_string(h) + ", " +
         std::to_string(w) + "]";
}
std::string Str(const DnnFilterDesc& f) {
  return Dims(f.k, f.c, f.h, f.w) + (f.format == DnnFormat::kNHWC ? " (KRSC)" : " (KCRS)");
}
std::string P(int a, int b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

} // namespace

DnnTensorDesc DnnTensorDesc::Packed(DnnFormat format, int n, int c, int h, int w, DnnDataType t) {
  DnnTensorDesc d;
  d.dtype = t, d.n = n, d.c = c, d.h = h, d.w = w;
  if (format == DnnFormat::kNHWC) {
    d.c_stride = 1, d.w_stride = c, d.h_stride = int64_t{w} * c, d.n_stride = int64_t{h} * w * c;
  } else {
    d.w_stride = 1, d.h_stride = w, d.c_stride = int64_t{h} * w, d.n_stride = int64_t{c} * h * w;
  }
  return d;
}

int64_t DnnTensorDesc::Span() const {
  return (n - 1) * n_stride + (c - 1) * c_stride + (h - 1) * h_stride + (w - 1) * w_stride + 1;
}

std::string DnnTensorDesc::ToString() const {
  return Dims(n, c, h, w) + " strides [" + std::to_string(n_stride) + ", " + std::to_string(c_stride) + ", " +
         std::to_string(h_stride) + ", " + std::to_string(w_stride) + "] " + TypeName(dtype);
}

void CheckTensorDesc(const DnnTensorDesc& t, const char* what, const char* call) {
  if (t.n <= 0 || t.c <= 0 || t.h <= 0 || t.w <= 0)
    FailDnn(kDnnBadParam, call,
            std::string(what) + " has sizes " + Dims(t.n, t.c, t.h, t.w) +
                "; every size of a 4-d tensor descriptor must be at least 1 (an empty tensor needs no call)");
  // cudnnSetTensor4dDescriptorEx rejects a zero stride; a negative one it takes, and the calls
  // then refuse it as NOT_SUPPORTED.
  const bool negative = t.n_stride < 0 || t.c_stride < 0 || t.h_stride < 0 || t.w_stride < 0;
  if (negative || t.n_stride == 0 || t.c_stride == 0 || t.h_stride == 0 || t.w_stride == 0)
    FailDnn(
        negative ? kDnnNotSupported : kDnnBadParam, call,
        std::string(what) + " is " + t.ToString() +
            "; strides must be at least 1 (elements, not bytes): a packed NCHW tensor has strides [C*H*W, "
            "H*W, W, 1], a packed NHWC one [H*W*C, 1, W*C, C]");
  if (int64_t{t.n} * t.c * t.h * t.w > int64_t{2147483647})
    FailDnn(kDnnNotSupported, call,
            std::string(what) + " has " + std::to_string(int64_t{t.n} * t.c * t.h * t.w) +
                " elements; cuDNN's 4-d tensors hold fewer than 2^31: split the batch");
  if (t.dtype != DnnDataType::kFloat)
    FailDnn(kDnnNotSupportedDataType, call,
            std::string(what) + " is " + TypeName(t.dtype) +
                "; kiln's cuDNN calls run CUDNN_DATA_FLOAT only: "
                "convert the tensor to float32 first");
}

void CheckFilterDesc(const DnnFilterDesc& f, const char* call) {
  if (f.format != DnnFormat::kNCHW && f.format != DnnFormat::kNHWC)
    FailDnn(
        kDnnBadParam, call,
        "the filter's format is " + std::to_string(static_cast<int>(f.format)) +
            "; a float filter is CUDNN_TENSOR_NCHW (KCRS) or CUDNN_TENSOR_NHWC (KRSC); NCHW_VECT_C is for "
            "int8 data only");
  if (f.k <= 0 || f.c <= 0 || f.h <= 0 || f.w <= 0)
    FailDnn(kDnnBadParam, call,
            "the filter has sizes " + Str(f) + "; every size of a 4-d filter descriptor must be at least 1");
  if (f.dtype != DnnDataType::kFloat)
    FailDnn(kDnnNotSupportedDataType, call,
            std::string("the filter is ") + TypeName(f.dtype) +
                "; kiln's cuDNN calls run CUDNN_DATA_FLOAT only");
}

void ConvForwardOutputDim(const DnnTensorDesc& x, const DnnFilterDesc& w, const DnnConvDesc& c, int out[4],
                          const char* call) {
  if (c.pad_h < 0 || c.pad_w < 0 || c.stride_h < 1 || c.stride_w < 1 || c.dilation_h < 1 || c.dilation_w < 1)
    FailDnn(kDnnBadParam, call,
            "the convolution has pads " + P(c.pad_h, c.pad_w) + ", strides " + P(c.stride_h, c.stride_w) +
                " and dilations " + P(c.dilation_h, c.dilation_w) +
                "; pads must be >= 0, strides and dilations >= 1 (dilation 1 is a dense filter)");
  if (c.mode != DnnConvMode::kConvolution && c.mode != DnnConvMode::kCrossCorrelation)
    FailDnn(
        kDnnBadParam, call,
        "the convolution mode is " + std::to_string(static_cast<int>(c.mode)) +
            "; it is CUDNN_CONVOLUTION (0) or CUDNN_CROSS_CORRELATION (1, what deep-learning frameworks call "
            "convolution)");
  if (c.groups < 1)
    FailDnn(kDnnBadParam, call,
            "the group count is " + std::to_string(c.groups) +
                "; it must be at least 1 (cudnnSetConvolutionGroupCount rejects it)");
  if (x.c != w.c * c.groups)
    FailDnn(kDnnBadParam, call,
            "the input " + x.ToString() + " has " + std::to_string(x.c) + " channels but the filter " +
                Str(w) + " with " + std::to_string(c.groups) + " group(s) takes " +
                std::to_string(w.c * c.groups) +
                " (filter C x groups); the filter's C is the input channels per group. If the data is NHWC, "
                "describe it with NHWC strides rather than as NCHW");
  const int kh = (w.h - 1) * c.dilation_h + 1, kw = (w.w - 1) * c.dilation_w + 1;
  if (kh > x.h + 2 * c.pad_h || kw > x.w + 2 * c.pad_w)
    FailDnn(kDnnBadParam, call,
            "the filter's dilated window " + P(kh, kw) + " is larger than the padded input " +
                P(x.h + 2 * c.pad_h, x.w + 2 * c.pad_w) + " (input " + x.ToString() +
                "); pad the input more, or check that H and W are not swapped with C (NCHW vs NHWC)");
  out[0] = x.n;
  out[1] = w.k;
  out[2] = 1 + (x.h + 2 * c.pad_h - kh) / c.stride_h;
  out[3] = 1 + (x.w + 2 * c.pad_w - kw) / c.stride_w;
}

void PoolingForwardOutputDim(const DnnPoolingDesc& p, const DnnTensorDesc& x, int out[4], const char* call) {
  if (p.window_h < 1 || p.window_w < 1 || p.stride_h < 1 || p.stride_w < 1)
    FailDnn(kDnnBadParam, call,
            "the pooling window is " + P(p.window_h, p.window_w) + " with strides " +
                P(p.stride_h, p.stride_w) + "; windows and strides must be at least 1");
  const int m = static_cast<int>(p.mode);
  if (m < 0 || m > 3)
    FailDnn(kDnnBadParam, call,
            "the pooling mode is " + std::to_string(m) +
                "; it is CUDNN_POOLING_MAX (0), _AVERAGE_COUNT_INCLUDE_PADDING (1), _EXCLUDE_PADDING (2) or "
                "MAX_DETERMINISTIC (3)");
  if (p.window_h > x.h + 2 * p.pad_h || p.window_w > x.w + 2 * p.pad_w)
    FailDnn(kDnnBadParam, call,
            "the pooling window " + P(p.window_h, p.window_w) + " is larger than the padded input " +
                P(x.h + 2 * p.pad_h, x.w + 2 * p.pad_w) + " (input " + x.ToString() + ")");
  out[0] = x.n;
  out[1] = x.c;
  out[2] = 1 + (x.h + 2 * p.pad_h - p.window_h) / p.stride_h;
  out[3] = 1 + (x.w + 2 * p.pad_w - p.window_w) / p.stride_w;
}

namespace {

// The legacy API's documented status for a null argument is plain BAD_PARAM (cuDNN 9.19 gives 2000,
// not BAD_PARAM_NULL_POINTER, for a null handle too).
void NotNull(const void* p, const char* what, const char* call) {
  if (!p)
    FailDnn(kDnnBadParam, call, std::string(what) + " is null; pass device memory of the stream's device");
}

// An output whose strides make two elements share an address is kiln's check (strides are positive
// here, CheckTensorDesc came first): on a GPU the threads writing them race and the result is
// silently wrong.
void NotOverlapping(const DnnTensorDesc& t, const char* what, const char* call) {
  std::array<std::pair<int64_t, int64_t>, 4> d{
      {{t.n_stride, t.n}, {t.c_stride, t.c}, {t.h_stride, t.h}, {t.w_stride, t.w}}};
  std::sort(d.begin(), d.end());
  int64_t reach = 1; // elements the inner dimensions span
  for (auto [stride, size] : d) {
    if (size == 1) continue;
    if (stride < reach)
      FailDnn(kDnnBadParam, call,
              std::string(what) + " is " + t.ToString() +
                  ": its strides make different elements share an address, so the output would be written by "
                  "racing threads; give it strides of a packed layout (NCHW [C*H*W, H*W, W, 1] or NHWC "
                  "[H*W*C, 1, "
                  "W*C, C])");
    reach = stride * size;
  }
}

// The parameter descriptor of batch norm over x in `mode`: 1 x C x 1 x 1 or 1 x C x H x W, packed.
void CheckBatchNormParam(DnnBatchNormMode mode, const DnnTensorDesc& x, const DnnTensorDesc& q,
                         const char* what, const char* call) {
  const int m = static_cast<int>(mode);
  if (m < 0 || m > 2)
    FailDnn(kDnnBadParam, call,
            "the batch-norm mode is " + std::to_string(m) +
                "; it is CUDNN_BATCHNORM_PER_ACTIVATION (0), _SPATIAL (1) or _SPATIAL_PERSISTENT (2)");
  CheckTensorDesc(q, what, call);
  const bool per_activation = mode == DnnBatchNormMode::kPerActivation;
  const int ph = per_activation ? x.h : 1, pw = per_activation ? x.w : 1;
  if (q.n != 1 || q.c != x.c || q.h != ph || q.w != pw)
    FailDnn(kDnnBadParam, call,
            std::string(what) + " is " + Dims(q.n, q.c, q.h, q.w) + " but " +
                (per_activation ? "per-activation" : "spatial") + " batch norm of " + x.ToString() +
                " needs " + Dims(1, x.c, ph, pw) + " (cudnnDeriveBNTensorDescriptor makes it)");
  if ((q.w > 1 && q.w_stride != 1) || (q.h > 1 && q.h_stride != q.w) ||
      (q.c > 1 && q.c_stride != int64_t{q.h} * q.w))
    FailDnn(kDnnBadParam, call,
            std::string(what) + " is " + q.ToString() +
                "; the parameters must be packed (strides [C*H*W, H*W, W, 1])");
}

void SameType(const DnnTensorDesc& x, const DnnTensorDesc& y, const char* call) {
  if (x.dtype != y.dtype)
    FailDnn(kDnnBadParam, call,
            std::string("the input is ") + TypeName(x.dtype) + " but the output is " + TypeName(y.dtype) +
                "; cuDNN needs them to match");
}

} // namespace

namespace {

// The names of a convolution's three operands in one call's messages.
struct ConvNames {
  const char* x; // "the input x" / "dx (the input's gradient)"
  const char* w;
  const char* y;
  enum { kX, kW, kY } written; // the one the call writes
};

// What every convolution call checks of (x, w, conv, y): y is what convolving x by w gives.
void CheckConv(const DnnTensorDesc& x, const void* xp, const DnnFilterDesc& w, const void* wp,
               const DnnConvDesc& c, const DnnTensorDesc& y, const void* yp, const ConvNames& names,
               const char* call) {
  NotNull(xp, names.x, call);
  NotNull(wp, names.w, call);
  NotNull(yp, names.y, call);
  if (x.dtype != w.dtype || x.dtype != y.dtype)
    FailDnn(kDnnBadParam, call,
            std::string(names.x) + " is " + TypeName(x.dtype) + ", " + names.w + " " + TypeName(w.dtype) +
                " and " + names.y + " " + TypeName(y.dtype) + "; cuDNN needs them to match");
  CheckTensorDesc(x, names.x, call);
  CheckFilterDesc(w, call);
  CheckTensorDesc(y, names.y, call);
  if (names.written == ConvNames::kY) NotOverlapping(y, names.y, call);
  if (names.written == ConvNames::kX) NotOverlapping(x, names.x, call);
  int out[4];
  ConvForwardOutputDim(x, w, c, out, call);
  if (w.k % c.groups != 0)
    FailDnn(kDnnBadParam, call,
            "the filter " + Str(w) + " has " + std::to_string(w.k) +
                " output channels, not a multiple of the " + std::to_string(c.groups) +
                " groups; each group needs the same number of filters");
  if (y.n != out[0] || y.c != out[1])
    FailDnn(kDnnBadParam, call,
            std::string(names.y) + " is " + y.ToString() + " but the convolution produces " +
                Dims(out[0], out[1], out[2], out[3]) + " (batch from x, channels from the filter's K)");
  if (y.h != out[2] || y.w != out[3])
    FailDnn(kDnnNotSupported, call,
            std::string(names.y) + " is " + y.ToString() +
                " but cudnnGetConvolution2dForwardOutputDim gives " + Dims(out[0], out[1], out[2], out[3]) +
                " for " + names.x + " " + x.ToString() + ", pads " + P(c.pad_h, c.pad_w) + ", strides " +
                P(c.stride_h, c.stride_w) + " and dilations " + P(c.dilation_h, c.dilation_w) +
                "; allocate it with that shape");
}

} // namespace

void CheckConvForward(const ConvForwardArgs& a, const char* call) {
  static const ConvNames names{"x (the input)", "w (the filter)", "y (the output)", ConvNames::kY};
  CheckConv(a.x, a.x_data, a.w, a.w_data, a.conv, a.y, a.y_data, names, call);
}

void CheckConvBackwardData(const ConvBackwardDataArgs& a, const char* call) {
  static const ConvNames names{"dx (the input's gradient)", "w (the filter)", "dy (the output's gradient)",
                               ConvNames::kX};
  CheckConv(a.dx, a.dx_data, a.w, a.w_data, a.conv, a.dy, a.dy_data, names, call);
}

void CheckConvBackwardFilter(const ConvBackwardFilterArgs& a, const char* call) {
  static const ConvNames names{"x (the input)", "dw (the filter's gradient)", "dy (the output's gradient)",
                               ConvNames::kW};
  CheckConv(a.x, a.x_data, a.dw, a.dw_data, a.conv, a.dy, a.dy_data, names, call);
}

void CheckPoolingForward(const PoolingForwardArgs& a, const char* call) {
  NotNull(a.x_data, "x (the input)", call);
  NotNull(a.y_data, "y (the output)", call);
  SameType(a.x, a.y, call);
  CheckTensorDesc(a.x, "the input x", call);
  CheckTensorDesc(a.y, "the output y", call);
  NotOverlapping(a.y, "the output y", call);
  if (a.pool.pad_h < 0 || a.pool.pad_w < 0)
    FailDnn(kDnnBadParam, call,
            "the pooling pads are " + P(a.pool.pad_h, a.pool.pad_w) + "; pads must be >= 0");
  int out[4];
  PoolingForwardOutputDim(a.pool, a.x, out, call);
  if (a.y.n != out[0] || a.y.c != out[1])
    FailDnn(kDnnBadParam, call,
            "the output y is " + a.y.ToString() + " but the input is " + a.x.ToString() +
                "; pooling keeps N and C, so they must match");
  // cuDNN itself pools whatever window positions y has room for; kiln asks for exactly its formula,
  // on every platform, since any other size is a shape mistake above.
  if (a.y.h != out[2] || a.y.w != out[3])
    FailDnn(kDnnBadParam, call,
            "the output y is " + a.y.ToString() + " but cudnnGetPooling2dForwardOutputDim gives " +
                Dims(out[0], out[1], out[2], out[3]) + " for window " + P(a.pool.window_h, a.pool.window_w) +
                ", pads " + P(a.pool.pad_h, a.pool.pad_w) + " and strides " +
                P(a.pool.stride_h, a.pool.stride_w) + "; allocate y with that shape");
}

void CheckBatchNormForward(const BatchNormArgs& a, bool training, const char* call) {
  NotNull(a.x_data, "x (the input)", call);
  NotNull(a.y_data, "y (the output)", call);
  NotNull(a.scale, "bnScale", call);
  NotNull(a.bias, "bnBias", call);
  if (!training) {
    NotNull(a.running_mean, "estimatedMean (running_mean)", call);
    NotNull(a.running_var, "estimatedVariance (running_var)", call);
  } else {
    if (!a.running_mean != !a.running_var)
      FailDnn(kDnnBadParam, call,
              std::string("resultRunningMean is ") + (a.running_mean ? "given" : "null") +
                  " but resultRunningVariance " + (a.running_var ? "is given" : "is null") +
                  "; pass both (to update the running statistics) or neither");
    if (!a.save_mean != !a.save_inv_variance)
      FailDnn(kDnnBadParam, call,
              std::string("resultSaveMean is ") + (a.save_mean ? "given" : "null") +
                  " but resultSaveInvVariance " + (a.save_inv_variance ? "is given" : "is null") +
                  "; pass both (for the backward pass) or neither");
    if (!(a.exponential_average_factor >= 0.0 && a.exponential_average_factor <= 1.0))
      FailDnn(
          kDnnBadParam, call,
          "exponentialAverageFactor is " + std::to_string(a.exponential_average_factor) +
              "; it weighs the new batch in the running statistics and lies in [0, 1] (PyTorch's momentum "
              "0.1 is factor 0.1; MXNet's momentum 0.9 is factor 0.1)");
  }
  SameType(a.x, a.y, call);
  CheckTensorDesc(a.x, "the input x", call);
  CheckTensorDesc(a.y, "the output y", call);
  NotOverlapping(a.y, "the output y", call);
  if (a.x.n != a.y.n || a.x.c != a.y.c || a.x.h != a.y.h || a.x.w != a.y.w)
    FailDnn(kDnnBadParam, call,
            "the input is " + a.x.ToString() + " but the output " + a.y.ToString() +
                "; batch normalization keeps the shape, so they must match");
  CheckBatchNormParam(a.mode, a.x, a.param, "bnScaleBiasMeanVarDesc", call);
  if (!(a.epsilon >= 0.0)) // CUDNN_BN_MIN_EPSILON is 0 in cuDNN 9
    FailDnn(kDnnBadParam, call,
            "epsilon is " + std::to_string(a.epsilon) + "; it must be >= CUDNN_BN_MIN_EPSILON (0)");
}

namespace {

bool SameLayout(const DnnTensorDesc& a, const DnnTensorDesc& b) {
  return a.n == b.n && a.c == b.c && a.h == b.h && a.w == b.w && a.n_stride == b.n_stride &&
         a.c_stride == b.c_stride && a.h_stride == b.h_stride && a.w_stride == b.w_stride &&
         a.dtype == b.dtype;
}

} // namespace

void CheckPoolingBackward(const PoolingBackwardArgs& a, const char* call) {
  NotNull(a.y_data, "y (the forward output)", call);
  NotNull(a.dy_data, "dy (the output's gradient)", call);
  NotNull(a.x_data, "x (the forward input)", call);
  NotNull(a.dx_data, "dx (the input's gradient)", call);
  CheckTensorDesc(a.x, "the input x", call);
  CheckTensorDesc(a.y, "the output y", call);
  if (!SameLayout(a.y, a.dy))
    FailDnn(kDnnBadParam, call,
            "y is " + a.y.ToString() + " but dy " + a.dy.ToString() +
                "; cuDNN needs the output and its gradient with the same sizes, strides and type");
  if (!SameLayout(a.x, a.dx))
    FailDnn(kDnnBadParam, call,
            "x is " + a.x.ToString() + " but dx " + a.dx.ToString() +
                "; cuDNN needs the input and its gradient with the same sizes, strides and type");
  NotOverlapping(a.dx, "dx (the input's gradient)", call);
  // The forward call's checks, so that y is what pooling x gives.
  PoolingForwardArgs f;
  f.pool = a.pool, f.x = a.x, f.x_data = a.x_data, f.y = a.y,
  f.y_data = const_cast<void*>(a.y_data); // only checked
  CheckPoolingForward(f, call);
}

void CheckBatchNormBackward(const BatchNormBackwardArgs& a, const char* call) {
  NotNull(a.x_data, "x (the forward input)", call);
  NotNull(a.dy_data, "dy (the output's gradient)", call);
  NotNull(a.dx_data, "dx (the input's gradient)", call);
  NotNull(a.scale, "bnScale", call);
  NotNull(a.dscale, "dBnScaleResult", call);
  NotNull(a.dbias, "dBnBiasResult", call);
  if (!a.saved_mean != !a.saved_inv_variance)
    FailDnn(kDnnBadParam, call,
            std::string("savedMean is ") + (a.saved_mean ? "given" : "null") + " but savedInvVariance " +
                (a.saved_inv_variance ? "is given" : "is null") +
                "; pass both (from the training forward pass) or neither (to recompute them from x)");
  CheckTensorDesc(a.x, "the input x", call);
  CheckTensorDesc(a.dy, "dy (the output's gradient)", call);
  CheckTensorDesc(a.dx, "dx (the input's gradient)", call);
  for (const DnnTensorDesc* t : {&a.dy, &a.dx})
    if (t->n != a.x.n || t->c != a.x.c || t->h != a.x.h || t->w != a.x.w || t->dtype != a.x.dtype)
      FailDnn(kDnnBadParam, call,
              std::string(t == &a.dy ? "dy" : "dx") + " is " + t->ToString() + " but x " + a.x.ToString() +
                  "; batch normalization keeps the shape, so x, dy and dx must match");
  NotOverlapping(a.dx, "dx (the input's gradient)", call);
  CheckBatchNormParam(a.mode, a.x, a.param, "dBnScaleBiasDesc", call);
  if (!(a.epsilon >= 0.0))
    FailDnn(kDnnBadParam, call,
            "epsilon is " + std::to_string(a.epsilon) + "; it must be >= CUDNN_BN_MIN_EPSILON (0)");
}

} // namespace kiln::gpurt

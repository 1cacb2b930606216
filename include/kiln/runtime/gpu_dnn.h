// The types of the platform's cuDNN calls (gpu.h, "cuDNN" methods): cuDNN's status codes, its
// descriptors as plain values (tensor, filter, convolution, pooling), the arguments of convolution
// (forward, backward data, backward filter), pooling and batch norm (forward for training and
// inference, backward), and the argument checks
// cuDNN makes, shared by every platform so that the simulator rejects what a real GPU rejects, with
// the same status. Only float32 is run; tensors may have any positive strides (NCHW, NHWC, padded).
// Numbering follows cudnn_graph.h / cudnn_ops.h / cudnn_cnn.h of cuDNN 9; CUDA's headers stay out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/runtime/gpu.h"

namespace kiln::gpurt {

/// cudnnStatus_t codes the cuDNN calls report (cuDNN 9 numbering).
enum DnnStatus : int {
  kDnnSuccess = 0,
  kDnnNotInitialized = 1001,            ///< CUDNN_STATUS_NOT_INITIALIZED (no handle, or not a cuDNN one)
  kDnnBadParam = 2000,                  ///< CUDNN_STATUS_BAD_PARAM
  kDnnBadParamNullPointer = 2002,       ///< CUDNN_STATUS_BAD_PARAM_NULL_POINTER (cuDNN may report it)
  kDnnBadParamMisalignedPointer = 2003, ///< CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER
  kDnnBadParamStreamMismatch = 2007,    ///< CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH
  kDnnNotSupported = 3000,              ///< CUDNN_STATUS_NOT_SUPPORTED
  kDnnNotSupportedDataType = 3003,      ///< CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE
  kDnnNotSupportedLayout = 3004,        ///< CUDNN_STATUS_NOT_SUPPORTED_LAYOUT
  kDnnExecutionFailed = 5000,           ///< CUDNN_STATUS_EXECUTION_FAILED
};
/// "CUDNN_STATUS_BAD_PARAM" for 2000; "CUDNN_STATUS_<number>" for codes not in the table.
const char* DnnStatusName(int status);

/// A failed cuDNN call: a GpuError whose code() is the cudnnStatus_t (not a CUresult).
/// what() reads "<call>: CUDNN_STATUS_NAME (n): <expected, found, what to do>".
class DnnError : public GpuError {
public:
  using GpuError::GpuError;
};
/// Throws DnnError(status) with "<call>: CUDNN_STATUS_NAME (status): <detail>".
[[noreturn]] void FailDnn(int status, const std::string& call, const std::string& detail);

/// cudnnTensorFormat_t.
enum class DnnFormat : int { kNCHW = 0, kNHWC = 1, kNCHWVectC = 2 };
/// cudnnDataType_t (the values kiln names; only kFloat runs).
enum class DnnDataType : int { kFloat = 0, kDouble = 1, kHalf = 2, kInt8 = 3, kInt32 = 4, kBFloat16 = 9 };

/// A 4-d cudnnTensorDescriptor_t (cudnnSetTensor4dDescriptorEx): sizes and strides in elements.
struct DnnTensorDesc {
  DnnDataType dtype = DnnDataType::kFloat;
  int n = 0, c = 0, h = 0, w = 0;
  int64_t n_stride = 0, c_stride = 0, h_stride = 0, w_stride = 0;
  /// cudnnSetTensor4dDescriptor: fully packed in `format` (kNCHW or kNHWC).
  static DnnTensorDesc Packed(DnnFormat format, int n, int c, int h, int w,
                              DnnDataType t = DnnDataType::kFloat);
  /// The elements [0, Span()) the tensor's addresses cover (the largest offset plus one).
  int64_t Span() const;
  std::string ToString() const; ///< "[n, c, h, w] strides [..] float"
};

/// A 4-d cudnnFilterDescriptor_t (cudnnSetFilter4dDescriptor): k output channels, c input
/// channels per group, an h x w window, packed in `format` (kNCHW: KCRS, kNHWC: KRSC).
struct DnnFilterDesc {
  DnnDataType dtype = DnnDataType::kFloat;
  DnnFormat format = DnnFormat::kNCHW;
  int k = 0, c = 0, h = 0, w = 0;
};

/// cudnnConvolutionMode_t: kConvolution flips the filter, kCrossCorrelation does not.
enum class DnnConvMode : int { kConvolution = 0, kCrossCorrelation = 1 };

/// A 2-d cudnnConvolutionDescriptor_t (cudnnSetConvolution2dDescriptor + GroupCount).
struct DnnConvDesc {
  int pad_h = 0, pad_w = 0;
  int stride_h = 1, stride_w = 1;
  int dilation_h = 1, dilation_w = 1;
  DnnConvMode mode = DnnConvMode::kCrossCorrelation;
  DnnDataType compute = DnnDataType::kFloat;
  int groups = 1;
  /// float32 may run on TF32 tensor cores (cuDNN's default math; the simulator rounds the inputs'
  /// mantissas to 10 bits); false: FMA math, full float32. Kiln's kernels set it from the math
  /// mode (kiln/runtime/math_mode.h).
  bool tf32 = false;
  /// The cudnnMathType_t to run with, as a measurement reported it for the chosen algorithm (cuDNN
  /// picks tensor-core kernels by algorithm and math type together); -1: from `tf32` (default
  /// math, or FMA). Never lets a float32 convolution use TF32 when `tf32` is false.
  int math = -1;
};

/// cudnnConvolutionForward: y = alpha * conv(x, w) + beta * y (beta == 0 never reads y).
/// Data pointers are device memory of the stream's device; alpha and beta are host values.
struct ConvForwardArgs {
  float alpha = 1.0f, beta = 0.0f;
  DnnTensorDesc x;
  const void* x_data = nullptr;
  DnnFilterDesc w;
  const void* w_data = nullptr;
  DnnConvDesc conv;
  DnnTensorDesc y;
  void* y_data = nullptr;
  /// cuDNN's scratch memory for the call's algorithm: device memory of the stream's device of at
  /// least DnnConvolutionWorkspaceSize(args) bytes, owned by the caller (kiln's kernels take it
  /// from the caching allocator, per stream). Null: the platform's own per-device workspace, which
  /// calls on different streams of one device must not use at the same time.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  /// The algorithm (cuDNN's enum value for this call) to run, as DnnFindConvolutionAlgorithms
  /// reported it; -1: the platform's heuristic choice. The workspace size follows it.
  int algo = -1;
};

/// cudnnConvolutionBackwardData: dx = alpha * (the gradient of the forward convolution's loss
/// with respect to x, given dy) + beta * dx. The shapes are the forward call's: dy is what
/// convolving dx's shape by w gives.
struct ConvBackwardDataArgs {
  float alpha = 1.0f, beta = 0.0f;
  DnnFilterDesc w;
  const void* w_data = nullptr;
  DnnTensorDesc dy;
  const void* dy_data = nullptr;
  DnnConvDesc conv;
  DnnTensorDesc dx;
  void* dx_data = nullptr;
  /// cuDNN's scratch memory for the call's algorithm: device memory of the stream's device of at
  /// least DnnConvolutionWorkspaceSize(args) bytes, owned by the caller (kiln's kernels take it
  /// from the caching allocator, per stream). Null: the platform's own per-device workspace, which
  /// calls on different streams of one device must not use at the same time.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  /// The algorithm (cuDNN's enum value for this call) to run, as DnnFindConvolutionAlgorithms
  /// reported it; -1: the platform's heuristic choice. The workspace size follows it.
  int algo = -1;
};

/// cudnnConvolutionBackwardFilter: dw = alpha * (the gradient with respect to the filter, given x
/// and dy) + beta * dw.
struct ConvBackwardFilterArgs {
  float alpha = 1.0f, beta = 0.0f;
  DnnTensorDesc x;
  const void* x_data = nullptr;
  DnnTensorDesc dy;
  const void* dy_data = nullptr;
  DnnConvDesc conv;
  DnnFilterDesc dw;
  void* dw_data = nullptr;
  /// cuDNN's scratch memory for the call's algorithm: device memory of the stream's device of at
  /// least DnnConvolutionWorkspaceSize(args) bytes, owned by the caller (kiln's kernels take it
  /// from the caching allocator, per stream). Null: the platform's own per-device workspace, which
  /// calls on different streams of one device must not use at the same time.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  /// The algorithm (cuDNN's enum value for this call) to run, as DnnFindConvolutionAlgorithms
  /// reported it; -1: the platform's heuristic choice. The workspace size follows it.
  int algo = -1;
};

/// One algorithm of a convolution call, as cudnnFind*Algorithm reports it: its cuDNN enum value,
/// whether it runs these arguments (status 0), its measured time and the workspace it needs.
struct DnnAlgoPerf {
  int algo = -1;
  int status = 0;
  float time_ms = 0;
  size_t workspace = 0;
  bool deterministic = true;
  int math = -1;  ///< the cudnnMathType_t it was measured with (-1: not reported)
};

/// cudnnPoolingMode_t.
enum class DnnPoolingMode : int {
  kMax = 0,
  kAverageCountIncludePadding = 1,
  kAverageCountExcludePadding = 2,
  kMaxDeterministic = 3,
};
/// A 2-d cudnnPoolingDescriptor_t (cudnnSetPooling2dDescriptor; NaNs not propagated).
struct DnnPoolingDesc {
  DnnPoolingMode mode = DnnPoolingMode::kMax;
  int window_h = 1, window_w = 1;
  int pad_h = 0, pad_w = 0;
  int stride_h = 1, stride_w = 1;
};

/// cudnnPoolingForward: y = alpha * pool(x) + beta * y.
struct PoolingForwardArgs {
  DnnPoolingDesc pool;
  float alpha = 1.0f, beta = 0.0f;
  DnnTensorDesc x;
  const void* x_data = nullptr;
  DnnTensorDesc y;
  void* y_data = nullptr;
};

/// cudnnBatchNormMode_t: kPerActivation normalizes each (c, h, w) over n (parameters 1 x C x H x W);
/// kSpatial each c over (n, h, w) (parameters 1 x C x 1 x 1).
enum class DnnBatchNormMode : int { kPerActivation = 0, kSpatial = 1, kSpatialPersistent = 2 };

/// cudnnBatchNormalizationForwardTraining / ForwardInference:
///   y = alpha * (scale * (x - mean) * inv_std + bias) + beta * y.
/// Training uses the batch's mean and biased variance, inv_std = 1 / sqrt(var + epsilon), and
///   running_mean = (1 - f) * running_mean + f * mean,
///   running_var  = (1 - f) * running_var + f * var * m / (m - 1)   (unbiased, m values per channel),
/// with f = exponential_average_factor (1 / (1 + calls) gives a cumulative average); the running
/// statistics are updated only when both are given, save_mean / save_inv_variance written only
/// when both are given. Inference normalizes with running_mean and running_var instead.
struct BatchNormArgs {
  DnnBatchNormMode mode = DnnBatchNormMode::kSpatial;
  float alpha = 1.0f, beta = 0.0f;
  DnnTensorDesc x;
  const void* x_data = nullptr;
  DnnTensorDesc y;
  void* y_data = nullptr;
  DnnTensorDesc param; ///< bnScaleBiasMeanVarDesc: scale, bias, means and variances
  const void* scale = nullptr;
  const void* bias = nullptr;
  double exponential_average_factor = 1.0; ///< training only
  void* running_mean = nullptr;            ///< training: updated; inference: read (estimatedMean)
  void* running_var = nullptr;             ///< training: updated; inference: read (estimatedVariance)
  double epsilon = 1e-5;
  void* save_mean = nullptr;         ///< training only
  void* save_inv_variance = nullptr; ///< training only
};

/// cudnnPoolingBackward: dx = alpha * (dy routed back through the pooling of x, which gave y) +
/// beta * dx. Max pooling sends each dy to its window's first maximum (as CUDNN_POOLING_MAX_
/// DETERMINISTIC does; CUDNN_POOLING_MAX may pick another of equal maxima); average pooling
/// spreads it over the window. y and dy share one shape and strides, as x and dx do.
struct PoolingBackwardArgs {
  DnnPoolingDesc pool;
  float alpha = 1.0f, beta = 0.0f;
  DnnTensorDesc y;
  const void* y_data = nullptr;
  DnnTensorDesc dy;
  const void* dy_data = nullptr;
  DnnTensorDesc x;
  const void* x_data = nullptr;
  DnnTensorDesc dx;
  void* dx_data = nullptr;
};

/// cudnnBatchNormalizationBackward, with the batch statistics of the training forward pass
/// (save_mean / save_inv_variance from it, or both null to recompute them from x):
///   dx     = alpha_data * scale * inv_std / m * (m * dy - sum(dy) - xhat * sum(dy * xhat)) + beta_data * dx,
///   dscale = alpha_param * sum(dy * xhat) + beta_param * dscale,
///   dbias  = alpha_param * sum(dy) + beta_param * dbias,
/// with xhat = (x - mean) * inv_std and sums over the m values of each parameter.
struct BatchNormBackwardArgs {
  DnnBatchNormMode mode = DnnBatchNormMode::kSpatial;
  float alpha_data = 1.0f, beta_data = 0.0f, alpha_param = 1.0f, beta_param = 0.0f;
  DnnTensorDesc x;
  const void* x_data = nullptr;
  DnnTensorDesc dy;
  const void* dy_data = nullptr;
  DnnTensorDesc dx;
  void* dx_data = nullptr;
  DnnTensorDesc param; ///< dBnScaleBiasDesc: scale, dscale, dbias and the saved statistics
  const void* scale = nullptr;
  void* dscale = nullptr;
  void* dbias = nullptr;
  double epsilon = 1e-5; ///< the forward pass's
  const void* saved_mean = nullptr;
  const void* saved_inv_variance = nullptr;
};

// ---- cuDNN's argument checks, shared by every platform ----
// Each throws DnnError with cuDNN's status and a message naming what was expected, what was found
// and what to do; `call` is the cuDNN function named in it.

/// cudnnSetTensor4dDescriptorEx and the calls: sizes >= 1 and strides != 0 (BAD_PARAM), strides
/// not negative and under 2^31 elements (NOT_SUPPORTED); kiln runs float32 only
/// (NOT_SUPPORTED_DATA_TYPE).
void CheckTensorDesc(const DnnTensorDesc& t, const char* what, const char* call);
/// cudnnSetFilter4dDescriptor: sizes >= 1 and a format of NCHW or NHWC (BAD_PARAM).
void CheckFilterDesc(const DnnFilterDesc& f, const char* call);
/// cudnnGetConvolution2dForwardOutputDim: the [n, k, h, w] a convolution of x by w produces;
/// BAD_PARAM for bad pads/strides/dilations/groups/mode, x.c != w.c * groups, or a dilated filter
/// larger than the padded input.
void ConvForwardOutputDim(const DnnTensorDesc& x, const DnnFilterDesc& w, const DnnConvDesc& c, int out[4],
                          const char* call = "cudnnGetConvolution2dForwardOutputDim");
/// cudnnGetPooling2dForwardOutputDim: the [n, c, h, w] pooling x produces (BAD_PARAM for a
/// window or stride < 1, a bad mode, or a window larger than the padded input).
void PoolingForwardOutputDim(const DnnPoolingDesc& p, const DnnTensorDesc& x, int out[4],
                             const char* call = "cudnnGetPooling2dForwardOutputDim");
/// Everything cudnnConvolutionForward checks before it runs (null pointers, dtypes, channels,
/// groups, y's shape against the output dim, negative or overlapping output strides).
void CheckConvForward(const ConvForwardArgs& a, const char* call = "cudnnConvolutionForward");
/// The same of the backward calls: dy must be what the forward convolution of dx (x) by w (dw) gives.
void CheckConvBackwardData(const ConvBackwardDataArgs& a, const char* call = "cudnnConvolutionBackwardData");
void CheckConvBackwardFilter(const ConvBackwardFilterArgs& a,
                             const char* call = "cudnnConvolutionBackwardFilter");
void CheckPoolingForward(const PoolingForwardArgs& a, const char* call = "cudnnPoolingForward");
/// `training`: cudnnBatchNormalizationForwardTraining, else ...ForwardInference.
void CheckBatchNormForward(const BatchNormArgs& a, bool training, const char* call);
void CheckPoolingBackward(const PoolingBackwardArgs& a, const char* call = "cudnnPoolingBackward");
void CheckBatchNormBackward(const BatchNormBackwardArgs& a,
                            const char* call = "cudnnBatchNormalizationBackward");

/// The status cuDNN's own descriptor functions give for these descriptors, and the output dims
/// they compute: CUDA builds only (runtime/cuda/dnn_cuda.cc), where tests compare them with the
/// checks above. Each returns the first failing cudnnStatus_t of building the descriptors and
/// asking for the output dim, else 0 with `out` filled.
int CudnnConvForwardOutputDim(const DnnTensorDesc& x, const DnnFilterDesc& w, const DnnConvDesc& c,
                              int out[4]);
int CudnnPoolingForwardOutputDim(const DnnPoolingDesc& p, const DnnTensorDesc& x, int out[4]);

} // namespace kiln::gpurt

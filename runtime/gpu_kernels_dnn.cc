// GPU kernels of the convolution, pooling and batch-norm ops (ir/ops_nn.cc) on the platform's cuDNN
// calls (gpu_dnn.h): conv2d, conv2d_grad_data, conv2d_grad_weight, max_pool2d(_grad),
// avg_pool2d(_grad), batch_norm_train(_grad);
// float32, NCHW data and OIHW filters made contiguous by dispatch, on the calling engine worker's
// stream. Other dtypes are refused by dispatch (the bindings' dtypes) with a DTypeError.
//
// The ops' semantics map exactly onto cuDNN's, so the GPU gives the CPU kernels' numbers:
// - conv2d is CUDNN_CROSS_CORRELATION with symmetric padding, stride, dilation and groups, in
//   floor mode (the op's only mode; cuDNN's output-size formula is the same).
// - Average pooling: count_include_pad picks CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING or
//   _EXCLUDE_PADDING. In floor mode with padding at most half the window (the op's rule) no window
//   reaches past the padded edge, so "include" divides by the whole window, as the CPU does.
// - Max pooling is CUDNN_POOLING_MAX_DETERMINISTIC: padding never wins (every window holds an
//   input cell), and the gradient goes to the window's first maximum, as the CPU kernel's ties do.
// The gradient ops carry fewer operands than cuDNN's backward call wants: max_pool2d_grad (dy, x)
// recomputes the forward output y into a block of the device's caching allocator (stream-ordered:
// freed on this stream once the call is queued); avg_pool2d_grad (dy) passes dy for y and dx for x,
// which an average's gradient does not depend on.
// cuDNN describes tensors with int sizes and strides: a batch whose tensors pass 2^31 - 1 elements
// runs in chunks of samples (the filter gradient accumulating over them with beta = 1).
// Empty operands: an empty output is nothing to do; an empty input (no input channels, samples or
// output channels, an empty plane under padding) gives zeros, as the CPU kernels write.
// The convolution's algorithm is the platform's, chosen once per shape and cached
// (runtime/cuda/dnn_cuda.cc); its workspace, of the size the platform says that algorithm needs, is
// a block of the device's caching allocator taken per call, so calls on different streams never
// share one (the simulator needs none).
// Batch norm in training mode (batch_norm_train, batch_norm_train_grad) is CUDNN_BATCHNORM_SPATIAL
// over (N, C, H, W), an (N, C) tensor described as (N, C, 1, 1): the forward call writes the batch
// mean and cuDNN's saved inverse standard deviation 1 / sqrt(biased var + eps), which are the op's
// mean and inv_std outputs; it updates no running statistics (null buffers: nd::batch_norm updates
// them from the outputs), and the backward call reads them back. One call each: a tensor of more
// than 2^31 - 1 elements is refused with a ShapeError (statistics over chunks of samples would need
// a kernel of kiln's own).
// Not here: conv bias (nd::conv2d adds it with a broadcast add, which has its own GPU kernel).
#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/gpu_dnn.h"
#include "kiln/runtime/gpu_dnn_autotune.h"
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/math_mode.h"

namespace kiln {

namespace {

using gpurt::DnnFormat;
using gpurt::DnnPoolingMode;
using gpurt::DnnTensorDesc;

constexpr int64_t kMaxElements = INT_MAX; // cuDNN's descriptors hold int sizes and strides
// The elements one cuDNN call's batched tensors may hold (kMaxElements; tests lower it to make
// small batches run in chunks).
std::atomic<int64_t> g_chunk_elements{kMaxElements};

// The platform, the device made current, the worker's stream and the cuDNN handle bound to it.
struct Dnn {
  explicit Dnn(const KernelArgs& k)
      : p(gpurt::Get()), guard(k.device.index, p), s(static_cast<gpurt::Stream>(cuda::CurrentStream())),
        h(p.LibraryHandle(gpurt::Library::kDnn, s)) {}
  gpurt::Platform& p;
  gpurt::DeviceGuard guard;
  gpurt::Stream s; // nullptr (naive engine): the default stream
  void* h;
};

void RequireFloat32(const KernelArgs& k) {
  for (const auto* views : {&k.in, &k.out})
    for (const TensorView& t : *views)
      KILN_CHECK(t.dtype == DType::kFloat32) << k.op.name << ": dispatch let " << DTypeName(t.dtype)
                                             << " reach a float32 GPU kernel (KernelBinding::dtypes)";
}

// A two-value spatial attribute (a single value stands for both dims) as cuDNN's ints.
std::array<int, 2> Pair(const KernelArgs& k, const char* name) {
  const std::vector<int64_t>& v = k.attrs.Ints(name);
  const std::array<int64_t, 2> r{v[0], v.size() > 1 ? v[1] : v[0]};
  for (int64_t x : r)
    if (x > kMaxElements)
      KILN_THROW(ValueError) << k.op.name << " on " << k.device.str() << ": attribute '" << name << "' is "
                             << x << ", more than cuDNN's int parameters hold (" << kMaxElements
                             << "); use a smaller value or run it on kiln.cpu()";
  return {static_cast<int>(r[0]), static_cast<int>(r[1])};
}

gpurt::DnnConvDesc ConvDesc(const KernelArgs& k) {
  gpurt::DnnConvDesc c;
  const auto s = Pair(k, "stride"), p = Pair(k, "padding"), d = Pair(k, "dilation");
  c.stride_h = s[0], c.stride_w = s[1];
  c.pad_h = p[0], c.pad_w = p[1];
  c.dilation_h = d[0], c.dilation_w = d[1];
  c.mode = gpurt::DnnConvMode::kCrossCorrelation;
  c.groups = static_cast<int>(k.attrs.Int("groups")); // divides the channels (inference checked it)
  c.tf32 = gpurt::Tf32Allowed(gpurt::MathOp::kConv);  // float32 only reaches here (RequireFloat32)
  return c;
}

gpurt::DnnPoolingDesc PoolDesc(const KernelArgs& k, bool avg) {
  gpurt::DnnPoolingDesc d;
  const auto w = Pair(k, "kernel"), p = Pair(k, "padding");
  const auto s = k.attrs.Ints("stride").empty() ? w : Pair(k, "stride"); // empty stride: the window
  d.window_h = w[0], d.window_w = w[1];
  d.pad_h = p[0], d.pad_w = p[1];
  d.stride_h = s[0], d.stride_w = s[1];
  d.mode = !avg                                ? DnnPoolingMode::kMaxDeterministic
           : k.attrs.Bool("count_include_pad") ? DnnPoolingMode::kAverageCountIncludePadding
                                               : DnnPoolingMode::kAverageCountExcludePadding;
  return d;
}

gpurt::DnnFilterDesc FilterDesc(const KernelArgs& k, const Shape& w) {
  if (w.numel() > kMaxElements)
    KILN_THROW(ShapeError) << k.op.name << " on " << k.device.str() << ": the filter " << w.str() << " has "
                           << w.numel() << " elements, more than cuDNN's int sizes address (" << kMaxElements
                           << "); use a smaller filter or run it on kiln.cpu()";
  gpurt::DnnFilterDesc f;
  f.format = DnnFormat::kNCHW; // KCRS: kiln's OIHW
  f.k = static_cast<int>(w[0]), f.c = static_cast<int>(w[1]), f.h = static_cast<int>(w[2]),
  f.w = static_cast<int>(w[3]);
  return f;
}

// `n` samples of the contiguous NCHW tensor of shape `s`.
DnnTensorDesc Desc(const Shape& s, int64_t n) {
  return DnnTensorDesc::Packed(DnnFormat::kNCHW, static_cast<int>(n), static_cast<int>(s[1]),
                               static_cast<int>(s[2]), static_cast<int>(s[3]));
}

// The address of sample `n0` of the contiguous NCHW tensor `t`.
float* At(const TensorView& t, int64_t n0) {
  return t.ptr<float>() + n0 * (t.shape[1] * t.shape[2] * t.shape[3]);
}

// Calls run(n0, n) over the batch of N samples in chunks that keep every tensor of `shapes`
// (NCHW, batch N) under cuDNN's 2^31 - 1 elements.
template <class F> void ForChunks(const KernelArgs& k, std::initializer_list<Shape> shapes, F&& run) {
  int64_t per_sample = 1;
  const Shape& first = *shapes.begin();
  for (const Shape& s : shapes) per_sample = std::max(per_sample, s[1] * s[2] * s[3]);
  const int64_t limit = g_chunk_elements.load(std::memory_order_relaxed);
  if (per_sample > limit)
    KILN_THROW(ShapeError) << k.op.name << " on " << k.device.str() << ": a sample of the tensor "
                           << first.str() << " has " << per_sample
                           << " elements, more than cuDNN's int strides address (" << limit
                           << "); use fewer channels or a smaller image, or run it on kiln.cpu()";
  const int64_t chunk = limit / per_sample, n = first[0];
  for (int64_t n0 = 0; n0 < n; n0 += chunk) run(n0, std::min(chunk, n - n0));
}

// Zeros `t` on the stream: what the CPU kernels write when an input is empty (a sum over nothing;
// for pooling too, where every window is padding only).
void Zero(Dnn& d, const TensorView& t) {
  d.p.MemsetAsync(t.data, 0, static_cast<size_t>(t.numel()) * sizeof(float), d.s);
}

// ---- convolution ----

// cuDNN's workspace for the convolution call of `a` (Conv*Args): scratch memory (the running plan's
// region, else the device's cache) of the bytes the platform's chosen algorithm needs, set in `a`.
template <class Args> std::unique_ptr<KernelScratch> Workspace(Dnn& d, const KernelArgs& k, Args& a) {
  gpurt::ChooseAlgorithm(d.p, d.h, d.s, k.device.index, a);  // measured once per problem
  a.workspace = nullptr, a.workspace_bytes = 0;
  const size_t bytes = d.p.DnnConvolutionWorkspaceSize(d.h, d.s, a);
  if (bytes == 0) return nullptr;
  auto ws = std::make_unique<KernelScratch>(k.device, bytes);
  a.workspace = ws->data(), a.workspace_bytes = bytes;
  return ws;
}

void GpuConv2d(const KernelArgs& k) {
  RequireFloat32(k);
  const TensorView &x = k.in[0], &w = k.in[1], &y = k.out[0];
  if (y.numel() == 0) return;
  Dnn d(k);
  if (x.numel() == 0 || w.numel() == 0) return Zero(d, y); // sums over no channels or only padding
  gpurt::ConvForwardArgs a;
  a.w = FilterDesc(k, w.shape), a.w_data = w.data;
  a.conv = ConvDesc(k);
  ForChunks(k, {x.shape, y.shape}, [&](int64_t n0, int64_t n) {
    a.x = Desc(x.shape, n), a.x_data = At(x, n0);
    a.y = Desc(y.shape, n), a.y_data = At(y, n0);
    const auto ws = Workspace(d, k, a);
    d.p.DnnConvolutionForward(d.h, d.s, a);
  });
}

void GpuConv2dGradData(const KernelArgs& k) {
  RequireFloat32(k);
  const TensorView &dy = k.in[0], &w = k.in[1], &dx = k.out[0];
  if (dx.numel() == 0) return;
  Dnn d(k);
  if (dy.numel() == 0 || w.numel() == 0) return Zero(d, dx);
  gpurt::ConvBackwardDataArgs a;
  a.w = FilterDesc(k, w.shape), a.w_data = w.data;
  a.conv = ConvDesc(k);
  ForChunks(k, {dx.shape, dy.shape}, [&](int64_t n0, int64_t n) {
    a.dy = Desc(dy.shape, n), a.dy_data = At(dy, n0);
    a.dx = Desc(dx.shape, n), a.dx_data = At(dx, n0);
    const auto ws = Workspace(d, k, a);
    d.p.DnnConvolutionBackwardData(d.h, d.s, a);
  });
}

void GpuConv2dGradWeight(const KernelArgs& k) {
  RequireFloat32(k);
  const TensorView &dy = k.in[0], &x = k.in[1], &dw = k.out[0];
  if (dw.numel() == 0) return;
  Dnn d(k);
  if (dy.numel() == 0 || x.numel() == 0) return Zero(d, dw); // no samples, or only padding
  gpurt::ConvBackwardFilterArgs a;
  a.dw = FilterDesc(k, dw.shape), a.dw_data = dw.data;
  a.conv = ConvDesc(k);
  ForChunks(k, {x.shape, dy.shape}, [&](int64_t n0, int64_t n) {
    a.x = Desc(x.shape, n), a.x_data = At(x, n0);
    a.dy = Desc(dy.shape, n), a.dy_data = At(dy, n0);
    a.beta = n0 == 0 ? 0.0f : 1.0f; // later chunks add their samples' share
    const auto ws = Workspace(d, k, a);
    d.p.DnnConvolutionBackwardFilter(d.h, d.s, a);
  });
}

// ---- pooling ----

void Pool(const KernelArgs& k, bool avg) {
  RequireFloat32(k);
  const TensorView &x = k.in[0], &y = k.out[0];
  if (y.numel() == 0) return;
  Dnn d(k);
  if (x.numel() == 0) return Zero(d, y); // an empty plane under padding: windows of padding only
  gpurt::PoolingForwardArgs a;
  a.pool = PoolDesc(k, avg);
  ForChunks(k, {x.shape, y.shape}, [&](int64_t n0, int64_t n) {
    a.x = Desc(x.shape, n), a.x_data = At(x, n0);
    a.y = Desc(y.shape, n), a.y_data = At(y, n0);
    d.p.DnnPoolingForward(d.h, d.s, a);
  });
}

void GpuMaxPool2d(const KernelArgs& k) { Pool(k, /*avg=*/false); }
void GpuAvgPool2d(const KernelArgs& k) { Pool(k, /*avg=*/true); }

void GpuMaxPool2dGrad(const KernelArgs& k) {
  RequireFloat32(k);
  const TensorView &dy = k.in[0], &x = k.in[1], &dx = k.out[0];
  if (dx.numel() == 0) return; // else x and dy are not empty either
  Dnn d(k);
  gpurt::PoolingForwardArgs f;
  f.pool = PoolDesc(k, /*avg=*/false);
  gpurt::PoolingBackwardArgs b;
  b.pool = f.pool;
  const int64_t per_sample = dy.shape[1] * dy.shape[2] * dy.shape[3];
  std::unique_ptr<KernelScratch> y; // the forward output of one chunk, which cuDNN's backward reads
  ForChunks(k, {x.shape, dy.shape}, [&](int64_t n0, int64_t n) {
    if (!y) y = std::make_unique<KernelScratch>(k.device, static_cast<size_t>(n * per_sample) * sizeof(float));
    f.x = b.x = b.dx = Desc(x.shape, n);
    f.y = b.y = b.dy = Desc(dy.shape, n);
    f.x_data = b.x_data = At(x, n0);
    f.y_data = y->data(), b.y_data = y->data();
    b.dy_data = At(dy, n0), b.dx_data = At(dx, n0);
    d.p.DnnPoolingForward(d.h, d.s, f);
    d.p.DnnPoolingBackward(d.h, d.s, b);
  });
}

void GpuAvgPool2dGrad(const KernelArgs& k) {
  RequireFloat32(k);
  const TensorView &dy = k.in[0], &dx = k.out[0];
  if (dx.numel() == 0) return; // else dy is not empty either
  Dnn d(k);
  gpurt::PoolingBackwardArgs b;
  b.pool = PoolDesc(k, /*avg=*/true);
  ForChunks(k, {dx.shape, dy.shape}, [&](int64_t n0, int64_t n) {
    b.x = b.dx = Desc(dx.shape, n);
    b.y = b.dy = Desc(dy.shape, n);
    b.dy_data = b.y_data = At(dy, n0); // y, x: any tensors of their layouts (an average ignores them)
    b.x_data = b.dx_data = At(dx, n0);
    d.p.DnnPoolingBackward(d.h, d.s, b);
  });
}

// ---- batch norm (training mode) ----

// (N, C) or (N, C, H, W) as cuDNN's packed NCHW descriptor; ShapeError past its int sizes.
DnnTensorDesc BnDesc(const KernelArgs& k, const Shape& s) {
  if (s.numel() > kMaxElements)
    KILN_THROW(ShapeError) << k.op.name << " on " << k.device.str() << ": x " << s.str() << " has " << s.numel()
                           << " elements, more than one cuDNN call addresses (" << kMaxElements
                           << "); use a smaller batch or run it on kiln.cpu()";
  const int h = s.rank() == 4 ? static_cast<int>(s[2]) : 1, w = s.rank() == 4 ? static_cast<int>(s[3]) : 1;
  return DnnTensorDesc::Packed(DnnFormat::kNCHW, static_cast<int>(s[0]), static_cast<int>(s[1]), h, w);
}

// The parameter descriptor of spatial batch norm over `x`: 1 x C x 1 x 1.
DnnTensorDesc BnParamDesc(const DnnTensorDesc& x) { return DnnTensorDesc::Packed(DnnFormat::kNCHW, 1, x.c, 1, 1); }

void GpuBatchNormTrain(const KernelArgs& k) {
  RequireFloat32(k);
  const TensorView &x = k.in[0], &gamma = k.in[1], &beta = k.in[2];
  const TensorView &y = k.out[0], &mean = k.out[1], &inv_std = k.out[2];
  if (x.numel() == 0) return; // no channels (inference refuses channels without values)
  Dnn d(k);
  gpurt::BatchNormArgs a;
  a.mode = gpurt::DnnBatchNormMode::kSpatial;
  a.x = a.y = BnDesc(k, x.shape);
  a.param = BnParamDesc(a.x);
  a.x_data = x.data, a.y_data = y.data;
  a.scale = gamma.data, a.bias = beta.data;
  a.exponential_average_factor = 0.0; // no running statistics: nd::batch_norm keeps them
  a.running_mean = a.running_var = nullptr;
  a.epsilon = k.attrs.Float("eps");
  a.save_mean = mean.data, a.save_inv_variance = inv_std.data;
  d.p.DnnBatchNormForwardTraining(d.h, d.s, a);
}

void GpuBatchNormTrainGrad(const KernelArgs& k) {
  RequireFloat32(k);
  const TensorView &x = k.in[0], &gamma = k.in[1], &dy = k.in[2], &mean = k.in[3], &inv_std = k.in[4];
  const TensorView &dx = k.out[0], &dgamma = k.out[1], &dbeta = k.out[2];
  if (x.numel() == 0) return;
  Dnn d(k);
  gpurt::BatchNormBackwardArgs a;
  a.mode = gpurt::DnnBatchNormMode::kSpatial;
  a.x = a.dy = a.dx = BnDesc(k, x.shape);
  a.param = BnParamDesc(a.x);
  a.x_data = x.data, a.dy_data = dy.data, a.dx_data = dx.data;
  a.scale = gamma.data, a.dscale = dgamma.data, a.dbias = dbeta.data;
  a.epsilon = k.attrs.Float("eps");
  a.saved_mean = mean.data, a.saved_inv_variance = inv_std.data;
  d.p.DnnBatchNormBackward(d.h, d.s, a);
}

} // namespace

/// For tests (declared there): the elements one cuDNN call's batched tensors may hold, at most
/// 2^31 - 1 (cuDNN's); returns the previous limit.
int64_t SetGpuDnnChunkElementsForTesting(int64_t elements) {
  KILN_CHECK(elements >= 1 && elements <= kMaxElements) << "chunk limit " << elements << " out of range";
  return g_chunk_elements.exchange(elements);
}

void BindGpuDnnKernels(KernelTable& t) {
  const auto bind = [&t](OpId op, KernelFn fn) {
    t.Bind(op, DeviceType::kGPU, {fn, /*contiguous_inputs=*/true, nullptr, DTypeBit(DType::kFloat32)});
  };
  bind(op::kConv2d, GpuConv2d);
  bind(op::kConv2dGradData, GpuConv2dGradData);
  bind(op::kConv2dGradWeight, GpuConv2dGradWeight);
  bind(op::kMaxPool2d, GpuMaxPool2d);
  bind(op::kMaxPool2dGrad, GpuMaxPool2dGrad);
  bind(op::kAvgPool2d, GpuAvgPool2d);
  bind(op::kAvgPool2dGrad, GpuAvgPool2dGrad);
  bind(op::kBatchNormTrain, GpuBatchNormTrain);
  bind(op::kBatchNormTrainGrad, GpuBatchNormTrainGrad);
}

} // namespace kiln

// bench_gpu's gpu_conv (a source of bench_gpu, see bench/CMakeLists.txt): float32 conv2d through
// kiln (nd::conv2d on gpu(0) tensors: cuDNN through kiln's GPU platform, the algorithm kiln's
// autotune measured on the first call, or cuDNN's v7 heuristic with KILN_CUDNN_AUTOTUNE=0, one
// engine task per call, timed by the host over back-to-back calls) against cudnnConvolutionForward
// called directly on a stream, with the fastest algorithm cudnnFindConvolutionForwardAlgorithm
// measured and a cudaMalloc'd workspace, timed with CUDA events. ResNet-18's 3x3 stride-1 shapes at
// batch 256: 64->64 at 28x28, 128->128 at 14x14, 256->256 at 7x7 (and 512->512 at 4x4 outside
// --quick). Both sides use the same math: cuDNN's default (TF32 tensor cores allowed on Ampere
// and later, as PyTorch's convolutions), kiln's default, or FMA (strict float32) with
// KILN_CONV_TF32=0 (kiln/runtime/math_mode.h).
// Kiln's output is checked against cuDNN's. Lines: TFLOP/s of each and the ratio cuDNN time / kiln time.
// On simulated GPUs only the check against the CPU runs, at batch 2 and 1/8 of the channels.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gpu_models.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/tensor.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/math_mode.h"

#if defined(KILN_WITH_CUDA) && KILN_WITH_CUDNN
#include <cuda_runtime.h>
#include <cudnn.h>
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // cuDNN 9's legacy convolution API
#endif

namespace kiln::gpubench {
namespace {

using kiln::bench::Emit;
using kiln::bench::Median;

struct ConvShape {
  int64_t channels, hw;
};

nd::Conv2dOptions Same3x3() {
  nd::Conv2dOptions o;
  o.padding = {1, 1};
  return o;
}

// kiln's convolution on gpu(0) against the CPU's, at batch 2 and channels / 8, within relative
// `tol`: tight on simulated GPUs; on a real one cuDNN's default math may take TF32 tensor cores
// (10-bit mantissas), which a layout or indexing mistake still exceeds by far.
void CheckAgainstCpu(const std::vector<ConvShape>& shapes, float tol) {
  for (const ConvShape& s : shapes) {
    const int64_t c = s.channels / 8;
    nd::random::seed(11);
    Tensor x = nd::random::normal(0, 1, {2, c, s.hw, s.hw});
    Tensor w = nd::random::normal(0, 1.0 / std::sqrt(9.0 * static_cast<double>(c)), {c, c, 3, 3});
    Tensor b = nd::random::normal(0, 0.1, {c});
    const std::vector<float> want = nd::conv2d(x, w, b, Same3x3()).ToVector<float>();
    const std::vector<float> got =
        nd::conv2d(x.To(gpu(0)), w.To(gpu(0)), b.To(gpu(0)), Same3x3()).ToVector<float>();
    for (size_t i = 0; i < want.size(); ++i)
      if (std::fabs(got[i] - want[i]) > tol * (1 + std::fabs(want[i]))) {
        std::fprintf(stderr, "gpu_conv: %lld->%lld 3x3 at %lldx%lld: gpu(0) gives %g, the CPU %g at %zu\n",
                     static_cast<long long>(c), static_cast<long long>(c), static_cast<long long>(s.hw),
                     static_cast<long long>(s.hw), got[i], want[i], i);
        std::exit(1);
      }
  }
  Emit("gpu_conv", "kiln_vs_cpu", "correct", 1, "bool");
}

#if defined(KILN_WITH_CUDA) && KILN_WITH_CUDNN
void CudnnCheck(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "gpu_conv: %s failed: %s\n", what, cudnnGetErrorString(st));
    std::exit(1);
  }
}
void CudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gpu_conv: %s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// One shape: kiln's median ms per call, cuDNN's, kiln's output against cuDNN's.
void TimeShape(cudnnHandle_t h, cudaStream_t stream, int64_t n, const ConvShape& s, bool quick) {
  const char* kBench = "gpu_conv";
  const Device dev = gpu(0);
  const int64_t c = s.channels, hw = s.hw;
  nd::random::seed(5);
  Tensor x = nd::random::normal(0, 1, {n, c, hw, hw}, DType::kFloat32, dev);
  Tensor w = nd::random::normal(0, std::sqrt(2.0 / (9.0 * static_cast<double>(c))), {c, c, 3, 3}, DType::kFloat32, dev);
  Tensor y = nd::conv2d(x, w, Tensor(), Same3x3());
  y.ToVector<float>();  // warm: handle, algorithm, workspace
  const int calls = quick ? 5 : 20;
  std::vector<double> kiln_ms;
  for (int r = 0; r < 4; ++r) {
    kiln::bench::Timer t;
    for (int i = 0; i < calls; ++i) y = nd::conv2d(x, w, Tensor(), Same3x3());
    engine::Engine::Get().WaitForAll();
    kiln_ms.push_back(t.Ms() / calls);
  }

  // cuDNN directly on kiln's input buffers.
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cd;
  CudnnCheck(cudnnCreateTensorDescriptor(&xd), "cudnnCreateTensorDescriptor");
  CudnnCheck(cudnnCreateTensorDescriptor(&yd), "cudnnCreateTensorDescriptor");
  CudnnCheck(cudnnCreateFilterDescriptor(&wd), "cudnnCreateFilterDescriptor");
  CudnnCheck(cudnnCreateConvolutionDescriptor(&cd), "cudnnCreateConvolutionDescriptor");
  const int ni = static_cast<int>(n), ci = static_cast<int>(c), hwi = static_cast<int>(hw);
  CudnnCheck(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, ni, ci, hwi, hwi), "x descriptor");
  CudnnCheck(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, ci, ci, 3, 3), "w descriptor");
  CudnnCheck(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
             "convolution descriptor");
  const bool tf32 = gpurt::Tf32Allowed(gpurt::MathOp::kConv);  // kiln's math (kiln/runtime/math_mode.h)
  CudnnCheck(cudnnSetConvolutionMathType(cd, tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH), "math type");
  int on, oc, oh, ow;
  CudnnCheck(cudnnGetConvolution2dForwardOutputDim(cd, xd, wd, &on, &oc, &oh, &ow), "output dims");
  if (on != ni || oc != ci || oh != hwi || ow != hwi) {
    std::fprintf(stderr, "gpu_conv: cuDNN's output is %dx%dx%dx%d, kiln's %s\n", on, oc, oh, ow, y.shape().str().c_str());
    std::exit(1);
  }
  CudnnCheck(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, on, oc, oh, ow), "y descriptor");
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int returned = 0;
  CudnnCheck(cudnnFindConvolutionForwardAlgorithm(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf),
             "cudnnFindConvolutionForwardAlgorithm");
  int best = -1;
  for (int i = 0; i < returned && best < 0; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS) best = i;  // sorted fastest first
  if (best < 0) {
    std::fprintf(stderr, "gpu_conv: cudnnFindConvolutionForwardAlgorithm found no algorithm that runs\n");
    std::exit(1);
  }
  const cudnnConvolutionFwdAlgo_t algo = perf[best].algo;
  const size_t ws_bytes = perf[best].memory;
  void* ws = nullptr;
  if (ws_bytes) CudaCheck(cudaMalloc(&ws, ws_bytes), "cudaMalloc (workspace)");
  float* py = nullptr;
  CudaCheck(cudaMalloc(&py, static_cast<size_t>(y.numel()) * 4), "cudaMalloc (output)");
  const void* px = x.View().data;
  const void* pw = w.View().data;
  const float one = 1, zero = 0;
  cudaEvent_t t0, t1;
  CudaCheck(cudaEventCreate(&t0), "cudaEventCreate");
  CudaCheck(cudaEventCreate(&t1), "cudaEventCreate");
  std::vector<double> ref_ms;
  for (int r = 0; r < 5; ++r) {
    CudaCheck(cudaEventRecord(t0, stream), "cudaEventRecord");
    for (int i = 0; i < calls; ++i)
      CudnnCheck(cudnnConvolutionForward(h, &one, xd, px, wd, pw, cd, algo, ws, ws_bytes, &zero, yd, py),
                 "cudnnConvolutionForward");
    CudaCheck(cudaEventRecord(t1, stream), "cudaEventRecord");
    CudaCheck(cudaEventSynchronize(t1), "cudaEventSynchronize");
    float m = 0;
    cudaEventElapsedTime(&m, t0, t1);
    if (r > 0) ref_ms.push_back(m / calls);
  }
  // Same numbers. Either side may use TF32 tensor cores: tolerance for 10-bit mantissas.
  std::vector<float> mine = y.ToVector<float>(), ref(mine.size());
  CudaCheck(cudaMemcpy(ref.data(), py, ref.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (size_t i = 0; i < ref.size(); i += ref.size() / 1009 + 1)
    if (std::fabs(mine[i] - ref[i]) > 2e-2f * (1 + std::fabs(ref[i]))) {
      std::fprintf(stderr, "gpu_conv: kiln %g vs cuDNN %g at %zu (%lld channels, %lldx%lld)\n", mine[i], ref[i], i,
                   static_cast<long long>(c), static_cast<long long>(hw), static_cast<long long>(hw));
      std::exit(1);
    }
  const double flop = 2.0 * static_cast<double>(n * c * hw * hw) * static_cast<double>(c * 9);
  const std::string name = std::to_string(c) + "to" + std::to_string(c) + "_3x3_" + std::to_string(hw) + "x" +
                           std::to_string(hw) + "_b" + std::to_string(n);
  const double k = Median(kiln_ms), rf = Median(ref_ms);
  Emit(kBench, "kiln_" + name, "TFLOPs", flop / (k * 1e-3) / 1e12, "TFLOP/s");
  Emit(kBench, "cudnn_find_" + name, "TFLOPs", flop / (rf * 1e-3) / 1e12, "TFLOP/s");
  Emit(kBench, "cudnn_find_" + name, "algo", static_cast<double>(algo), "cudnnConvolutionFwdAlgo_t");
  Emit(kBench, "cudnn_find/kiln_" + name, "speedup", rf / k, "x");
  Emit(kBench, "math_" + name, "tf32", tf32 ? 1 : 0, "bool");
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaFree(py);
  if (ws) cudaFree(ws);
  cudnnDestroyTensorDescriptor(xd);
  cudnnDestroyTensorDescriptor(yd);
  cudnnDestroyFilterDescriptor(wd);
  cudnnDestroyConvolutionDescriptor(cd);
}
#endif

}  // namespace

void ConvBench(bool quick, bool timed) {
  std::vector<ConvShape> shapes = {{64, 28}, {128, 14}, {256, 7}};
  if (!quick) shapes.push_back({512, 4});
  // TF32 (a real GPU's, or the simulator's rounding when the math mode allows it) reads 10-bit mantissas.
  CheckAgainstCpu(shapes, timed || gpurt::Tf32Allowed(gpurt::MathOp::kConv) ? 1e-2f : 1e-4f);
  if (!timed) return Skipped("gpu_conv", kSimulatedOnly);
#if defined(KILN_WITH_CUDA) && KILN_WITH_CUDNN
  CudaCheck(cudaSetDevice(0), "cudaSetDevice");
  cudnnHandle_t h;
  if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) return Skipped("gpu_conv", "cudnnCreate failed");
  cudaStream_t stream;
  CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  CudnnCheck(cudnnSetStream(h, stream), "cudnnSetStream");
  engine::Engine::Get().WaitForAll();
  for (const ConvShape& s : shapes) TimeShape(h, stream, 256, s, quick);
  cudnnDestroy(h);
  cudaStreamDestroy(stream);
#else
  Skipped("gpu_conv", "kiln built without cuDNN: no reference to time against");
#endif
}

}  // namespace kiln::gpubench

// cuDNN on real GPUs (dnn_cuda.h): one cudnnHandle_t per device bound to the caller's stream;
// convolution forward with the algorithm cudnnGetConvolutionForwardAlgorithm_v7 ranks first among
// those that run, cached per shape, and a per-device workspace from the platform's allocation;
// pooling and batch norm through their cuDNN functions. Every call first makes the checks of
// gpu_dnn.h (the simulator makes the same ones), so a mistake fails identically on both; cuDNN's
// own status is reported as it is where it rejects something more.
// Also the descriptor probes gpu_dnn.h declares (CudnnConvForwardOutputDim...), which work
// without a driver, so CI compares kiln's checks with cuDNN's own answers.
// cuDNN 9 marks its legacy (non-graph) API deprecated; it is the API these calls use.
#include "dnn_cuda.h"

#if KILN_WITH_CUDNN
#include <cudnn.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace kiln {
namespace {

void Check(cudnnStatus_t st, const char* call) {
  if (st != CUDNN_STATUS_SUCCESS) gpurt::FailDnn(static_cast<int>(st), call, cudnnGetErrorString(st));
}

// RAII descriptors, filled from kiln's plain descriptors.
struct Tensor {
  cudnnTensorDescriptor_t d = nullptr;
  Tensor() { Check(cudnnCreateTensorDescriptor(&d), "cudnnCreateTensorDescriptor"); }
  ~Tensor() { cudnnDestroyTensorDescriptor(d); }
  cudnnStatus_t Set(const gpurt::DnnTensorDesc& t) {
    return cudnnSetTensor4dDescriptorEx(d, static_cast<cudnnDataType_t>(t.dtype), t.n, t.c, t.h, t.w,
                                        static_cast<int>(t.n_stride), static_cast<int>(t.c_stride),
                                        static_cast<int>(t.h_stride), static_cast<int>(t.w_stride));
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
};
struct Filter {
  cudnnFilterDescriptor_t d = nullptr;
  Filter() { Check(cudnnCreateFilterDescriptor(&d), "cudnnCreateFilterDescriptor"); }
  ~Filter() { cudnnDestroyFilterDescriptor(d); }
  cudnnStatus_t Set(const gpurt::DnnFilterDesc& f) {
    return cudnnSetFilter4dDescriptor(d, static_cast<cudnnDataType_t>(f.dtype), static_cast<cudnnTensorFormat_t>(f.format),
                                      f.k, f.c, f.h, f.w);
  }
  Filter(const Filter&) = delete;
  Filter& operator=(const Filter&) = delete;
};
struct Conv {
  cudnnConvolutionDescriptor_t d = nullptr;
  Conv() { Check(cudnnCreateConvolutionDescriptor(&d), "cudnnCreateConvolutionDescriptor"); }
  ~Conv() { cudnnDestroyConvolutionDescriptor(d); }
  cudnnStatus_t Set(const gpurt::DnnConvDesc& c) {
    cudnnStatus_t st = cudnnSetConvolution2dDescriptor(d, c.pad_h, c.pad_w, c.stride_h, c.stride_w, c.dilation_h,
                                                       c.dilation_w, static_cast<cudnnConvolutionMode_t>(c.mode),
                                                       static_cast<cudnnDataType_t>(c.compute));
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetConvolutionGroupCount(d, c.groups);
    return st;
  }
  Conv(const Conv&) = delete;
  Conv& operator=(const Conv&) = delete;
};
struct Pool {
  cudnnPoolingDescriptor_t d = nullptr;
  Pool() { Check(cudnnCreatePoolingDescriptor(&d), "cudnnCreatePoolingDescriptor"); }
  ~Pool() { cudnnDestroyPoolingDescriptor(d); }
  cudnnStatus_t Set(const gpurt::DnnPoolingDesc& p) {
    return cudnnSetPooling2dDescriptor(d, static_cast<cudnnPoolingMode_t>(p.mode), CUDNN_NOT_PROPAGATE_NAN, p.window_h,
                                       p.window_w, p.pad_h, p.pad_w, p.stride_h, p.stride_w);
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
};

cudaStream_t S(gpurt::Stream s) { return reinterpret_cast<cudaStream_t>(s); }

cudnnHandle_t BoundTo(void* handle, gpurt::Stream s, const char* call) {
  if (!handle) gpurt::FailDnn(gpurt::kDnnBadParam, call, "the handle is null; use LibraryHandle(Library::kDnn, stream)");
  auto h = static_cast<cudnnHandle_t>(handle);
  cudaStream_t bound = nullptr;
  Check(cudnnGetStream(h, &bound), "cudnnGetStream");
  if (bound != S(s))
    gpurt::FailDnn(gpurt::kDnnBadParamStreamMismatch, call,
                   "the cuDNN handle is bound to another stream than the one the call is issued to: cuDNN would run "
                   "it there, unordered with the work around it. Call LibraryHandle(Library::kDnn, stream) "
                   "(cudnnSetStream) for this stream right before the call");
  return h;
}

struct Algo {
  cudnnConvolutionFwdAlgo_t algo;
  size_t workspace;
};

// Handles, chosen algorithms and workspaces, per device.
struct State {
  std::mutex mu;
  std::map<int, cudnnHandle_t> handles;
  std::map<std::string, Algo> algos;
  std::map<int, std::pair<void*, size_t>> workspaces;
};
State& St() {
  static State* s = new State;  // outlives every caller (handles die with the process)
  return *s;
}

std::string Key(int device, const gpurt::ConvForwardArgs& a) {
  std::string k = std::to_string(device) + "|" + a.x.ToString() + "|" + a.y.ToString();
  for (int v : {a.w.k, a.w.c, a.w.h, a.w.w, static_cast<int>(a.w.format), a.conv.pad_h, a.conv.pad_w,
                a.conv.stride_h, a.conv.stride_w, a.conv.dilation_h, a.conv.dilation_w,
                static_cast<int>(a.conv.mode), a.conv.groups})
    k += "," + std::to_string(v);
  return k;
}

}  // namespace

namespace cuda {

void* DnnHandle(gpurt::Stream s) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) (void)cudaGetLastError();
  State& st = St();
  std::lock_guard<std::mutex> g(st.mu);
  cudnnHandle_t& h = st.handles[device];
  if (!h) Check(cudnnCreate(&h), "cudnnCreate");
  Check(cudnnSetStream(h, S(s)), "cudnnSetStream");
  return h;
}

void DnnConvolutionForward(gpurt::Platform& p, void* handle, gpurt::Stream s, const gpurt::ConvForwardArgs& a) {
  const char* call = "cudnnConvolutionForward";
  cudnnHandle_t h = BoundTo(handle, s, call);
  gpurt::CheckConvForward(a, call);
  Tensor x, y;
  Filter w;
  Conv c;
  Check(x.Set(a.x), "cudnnSetTensor4dDescriptorEx");
  Check(y.Set(a.y), "cudnnSetTensor4dDescriptorEx");
  Check(w.Set(a.w), "cudnnSetFilter4dDescriptor");
  Check(c.Set(a.conv), "cudnnSetConvolution2dDescriptor");
  const int device = p.GetDevice();
  State& st = St();
  std::lock_guard<std::mutex> g(st.mu);
  const std::string key = Key(device, a);
  auto it = st.algos.find(key);
  if (it == st.algos.end()) {
    int count = 0;
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
    Check(cudnnGetConvolutionForwardAlgorithm_v7(h, x.d, w.d, c.d, y.d, static_cast<int>(perf.size()), &count,
                                                 perf.data()),
          "cudnnGetConvolutionForwardAlgorithm_v7");
    const cudnnConvolutionFwdAlgoPerf_t* best = nullptr;
    for (int i = 0; i < count && !best; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS) best = &perf[i];
    if (!best)
      gpurt::FailDnn(gpurt::kDnnNotSupported, call,
                     "cuDNN has no forward algorithm for input " + a.x.ToString() + " and output " + a.y.ToString());
    size_t bytes = 0;
    Check(cudnnGetConvolutionForwardWorkspaceSize(h, x.d, w.d, c.d, y.d, best->algo, &bytes),
          "cudnnGetConvolutionForwardWorkspaceSize");
    it = st.algos.emplace(key, Algo{best->algo, bytes}).first;
  }
  auto& [ws, ws_bytes] = st.workspaces[device];
  if (ws_bytes < it->second.workspace) {
    if (ws) p.Free(ws);  // cudaFree waits for the work that used it
    ws = nullptr, ws_bytes = 0;
    ws = p.Malloc(it->second.workspace);
    ws_bytes = it->second.workspace;
  }
  Check(cudnnConvolutionForward(h, &a.alpha, x.d, a.x_data, w.d, a.w_data, c.d, it->second.algo, ws, ws_bytes,
                                &a.beta, y.d, a.y_data),
        call);
}

void DnnPoolingForward(void* handle, gpurt::Stream s, const gpurt::PoolingForwardArgs& a) {
  const char* call = "cudnnPoolingForward";
  cudnnHandle_t h = BoundTo(handle, s, call);
  gpurt::CheckPoolingForward(a, call);
  Tensor x, y;
  Pool p;
  Check(x.Set(a.x), "cudnnSetTensor4dDescriptorEx");
  Check(y.Set(a.y), "cudnnSetTensor4dDescriptorEx");
  Check(p.Set(a.pool), "cudnnSetPooling2dDescriptor");
  Check(cudnnPoolingForward(h, p.d, &a.alpha, x.d, a.x_data, &a.beta, y.d, a.y_data), call);
}

void DnnBatchNormForward(void* handle, gpurt::Stream s, const gpurt::BatchNormArgs& a, bool training) {
  const char* call = training ? "cudnnBatchNormalizationForwardTraining" : "cudnnBatchNormalizationForwardInference";
  cudnnHandle_t h = BoundTo(handle, s, call);
  gpurt::CheckBatchNormForward(a, training, call);
  Tensor x, y, bn;
  Check(x.Set(a.x), "cudnnSetTensor4dDescriptorEx");
  Check(y.Set(a.y), "cudnnSetTensor4dDescriptorEx");
  Check(bn.Set(a.param), "cudnnSetTensor4dDescriptorEx");
  const auto mode = static_cast<cudnnBatchNormMode_t>(a.mode);
  if (training)
    Check(cudnnBatchNormalizationForwardTraining(h, mode, &a.alpha, &a.beta, x.d, a.x_data, y.d, a.y_data, bn.d,
                                                 a.scale, a.bias, a.exponential_average_factor, a.running_mean,
                                                 a.running_var, a.epsilon, a.save_mean, a.save_inv_variance),
          call);
  else
    Check(cudnnBatchNormalizationForwardInference(h, mode, &a.alpha, &a.beta, x.d, a.x_data, y.d, a.y_data, bn.d,
                                                  a.scale, a.bias, a.running_mean, a.running_var, a.epsilon),
          call);
}

}  // namespace cuda

namespace gpurt {

int CudnnConvForwardOutputDim(const DnnTensorDesc& xd, const DnnFilterDesc& wd, const DnnConvDesc& cd, int out[4]) {
  Tensor x;
  Filter w;
  Conv c;
  cudnnStatus_t st = x.Set(xd);
  if (st == CUDNN_STATUS_SUCCESS) st = w.Set(wd);
  if (st == CUDNN_STATUS_SUCCESS) st = c.Set(cd);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnGetConvolution2dForwardOutputDim(c.d, x.d, w.d, &out[0], &out[1], &out[2], &out[3]);
  return static_cast<int>(st);
}

int CudnnPoolingForwardOutputDim(const DnnPoolingDesc& pd, const DnnTensorDesc& xd, int out[4]) {
  Tensor x;
  Pool p;
  cudnnStatus_t st = x.Set(xd);
  if (st == CUDNN_STATUS_SUCCESS) st = p.Set(pd);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnGetPooling2dForwardOutputDim(p.d, x.d, &out[0], &out[1], &out[2], &out[3]);
  return static_cast<int>(st);
}

}  // namespace gpurt
}  // namespace kiln

#else  // a CUDA toolkit without cuDNN: the calls fail as an uninitialized cuDNN does

namespace kiln::cuda {
namespace {
[[noreturn]] void NoCudnn(const char* call) {
  gpurt::FailDnn(gpurt::kDnnNotInitialized, call, "this kiln was built without cuDNN (CMake did not find libcudnn)");
}
}  // namespace
void* DnnHandle(gpurt::Stream) { NoCudnn("cudnnCreate"); }
void DnnConvolutionForward(gpurt::Platform&, void*, gpurt::Stream, const gpurt::ConvForwardArgs&) {
  NoCudnn("cudnnConvolutionForward");
}
void DnnPoolingForward(void*, gpurt::Stream, const gpurt::PoolingForwardArgs&) { NoCudnn("cudnnPoolingForward"); }
void DnnBatchNormForward(void*, gpurt::Stream, const gpurt::BatchNormArgs&, bool) {
  NoCudnn("cudnnBatchNormalizationForward");
}
}  // namespace kiln::cuda

#endif

// cuDNN on real GPUs (dnn_cuda.h): one cudnnHandle_t per device bound to the caller's stream;
// convolution forward, backward data and backward filter with the algorithm cuDNN's heuristics
// (cudnnGet*Algorithm_v7) rank first among those that run, cached per shape, and the caller's
// workspace (DnnConvolutionWorkspaceSize says how much), else a per-device one of the platform's;
// pooling and batch norm (forward and backward) through their cuDNN functions. Every call first
// makes the checks of gpu_dnn.h (the simulator makes the same ones), so a mistake fails identically
// on both; cuDNN's own status is reported as it is where it rejects something more.
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
    return cudnnSetFilter4dDescriptor(d, static_cast<cudnnDataType_t>(f.dtype),
                                      static_cast<cudnnTensorFormat_t>(f.format), f.k, f.c, f.h, f.w);
  }
  Filter(const Filter&) = delete;
  Filter& operator=(const Filter&) = delete;
};
struct Conv {
  cudnnConvolutionDescriptor_t d = nullptr;
  Conv() { Check(cudnnCreateConvolutionDescriptor(&d), "cudnnCreateConvolutionDescriptor"); }
  ~Conv() { cudnnDestroyConvolutionDescriptor(d); }
  cudnnStatus_t Set(const gpurt::DnnConvDesc& c) {
    cudnnStatus_t st = cudnnSetConvolution2dDescriptor(
        d, c.pad_h, c.pad_w, c.stride_h, c.stride_w, c.dilation_h, c.dilation_w,
        static_cast<cudnnConvolutionMode_t>(c.mode), static_cast<cudnnDataType_t>(c.compute));
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetConvolutionGroupCount(d, c.groups);
    // c.tf32 (the math mode: kiln/runtime/math_mode.h): cuDNN's default math lets float32
    // convolutions use TF32 tensor cores on Ampere and later; FMA math keeps them in float32.
    // A measured choice runs with the math type it was measured with (c.math), within c.tf32.
    cudnnMathType_t math = c.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    // Never TENSOR_OP_MATH_ALLOW_CONVERSION (float32 computed in half precision).
    if (c.math == CUDNN_FMA_MATH || (c.tf32 && (c.math == CUDNN_DEFAULT_MATH || c.math == CUDNN_TENSOR_OP_MATH)))
      math = static_cast<cudnnMathType_t>(c.math);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetConvolutionMathType(d, math);
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
    return cudnnSetPooling2dDescriptor(d, static_cast<cudnnPoolingMode_t>(p.mode), CUDNN_NOT_PROPAGATE_NAN,
                                       p.window_h, p.window_w, p.pad_h, p.pad_w, p.stride_h, p.stride_w);
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
};

cudaStream_t S(gpurt::Stream s) { return reinterpret_cast<cudaStream_t>(s); }

cudnnHandle_t BoundTo(void* handle, gpurt::Stream s, const char* call) {
  if (!handle)
    gpurt::FailDnn(gpurt::kDnnBadParam, call, "the handle is null; use LibraryHandle(Library::kDnn, stream)");
  auto h = static_cast<cudnnHandle_t>(handle);
  cudaStream_t bound = nullptr;
  Check(cudnnGetStream(h, &bound), "cudnnGetStream");
  if (bound != S(s))
    gpurt::FailDnn(
        gpurt::kDnnBadParamStreamMismatch, call,
        "the cuDNN handle is bound to another stream than the one the call is issued to: cuDNN would run "
        "it there, unordered with the work around it. Call LibraryHandle(Library::kDnn, stream) "
        "(cudnnSetStream) for this stream right before the call");
  return h;
}

// A chosen algorithm (of any of the three convolution calls) and its workspace size.
struct Algo {
  int algo;
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
  static State* s = new State; // outlives every caller (handles die with the process)
  return *s;
}

// The algorithm cache's key: the call, the device, every descriptor field and the math mode.
std::string Key(const char* call, int device, const gpurt::DnnTensorDesc& x, const gpurt::DnnFilterDesc& w,
                const gpurt::DnnConvDesc& c, const gpurt::DnnTensorDesc& y) {
  std::string k = call; // appended piece by piece (GCC 12's -Wrestrict misfires on a + chain here)
  for (const std::string& part : {std::to_string(device), x.ToString(), y.ToString()})
    k.append("|").append(part);
  for (int v : {w.k, w.c, w.h, w.w, static_cast<int>(w.format), c.pad_h, c.pad_w, c.stride_h, c.stride_w,
                c.dilation_h, c.dilation_w, static_cast<int>(c.mode), c.groups, c.tf32 ? 1 : 0, c.math})
    k.append(",").append(std::to_string(v));
  return k;
}

// The first algorithm cuDNN's heuristics rank that runs for the problem (cached by `key`), with
// `st.mu` held; `rank(perf, n, &count)` and `bytes(algo, &size)` ask cuDNN.
// `given` >= 0: that algorithm (measured by the caller: gpu_dnn_autotune.cc), its workspace asked.
template <class Perf, class Rank, class Bytes>
const Algo& Choose(State& st, std::string key, int algo_count, Rank rank, Bytes bytes, const char* call,
                   const std::string& problem, int given) {
  if (given >= 0) key.append("|algo ").append(std::to_string(given));
  auto it = st.algos.find(key);
  if (it != st.algos.end()) return it->second;
  if (given >= 0) {
    if (given >= algo_count)
      gpurt::FailDnn(gpurt::kDnnBadParam, call,
                     "algorithm " + std::to_string(given) + " is not one of cuDNN's " + std::to_string(algo_count));
    size_t size = 0;
    bytes(static_cast<decltype(Perf{}.algo)>(given), &size);
    return st.algos.emplace(key, Algo{given, size}).first->second;
  }
  int count = 0;
  std::vector<Perf> perf(static_cast<size_t>(algo_count));
  rank(perf.data(), algo_count, &count);
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    size_t size = 0;
    bytes(perf[i].algo, &size);
    return st.algos.emplace(key, Algo{static_cast<int>(perf[i].algo), size}).first->second;
  }
  gpurt::FailDnn(gpurt::kDnnNotSupported, call, "cuDNN has no algorithm for " + problem);
}

// The device's workspace, grown to `bytes` (with `st.mu` held).
std::pair<void*, size_t> Workspace(State& st, gpurt::Platform& p, int device, size_t bytes) {
  auto& [ws, size] = st.workspaces[device];
  if (size < bytes) {
    if (ws) p.Free(ws); // cudaFree waits for the work that used it
    ws = nullptr, size = 0;
    ws = p.Malloc(bytes);
    size = bytes;
  }
  return {ws, size};
}

// The workspace of a call whose algorithm is `algo`: the caller's (`given`, checked against the
// algorithm's need), else none when it needs none, else the device's own (with `st.mu` held).
std::pair<void*, size_t> WorkspaceFor(State& st, gpurt::Platform& p, const Algo& algo, void* given,
                                      size_t given_bytes, const char* call) {
  if (given) {
    if (given_bytes < algo.workspace)
      gpurt::FailDnn(gpurt::kDnnBadParam, call,
                     "the workspace is " + std::to_string(given_bytes) +
                         " bytes but the chosen algorithm needs " + std::to_string(algo.workspace) +
                         "; allocate what DnnConvolutionWorkspaceSize returns for these arguments");
    return {given, given_bytes};
  }
  if (algo.workspace == 0) return {nullptr, 0};
  return Workspace(st, p, p.GetDevice(), algo.workspace);
}

// Each convolution problem as cuDNN takes it: the descriptors and the algorithm its heuristics
// chose for them (cached per shape), built with `st.mu` held. `call` names the operation in errors;
// the cache key names the cuDNN call, so the workspace query and the call share the choice.
struct ForwardProblem {
  static constexpr const char* kCall = "cudnnConvolutionForward";
  Tensor x, y;
  Filter w;
  Conv c;
  Algo algo{};
  ForwardProblem(State& st, gpurt::Platform& p, cudnnHandle_t h, const gpurt::ConvForwardArgs& a,
                 const char* call) {
    gpurt::CheckConvForward(a, call);
    Check(x.Set(a.x), "cudnnSetTensor4dDescriptorEx");
    Check(y.Set(a.y), "cudnnSetTensor4dDescriptorEx");
    Check(w.Set(a.w), "cudnnSetFilter4dDescriptor");
    Check(c.Set(a.conv), "cudnnSetConvolution2dDescriptor");
    algo = Choose<cudnnConvolutionFwdAlgoPerf_t>(
        st, Key(kCall, p.GetDevice(), a.x, a.w, a.conv, a.y), CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
        [&](cudnnConvolutionFwdAlgoPerf_t* perf, int n, int* count) {
          Check(cudnnGetConvolutionForwardAlgorithm_v7(h, x.d, w.d, c.d, y.d, n, count, perf),
                "cudnnGetConvolutionForwardAlgorithm_v7");
        },
        [&](cudnnConvolutionFwdAlgo_t al, size_t* size) {
          Check(cudnnGetConvolutionForwardWorkspaceSize(h, x.d, w.d, c.d, y.d, al, size),
                "cudnnGetConvolutionForwardWorkspaceSize");
        },
        call, "input " + a.x.ToString() + " and output " + a.y.ToString(), a.algo);
  }
};

struct BackwardDataProblem {
  static constexpr const char* kCall = "cudnnConvolutionBackwardData";
  Tensor dx, dy;
  Filter w;
  Conv c;
  Algo algo{};
  BackwardDataProblem(State& st, gpurt::Platform& p, cudnnHandle_t h, const gpurt::ConvBackwardDataArgs& a,
                      const char* call) {
    gpurt::CheckConvBackwardData(a, call);
    Check(dx.Set(a.dx), "cudnnSetTensor4dDescriptorEx");
    Check(dy.Set(a.dy), "cudnnSetTensor4dDescriptorEx");
    Check(w.Set(a.w), "cudnnSetFilter4dDescriptor");
    Check(c.Set(a.conv), "cudnnSetConvolution2dDescriptor");
    algo = Choose<cudnnConvolutionBwdDataAlgoPerf_t>(
        st, Key(kCall, p.GetDevice(), a.dx, a.w, a.conv, a.dy), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
        [&](cudnnConvolutionBwdDataAlgoPerf_t* perf, int n, int* count) {
          Check(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w.d, dy.d, c.d, dx.d, n, count, perf),
                "cudnnGetConvolutionBackwardDataAlgorithm_v7");
        },
        [&](cudnnConvolutionBwdDataAlgo_t al, size_t* size) {
          Check(cudnnGetConvolutionBackwardDataWorkspaceSize(h, w.d, dy.d, c.d, dx.d, al, size),
                "cudnnGetConvolutionBackwardDataWorkspaceSize");
        },
        call, "dx " + a.dx.ToString() + " and dy " + a.dy.ToString(), a.algo);
  }
};

struct BackwardFilterProblem {
  static constexpr const char* kCall = "cudnnConvolutionBackwardFilter";
  Tensor x, dy;
  Filter dw;
  Conv c;
  Algo algo{};
  BackwardFilterProblem(State& st, gpurt::Platform& p, cudnnHandle_t h,
                        const gpurt::ConvBackwardFilterArgs& a, const char* call) {
    gpurt::CheckConvBackwardFilter(a, call);
    Check(x.Set(a.x), "cudnnSetTensor4dDescriptorEx");
    Check(dy.Set(a.dy), "cudnnSetTensor4dDescriptorEx");
    Check(dw.Set(a.dw), "cudnnSetFilter4dDescriptor");
    Check(c.Set(a.conv), "cudnnSetConvolution2dDescriptor");
    algo = Choose<cudnnConvolutionBwdFilterAlgoPerf_t>(
        st, Key(kCall, p.GetDevice(), a.x, a.dw, a.conv, a.dy), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
        [&](cudnnConvolutionBwdFilterAlgoPerf_t* perf, int n, int* count) {
          Check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x.d, dy.d, c.d, dw.d, n, count, perf),
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
        },
        [&](cudnnConvolutionBwdFilterAlgo_t al, size_t* size) {
          Check(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x.d, dy.d, c.d, dw.d, al, size),
                "cudnnGetConvolutionBackwardFilterWorkspaceSize");
        },
        call, "x " + a.x.ToString() + " and dy " + a.dy.ToString(), a.algo);
  }
};

// The workspace bytes of `Problem` for `a`, as the call would choose them.
template <class Problem, class Args>
size_t WorkspaceSize(gpurt::Platform& p, void* handle, gpurt::Stream s, const Args& a) {
  cudnnHandle_t h = BoundTo(handle, s, Problem::kCall);
  State& st = St();
  std::lock_guard<std::mutex> g(st.mu);
  return Problem(st, p, h, a, Problem::kCall).algo.workspace;
}

} // namespace

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

size_t DnnConvolutionWorkspaceSize(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                   const gpurt::ConvForwardArgs& a) {
  return WorkspaceSize<ForwardProblem>(p, handle, s, a);
}
size_t DnnConvolutionWorkspaceSize(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                   const gpurt::ConvBackwardDataArgs& a) {
  return WorkspaceSize<BackwardDataProblem>(p, handle, s, a);
}
size_t DnnConvolutionWorkspaceSize(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                   const gpurt::ConvBackwardFilterArgs& a) {
  return WorkspaceSize<BackwardFilterProblem>(p, handle, s, a);
}

void DnnConvolutionForward(gpurt::Platform& p, void* handle, gpurt::Stream s,
                           const gpurt::ConvForwardArgs& a) {
  const char* call = ForwardProblem::kCall;
  cudnnHandle_t h = BoundTo(handle, s, call);
  State& st = St();
  std::lock_guard<std::mutex> g(st.mu);
  ForwardProblem f(st, p, h, a, call);
  auto [ws, ws_bytes] = WorkspaceFor(st, p, f.algo, a.workspace, a.workspace_bytes, call);
  Check(cudnnConvolutionForward(h, &a.alpha, f.x.d, a.x_data, f.w.d, a.w_data, f.c.d,
                                static_cast<cudnnConvolutionFwdAlgo_t>(f.algo.algo), ws, ws_bytes, &a.beta,
                                f.y.d, a.y_data),
        call);
}

void DnnConvolutionBackwardData(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                const gpurt::ConvBackwardDataArgs& a) {
  const char* call = BackwardDataProblem::kCall;
  cudnnHandle_t h = BoundTo(handle, s, call);
  State& st = St();
  std::lock_guard<std::mutex> g(st.mu);
  BackwardDataProblem f(st, p, h, a, call);
  auto [ws, ws_bytes] = WorkspaceFor(st, p, f.algo, a.workspace, a.workspace_bytes, call);
  Check(cudnnConvolutionBackwardData(h, &a.alpha, f.w.d, a.w_data, f.dy.d, a.dy_data, f.c.d,
                                     static_cast<cudnnConvolutionBwdDataAlgo_t>(f.algo.algo), ws, ws_bytes,
                                     &a.beta, f.dx.d, a.dx_data),
        call);
}

void DnnConvolutionBackwardFilter(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                  const gpurt::ConvBackwardFilterArgs& a) {
  const char* call = BackwardFilterProblem::kCall;
  cudnnHandle_t h = BoundTo(handle, s, call);
  State& st = St();
  std::lock_guard<std::mutex> g(st.mu);
  BackwardFilterProblem f(st, p, h, a, call);
  auto [ws, ws_bytes] = WorkspaceFor(st, p, f.algo, a.workspace, a.workspace_bytes, call);
  Check(cudnnConvolutionBackwardFilter(h, &a.alpha, f.x.d, a.x_data, f.dy.d, a.dy_data, f.c.d,
                                       static_cast<cudnnConvolutionBwdFilterAlgo_t>(f.algo.algo), ws,
                                       ws_bytes, &a.beta, f.dw.d, a.dw_data),
        call);
}

// ---- measured algorithms (cudnnFind*AlgorithmEx) ----

template <class Perf> std::vector<gpurt::DnnAlgoPerf> Reported(const Perf* perf, int count) {
  std::vector<gpurt::DnnAlgoPerf> out;
  for (int i = 0; i < count; ++i) {
    gpurt::DnnAlgoPerf r;
    r.algo = static_cast<int>(perf[i].algo);
    r.status = perf[i].status == CUDNN_STATUS_SUCCESS ? 0 : static_cast<int>(perf[i].status);
    r.time_ms = perf[i].time;
    r.workspace = perf[i].memory;
    r.deterministic = perf[i].determinism == CUDNN_DETERMINISTIC;
    r.math = static_cast<int>(perf[i].mathType);
    out.push_back(r);
  }
  return out;
}

std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                                             const gpurt::ConvForwardArgs& a) {
  const char* call = "cudnnFindConvolutionForwardAlgorithmEx";
  cudnnHandle_t h = BoundTo(handle, s, call);
  State& st = St();
  std::lock_guard<std::mutex> g(st.mu);
  ForwardProblem f(st, p, h, a, call);
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  int count = 0;
  Check(cudnnFindConvolutionForwardAlgorithmEx(h, f.x.d, a.x_data, f.w.d, a.w_data, f.c.d, f.y.d, a.y_data,
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf.data(),
                                               a.workspace, a.workspace_bytes),
        call);
  return Reported(perf.data(), count);
}

std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                                             const gpurt::ConvBackwardDataArgs& a) {
  const char* call = "cudnnFindConvolutionBackwardDataAlgorithmEx";
  cudnnHandle_t h = BoundTo(handle, s, call);
  State& st = St();
  std::lock_guard<std::mutex> g(st.mu);
  BackwardDataProblem f(st, p, h, a, call);
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
  int count = 0;
  Check(cudnnFindConvolutionBackwardDataAlgorithmEx(h, f.w.d, a.w_data, f.dy.d, a.dy_data, f.c.d, f.dx.d,
                                                    a.dx_data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count,
                                                    perf.data(), a.workspace, a.workspace_bytes),
        call);
  return Reported(perf.data(), count);
}

std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(gpurt::Platform& p, void* handle, gpurt::Stream s,
                                                             const gpurt::ConvBackwardFilterArgs& a) {
  const char* call = "cudnnFindConvolutionBackwardFilterAlgorithmEx";
  cudnnHandle_t h = BoundTo(handle, s, call);
  State& st = St();
  std::lock_guard<std::mutex> g(st.mu);
  BackwardFilterProblem f(st, p, h, a, call);
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
  int count = 0;
  Check(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, f.x.d, a.x_data, f.dy.d, a.dy_data, f.c.d, f.dw.d,
                                                      a.dw_data, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
                                                      perf.data(), a.workspace, a.workspace_bytes),
        call);
  return Reported(perf.data(), count);
}

std::string DnnLibraryKey(int device) {
  // Asked once per device: cudaGetDeviceProperties is slow, and convolutions ask at every call.
  static std::mutex mu;
  static std::map<int, std::string> known;
  std::lock_guard<std::mutex> g(mu);
  if (auto it = known.find(device); it != known.end()) return it->second;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";  // unknown: choices are kept in memory only (asked again next time)
  }
  return known[device] = "cudnn " + std::to_string(cudnnGetVersion()) + " " + prop.name + " sm_" +
                         std::to_string(prop.major) + std::to_string(prop.minor) + " x" +
                         std::to_string(prop.multiProcessorCount);
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
  const char* call =
      training ? "cudnnBatchNormalizationForwardTraining" : "cudnnBatchNormalizationForwardInference";
  cudnnHandle_t h = BoundTo(handle, s, call);
  gpurt::CheckBatchNormForward(a, training, call);
  Tensor x, y, bn;
  Check(x.Set(a.x), "cudnnSetTensor4dDescriptorEx");
  Check(y.Set(a.y), "cudnnSetTensor4dDescriptorEx");
  Check(bn.Set(a.param), "cudnnSetTensor4dDescriptorEx");
  const auto mode = static_cast<cudnnBatchNormMode_t>(a.mode);
  if (training)
    Check(cudnnBatchNormalizationForwardTraining(h, mode, &a.alpha, &a.beta, x.d, a.x_data, y.d, a.y_data,
                                                 bn.d, a.scale, a.bias, a.exponential_average_factor,
                                                 a.running_mean, a.running_var, a.epsilon, a.save_mean,
                                                 a.save_inv_variance),
          call);
  else
    Check(cudnnBatchNormalizationForwardInference(h, mode, &a.alpha, &a.beta, x.d, a.x_data, y.d, a.y_data,
                                                  bn.d, a.scale, a.bias, a.running_mean, a.running_var,
                                                  a.epsilon),
          call);
}

void DnnPoolingBackward(void* handle, gpurt::Stream s, const gpurt::PoolingBackwardArgs& a) {
  const char* call = "cudnnPoolingBackward";
  cudnnHandle_t h = BoundTo(handle, s, call);
  gpurt::CheckPoolingBackward(a, call);
  Tensor y, dy, x, dx;
  Pool p;
  Check(y.Set(a.y), "cudnnSetTensor4dDescriptorEx");
  Check(dy.Set(a.dy), "cudnnSetTensor4dDescriptorEx");
  Check(x.Set(a.x), "cudnnSetTensor4dDescriptorEx");
  Check(dx.Set(a.dx), "cudnnSetTensor4dDescriptorEx");
  Check(p.Set(a.pool), "cudnnSetPooling2dDescriptor");
  Check(cudnnPoolingBackward(h, p.d, &a.alpha, y.d, a.y_data, dy.d, a.dy_data, x.d, a.x_data, &a.beta, dx.d,
                             a.dx_data),
        call);
}

void DnnBatchNormBackward(void* handle, gpurt::Stream s, const gpurt::BatchNormBackwardArgs& a) {
  const char* call = "cudnnBatchNormalizationBackward";
  cudnnHandle_t h = BoundTo(handle, s, call);
  gpurt::CheckBatchNormBackward(a, call);
  Tensor x, dy, dx, bn;
  Check(x.Set(a.x), "cudnnSetTensor4dDescriptorEx");
  Check(dy.Set(a.dy), "cudnnSetTensor4dDescriptorEx");
  Check(dx.Set(a.dx), "cudnnSetTensor4dDescriptorEx");
  Check(bn.Set(a.param), "cudnnSetTensor4dDescriptorEx");
  Check(cudnnBatchNormalizationBackward(h, static_cast<cudnnBatchNormMode_t>(a.mode), &a.alpha_data,
                                        &a.beta_data, &a.alpha_param, &a.beta_param, x.d, a.x_data, dy.d,
                                        a.dy_data, dx.d, a.dx_data, bn.d, a.scale, a.dscale, a.dbias,
                                        a.epsilon, a.saved_mean, a.saved_inv_variance),
        call);
}

} // namespace cuda

namespace gpurt {

int CudnnConvForwardOutputDim(const DnnTensorDesc& xd, const DnnFilterDesc& wd, const DnnConvDesc& cd,
                              int out[4]) {
  Tensor x;
  Filter w;
  Conv c;
  cudnnStatus_t st = x.Set(xd);
  if (st == CUDNN_STATUS_SUCCESS) st = w.Set(wd);
  if (st == CUDNN_STATUS_SUCCESS) st = c.Set(cd);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnGetConvolution2dForwardOutputDim(c.d, x.d, w.d, &out[0], &out[1], &out[2], &out[3]);
  return static_cast<int>(st);
}

int CudnnPoolingForwardOutputDim(const DnnPoolingDesc& pd, const DnnTensorDesc& xd, int out[4]) {
  Tensor x;
  Pool p;
  cudnnStatus_t st = x.Set(xd);
  if (st == CUDNN_STATUS_SUCCESS) st = p.Set(pd);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnGetPooling2dForwardOutputDim(p.d, x.d, &out[0], &out[1], &out[2], &out[3]);
  return static_cast<int>(st);
}

} // namespace gpurt
} // namespace kiln

#else // a CUDA toolkit without cuDNN: the calls fail as an uninitialized cuDNN does

namespace kiln::cuda {
namespace {
[[noreturn]] void NoCudnn(const char* call) {
  gpurt::FailDnn(gpurt::kDnnNotInitialized, call,
                 "this kiln was built without cuDNN (CMake did not find libcudnn)");
}
} // namespace
void* DnnHandle(gpurt::Stream) { NoCudnn("cudnnCreate"); }
void DnnConvolutionForward(gpurt::Platform&, void*, gpurt::Stream, const gpurt::ConvForwardArgs&) {
  NoCudnn("cudnnConvolutionForward");
}
void DnnConvolutionBackwardData(gpurt::Platform&, void*, gpurt::Stream, const gpurt::ConvBackwardDataArgs&) {
  NoCudnn("cudnnConvolutionBackwardData");
}
void DnnConvolutionBackwardFilter(gpurt::Platform&, void*, gpurt::Stream,
                                  const gpurt::ConvBackwardFilterArgs&) {
  NoCudnn("cudnnConvolutionBackwardFilter");
}
size_t DnnConvolutionWorkspaceSize(gpurt::Platform&, void*, gpurt::Stream, const gpurt::ConvForwardArgs&) {
  NoCudnn("cudnnGetConvolutionForwardWorkspaceSize");
}
size_t DnnConvolutionWorkspaceSize(gpurt::Platform&, void*, gpurt::Stream,
                                   const gpurt::ConvBackwardDataArgs&) {
  NoCudnn("cudnnGetConvolutionBackwardDataWorkspaceSize");
}
size_t DnnConvolutionWorkspaceSize(gpurt::Platform&, void*, gpurt::Stream,
                                   const gpurt::ConvBackwardFilterArgs&) {
  NoCudnn("cudnnGetConvolutionBackwardFilterWorkspaceSize");
}
std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(gpurt::Platform&, void*, gpurt::Stream,
                                                             const gpurt::ConvForwardArgs&) {
  return {};
}
std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(gpurt::Platform&, void*, gpurt::Stream,
                                                             const gpurt::ConvBackwardDataArgs&) {
  return {};
}
std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(gpurt::Platform&, void*, gpurt::Stream,
                                                             const gpurt::ConvBackwardFilterArgs&) {
  return {};
}
std::string DnnLibraryKey(int) { return ""; }
void DnnPoolingForward(void*, gpurt::Stream, const gpurt::PoolingForwardArgs&) {
  NoCudnn("cudnnPoolingForward");
}
void DnnPoolingBackward(void*, gpurt::Stream, const gpurt::PoolingBackwardArgs&) {
  NoCudnn("cudnnPoolingBackward");
}
void DnnBatchNormBackward(void*, gpurt::Stream, const gpurt::BatchNormBackwardArgs&) {
  NoCudnn("cudnnBatchNormalizationBackward");
}
void DnnBatchNormForward(void*, gpurt::Stream, const gpurt::BatchNormArgs&, bool) {
  NoCudnn("cudnnBatchNormalizationForward");
}
} // namespace kiln::cuda

#endif

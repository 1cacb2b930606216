// The CUDA platform (gpu.h) over the CUDA runtime, with modules and launches through the driver
// API (driver.cc). Without a driver or a GPU, DeviceCount() is 0 (cudaGetDeviceCount reports 35
// or 100) and nothing else is called. Handles are CUDA's own, cast to gpu.h's opaque types.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>

#include "blas_cuda.h"
#include "dnn_cuda.h"
#include "driver.h"
#include "kiln/runtime/gpu.h"
#include "nccl_coll.h"

namespace kiln::cuda {

namespace {

void Check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    gpurt::Fail(static_cast<int>(e), call, cudaGetErrorString(e));
  }
}

cudaStream_t S(gpurt::Stream s) { return reinterpret_cast<cudaStream_t>(s); }
cudaEvent_t E(gpurt::Event e) { return reinterpret_cast<cudaEvent_t>(e); }

class CudaPlatform final : public gpurt::Platform {
 public:
  const char* Name() const override { return "cuda"; }

  int DriverVersion() override {
    int v = 0;
    if (cudaDriverGetVersion(&v) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return v;
  }

  int DeviceCount() override {
    static int count = [] {
      int n = 0;
      if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // no driver (35) or no device (100): no GPUs
        return 0;
      }
      return n;
    }();
    return count;
  }

  gpurt::DeviceProperties Properties(int device) override {
    cudaDeviceProp p{};
    Check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
    gpurt::DeviceProperties d;
    d.name = p.name;
    d.cc_major = p.major, d.cc_minor = p.minor;
    d.multiprocessors = p.multiProcessorCount;
    d.total_memory = p.totalGlobalMem;
    d.l2_bytes = static_cast<size_t>(p.l2CacheSize);
    d.warp_size = p.warpSize;
    d.max_threads_per_block = p.maxThreadsPerBlock;
    d.max_block = {static_cast<uint32_t>(p.maxThreadsDim[0]), static_cast<uint32_t>(p.maxThreadsDim[1]),
                   static_cast<uint32_t>(p.maxThreadsDim[2])};
    d.max_grid = {static_cast<uint32_t>(p.maxGridSize[0]), static_cast<uint32_t>(p.maxGridSize[1]),
                  static_cast<uint32_t>(p.maxGridSize[2])};
    d.shared_per_block = p.sharedMemPerBlock;
    d.shared_per_block_optin = p.sharedMemPerBlockOptin;
    d.registers_per_block = p.regsPerBlock;
    d.unified_addressing = p.unifiedAddressing != 0;
    return d;
  }

  void SetDevice(int device) override { Check(cudaSetDevice(device), "cudaSetDevice"); }
  int GetDevice() override {
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) (void)cudaGetLastError(), d = 0;  // no driver: device 0, as CUDA says
    return d;
  }
  void DeviceSynchronize() override { Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  bool CanAccessPeer(int device, int peer) override {
    int ok = 0;
    Check(cudaDeviceCanAccessPeer(&ok, device, peer), "cudaDeviceCanAccessPeer");
    return ok != 0;
  }
  void EnablePeerAccess(int peer) override {
    cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) e = cudaSuccess, (void)cudaGetLastError();
    Check(e, "cudaDeviceEnablePeerAccess");
  }

  gpurt::Stream StreamCreate() override {
    cudaStream_t s = nullptr;
    Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return reinterpret_cast<gpurt::Stream>(s);
  }
  void StreamDestroy(gpurt::Stream s) override { cudaStreamDestroy(S(s)); }
  void StreamSynchronize(gpurt::Stream s) override { Check(cudaStreamSynchronize(S(s)), "cudaStreamSynchronize"); }
  bool StreamQuery(gpurt::Stream s) override {
    cudaError_t e = cudaStreamQuery(S(s));
    if (e == cudaErrorNotReady) return (void)cudaGetLastError(), false;
    Check(e, "cudaStreamQuery");
    return true;
  }
  void StreamWaitEvent(gpurt::Stream s, gpurt::Event e) override {
    Check(cudaStreamWaitEvent(S(s), E(e), 0), "cudaStreamWaitEvent");
  }
  void LaunchHostFunc(gpurt::Stream s, void (*fn)(void*), void* data) override {
    Check(cudaLaunchHostFunc(S(s), fn, data), "cudaLaunchHostFunc");
  }
  gpurt::Event EventCreate(bool timing) override {
    cudaEvent_t e = nullptr;
    Check(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate");
    return reinterpret_cast<gpurt::Event>(e);
  }
  void EventDestroy(gpurt::Event e) override { cudaEventDestroy(E(e)); }
  void EventRecord(gpurt::Event e, gpurt::Stream s) override { Check(cudaEventRecord(E(e), S(s)), "cudaEventRecord"); }
  bool EventQuery(gpurt::Event e) override {
    cudaError_t r = cudaEventQuery(E(e));
    if (r == cudaErrorNotReady) return (void)cudaGetLastError(), false;
    Check(r, "cudaEventQuery");
    return true;
  }
  void EventSynchronize(gpurt::Event e) override { Check(cudaEventSynchronize(E(e)), "cudaEventSynchronize"); }
  float EventElapsedMs(gpurt::Event a, gpurt::Event b) override {
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, E(a), E(b)), "cudaEventElapsedTime");
    return ms;
  }

  void* Malloc(size_t nbytes) override {
    void* p = nullptr;
    Check(cudaMalloc(&p, nbytes), "cudaMalloc");
    return p;
  }
  void Free(void* p) override { Check(cudaFree(p), "cudaFree"); }
  void* HostAllocPinned(size_t nbytes) override {
    void* p = nullptr;
    Check(cudaHostAlloc(&p, nbytes, cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void HostFreePinned(void* p) override { Check(cudaFreeHost(p), "cudaFreeHost"); }
  bool IsPinnedHost(const void* p) override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) return (void)cudaGetLastError(), false;
    return a.type == cudaMemoryTypeHost;
  }
  void MemcpyAsync(void* dst, const void* src, size_t n, gpurt::CopyKind kind, gpurt::Stream s) override {
    cudaMemcpyKind k = kind == gpurt::CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                       : kind == gpurt::CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
    Check(cudaMemcpyAsync(dst, src, n, k, S(s)), "cudaMemcpyAsync");
  }
  void MemcpyPeerAsync(void* dst, int dd, const void* src, int sd, size_t n, gpurt::Stream s) override {
    Check(cudaMemcpyPeerAsync(dst, dd, src, sd, n, S(s)), "cudaMemcpyPeerAsync");
  }
  void MemsetAsync(void* dst, int value, size_t n, gpurt::Stream s) override {
    Check(cudaMemsetAsync(dst, value, n, S(s)), "cudaMemsetAsync");
  }

  gpurt::Module ModuleLoad(const gpurt::ModuleImage& image) override {
    if (image.ptx.empty())
      gpurt::Fail(gpurt::kInvalidImage, "cuModuleLoadDataEx", "the module image has no PTX (only NVPTX IR); generate "
                                                           "PTX from it before loading it on a real GPU");
    Check(cudaFree(nullptr), "cudaFree(nullptr) (context creation)");  // the primary context
    return static_cast<gpurt::Module>(drv::LoadModule(image.ptx));
  }
  void ModuleUnload(gpurt::Module m) override { drv::UnloadModule(m); }
  gpurt::Function ModuleGetFunction(gpurt::Module m, const std::string& name) override {
    return static_cast<gpurt::Function>(drv::GetFunction(m, name));
  }
  void FuncSetMaxDynamicSharedMemory(gpurt::Function f, size_t bytes) override {
    drv::SetMaxDynamicSharedMemory(f, static_cast<int>(bytes));
  }
  void LaunchKernel(gpurt::Function f, gpurt::Dim3 grid, gpurt::Dim3 block, size_t smem, gpurt::Stream s,
                    void** args) override {
    drv::Launch(f, grid, block, static_cast<unsigned>(smem), s, args);
  }

  void StreamBeginCapture(gpurt::Stream s) override {
    Check(cudaStreamBeginCapture(S(s), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  }
  gpurt::Graph StreamEndCapture(gpurt::Stream s) override {
    cudaGraph_t g = nullptr;
    Check(cudaStreamEndCapture(S(s), &g), "cudaStreamEndCapture");
    return reinterpret_cast<gpurt::Graph>(g);
  }
  bool StreamIsCapturing(gpurt::Stream s) override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    Check(cudaStreamIsCapturing(S(s), &st), "cudaStreamIsCapturing");
    return st == cudaStreamCaptureStatusActive;
  }
  gpurt::GraphExec GraphInstantiate(gpurt::Graph g) override {
    cudaGraphExec_t x = nullptr;
    Check(cudaGraphInstantiate(&x, reinterpret_cast<cudaGraph_t>(g), 0), "cudaGraphInstantiate");
    return reinterpret_cast<gpurt::GraphExec>(x);
  }
  void GraphLaunch(gpurt::GraphExec g, gpurt::Stream s) override {
    Check(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(g), S(s)), "cudaGraphLaunch");
  }
  void GraphDestroy(gpurt::Graph g) override { cudaGraphDestroy(reinterpret_cast<cudaGraph_t>(g)); }
  void GraphExecDestroy(gpurt::GraphExec g) override { cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(g)); }

  void* LibraryHandle(gpurt::Library lib, gpurt::Stream s) override {
    if (lib == gpurt::Library::kDnn) return cuda::DnnHandle(s);
    // cuBLASLt takes the stream with each call; the handle itself is per device.
    std::lock_guard<std::mutex> g(mu_);
    int d = GetDevice();
    auto& h = blaslt_[d];
    if (!h) {
      cublasStatus_t st = cublasLtCreate(&h);
      if (st != CUBLAS_STATUS_SUCCESS)
        gpurt::Fail(gpurt::kNotSupported, "cublasLtCreate", "cuBLAS status " + std::to_string(static_cast<int>(st)));
    }
    return h;
  }

  // cuBLASLt takes the stream with each call, so a per-device handle cannot be on the wrong stream.
  void Gemm(void* blas, gpurt::Stream s, const gpurt::GemmArgs& g) override {
    gpurt::CheckGemm(g, "cublasLtMatmul");
    LtGemm(blas, S(s), g);
  }

  // cuDNN: dnn_cuda.cc.
  void DnnConvolutionForward(void* dnn, gpurt::Stream s, const gpurt::ConvForwardArgs& a) override {
    cuda::DnnConvolutionForward(*this, dnn, s, a);
  }
  void DnnConvolutionBackwardData(void* dnn, gpurt::Stream s, const gpurt::ConvBackwardDataArgs& a) override {
    cuda::DnnConvolutionBackwardData(*this, dnn, s, a);
  }
  void DnnConvolutionBackwardFilter(void* dnn, gpurt::Stream s, const gpurt::ConvBackwardFilterArgs& a) override {
    cuda::DnnConvolutionBackwardFilter(*this, dnn, s, a);
  }
  std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(void* dnn, gpurt::Stream s,
                                                               const gpurt::ConvForwardArgs& a) override {
    return cuda::DnnFindConvolutionAlgorithms(*this, dnn, s, a);
  }
  std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(void* dnn, gpurt::Stream s,
                                                               const gpurt::ConvBackwardDataArgs& a) override {
    return cuda::DnnFindConvolutionAlgorithms(*this, dnn, s, a);
  }
  std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(void* dnn, gpurt::Stream s,
                                                               const gpurt::ConvBackwardFilterArgs& a) override {
    return cuda::DnnFindConvolutionAlgorithms(*this, dnn, s, a);
  }
  std::string DnnLibraryKey(int device) override { return cuda::DnnLibraryKey(device); }
  size_t DnnConvolutionWorkspaceSize(void* dnn, gpurt::Stream s, const gpurt::ConvForwardArgs& a) override {
    return cuda::DnnConvolutionWorkspaceSize(*this, dnn, s, a);
  }
  size_t DnnConvolutionWorkspaceSize(void* dnn, gpurt::Stream s,
                                     const gpurt::ConvBackwardDataArgs& a) override {
    return cuda::DnnConvolutionWorkspaceSize(*this, dnn, s, a);
  }
  size_t DnnConvolutionWorkspaceSize(void* dnn, gpurt::Stream s,
                                     const gpurt::ConvBackwardFilterArgs& a) override {
    return cuda::DnnConvolutionWorkspaceSize(*this, dnn, s, a);
  }
  void DnnPoolingForward(void* dnn, gpurt::Stream s, const gpurt::PoolingForwardArgs& a) override {
    cuda::DnnPoolingForward(dnn, s, a);
  }
  void DnnBatchNormForwardTraining(void* dnn, gpurt::Stream s, const gpurt::BatchNormArgs& a) override {
    cuda::DnnBatchNormForward(dnn, s, a, true);
  }
  void DnnBatchNormForwardInference(void* dnn, gpurt::Stream s, const gpurt::BatchNormArgs& a) override {
    cuda::DnnBatchNormForward(dnn, s, a, false);
  }
  void DnnPoolingBackward(void* dnn, gpurt::Stream s, const gpurt::PoolingBackwardArgs& a) override {
    cuda::DnnPoolingBackward(dnn, s, a);
  }
  void DnnBatchNormBackward(void* dnn, gpurt::Stream s, const gpurt::BatchNormBackwardArgs& a) override {
    cuda::DnnBatchNormBackward(dnn, s, a);
  }

  void AllReduce(std::span<const Device> devs, const coll::BufferSet& b, coll::ReduceOp op) override {
    coll::NcclAllReduceImpl(devs, b, op);
  }
  void Broadcast(std::span<const Device> devs, const coll::BufferSet& b, int root) override {
    coll::NcclBroadcastImpl(devs, b, root);
  }
  void ReduceScatter(std::span<const Device> devs, DType dt, std::span<const void* const> in, int64_t n,
                     std::span<void* const> out, coll::ReduceOp op) override {
    coll::NcclReduceScatterImpl(devs, dt, in, n, out, op);
  }
  void AllGather(std::span<const Device> devs, DType dt, std::span<const void* const> in,
                 std::span<const int64_t> counts, std::span<void* const> out) override {
    coll::NcclAllGatherImpl(devs, dt, in, counts, out);
  }

 private:
  std::mutex mu_;
  std::map<int, cublasLtHandle_t> blaslt_;
};

}  // namespace

}  // namespace kiln::cuda

namespace kiln::gpurt {
Platform* CreateCudaPlatform() { return new cuda::CudaPlatform(); }
}  // namespace kiln::gpurt

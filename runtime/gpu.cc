// The choice of GPU platform (gpu.h) and what every platform shares: the names of CUDA's result
// codes and the GpuError they travel in. The simulator is chosen by KILN_GPU_SIM=N > 0 (each of
// its N devices with KILN_GPU_SIM_MEM of memory); otherwise CUDA in CUDA builds, else none.
#include "kiln/runtime/gpu.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/runtime/cuda.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/gpu_dnn.h"

namespace kiln::gpurt {

const char* CodeName(int code) {
  switch (code) {
  case kSuccess: return "CUDA_SUCCESS";
  case kInvalidValue: return "CUDA_ERROR_INVALID_VALUE";
  case kOutOfMemory: return "CUDA_ERROR_OUT_OF_MEMORY";
  case 3: return "CUDA_ERROR_NOT_INITIALIZED";
  case 34: return "CUDA_ERROR_STUB_LIBRARY";
  case 35: return "CUDA_ERROR_INSUFFICIENT_DRIVER";
  case kNoDevice: return "CUDA_ERROR_NO_DEVICE";
  case kInvalidDevice: return "CUDA_ERROR_INVALID_DEVICE";
  case kInvalidImage: return "CUDA_ERROR_INVALID_IMAGE";
  case kInvalidContext: return "CUDA_ERROR_INVALID_CONTEXT";
  case 222: return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
  case kInvalidHandle: return "CUDA_ERROR_INVALID_HANDLE";
  case kIllegalState: return "CUDA_ERROR_ILLEGAL_STATE";
  case kNotFound: return "CUDA_ERROR_NOT_FOUND";
  case kNotReady: return "CUDA_ERROR_NOT_READY";
  case kIllegalAddress: return "CUDA_ERROR_ILLEGAL_ADDRESS";
  case kLaunchOutOfResources: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
  case 704: return "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED";
  case kMisalignedAddress: return "CUDA_ERROR_MISALIGNED_ADDRESS";
  case kLaunchFailed: return "CUDA_ERROR_LAUNCH_FAILED";
  case kNotSupported: return "CUDA_ERROR_NOT_SUPPORTED";
  case kCaptureUnsupported: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
  case kCaptureInvalidated: return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
  case kCaptureUnmatched: return "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED";
  case kCapturedEvent: return "CUDA_ERROR_CAPTURED_EVENT";
  case kCaptureWrongThread: return "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD";
  default: return "CUDA_ERROR";
  }
}

void Fail(int code, const std::string& call, const std::string& detail) {
  throw GpuError(code, call + ": " + CodeName(code) + " (" + std::to_string(code) + "): " + detail);
}

namespace {

// KILN_GPU_SIM_MEM: bytes with an optional K, M or G suffix (powers of 1024); a bare number is MiB.
size_t ParseMemory(const std::string& v) {
  char* end = nullptr;
  unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  std::string unit(end);
  size_t mult = unit.empty() || unit == "M" || unit == "MiB" ? size_t{1} << 20
                : unit == "G" || unit == "GiB"               ? size_t{1} << 30
                : unit == "K" || unit == "KiB"               ? size_t{1} << 10
                                                              : 0;
  if (end == v.c_str() || mult == 0 || x == 0 || x * mult < (size_t{1} << 20))
    KILN_THROW(ValueError) << "KILN_GPU_SIM_MEM=" << v << " is not a memory size: expected e.g. 4G, 512M or "
                           << "a number of MiB, at least 1 MiB";
  return static_cast<size_t>(x) * mult;
}

Platform* Choose() {
  int64_t sim = env::GetInt("KILN_GPU_SIM");
  if (sim < 0 || sim > 16)
    KILN_THROW(ValueError) << "KILN_GPU_SIM=" << sim << " is not a number of simulated GPUs: expected 0 (off) to 16";
  Platform* p = nullptr;
  if (sim > 0) p = CreateSimulatedPlatform(static_cast<int>(sim), ParseMemory(env::Get("KILN_GPU_SIM_MEM")));
  if (!p) p = CreateCudaPlatform();
  if (!p) p = CreateNoPlatform();
  if (env::GetInt("KILN_GPU_LOG") > 0) {
    const int v = p->DriverVersion();
    if (v) std::fprintf(stderr, "kiln: GPU platform %s, driver CUDA %d.%d, %d device(s)\n", p->Name(), v / 1000,
                        v % 1000 / 10, p->DeviceCount());
    else std::fprintf(stderr, "kiln: GPU platform %s, no CUDA driver, %d device(s)\n", p->Name(), p->DeviceCount());
    for (int i = 0; i < p->DeviceCount(); ++i) {
      DeviceProperties d = p->Properties(i);
      std::fprintf(stderr, "kiln:   gpu(%d): %s, sm_%d%d, %d SMs, %.1f GiB\n", i, d.name.c_str(), d.cc_major,
                   d.cc_minor, d.multiprocessors, static_cast<double>(d.total_memory) / (1u << 30));
    }
  }
  return p;
}

// Zero devices: what a build without CUDA (and without KILN_GPU_SIM) sees.
class NoPlatform final : public Platform {
 public:
  const char* Name() const override { return "none"; }
  int DriverVersion() override { return 0; }
  int DeviceCount() override { return 0; }
  [[noreturn]] static void None(const char* call) {
    Fail(kNoDevice, call,
         "this process has no GPU (kiln was built without CUDA, or no driver was found); use kiln.cpu(), "
         "or run with KILN_GPU_SIM=2 for two simulated GPUs");
  }
  DeviceProperties Properties(int) override { None("cudaGetDeviceProperties"); }
  void SetDevice(int) override { None("cudaSetDevice"); }
  int GetDevice() override { return 0; }
  void DeviceSynchronize() override {}
  bool CanAccessPeer(int, int) override { return false; }
  void EnablePeerAccess(int) override { None("cudaDeviceEnablePeerAccess"); }
  Stream StreamCreate() override { None("cudaStreamCreate"); }
  void StreamDestroy(Stream) override {}
  void StreamSynchronize(Stream) override {}
  bool StreamQuery(Stream) override { return true; }
  void StreamWaitEvent(Stream, Event) override { None("cudaStreamWaitEvent"); }
  void LaunchHostFunc(Stream, void (*)(void*), void*) override { None("cudaLaunchHostFunc"); }
  Event EventCreate(bool) override { None("cudaEventCreate"); }
  void EventDestroy(Event) override {}
  void EventRecord(Event, Stream) override { None("cudaEventRecord"); }
  bool EventQuery(Event) override { return true; }
  void EventSynchronize(Event) override {}
  float EventElapsedMs(Event, Event) override { None("cudaEventElapsedTime"); }
  void* Malloc(size_t) override { None("cudaMalloc"); }
  void Free(void*) override { None("cudaFree"); }
  void* HostAllocPinned(size_t) override { None("cudaHostAlloc"); }
  void HostFreePinned(void*) override { None("cudaFreeHost"); }
  bool IsPinnedHost(const void*) override { return false; }
  void MemcpyAsync(void*, const void*, size_t, CopyKind, Stream) override { None("cudaMemcpyAsync"); }
  void MemcpyPeerAsync(void*, int, const void*, int, size_t, Stream) override { None("cudaMemcpyPeerAsync"); }
  void MemsetAsync(void*, int, size_t, Stream) override { None("cudaMemsetAsync"); }
  Module ModuleLoad(const ModuleImage&) override { None("cuModuleLoadData"); }
  void ModuleUnload(Module) override {}
  Function ModuleGetFunction(Module, const std::string&) override { None("cuModuleGetFunction"); }
  void FuncSetMaxDynamicSharedMemory(Function, size_t) override { None("cuFuncSetAttribute"); }
  void LaunchKernel(Function, Dim3, Dim3, size_t, Stream, void**) override { None("cuLaunchKernel"); }
  void StreamBeginCapture(Stream) override { None("cudaStreamBeginCapture"); }
  Graph StreamEndCapture(Stream) override { None("cudaStreamEndCapture"); }
  bool StreamIsCapturing(Stream) override { return false; }
  GraphExec GraphInstantiate(Graph) override { None("cudaGraphInstantiate"); }
  void GraphLaunch(GraphExec, Stream) override { None("cudaGraphLaunch"); }
  void GraphDestroy(Graph) override {}
  void GraphExecDestroy(GraphExec) override {}
  void* LibraryHandle(Library, Stream) override { None("library handle"); }
  void AllReduce(std::span<const Device>, const coll::BufferSet&, coll::ReduceOp) override { None("allreduce"); }
  void Broadcast(std::span<const Device>, const coll::BufferSet&, int) override { None("broadcast"); }
  void ReduceScatter(std::span<const Device>, DType, std::span<const void* const>, int64_t, std::span<void* const>,
                     coll::ReduceOp) override {
    None("reduce_scatter");
  }
  void AllGather(std::span<const Device>, DType, std::span<const void* const>, std::span<const int64_t>,
                 std::span<void* const>) override {
    None("all_gather");
  }
};


// Every call of the chosen platform, counted (Counters()) and forwarded.
class CountingPlatform final : public Platform {
 public:
  explicit CountingPlatform(Platform* p) : p_(*p) {}
  const char* Name() const override { return p_.Name(); }
  int DriverVersion() override { return p_.DriverVersion(); }
  int DeviceCount() override { return p_.DeviceCount(); }
  DeviceProperties Properties(int device) override { return p_.Properties(device); }
  void SetDevice(int device) override { p_.SetDevice(device); }
  int GetDevice() override { return p_.GetDevice(); }
  void DeviceSynchronize() override { Sync(), p_.DeviceSynchronize(); }
  bool CanAccessPeer(int device, int peer) override { return p_.CanAccessPeer(device, peer); }
  void EnablePeerAccess(int peer) override { p_.EnablePeerAccess(peer); }
  Stream StreamCreate() override { return p_.StreamCreate(); }
  void StreamDestroy(Stream s) override { p_.StreamDestroy(s); }
  void StreamSynchronize(Stream s) override { Sync(), p_.StreamSynchronize(s); }
  bool StreamQuery(Stream s) override { return p_.StreamQuery(s); }
  void StreamWaitEvent(Stream s, Event e) override { p_.StreamWaitEvent(s, e); }
  void LaunchHostFunc(Stream s, void (*fn)(void*), void* data) override { p_.LaunchHostFunc(s, fn, data); }
  Event EventCreate(bool timing) override { return p_.EventCreate(timing); }
  void EventDestroy(Event e) override { p_.EventDestroy(e); }
  void EventRecord(Event e, Stream s) override { p_.EventRecord(e, s); }
  bool EventQuery(Event e) override { return p_.EventQuery(e); }
  void EventSynchronize(Event e) override { Sync(), p_.EventSynchronize(e); }
  float EventElapsedMs(Event start, Event end) override { return p_.EventElapsedMs(start, end); }
  void* Malloc(size_t nbytes) override { return Add(c_.device_mallocs), p_.Malloc(nbytes); }
  void Free(void* p) override { p_.Free(p); }
  void* HostAllocPinned(size_t nbytes) override { return p_.HostAllocPinned(nbytes); }
  void HostFreePinned(void* p) override { p_.HostFreePinned(p); }
  bool IsPinnedHost(const void* p) override { return p_.IsPinnedHost(p); }
  void MemcpyAsync(void* dst, const void* src, size_t nbytes, CopyKind kind, Stream s) override {
    Add(c_.copies);
    Add(kind == CopyKind::kHostToDevice ? c_.h2d_bytes : kind == CopyKind::kDeviceToHost ? c_.d2h_bytes : c_.d2d_bytes,
        static_cast<int64_t>(nbytes));
    p_.MemcpyAsync(dst, src, nbytes, kind, s);
  }
  void MemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device, size_t nbytes, Stream s) override {
    Add(c_.copies), Add(c_.d2d_bytes, static_cast<int64_t>(nbytes));
    p_.MemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, s);
  }
  void MemsetAsync(void* dst, int value, size_t nbytes, Stream s) override {
    Add(c_.memsets), p_.MemsetAsync(dst, value, nbytes, s);
  }
  Module ModuleLoad(const ModuleImage& image) override { return p_.ModuleLoad(image); }
  void ModuleUnload(Module m) override { p_.ModuleUnload(m); }
  Function ModuleGetFunction(Module m, const std::string& name) override { return p_.ModuleGetFunction(m, name); }
  void FuncSetMaxDynamicSharedMemory(Function f, size_t bytes) override { p_.FuncSetMaxDynamicSharedMemory(f, bytes); }
  void LaunchKernel(Function f, Dim3 grid, Dim3 block, size_t dynamic_smem, Stream s, void** args) override {
    Add(c_.kernel_launches), p_.LaunchKernel(f, grid, block, dynamic_smem, s, args);
  }
  void StreamBeginCapture(Stream s) override { p_.StreamBeginCapture(s); }
  Graph StreamEndCapture(Stream s) override { return p_.StreamEndCapture(s); }
  bool StreamIsCapturing(Stream s) override { return p_.StreamIsCapturing(s); }
  GraphExec GraphInstantiate(Graph g) override { return p_.GraphInstantiate(g); }
  void GraphLaunch(GraphExec g, Stream s) override { Add(c_.graph_launches), p_.GraphLaunch(g, s); }
  void GraphDestroy(Graph g) override { p_.GraphDestroy(g); }
  void GraphExecDestroy(GraphExec g) override { p_.GraphExecDestroy(g); }
  void* LibraryHandle(Library lib, Stream s) override { return p_.LibraryHandle(lib, s); }
  void Gemm(void* blas, Stream s, const GemmArgs& g) override { Add(c_.library_calls), p_.Gemm(blas, s, g); }
  void DnnConvolutionForward(void* dnn, Stream s, const ConvForwardArgs& a) override {
    Add(c_.library_calls), p_.DnnConvolutionForward(dnn, s, a);
  }
  void DnnConvolutionBackwardData(void* dnn, Stream s, const ConvBackwardDataArgs& a) override {
    Add(c_.library_calls), p_.DnnConvolutionBackwardData(dnn, s, a);
  }
  void DnnConvolutionBackwardFilter(void* dnn, Stream s, const ConvBackwardFilterArgs& a) override {
    Add(c_.library_calls), p_.DnnConvolutionBackwardFilter(dnn, s, a);
  }
  size_t DnnConvolutionWorkspaceSize(void* dnn, Stream s, const ConvForwardArgs& a) override {
    return p_.DnnConvolutionWorkspaceSize(dnn, s, a);
  }
  size_t DnnConvolutionWorkspaceSize(void* dnn, Stream s, const ConvBackwardDataArgs& a) override {
    return p_.DnnConvolutionWorkspaceSize(dnn, s, a);
  }
  size_t DnnConvolutionWorkspaceSize(void* dnn, Stream s, const ConvBackwardFilterArgs& a) override {
    return p_.DnnConvolutionWorkspaceSize(dnn, s, a);
  }
  // A measurement waits for the stream: a host sync.
  std::vector<DnnAlgoPerf> DnnFindConvolutionAlgorithms(void* dnn, Stream s, const ConvForwardArgs& a) override {
    Sync();
    return p_.DnnFindConvolutionAlgorithms(dnn, s, a);
  }
  std::vector<DnnAlgoPerf> DnnFindConvolutionAlgorithms(void* dnn, Stream s, const ConvBackwardDataArgs& a) override {
    Sync();
    return p_.DnnFindConvolutionAlgorithms(dnn, s, a);
  }
  std::vector<DnnAlgoPerf> DnnFindConvolutionAlgorithms(void* dnn, Stream s,
                                                        const ConvBackwardFilterArgs& a) override {
    Sync();
    return p_.DnnFindConvolutionAlgorithms(dnn, s, a);
  }
  std::string DnnLibraryKey(int device) override { return p_.DnnLibraryKey(device); }
  void DnnPoolingForward(void* dnn, Stream s, const PoolingForwardArgs& a) override {
    Add(c_.library_calls), p_.DnnPoolingForward(dnn, s, a);
  }
  void DnnBatchNormForwardTraining(void* dnn, Stream s, const BatchNormArgs& a) override {
    Add(c_.library_calls), p_.DnnBatchNormForwardTraining(dnn, s, a);
  }
  void DnnBatchNormForwardInference(void* dnn, Stream s, const BatchNormArgs& a) override {
    Add(c_.library_calls), p_.DnnBatchNormForwardInference(dnn, s, a);
  }
  void DnnPoolingBackward(void* dnn, Stream s, const PoolingBackwardArgs& a) override {
    Add(c_.library_calls), p_.DnnPoolingBackward(dnn, s, a);
  }
  void DnnBatchNormBackward(void* dnn, Stream s, const BatchNormBackwardArgs& a) override {
    Add(c_.library_calls), p_.DnnBatchNormBackward(dnn, s, a);
  }
  void AllReduce(std::span<const Device> devices, const coll::BufferSet& b, coll::ReduceOp op) override {
    p_.AllReduce(devices, b, op);
  }
  void Broadcast(std::span<const Device> devices, const coll::BufferSet& b, int root) override {
    p_.Broadcast(devices, b, root);
  }
  void ReduceScatter(std::span<const Device> devices, DType dt, std::span<const void* const> in, int64_t n,
                     std::span<void* const> out, coll::ReduceOp op) override {
    p_.ReduceScatter(devices, dt, in, n, out, op);
  }
  void AllGather(std::span<const Device> devices, DType dt, std::span<const void* const> in,
                 std::span<const int64_t> counts, std::span<void* const> out) override {
    p_.AllGather(devices, dt, in, counts, out);
  }

 private:
  static void Add(std::atomic<int64_t>& c, int64_t n = 1) { c.fetch_add(n, std::memory_order_relaxed); }
  void Sync() {
    if (cuda::CurrentStream()) Add(c_.host_syncs);  // an engine worker of a GPU
  }
  Platform& p_;
  PlatformCounters& c_ = Counters();
};

}  // namespace

Platform* CreateNoPlatform() { return new NoPlatform(); }

PlatformCounters& Counters() {
  static auto* c = new PlatformCounters();  // process lifetime, as the platform
  return *c;
}

Platform& Get() {
  static Platform* p = new CountingPlatform(Choose());  // process lifetime: streams may still drain at exit
  return *p;
}

}  // namespace kiln::gpurt

// The simulated GPU platform (gpu.h, DESIGN.md section 4a): KILN_GPU_SIM=N devices like an sm_90
// part, each with KILN_GPU_SIM_MEM of memory the host cannot touch. It fails where the driver
// fails, with the driver's codes: launch limits (block and grid dimensions, dynamic shared memory
// above 48 KiB without the opt-in, registers x threads), a stream, event or kernel of another
// device than the thread's current one, synchronizing or allocating during a capture, and the
// sticky error a faulting kernel leaves. Kernels run through the emulator codegen installs behind
// gpusim/emulator.h; without one, loading a module is a DeviceError that says so.
#include <cstring>
#include <memory>

#include "kiln/runtime/gpusim/emulator.h"
#include "kiln/runtime/gpusim/seam_internal.h"
#include "sim.h"
#include "sim_dnn.h"

namespace kiln::gpusim {

namespace {

struct SimFunction {
  int device;
  EmulatedKernel* kernel;
  std::string name;
};
struct SimModule {
  int device;
  std::unique_ptr<EmulatedModule> module;
  std::mutex mu;
  std::map<std::string, std::unique_ptr<SimFunction>> functions;
};
struct SimGraph {
  int device;
  std::vector<std::function<void(gpurt::Stream)>> nodes;
};

StreamImpl* S(gpurt::Stream s) { return reinterpret_cast<StreamImpl*>(s); }
std::shared_ptr<EventState>& E(gpurt::Event e) { return *reinterpret_cast<std::shared_ptr<EventState>*>(e); }
std::string Gpu(int d) { return "gpu(" + std::to_string(d) + ")"; }

thread_local int tls_device = 0;

class SimPlatform final : public gpurt::Platform {
 public:
  SimPlatform(int n, size_t bytes) : memory_(n, bytes) {
    for (int i = 0; i < n; ++i) {
      devices_.push_back(std::make_unique<SimDevice>(i));
      devices_.back()->peer_enabled.assign(static_cast<size_t>(n), false);
    }
  }

  const char* Name() const override { return "simulator"; }
  int DriverVersion() override { return 13000; }
  int DeviceCount() override { return static_cast<int>(devices_.size()); }

  gpurt::DeviceProperties Properties(int device) override {
    Dev(device, "cudaGetDeviceProperties");
    gpurt::DeviceProperties p;
    p.name = "kiln simulated GPU (sm_90 limits)";
    p.cc_major = 9, p.cc_minor = 0;
    p.multiprocessors = 132;
    p.total_memory = memory_.bytes_per_device();
    p.l2_bytes = size_t{50} << 20;
    return p;
  }

  void SetDevice(int device) override {
    Dev(device, "cudaSetDevice");
    tls_device = device;
  }
  int GetDevice() override { return tls_device; }
  void DeviceSynchronize() override {
    SimDevice& d = Dev(tls_device, "cudaDeviceSynchronize");
    if (d.capturing.load()) {
      InvalidateCaptures(d);
      gpurt::Fail(gpurt::kCaptureUnsupported, "cudaDeviceSynchronize on " + Gpu(d.index),
                "a stream of this device is being captured into a graph; synchronizing is not allowed then "
                "(the capture is now invalidated)");
    }
    d.Synchronize();
    d.CheckSticky("cudaDeviceSynchronize");
  }
  bool CanAccessPeer(int device, int peer) override {
    Dev(device, "cudaDeviceCanAccessPeer"), Dev(peer, "cudaDeviceCanAccessPeer");
    return device != peer;
  }
  void EnablePeerAccess(int peer) override {
    SimDevice& d = Dev(tls_device, "cudaDeviceEnablePeerAccess");
    Dev(peer, "cudaDeviceEnablePeerAccess");
    if (peer == d.index) gpurt::Fail(gpurt::kInvalidDevice, "cudaDeviceEnablePeerAccess", "a device is not its own peer");
    d.peer_enabled[static_cast<size_t>(peer)] = true;
  }

  // ---- streams and events ----
  gpurt::Stream StreamCreate() override {
    SimDevice& d = Dev(tls_device, "cudaStreamCreate");
    std::lock_guard<std::mutex> g(d.streams_mu);
    auto* s = new StreamImpl(&d, static_cast<int>(d.streams.size()));
    d.streams.push_back(s);
    return reinterpret_cast<gpurt::Stream>(s);
  }
  void StreamDestroy(gpurt::Stream h) override {
    StreamImpl* s = Stream(h, "cudaStreamDestroy");
    if (s == s->device()->default_stream.get()) return;
    {
      std::lock_guard<std::mutex> g(s->device()->streams_mu);
      std::erase(s->device()->streams, s);
    }
    delete s;  // finishes its queue first, as CUDA does
  }
  void StreamSynchronize(gpurt::Stream h) override {
    StreamImpl* s = Stream(h, "cudaStreamSynchronize");
    ProhibitedInCapture(s, "cudaStreamSynchronize");
    s->Drain();
    s->device()->CheckSticky("cudaStreamSynchronize");
  }
  bool StreamQuery(gpurt::Stream h) override {
    StreamImpl* s = Stream(h, "cudaStreamQuery");
    ProhibitedInCapture(s, "cudaStreamQuery");
    s->device()->CheckSticky("cudaStreamQuery");
    return s->Idle();
  }
  void StreamWaitEvent(gpurt::Stream h, gpurt::Event e) override {
    StreamImpl* s = Stream(h, "cudaStreamWaitEvent");
    std::shared_ptr<EventState> ev = Event(e, "cudaStreamWaitEvent");
    if (Capturing(s, "cudaStreamWaitEvent")) {
      s->Capture([this, ev](gpurt::Stream r) { WaitOn(S(r), ev); });
      return;
    }
    WaitOn(s, ev);  // any device's event may be waited on (cross-device waits are legal)
  }
  void LaunchHostFunc(gpurt::Stream h, void (*fn)(void*), void* data) override {
    StreamImpl* s = Stream(h, "cudaLaunchHostFunc");
    s->device()->CheckSticky("cudaLaunchHostFunc");
    if (Capturing(s, "cudaLaunchHostFunc")) s->Capture([fn, data](gpurt::Stream r) { S(r)->Enqueue([fn, data] { fn(data); }); });
    else s->Enqueue([fn, data] { fn(data); });
  }
  gpurt::Event EventCreate(bool timing) override {
    Dev(tls_device, "cudaEventCreate");
    auto* e = new std::shared_ptr<EventState>(std::make_shared<EventState>());
    (*e)->device = tls_device;
    (*e)->timing = timing;
    return reinterpret_cast<gpurt::Event>(e);
  }
  void EventDestroy(gpurt::Event e) override { delete &E(e); }  // pending uses hold their own reference
  void EventRecord(gpurt::Event e, gpurt::Stream h) override {
    StreamImpl* s = Stream(h, "cudaEventRecord");
    std::shared_ptr<EventState> ev = Event(e, "cudaEventRecord");
    if (ev->device != s->device()->index)
      gpurt::Fail(gpurt::kInvalidHandle, "cudaEventRecord",
                "the event was created on " + Gpu(ev->device) + " but the stream belongs to " +
                    Gpu(s->device()->index) + "; record an event of the stream's device (create it with that "
                    "device current)");
    if (Capturing(s, "cudaEventRecord")) {
      {
        std::lock_guard<std::mutex> g(ev->mu);
        ev->captured = true;
      }
      s->Capture([this, ev](gpurt::Stream r) { RecordOn(S(r), ev); });
      return;
    }
    {
      std::lock_guard<std::mutex> g(ev->mu);
      ev->captured = false;
    }
    RecordOn(s, ev);
  }
  // cudaEventQuery and cudaEventSynchronize: prohibited to a capturing thread (they invalidate its
  // capture), and refused for an event whose last record was captured (it marks a point of a
  // graph, not of a stream) until it is recorded outside a capture again.
  void CheckEventUse(const std::shared_ptr<EventState>& ev, const char* call) {
    ProhibitedDuringAnyCapture(call);
    std::lock_guard<std::mutex> g(ev->mu);
    if (ev->captured)
      gpurt::Fail(gpurt::kCapturedEvent, call,
                  "the event was last recorded in a stream being captured into a graph; record it on a stream "
                  "outside the capture before querying or waiting for it");
  }
  bool EventQuery(gpurt::Event e) override {
    std::shared_ptr<EventState> ev = Event(e, "cudaEventQuery");
    CheckEventUse(ev, "cudaEventQuery");
    devices_[static_cast<size_t>(ev->device)]->CheckSticky("cudaEventQuery");
    std::lock_guard<std::mutex> g(ev->mu);
    return ev->completed >= ev->recorded;
  }
  void EventSynchronize(gpurt::Event e) override {
    std::shared_ptr<EventState> ev = Event(e, "cudaEventSynchronize");
    CheckEventUse(ev, "cudaEventSynchronize");
    {
      std::unique_lock<std::mutex> g(ev->mu);
      uint64_t target = ev->recorded;
      SimDevice& d = *devices_[static_cast<size_t>(ev->device)];
      ev->cv.wait(g, [&] { return ev->completed >= target || d.sticky.load(); });
    }
    devices_[static_cast<size_t>(ev->device)]->CheckSticky("cudaEventSynchronize");
  }
  float EventElapsedMs(gpurt::Event a, gpurt::Event b) override {
    std::shared_ptr<EventState> x = Event(a, "cudaEventElapsedTime"), y = Event(b, "cudaEventElapsedTime");
    if (!x->timing || !y->timing)
      gpurt::Fail(gpurt::kInvalidHandle, "cudaEventElapsedTime",
                "an event was created with timing disabled (cudaEventDisableTiming); create both with timing");
    if (x->device != y->device)
      gpurt::Fail(gpurt::kInvalidHandle, "cudaEventElapsedTime",
                "the events belong to " + Gpu(x->device) + " and " + Gpu(y->device) + "; time events of one device");
    std::lock_guard<std::mutex> g1(x->mu), g2(y->mu);
    if (!x->recorded || !y->recorded)
      gpurt::Fail(gpurt::kInvalidHandle, "cudaEventElapsedTime", "an event was never recorded");
    if (x->completed < x->recorded || y->completed < y->recorded)
      gpurt::Fail(gpurt::kNotReady, "cudaEventElapsedTime", "an event has not completed yet; synchronize on it first");
    return std::chrono::duration<float, std::milli>(y->when - x->when).count();
  }

  // ---- memory ----
  void* Malloc(size_t nbytes) override {
    SimDevice& d = Dev(tls_device, "cudaMalloc");
    ProhibitedDuringAnyCapture("cudaMalloc");
    d.CheckSticky("cudaMalloc");
    return memory_.Allocate(d.index, nbytes);
  }
  void Free(void* p) override {
    if (!p) return;
    ProhibitedDuringAnyCapture("cudaFree");
    int dev = memory_.DeviceOf(p);
    if (dev < 0) memory_.Free(p);  // fails: not device memory
    devices_[static_cast<size_t>(dev)]->Synchronize();  // cudaFree synchronizes, as on a real GPU
    memory_.Free(p);
  }
  void* HostAllocPinned(size_t nbytes) override { return memory_.AllocatePinned(nbytes); }
  void HostFreePinned(void* p) override { memory_.FreePinned(p); }
  bool IsPinnedHost(const void* p) override { return memory_.IsPinned(p); }

  void MemcpyAsync(void* dst, const void* src, size_t n, gpurt::CopyKind kind, gpurt::Stream h) override {
    StreamImpl* s = Stream(h, "cudaMemcpyAsync");
    s->device()->CheckSticky("cudaMemcpyAsync");
    if (n == 0) return;
    const char* call = "cudaMemcpyAsync";
    bool from_device = kind != gpurt::CopyKind::kHostToDevice, to_device = kind != gpurt::CopyKind::kDeviceToHost;
    if (from_device) memory_.CheckDeviceRange(src, n, call, "the source");
    else HostSide(src, n, call, "the source");
    if (to_device) memory_.CheckDeviceRange(dst, n, call, "the destination");
    else HostSide(dst, n, call, "the destination");
    void* d = to_device ? memory_.Alias(dst) : dst;
    const void* from = from_device ? memory_.Alias(src) : src;
    if (Capturing(s, call)) {
      s->Capture([d, from, n](gpurt::Stream r) { S(r)->Enqueue([=] { std::memmove(d, from, n); }); });
      return;
    }
    if (kind == gpurt::CopyKind::kHostToDevice && !memory_.IsPinned(src)) {
      // Pageable: CUDA stages the bytes before returning; the DMA follows in stream order.
      auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + n);
      s->Enqueue([d, staged] { std::memcpy(d, staged->data(), staged->size()); });
      return;
    }
    s->Enqueue([d, from, n] { std::memmove(d, from, n); });
    if (kind == gpurt::CopyKind::kDeviceToHost && !memory_.IsPinned(dst)) {
      s->Drain();  // pageable destination: synchronous, as in CUDA
      s->device()->CheckSticky(call);
    }
  }
  void MemcpyPeerAsync(void* dst, int dd, const void* src, int sd, size_t n, gpurt::Stream h) override {
    Dev(dd, "cudaMemcpyPeerAsync"), Dev(sd, "cudaMemcpyPeerAsync");
    if (memory_.DeviceOf(dst) != dd || memory_.DeviceOf(src) != sd)
      gpurt::Fail(gpurt::kInvalidValue, "cudaMemcpyPeerAsync",
                "the destination lies on " + Gpu(memory_.DeviceOf(dst)) + " and the source on " +
                    Gpu(memory_.DeviceOf(src)) + ", not on the devices named (" + Gpu(dd) + ", " + Gpu(sd) + ")");
    MemcpyAsync(dst, src, n, gpurt::CopyKind::kDeviceToDevice, h);  // staged or direct: the same bytes
  }
  void MemsetAsync(void* dst, int value, size_t n, gpurt::Stream h) override {
    StreamImpl* s = Stream(h, "cudaMemsetAsync");
    s->device()->CheckSticky("cudaMemsetAsync");
    if (n == 0) return;
    memory_.CheckDeviceRange(dst, n, "cudaMemsetAsync", "the destination");
    void* d = memory_.Alias(dst);
    auto op = [d, value, n] { std::memset(d, value, n); };
    if (Capturing(s, "cudaMemsetAsync")) s->Capture([op](gpurt::Stream r) { S(r)->Enqueue(op); });
    else s->Enqueue(op);
  }

  // ---- modules and kernels ----
  gpurt::Module ModuleLoad(const gpurt::ModuleImage& image) override {
    Dev(tls_device, "cuModuleLoadData");
    ModuleCompiler compile = GetModuleCompiler();
    if (!compile)
      gpurt::Fail(gpurt::kNotSupported, "cuModuleLoadData on simulated " + Gpu(tls_device),
                "no kernel emulator is installed, so simulated GPUs cannot run kernels in this program (the "
                "emulator lives in kiln_codegen and installs itself when linked)");
    if (image.nvptx_ir.empty())
      gpurt::Fail(gpurt::kInvalidImage, "cuModuleLoadData on simulated " + Gpu(tls_device),
                "the module image has PTX only; the simulator runs the NVPTX LLVM IR the PTX was made from");
    auto m = std::make_unique<SimModule>();
    m->device = tls_device;
    m->module = compile(image.nvptx_ir);
    if (!m->module)
      gpurt::Fail(gpurt::kInvalidImage, "cuModuleLoadData on simulated " + Gpu(tls_device),
                  "the kernel emulator could not build the module");
    return reinterpret_cast<gpurt::Module>(m.release());
  }
  void ModuleUnload(gpurt::Module m) override { delete reinterpret_cast<SimModule*>(m); }
  gpurt::Function ModuleGetFunction(gpurt::Module h, const std::string& name) override {
    auto* m = reinterpret_cast<SimModule*>(h);
    std::lock_guard<std::mutex> g(m->mu);
    auto& f = m->functions[name];
    if (!f) {
      EmulatedKernel* k = m->module->Function(name);
      if (!k) {
        m->functions.erase(name);
        gpurt::Fail(gpurt::kNotFound, "cuModuleGetFunction", "the module has no kernel '" + name + "'");
      }
      f = std::make_unique<SimFunction>(SimFunction{m->device, k, name});
    }
    return reinterpret_cast<gpurt::Function>(f.get());
  }
  void FuncSetMaxDynamicSharedMemory(gpurt::Function h, size_t bytes) override {
    auto* f = reinterpret_cast<SimFunction*>(h);
    KernelAttributes& a = f->kernel->attributes();
    size_t optin = Properties(f->device).shared_per_block_optin;
    if (bytes + a.static_smem_bytes > optin)
      gpurt::Fail(gpurt::kInvalidValue, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                std::to_string(bytes) + " bytes of dynamic plus " + std::to_string(a.static_smem_bytes) +
                    " of static shared memory exceed the " + std::to_string(optin) + " bytes a block may have");
    a.max_dynamic_smem_bytes = bytes;
  }
  void LaunchKernel(gpurt::Function h, gpurt::Dim3 grid, gpurt::Dim3 block, size_t smem, gpurt::Stream hs,
                    void** args) override;

  // ---- graphs ----
  void StreamBeginCapture(gpurt::Stream h) override {
    StreamImpl* s = Stream(h, "cudaStreamBeginCapture");
    if (!h) gpurt::Fail(gpurt::kCaptureUnsupported, "cudaStreamBeginCapture", "the legacy default stream cannot be captured");
    if (s->capturing) gpurt::Fail(gpurt::kIllegalState, "cudaStreamBeginCapture", "the stream is already capturing");
    s->capturing = true;
    s->capture_invalidated = false;
    s->capture_thread = std::this_thread::get_id();
    {
      std::lock_guard<std::mutex> g(s->capture_mu);
      s->captured.clear();
    }
    s->device()->capturing.fetch_add(1);
    ++tls_captures;
  }
  gpurt::Graph StreamEndCapture(gpurt::Stream h) override {
    StreamImpl* s = Stream(h, "cudaStreamEndCapture");
    if (!s->capturing) gpurt::Fail(gpurt::kIllegalState, "cudaStreamEndCapture", "the stream is not capturing");
    if (s->capture_thread != std::this_thread::get_id())
      gpurt::Fail(gpurt::kCaptureWrongThread, "cudaStreamEndCapture",
                "the capture was begun on another thread (global capture mode ends it on the thread that began it)");
    s->capturing = false;
    s->device()->capturing.fetch_sub(1);
    --tls_captures;
    std::vector<std::function<void(gpurt::Stream)>> nodes;
    {
      std::lock_guard<std::mutex> g(s->capture_mu);
      nodes.swap(s->captured);
    }
    if (s->capture_invalidated)
      gpurt::Fail(gpurt::kCaptureInvalidated, "cudaStreamEndCapture",
                "a prohibited call (synchronization or allocation) during the capture invalidated it");
    return reinterpret_cast<gpurt::Graph>(new SimGraph{s->device()->index, std::move(nodes)});
  }
  // cudaStreamCaptureStatusActive only: an invalidated capture reports cudaStreamCaptureStatusInvalidated.
  bool StreamIsCapturing(gpurt::Stream h) override {
    StreamImpl* s = Stream(h, "cudaStreamIsCapturing");
    return s->capturing && !s->capture_invalidated;
  }
  gpurt::GraphExec GraphInstantiate(gpurt::Graph g) override {
    return reinterpret_cast<gpurt::GraphExec>(new SimGraph(*reinterpret_cast<SimGraph*>(g)));
  }
  void GraphLaunch(gpurt::GraphExec g, gpurt::Stream h) override {
    auto* graph = reinterpret_cast<SimGraph*>(g);
    StreamImpl* s = Stream(h, "cudaGraphLaunch");
    if (graph->device != s->device()->index)
      gpurt::Fail(gpurt::kInvalidHandle, "cudaGraphLaunch",
                "the graph was captured on " + Gpu(graph->device) + " but the stream belongs to " +
                    Gpu(s->device()->index));
    s->device()->CheckSticky("cudaGraphLaunch");
    for (auto& node : graph->nodes) node(reinterpret_cast<gpurt::Stream>(s));
  }
  void GraphDestroy(gpurt::Graph g) override { delete reinterpret_cast<SimGraph*>(g); }
  void GraphExecDestroy(gpurt::GraphExec g) override { delete reinterpret_cast<SimGraph*>(g); }

  void* LibraryHandle(gpurt::Library lib, gpurt::Stream h) override;
  void Gemm(void* blas, gpurt::Stream h, const gpurt::GemmArgs& g) override;
  // cuDNN: sim_dnn.cc.
  size_t DnnConvolutionWorkspaceSize(void*, gpurt::Stream, const gpurt::ConvForwardArgs& a) override {
    const char* call = "cudnnGetConvolutionForwardWorkspaceSize";
    gpurt::CheckConvForward(a, call);
    return gpusim::AlgorithmWorkspace(gpusim::ProblemOf(a), a.algo, call);
  }
  size_t DnnConvolutionWorkspaceSize(void*, gpurt::Stream, const gpurt::ConvBackwardDataArgs& a) override {
    const char* call = "cudnnGetConvolutionBackwardDataWorkspaceSize";
    gpurt::CheckConvBackwardData(a, call);
    return gpusim::AlgorithmWorkspace(gpusim::ProblemOf(a), a.algo, call);
  }
  size_t DnnConvolutionWorkspaceSize(void*, gpurt::Stream, const gpurt::ConvBackwardFilterArgs& a) override {
    const char* call = "cudnnGetConvolutionBackwardFilterWorkspaceSize";
    gpurt::CheckConvBackwardFilter(a, call);
    return gpusim::AlgorithmWorkspace(gpusim::ProblemOf(a), a.algo, call);
  }
  std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(void*, gpurt::Stream h,
                                                               const gpurt::ConvForwardArgs& a) override {
    const char* call = "cudnnFindConvolutionForwardAlgorithmEx";
    gpurt::CheckConvForward(a, call);
    return Find(h, gpusim::ProblemOf(a), a.workspace_bytes, call);
  }
  std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(void*, gpurt::Stream h,
                                                               const gpurt::ConvBackwardDataArgs& a) override {
    const char* call = "cudnnFindConvolutionBackwardDataAlgorithmEx";
    gpurt::CheckConvBackwardData(a, call);
    return Find(h, gpusim::ProblemOf(a), a.workspace_bytes, call);
  }
  std::vector<gpurt::DnnAlgoPerf> DnnFindConvolutionAlgorithms(void*, gpurt::Stream h,
                                                               const gpurt::ConvBackwardFilterArgs& a) override {
    const char* call = "cudnnFindConvolutionBackwardFilterAlgorithmEx";
    gpurt::CheckConvBackwardFilter(a, call);
    return Find(h, gpusim::ProblemOf(a), a.workspace_bytes, call);
  }
  std::string DnnLibraryKey(int) override { return "gpusim dnn model 1"; }
  // A measurement as cuDNN's Find makes one: it waits for the stream (refused while capturing),
  // then reports every algorithm, those that ran fastest first, then those that could not run
  // (not supported, or more workspace than given), each in enum order.
  std::vector<gpurt::DnnAlgoPerf> Find(gpurt::Stream h, const gpusim::ConvProblem& p, size_t workspace,
                                       const char* call) {
    StreamImpl* s = Stream(h, call);
    ProhibitedInCapture(s, call);
    s->Drain();
    s->device()->CheckSticky(call);
    std::vector<gpurt::DnnAlgoPerf> algos = gpusim::ModelAlgorithms(p);
    for (gpurt::DnnAlgoPerf& a : algos)
      if (a.status == 0 && a.workspace > workspace) a.status = gpurt::kDnnNotSupported, a.time_ms = 0;
    std::stable_sort(algos.begin(), algos.end(), [](const gpurt::DnnAlgoPerf& x, const gpurt::DnnAlgoPerf& y) {
      if ((x.status == 0) != (y.status == 0)) return x.status == 0;
      return x.status == 0 && x.time_ms < y.time_ms;
    });
    return algos;
  }
  void DnnConvolutionForward(void* dnn, gpurt::Stream h, const gpurt::ConvForwardArgs& a) override {
    gpusim::DnnConvolutionForward(memory_, dnn, h, Stream(h, "cudnnConvolutionForward"), a);
  }
  void DnnConvolutionBackwardData(void* dnn, gpurt::Stream h, const gpurt::ConvBackwardDataArgs& a) override {
    gpusim::DnnConvolutionBackwardData(memory_, dnn, h, Stream(h, "cudnnConvolutionBackwardData"), a);
  }
  void DnnConvolutionBackwardFilter(void* dnn, gpurt::Stream h, const gpurt::ConvBackwardFilterArgs& a) override {
    gpusim::DnnConvolutionBackwardFilter(memory_, dnn, h, Stream(h, "cudnnConvolutionBackwardFilter"), a);
  }
  void DnnPoolingForward(void* dnn, gpurt::Stream h, const gpurt::PoolingForwardArgs& a) override {
    gpusim::DnnPoolingForward(memory_, dnn, h, Stream(h, "cudnnPoolingForward"), a);
  }
  void DnnBatchNormForwardTraining(void* dnn, gpurt::Stream h, const gpurt::BatchNormArgs& a) override {
    gpusim::DnnBatchNormForward(memory_, dnn, h, Stream(h, "cudnnBatchNormalizationForwardTraining"), a, true);
  }
  void DnnBatchNormForwardInference(void* dnn, gpurt::Stream h, const gpurt::BatchNormArgs& a) override {
    gpusim::DnnBatchNormForward(memory_, dnn, h, Stream(h, "cudnnBatchNormalizationForwardInference"), a, false);
  }
  void DnnPoolingBackward(void* dnn, gpurt::Stream h, const gpurt::PoolingBackwardArgs& a) override {
    gpusim::DnnPoolingBackward(memory_, dnn, h, Stream(h, "cudnnPoolingBackward"), a);
  }
  void DnnBatchNormBackward(void* dnn, gpurt::Stream h, const gpurt::BatchNormBackwardArgs& a) override {
    gpusim::DnnBatchNormBackward(memory_, dnn, h, Stream(h, "cudnnBatchNormalizationBackward"), a);
  }

  // ---- collectives: in-process, over the alias of each device's memory ----
  void AllReduce(std::span<const kiln::Device>, const coll::BufferSet& b, coll::ReduceOp op) override {
    coll::HostAllReduce(Aliased(b), op);
  }
  void Broadcast(std::span<const kiln::Device>, const coll::BufferSet& b, int root) override {
    coll::HostBroadcast(Aliased(b), root);
  }
  void ReduceScatter(std::span<const kiln::Device>, DType dt, std::span<const void* const> in, int64_t n,
                     std::span<void* const> out, coll::ReduceOp op) override {
    const size_t es = DTypeSize(dt);
    auto counts = coll::SplitCounts(n, static_cast<int>(in.size()));
    std::vector<const void*> i2;
    std::vector<void*> o2;
    for (size_t d = 0; d < in.size(); ++d) {
      i2.push_back(Alias(in[d], static_cast<size_t>(n) * es, "reduce_scatter"));
      o2.push_back(const_cast<void*>(Alias(out[d], static_cast<size_t>(counts[d]) * es, "reduce_scatter")));
    }
    coll::HostReduceScatter(dt, i2, n, o2, op);
  }
  void AllGather(std::span<const kiln::Device>, DType dt, std::span<const void* const> in, std::span<const int64_t> counts,
                 std::span<void* const> out) override {
    const size_t es = DTypeSize(dt);
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    std::vector<const void*> i2;
    std::vector<void*> o2;
    for (size_t d = 0; d < in.size(); ++d) {
      i2.push_back(Alias(in[d], static_cast<size_t>(counts[d]) * es, "all_gather"));
      o2.push_back(const_cast<void*>(Alias(out[d], static_cast<size_t>(total) * es, "all_gather")));
    }
    coll::HostAllGather(dt, i2, counts, o2);
  }

 private:
  SimDevice& Dev(int device, const char* call) {
    if (device < 0 || device >= DeviceCount())
      gpurt::Fail(gpurt::kInvalidDevice, call,
                Gpu(device) + " does not exist: KILN_GPU_SIM gives " + std::to_string(DeviceCount()) + " simulated GPUs");
    return *devices_[static_cast<size_t>(device)];
  }
  // nullptr: the legacy default stream of the current device.
  StreamImpl* Stream(gpurt::Stream h, const char* call) {
    if (h) return S(h);
    SimDevice& d = Dev(tls_device, call);
    std::lock_guard<std::mutex> g(d.streams_mu);
    if (!d.default_stream) d.default_stream = std::make_unique<StreamImpl>(&d, -1);
    return d.default_stream.get();
  }
  std::shared_ptr<EventState> Event(gpurt::Event e, const char* call) {
    if (!e) gpurt::Fail(gpurt::kInvalidHandle, call, "the event is null");
    return E(e);
  }
  // Whether work on `s` is captured instead of run. Once a prohibited call invalidated the capture,
  // every call on the stream fails with 901 until cudaStreamEndCapture, as on a GPU.
  bool Capturing(StreamImpl* s, const char* call) {
    if (s->capturing && s->capture_invalidated)
      gpurt::Fail(gpurt::kCaptureInvalidated, call,
                "operation failed due to a previous error during capture: the stream's capture was invalidated; "
                "end it with cudaStreamEndCapture before using the stream again");
    return s->capturing;
  }
  void RecordOn(StreamImpl* s, const std::shared_ptr<EventState>& ev) {
    uint64_t gen;
    {
      std::lock_guard<std::mutex> g(ev->mu);
      gen = ++ev->recorded;
    }
    s->Enqueue([ev, gen] {
      std::lock_guard<std::mutex> g(ev->mu);
      if (gen > ev->completed) ev->completed = gen, ev->when = std::chrono::steady_clock::now();
      ev->cv.notify_all();
    });
  }
  void WaitOn(StreamImpl* s, const std::shared_ptr<EventState>& ev) {
    uint64_t target;
    {
      std::lock_guard<std::mutex> g(ev->mu);
      target = ev->recorded;  // the most recent record; none: nothing to wait for
    }
    if (!target) return;
    SimDevice* src = devices_[static_cast<size_t>(ev->device)].get();
    s->Enqueue([ev, target, src] {
      std::unique_lock<std::mutex> g(ev->mu);
      ev->cv.wait(g, [&] { return ev->completed >= target || src->sticky.load(); });
    });
  }
  void InvalidateCaptures(SimDevice& d) {
    std::lock_guard<std::mutex> g(d.streams_mu);
    for (StreamImpl* s : d.streams)
      if (s->capturing) s->capture_invalidated = true;
  }
  void ProhibitedInCapture(StreamImpl* s, const char* call) {
    if (!s->capturing) return;
    s->capture_invalidated = true;
    gpurt::Fail(gpurt::kCaptureUnsupported, call,
              "the stream is being captured into a graph, where this call is not allowed (the capture is now "
              "invalidated); synchronize after cudaStreamEndCapture");
  }
  // Thread-local capture mode (cudaStreamCaptureModeThreadLocal): the calling thread's captures.
  void ProhibitedDuringAnyCapture(const char* call) {
    if (tls_captures == 0) return;
    for (auto& d : devices_) {
      std::lock_guard<std::mutex> g(d->streams_mu);
      for (StreamImpl* s : d->streams)
        if (s->capturing && s->capture_thread == std::this_thread::get_id()) s->capture_invalidated = true;
    }
    gpurt::Fail(gpurt::kCaptureUnsupported, call,
              "this thread is capturing a stream into a graph, where allocating or freeing device memory is "
              "not allowed (the capture is now invalidated); allocate before the capture begins");
  }
  void HostSide(const void* p, size_t n, const char* call, const char* what) {
    if (memory_.DeviceOf(p) >= 0)
      gpurt::Fail(gpurt::kInvalidValue, call,
                std::string(what) + " is device memory of " + Gpu(memory_.DeviceOf(p)) +
                    " but the copy's direction says host memory; use the kind that matches both pointers");
  }
  const void* Alias(const void* p, size_t n, const char* call) {
    memory_.CheckDeviceRange(p, n, call, "a buffer");
    return memory_.Alias(p);
  }
  coll::BufferSet Aliased(const coll::BufferSet& b) {
    coll::BufferSet a = b;
    const size_t K = b.numel.size();
    for (size_t i = 0; i < b.ptrs.size(); ++i)
      a.ptrs[i] = const_cast<void*>(Alias(b.ptrs[i], static_cast<size_t>(b.numel[i % K]) * DTypeSize(b.dtype), "collective"));
    return a;
  }

  Memory memory_;
  std::vector<std::unique_ptr<SimDevice>> devices_;
  static inline thread_local int tls_captures = 0;  ///< captures this thread has begun and not ended
  std::mutex lib_mu_;
  std::map<std::pair<int, int>, std::unique_ptr<std::pair<gpurt::Library, gpurt::Stream>>> libs_;
};

void SimPlatform::LaunchKernel(gpurt::Function h, gpurt::Dim3 grid, gpurt::Dim3 block, size_t smem, gpurt::Stream hs,
                               void** args) {
  const char* call = "cuLaunchKernel";
  auto* f = reinterpret_cast<SimFunction*>(h);
  if (!f) gpurt::Fail(gpurt::kInvalidHandle, call, "the kernel is null");
  StreamImpl* s = Stream(hs, call);
  SimDevice& d = *s->device();
  // The driver launches into the calling thread's current context: a stream or kernel of another
  // device is an invalid handle there.
  if (d.index != tls_device)
    gpurt::Fail(gpurt::kInvalidHandle, call,
              "the stream belongs to " + Gpu(d.index) + " but this thread's current device is " + Gpu(tls_device) +
                  "; call cudaSetDevice(" + std::to_string(d.index) + ") on this thread first");
  if (f->device != d.index)
    gpurt::Fail(gpurt::kInvalidHandle, call,
              "kernel '" + f->name + "' was loaded on " + Gpu(f->device) + ", not on the stream's " + Gpu(d.index) +
                  "; load the module on every device that launches it");
  d.CheckSticky(call);
  const gpurt::DeviceProperties p = Properties(d.index);
  KernelAttributes& a = f->kernel->attributes();
  auto dims = [](gpurt::Dim3 v) {
    return "(" + std::to_string(v.x) + ", " + std::to_string(v.y) + ", " + std::to_string(v.z) + ")";
  };
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const int max_threads = std::min(a.max_threads_per_block, p.max_threads_per_block);
  if (!block.x || !block.y || !block.z || block.x > p.max_block.x || block.y > p.max_block.y ||
      block.z > p.max_block.z || threads > static_cast<uint64_t>(max_threads))
    gpurt::Fail(gpurt::kInvalidValue, call,
              "kernel '" + f->name + "': block " + dims(block) + " has " + std::to_string(threads) +
                  " threads; a block may have at most " + std::to_string(max_threads) + " threads and dimensions " +
                  dims(p.max_block));
  if (!grid.x || !grid.y || !grid.z || grid.x > p.max_grid.x || grid.y > p.max_grid.y || grid.z > p.max_grid.z)
    gpurt::Fail(gpurt::kInvalidValue, call,
              "kernel '" + f->name + "': grid " + dims(grid) + " is outside 1.." + dims(p.max_grid));
  if (smem > a.max_dynamic_smem_bytes || smem + a.static_smem_bytes > p.shared_per_block_optin)
    gpurt::Fail(gpurt::kInvalidValue, call,
              "kernel '" + f->name + "': " + std::to_string(smem) + " bytes of dynamic shared memory, but the kernel "
                  "allows " + std::to_string(a.max_dynamic_smem_bytes) + " (above 48 KiB a kernel must opt in with "
                  "cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), up to " +
                  std::to_string(p.shared_per_block_optin) + " bytes with its static shared memory)");
  const uint64_t warps = (threads + 31) / 32;
  if (static_cast<uint64_t>(a.num_regs) * warps * 32 > static_cast<uint64_t>(p.registers_per_block))
    gpurt::Fail(gpurt::kLaunchOutOfResources, call,
              "kernel '" + f->name + "' uses " + std::to_string(a.num_regs) + " registers per thread; " +
                  std::to_string(threads) + " threads need " + std::to_string(a.num_regs * warps * 32) +
                  ", more than the " + std::to_string(p.registers_per_block) +
                  " a block has: launch smaller blocks or limit registers (__launch_bounds__)");

  // The parameter values are copied now, as cuLaunchKernel does, when the kernel says their sizes.
  struct Packed {
    std::vector<char> bytes;
    std::vector<void*> ptrs;
  };
  auto packed = std::make_shared<Packed>();
  const bool known = !a.param_sizes.empty();
  if (known) {
    std::vector<size_t> off;
    size_t total = 0;
    for (size_t sz : a.param_sizes) off.push_back(total), total += (sz + 7) & ~size_t{7};
    packed->bytes.resize(total);
    for (size_t i = 0; i < a.param_sizes.size(); ++i)
      std::memcpy(packed->bytes.data() + off[i], args[i], a.param_sizes[i]);
    for (size_t o : off) packed->ptrs.push_back(packed->bytes.data() + o);
  }
  EmulatedKernel* k = f->kernel;
  std::string name = f->name;
  const Memory* memory = &memory_;
  auto run = [k, grid, block, smem, packed, name, memory](void** argv) {
    DeviceMemoryScope scope(*memory);  // the kernel reaches this platform's memory, not another's
    std::unique_ptr<KernelFault> fault = k->Run(grid, block, smem, argv);
    if (fault) gpurt::Fail(fault->cuda_error, "kernel '" + name + "'", fault->message);
  };
  if (Capturing(s, call)) {
    if (!known)
      gpurt::Fail(gpurt::kNotSupported, call,
                "kernel '" + name + "' does not say its parameter sizes, so its launch cannot be captured");
    s->Capture([run, packed](gpurt::Stream r) { S(r)->Enqueue([run, packed] { run(packed->ptrs.data()); }); });
    return;
  }
  if (known) {
    s->Enqueue([run, packed] { run(packed->ptrs.data()); });
  } else {  // the caller's args must outlive the kernel: wait for it
    s->Enqueue([run, args] { run(args); });
    s->Drain();
  }
}

// A simulated library handle: which library, bound to which stream (the library calls of the
// simulator check that the handle runs on the stream they are issued to).
void* SimPlatform::LibraryHandle(gpurt::Library lib, gpurt::Stream h) {
  StreamImpl* s = Stream(h, "library handle");
  std::lock_guard<std::mutex> g(lib_mu_);
  auto& slot = libs_[{static_cast<int>(lib), s->device()->index}];
  if (!slot) slot = std::make_unique<std::pair<gpurt::Library, gpurt::Stream>>(lib, h);
  slot->second = h;
  return slot.get();
}

// What `blas` is bound to, for sim_blas.cc's checks (the handles are this class's).
void SimPlatform::Gemm(void* blas, gpurt::Stream h, const gpurt::GemmArgs& g) {
  LibraryBinding bound;
  {
    std::lock_guard<std::mutex> lk(lib_mu_);
    for (const auto& [key, slot] : libs_)
      if (slot.get() == blas) bound = {true, slot->first, key.second, slot->second};
  }
  EnqueueGemm(memory_, Stream(h, "cublasLtMatmul"), h, tls_device, bound, g);
}

}  // namespace
}  // namespace kiln::gpusim

namespace kiln::gpurt {
Platform* CreateSimulatedPlatform(int devices, size_t bytes_per_device) {
  return new gpusim::SimPlatform(devices, bytes_per_device);
}
}  // namespace kiln::gpurt

// kiln::cuda (cuda.h) over the GPU platform (gpu.h): one code path for CUDA and the simulator.
//
// Pinned staging: kiln's host tensors are pageable memory, which the GPU's copy engines cannot
// read directly; the driver's own path for them ran at 7-15 GB/s on an H100 against 54 GB/s from
// pinned memory. A worker copying 1 MiB or more of pageable memory goes through two pinned
// buffers of its own instead: host memcpy (split over kiln's CPU threads) into one while the DMA
// of the other runs, ordered by events on the worker's stream.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <tuple>
#include <vector>
#include <utility>
#include <functional>
#include <exception>

#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/cpu/movement.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/lanes.h"
#include "kiln/runtime/gpu.h"

namespace kiln::cuda {

namespace {
thread_local gpurt::Stream tls_stream = nullptr;
gpurt::Platform& P() { return gpurt::Get(); }
}  // namespace

bool CompiledWithCuda() {
#ifdef KILN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int DeviceCount() { return P().DeviceCount(); }

void BindWorkerThread(const Device& d, int stream_kind) {
  (void)stream_kind;
  P().SetDevice(d.index);
  tls_stream = P().StreamCreate();
}

void* CurrentStream() { return tls_stream; }

void SynchronizeWorkerStream() {
  if (tls_stream) P().StreamSynchronize(tls_stream);
}

void SynchronizeDevice(const Device& d) {
  gpurt::DeviceGuard g(d.index);
  P().DeviceSynchronize();
}

// A refusal is a MemoryError naming the device and the size (Python's OutOfMemoryError); the
// caching allocators catch it to empty their cache and try once more.
void* DeviceMalloc(const Device& d, size_t nbytes) {
  gpurt::DeviceGuard g(d.index);
  try {
    return P().Malloc(nbytes);
  } catch (const gpurt::GpuError& e) {
    if (e.code() == gpurt::kOutOfMemory)
      KILN_THROW(MemoryError) << "out of memory on " << d.str() << " allocating " << nbytes
                              << " bytes: the device refused (" << e.what()
                              << "); free tensors, use smaller batches, or call kiln.empty_cache()";
    throw;
  }
}

void DeviceFree(const Device& d, void* p) {
  gpurt::DeviceGuard g(d.index);
  P().Free(p);
}

void* HostMallocPinned(size_t nbytes) {
  try {
    return P().HostAllocPinned(nbytes);
  } catch (const gpurt::GpuError& e) {
    if (e.code() == gpurt::kOutOfMemory)
      KILN_THROW(MemoryError) << "out of memory on pinned host memory allocating " << nbytes << " bytes ("
                              << e.what() << "); free tensors or use smaller batches";
    throw;
  }
}
void HostFreePinned(void* p) { P().HostFreePinned(p); }

namespace {

constexpr size_t kStageChunk = size_t{8} << 20;  // bytes per staging buffer
constexpr size_t kStageMin = size_t{1} << 20;    // smaller copies go to MemcpyAsync as they are

// Two pinned buffers per worker thread (so per stream and device), each with the event recorded
// after the last DMA that used it. Kept for the thread's life: workers live as long as the engine.
struct Staging {
  void* buf[2] = {nullptr, nullptr};
  gpurt::Event done[2] = {nullptr, nullptr};
};
thread_local Staging tls_staging;

Staging& WorkerStaging() {
  Staging& s = tls_staging;
  if (!s.buf[0]) {
    for (int i = 0; i < 2; ++i) {
      s.buf[i] = P().HostAllocPinned(kStageChunk);
      s.done[i] = P().EventCreate(/*timing=*/false);
    }
  }
  return s;
}

void HostCopy(void* dst, const void* src, size_t n) {
  constexpr size_t kPiece = size_t{1} << 20;
  host::ParallelFor(static_cast<int64_t>((n + kPiece - 1) / kPiece), 2, [&](int64_t b, int64_t e) {
    size_t lo = static_cast<size_t>(b) * kPiece, hi = std::min(n, static_cast<size_t>(e) * kPiece);
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, hi - lo);
  });
}

void StagedHostToDevice(char* dst, const char* src, size_t n) {
  Staging& s = WorkerStaging();
  for (size_t off = 0, i = 0; off < n; off += kStageChunk, ++i) {
    const size_t k = i & 1, len = std::min(kStageChunk, n - off);
    P().EventSynchronize(s.done[k]);  // its last DMA is over
    HostCopy(s.buf[k], src + off, len);
    P().MemcpyAsync(dst + off, s.buf[k], len, gpurt::CopyKind::kHostToDevice, tls_stream);
    P().EventRecord(s.done[k], tls_stream);
  }
}

void StagedDeviceToHost(char* dst, const char* src, size_t n) {
  Staging& s = WorkerStaging();
  const size_t chunks = (n + kStageChunk - 1) / kStageChunk;
  auto issue = [&](size_t i) {  // buffer i & 1 was emptied by the host copy of chunk i - 2
    const size_t off = i * kStageChunk, len = std::min(kStageChunk, n - off);
    P().MemcpyAsync(s.buf[i & 1], src + off, len, gpurt::CopyKind::kDeviceToHost, tls_stream);
    P().EventRecord(s.done[i & 1], tls_stream);
  };
  issue(0);
  for (size_t i = 0; i < chunks; ++i) {
    if (i + 1 < chunks) issue(i + 1);  // the next DMA runs while this chunk is copied out
    const size_t off = i * kStageChunk, len = std::min(kStageChunk, n - off);
    P().EventSynchronize(s.done[i & 1]);
    HostCopy(dst + off, s.buf[i & 1], len);
  }
}

}  // namespace

void CopyAsync(void* dst, const void* src, size_t nbytes, CopyKind kind) {
  // Staging needs the worker's own stream (events and buffers are the worker's).
  if (tls_stream && nbytes >= kStageMin) {
    if (kind == CopyKind::kHostToDevice && !P().IsPinnedHost(src)) {
      StagedHostToDevice(static_cast<char*>(dst), static_cast<const char*>(src), nbytes);
      return;
    }
    if (kind == CopyKind::kDeviceToHost && !P().IsPinnedHost(dst)) {
      StagedDeviceToHost(static_cast<char*>(dst), static_cast<const char*>(src), nbytes);
      return;
    }
  }
  gpurt::CopyKind k = kind == CopyKind::kHostToDevice   ? gpurt::CopyKind::kHostToDevice
                    : kind == CopyKind::kDeviceToHost ? gpurt::CopyKind::kDeviceToHost
                                                      : gpurt::CopyKind::kDeviceToDevice;
  P().MemcpyAsync(dst, src, nbytes, k, tls_stream);
}

namespace {
constexpr int kMaxRecordDevices = 64;
constexpr size_t kRecordBytes = 8 * sizeof(int64_t);  // the layout: codegen/cu/index.cu RecordFirstBad
struct ErrorRecord {
  int64_t* device = nullptr;
  int64_t* host = nullptr;  // pinned: written by the copies PublishDeviceErrors queues
  gpurt::Stream clear = nullptr;  // the record's own stream: clearing waits for nothing else
  int64_t raised = 0;       // the number of the last error raised (guarded by the mutex)
};
struct ErrorRecords {
  std::mutex mu;
  std::atomic<ErrorRecord*> of[kMaxRecordDevices] = {};
};
ErrorRecords& Records() {
  static auto* r = new ErrorRecords();  // leaked: a sync point may run while statics are destroyed
  return *r;
}
std::atomic<bool> g_any_record{false};

ErrorRecord& RecordOf(const Device& d) {
  KILN_CHECK(d.index >= 0 && d.index < kMaxRecordDevices) << d.str();
  ErrorRecords& r = Records();
  if (ErrorRecord* e = r.of[d.index].load(std::memory_order_acquire)) return *e;
  std::lock_guard<std::mutex> lock(r.mu);
  if (ErrorRecord* e = r.of[d.index].load(std::memory_order_acquire)) return *e;
  // First use: a plan's first call runs its steps plainly (never captured), so this allocation and
  // wait happen outside any capture.
  gpurt::DeviceGuard g(d.index);
  auto e = std::make_unique<ErrorRecord>();
  e->host = static_cast<int64_t*>(HostMallocPinned(kRecordBytes));
  std::memset(e->host, 0, kRecordBytes);
  e->device = static_cast<int64_t*>(DeviceMalloc(d, kRecordBytes));
  e->clear = P().StreamCreate();
  P().MemsetAsync(e->device, 0, kRecordBytes, e->clear);
  P().StreamSynchronize(e->clear);
  ErrorRecord* made = e.release();  // leaked with the records
  r.of[d.index].store(made, std::memory_order_release);
  g_any_record.store(true, std::memory_order_release);
  return *made;
}
}  // namespace

int64_t* DeviceErrorRecord(const Device& d) { return RecordOf(d).device; }

void PublishDeviceErrors(const Device& d) {
  ErrorRecord& e = RecordOf(d);
  P().MemcpyAsync(e.host, e.device, kRecordBytes, gpurt::CopyKind::kDeviceToHost, tls_stream);
}

void RaiseDeferredDeviceErrors() {
  if (!g_any_record.load(std::memory_order_acquire)) return;
  ErrorRecords& r = Records();
  int64_t found[8] = {};
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(r.mu);  // one raiser at a time: each error is raised once
    for (int i = 0; i < kMaxRecordDevices && device < 0; ++i) {
      ErrorRecord* e = r.of[i].load(std::memory_order_acquire);
      if (!e) continue;
      volatile const int64_t* h = e->host;  // written by DMAs: the latest one the sync point waited for
      for (int k = 0; k < 8; ++k) found[k] = h[k];
      // Not whole (a copy caught it half written: the next copy brings it whole), or raised
      // already (a copy queued before the record was cleared).
      if (found[0] < static_cast<int64_t>(DeferredCheck::kBadLabel) ||
          found[0] > static_cast<int64_t>(DeferredCheck::kBadTakeGradIndex) || found[1] != found[5] ||
          found[1] <= e->raised)
        continue;
      e->raised = found[1];
      device = i;
      // The device's record takes the next error once cleared: its check word only, on its own
      // stream (no wait for the device: another thread may be capturing one of its streams).
      gpurt::DeviceGuard g(i);
      P().MemsetAsync(e->device, 0, sizeof(int64_t), e->clear);
      P().StreamSynchronize(e->clear);
    }
  }
  if (device < 0) return;
  const auto kind = static_cast<DeferredCheck>(found[0]);
  const char* op = kind == DeferredCheck::kBadLabel ? "one_hot" : kind == DeferredCheck::kBadTakeIndex ? "take" : "take_grad";
  const std::string found_by = std::string("; found by ") + gpu(device).str() + "'s check of an earlier " + op +
                               ", which the host does not wait for: raised at this synchronization with the GPU "
                               "(the work queued after that " + op + " ran, optimizer steps included)";
  try {
    if (kind == DeferredCheck::kBadLabel) host::RaiseBadLabel(found[3], found[2], found[4], found_by.c_str());
    host::RaiseBadIndex(op, found[3], found[2], static_cast<int>(found[7]), found[4], found_by.c_str());
  } catch (const ValueError& e) {
    throw DeferredDeviceError(e.what());
  }
}

void CopyPeerAsync(void* dst, const Device& dst_dev, const void* src, const Device& src_dev, size_t nbytes) {
  P().MemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, nbytes, tls_stream);
}

void Memset(void* dst, int value, size_t nbytes) { P().MemsetAsync(dst, value, nbytes, tls_stream); }

int DriverVersion() { return P().DriverVersion(); }

std::string DeviceDescription(const Device& d) {
  gpurt::DeviceProperties p = P().Properties(d.index);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB", p.name.c_str(), p.cc_major, p.cc_minor,
                p.multiprocessors, static_cast<double>(p.total_memory) / (1u << 30),
                static_cast<double>(p.l2_bytes) / (1u << 20));
  return buf;
}

int ComputeCapability(const Device& d) {
  gpurt::DeviceProperties p = P().Properties(d.index);
  return p.cc_major * 10 + p.cc_minor;
}

void* LoadKernel(const Device& d, const std::string& nvptx_ir, const std::string& ptx, const std::string& name) {
  static std::mutex mu;
  static auto* modules = new std::map<std::tuple<int, std::string, std::string>, gpurt::Module>;  // process lifetime
  static auto* kernels = new std::map<std::pair<gpurt::Module, std::string>, gpurt::Function>;
  std::lock_guard<std::mutex> lock(mu);
  gpurt::DeviceGuard guard(d.index);
  auto key = std::make_tuple(d.index, nvptx_ir, ptx);
  auto it = modules->find(key);
  if (it == modules->end()) it = modules->emplace(key, P().ModuleLoad(gpurt::ModuleImage{nvptx_ir, ptx})).first;
  auto& fn = (*kernels)[{it->second, name}];
  if (!fn) {
    try {
      fn = P().ModuleGetFunction(it->second, name);
    } catch (...) {
      kernels->erase({it->second, name});
      throw;
    }
  }
  return fn;
}

void* LoadKernel(const Device& d, const std::string& ptx, const std::string& name) {
  return LoadKernel(d, std::string(), ptx, name);
}

void LaunchKernel(void* kernel, unsigned grid, unsigned block, unsigned shared_bytes, void** args, void* stream) {
  gpurt::Stream s = stream ? static_cast<gpurt::Stream>(stream) : tls_stream;
  P().LaunchKernel(static_cast<gpurt::Function>(kernel), gpurt::Dim3{grid, 1, 1}, gpurt::Dim3{block, 1, 1}, shared_bytes, s,
                   args);
}

// Set from BeginCapture to EndCapture, also while the capture is invalidated (where
// cudaStreamIsCapturing says it is not active): the allocator must not free to the shared pool,
// query events or record them then.
thread_local bool tls_capturing = false;

void BeginCapture() {
  P().StreamBeginCapture(tls_stream);
  tls_capturing = true;
}

void* EndCapture() {
  tls_capturing = false;  // ended, whether or not it succeeds
  gpurt::Graph g = P().StreamEndCapture(tls_stream);
  gpurt::GraphExec exec = nullptr;
  try {
    exec = P().GraphInstantiate(g);
  } catch (...) {
    P().GraphDestroy(g);
    throw;
  }
  P().GraphDestroy(g);
  return exec;
}

bool Capturing() { return tls_capturing; }

void LaunchGraph(void* graph) { P().GraphLaunch(static_cast<gpurt::GraphExec>(graph), tls_stream); }

void DestroyGraph(void* graph) { P().GraphExecDestroy(static_cast<gpurt::GraphExec>(graph)); }

}  // namespace kiln::cuda

namespace kiln::exec {

namespace {

// The lanes of a GPU worker thread: lane 0 is the worker's stream, the others streams of the
// worker's own, created on first use and kept. Begin forks them from lane 0 (they start after its
// earlier work), Finish joins them back (lane 0's later work waits for them), all by events:
// nothing here blocks the host.
class StreamLanes : public Lanes {
 public:
  int MaxLanes() const override { return 4; }

  bool Begin(int num_lanes, int num_steps, const std::function<void(int)>& launch) override {
    if (busy_ || !cuda::tls_stream || num_lanes > MaxLanes()) return false;
    busy_ = true;
    launch_ = &launch;
    error_ = nullptr;
    base_ = cuda::tls_stream;
    while (static_cast<int>(streams_.size()) < num_lanes - 1) streams_.push_back(cuda::P().StreamCreate());
    while (static_cast<int>(events_.size()) < num_steps + num_lanes) events_.push_back(cuda::P().EventCreate(false));
    num_lanes_ = num_lanes;
    num_steps_ = num_steps;
    gpurt::Event fork = events_[static_cast<size_t>(num_steps)];
    cuda::P().EventRecord(fork, base_);
    for (int l = 1; l < num_lanes; ++l) cuda::P().StreamWaitEvent(Stream(l), fork);
    return true;
  }
  void Wait(int lane, int event) override { cuda::P().StreamWaitEvent(Stream(lane), events_[static_cast<size_t>(event)]); }
  void Launch(int lane, int step) override {
    if (error_) return;  // the steps after a failed one are skipped
    cuda::tls_stream = Stream(lane);
    try {
      (*launch_)(step);
    } catch (...) {
      error_ = std::current_exception();
    }
    cuda::tls_stream = base_;
  }
  void Record(int lane, int event) override { cuda::P().EventRecord(events_[static_cast<size_t>(event)], Stream(lane)); }
  void Finish() override {
    for (int l = 1; l < num_lanes_; ++l) {
      gpurt::Event join = events_[static_cast<size_t>(num_steps_ + l)];
      cuda::P().EventRecord(join, Stream(l));
      cuda::P().StreamWaitEvent(base_, join);
    }
    busy_ = false;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  gpurt::Stream Stream(int lane) const { return lane == 0 ? base_ : streams_[static_cast<size_t>(lane - 1)]; }
  bool busy_ = false;
  const std::function<void(int)>* launch_ = nullptr;
  std::exception_ptr error_;
  gpurt::Stream base_ = nullptr;
  std::vector<gpurt::Stream> streams_;  // lanes 1, 2, ...: kept for the thread's life
  std::vector<gpurt::Event> events_;    // one per step, then the fork and one join per lane
  int num_lanes_ = 0, num_steps_ = 0;
};

}  // namespace

Lanes& GpuLanes() {
  thread_local StreamLanes lanes;
  return lanes;
}

}  // namespace kiln::exec

namespace kiln {
int NumGPUs() { return cuda::DeviceCount(); }
}  // namespace kiln

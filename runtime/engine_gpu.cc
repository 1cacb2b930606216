// GPU ordering for the engines (see engine_gpu.h): events on streams instead of host waits.
#include "engine_gpu.h"

#include <atomic>
#include <mutex>

#include "engine_task.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/gpu.h"

namespace kiln::engine::detail {

namespace {

constexpr int kMaxGpus = 64;
std::atomic<uint64_t> g_used_devices{0};  // bit d: a GPU task ran on gpu(d)

// Timing-free events of one device, reused once no variable refers to them.
struct EventPool {
  std::mutex mu;
  std::vector<gpurt::Event> free;
};
EventPool& Pool(int device) {
  static EventPool* pools = new EventPool[kMaxGpus];  // process lifetime
  return pools[device];
}

}  // namespace

struct GpuMark {
  int device;
  gpurt::Stream stream;
  gpurt::Event event;
  ~GpuMark() {
    EventPool& p = Pool(device);
    std::lock_guard<std::mutex> g(p.mu);
    p.free.push_back(event);
  }
};

namespace {

std::shared_ptr<GpuMark> NewMark(int device, gpurt::Stream s) {
  gpurt::Event e = nullptr;
  {
    EventPool& p = Pool(device);
    std::lock_guard<std::mutex> g(p.mu);
    if (!p.free.empty()) e = p.free.back(), p.free.pop_back();
  }
  if (!e) e = gpurt::Get().EventCreate(/*timing=*/false);  // a worker of `device`: it is current
  std::shared_ptr<GpuMark> m(new GpuMark{device, s, e});
  gpurt::Get().EventRecord(e, s);
  return m;
}

bool OrdersOnStream(const TaskOptions& o) {
  return o.device.is_gpu() && o.stream != StreamKind::kComm && static_cast<uint8_t>(o.stream) != 255 &&
         cuda::CurrentStream() != nullptr;
}

void Collect(Var* v, bool write, std::vector<std::shared_ptr<GpuMark>>* out) {
  if (!v->gpu.load(std::memory_order_acquire)) return;
  std::lock_guard<SpinLock> g(v->mu);
  GpuVarState* s = v->gpu.load(std::memory_order_relaxed);
  if (s->write) out->push_back(s->write);
  if (write) out->insert(out->end(), s->reads.begin(), s->reads.end());
}

GpuVarState* State(Var* v) {  // under v->mu
  GpuVarState* s = v->gpu.load(std::memory_order_relaxed);
  if (!s) v->gpu.store(s = new GpuVarState(), std::memory_order_release);
  return s;
}

}  // namespace

void WaitForGpuWork(std::span<Var* const> reads, std::span<Var* const> writes, const TaskOptions& o) {
  std::vector<std::shared_ptr<GpuMark>> marks;
  for (Var* v : reads) Collect(v, false, &marks);
  for (Var* v : writes) Collect(v, true, &marks);
  if (marks.empty()) return;
  if (OrdersOnStream(o)) {
    auto own = static_cast<gpurt::Stream>(cuda::CurrentStream());
    for (const auto& m : marks)
      if (m->stream != own) gpurt::Get().StreamWaitEvent(own, m->event);
  } else {
    for (const auto& m : marks) gpurt::Get().EventSynchronize(m->event);
  }
}

void MarkGpuWork(std::span<Var* const> reads, std::span<Var* const> writes, const TaskOptions& o) {
  if (o.device.index < kMaxGpus) g_used_devices.fetch_or(uint64_t{1} << o.device.index, std::memory_order_relaxed);
  if (!OrdersOnStream(o) || o.stream == StreamKind::kCopyD2H) {
    // Copy-out results are host memory, communication reaches memory outside the stream: done
    // when the stream is. Nothing stays pending on the variables written.
    cuda::SynchronizeWorkerStream();
    for (Var* v : writes) {
      if (!v->gpu.load(std::memory_order_acquire)) continue;
      std::lock_guard<SpinLock> g(v->mu);
      GpuVarState* s = v->gpu.load(std::memory_order_relaxed);
      s->write.reset();
      s->reads.clear();
    }
    return;
  }
  std::shared_ptr<GpuMark> m = NewMark(o.device.index, static_cast<gpurt::Stream>(cuda::CurrentStream()));
  for (Var* v : writes) {
    std::lock_guard<SpinLock> g(v->mu);
    GpuVarState* s = State(v);
    s->write = m;
    s->reads.clear();
  }
  for (Var* v : reads) {
    bool written = false;
    for (Var* w : writes) written |= w == v;
    if (written) continue;
    std::lock_guard<SpinLock> g(v->mu);
    GpuVarState* s = State(v);
    if (s->reads.size() >= 16) {  // many readers between writes: forget those that are done
      std::erase_if(s->reads, [](const std::shared_ptr<GpuMark>& r) { return gpurt::Get().EventQuery(r->event); });
    }
    s->reads.push_back(m);
  }
}

void WaitForGpuWrite(Var* v) {
  if (!v->gpu.load(std::memory_order_acquire)) return;
  std::shared_ptr<GpuMark> m;
  {
    std::lock_guard<SpinLock> g(v->mu);
    m = v->gpu.load(std::memory_order_relaxed)->write;
  }
  if (m) gpurt::Get().EventSynchronize(m->event);
}

void WaitForAllGpuWork() {
  uint64_t used = g_used_devices.load(std::memory_order_relaxed);
  for (int d = 0; used; ++d, used >>= 1)
    if (used & 1) cuda::SynchronizeDevice(gpu(d));
}

void DeleteGpuState(GpuVarState* s) { delete s; }

}  // namespace kiln::engine::detail

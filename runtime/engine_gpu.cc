// GPU ordering for the engines (see engine_gpu.h): events on streams instead of host waits.
#include "engine_gpu.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "engine_task.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/interrupt.h"
#include "kiln/runtime/wait_point.h"

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
    // A copy to the CPU is a sync point: a GPU check that failed fails it (cuda.h DeferredCheck).
    if (o.stream == StreamKind::kCopyD2H) cuda::RaiseDeferredDeviceErrors();
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

namespace {

// The sync points' waits for GPU work answer the interrupt check (interrupt.h) as the engine's
// own waits do. An event is polled: spinning first (most waits are short, and the driver's own
// wait spins too), then sleeping a little longer each time, never more than kMaxNap, so that a
// long wait ends at most that late. A device has no query, so its synchronization runs on a
// thread of its own while the caller waits interruptibly; an interrupted caller leaves it
// running, and the next caller's request is served after it.
constexpr auto kSpin = std::chrono::microseconds(500);
constexpr auto kMaxNap = std::chrono::microseconds(200);

void SyncEventInterruptibly(gpurt::Event e) {
  gpurt::Platform& p = gpurt::Get();
  InterruptCheck check = GetInterruptCheck();
  if (!check) return p.EventSynchronize(e);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point next_check = start + kInterruptPoll;
  auto nap = std::chrono::microseconds(10);
  while (!p.EventQuery(e)) {
    Clock::time_point now = Clock::now();
    if (now - start < kSpin) {
      std::this_thread::yield();
      continue;
    }
    if (now >= next_check) {
      check();
      next_check = now + kInterruptPoll;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, kMaxNap);
  }
}

// One device's synchronizer. Requests are numbered; a synchronization that starts after request
// n was made covers it (it waits for all work issued before it began), so one may serve many.
struct DeviceSyncer {
  int device = 0;
  std::mutex mu;
  std::condition_variable requested_cv;
  uint64_t requested = 0, done = 0;
  uint64_t failed_from = 1, failed_to = 0;  // the requests the last failed synchronization covered
  std::exception_ptr error;
  WaitPoint finished;

  void Loop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      requested_cv.wait(lock, [&] { return requested > done; });
      uint64_t upto = requested;
      lock.unlock();
      std::exception_ptr err;
      try {
        cuda::SynchronizeDevice(gpu(device));
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (err) failed_from = done + 1, failed_to = upto, error = err;
      done = upto;
      lock.unlock();
      finished.Notify();
      lock.lock();
    }
  }

  void Sync() {
    uint64_t mine;
    {
      std::lock_guard<std::mutex> g(mu);
      mine = ++requested;
    }
    requested_cv.notify_one();
    finished.WaitInterruptible([&] {
      std::lock_guard<std::mutex> g(mu);
      return done >= mine;
    });
    std::lock_guard<std::mutex> g(mu);
    if (mine >= failed_from && mine <= failed_to) std::rethrow_exception(error);
  }
};

void SyncDeviceInterruptibly(int device) {
  if (!GetInterruptCheck()) return cuda::SynchronizeDevice(gpu(device));
  static std::mutex mu;
  static DeviceSyncer* syncers[kMaxGpus] = {};  // process lifetime, as their threads
  DeviceSyncer* s;
  {
    std::lock_guard<std::mutex> g(mu);
    if (!syncers[device]) {
      syncers[device] = new DeviceSyncer();
      syncers[device]->device = device;
      std::thread([s = syncers[device]] { s->Loop(); }).detach();
    }
    s = syncers[device];
  }
  s->Sync();
}

}  // namespace

void WaitForGpuWrite(Var* v) {
  if (!v->gpu.load(std::memory_order_acquire)) return;
  std::shared_ptr<GpuMark> m;
  {
    std::lock_guard<SpinLock> g(v->mu);
    m = v->gpu.load(std::memory_order_relaxed)->write;
  }
  if (m) SyncEventInterruptibly(m->event);  // `m` keeps the event from going back to the pool
  cuda::RaiseDeferredDeviceErrors();
}

void WaitForAllGpuWork() {
  uint64_t used = g_used_devices.load(std::memory_order_relaxed);
  for (int d = 0; used; ++d, used >>= 1)
    if (used & 1) SyncDeviceInterruptibly(d);
  cuda::RaiseDeferredDeviceErrors();
}

void DeleteGpuState(GpuVarState* s) { delete s; }

}  // namespace kiln::engine::detail

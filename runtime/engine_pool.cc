// The worker pools of the threaded engine (see engine_pool.h). The queue is an intrusive
// multi-producer list (Vyukov's); workers spin briefly on an empty queue, then sleep.
#include "engine_pool.h"

#include <mutex>

#include "kiln/runtime/cuda.h"
#include "kiln/runtime/profiler.h"

namespace kiln::engine::detail {

WorkerPool::WorkerPool(int threads, Device device, StreamKind stream, std::function<void()> on_start,
                       std::function<void(QueueNode*)> run)
    : run_(std::move(run)) {
  for (int i = 0; i < threads; ++i)
    threads_.emplace_back([this, device, stream, on_start, i] {
      static const char* kinds[] = {"compute", "copy-in", "copy-out", "comm"};
      const char* kind = kinds[static_cast<int>(stream) & 3];
      // The profiler's lane of this thread (a GPU stream's device time has a lane of its own).
      profiler::NameThisThread(device.is_gpu() ? device.str() + " " + kind + " stream (host)"
                               : stream == StreamKind::kComm ? device.str() + " comm worker"
                                                             : device.str() + " worker " + std::to_string(i));
      on_start();
      if (device.is_gpu()) cuda::BindWorkerThread(device, static_cast<int>(stream));
      Loop();
    });
}

WorkerPool::~WorkerPool() {
  stop_.store(true);
  ready_.Notify();
  for (auto& t : threads_) t.join();
}

void WorkerPool::Enqueue(QueueNode* n) {
  Link(n);
  ready_.Notify();
}

void WorkerPool::Link(QueueNode* n) {
  n->next.store(nullptr, std::memory_order_relaxed);
  QueueNode* prev = tail_.exchange(n, std::memory_order_seq_cst);  // seq_cst: see HasWork
  prev->next.store(n, std::memory_order_release);
}

QueueNode* WorkerPool::TryPop() {
  std::lock_guard<SpinLock> g(pop_mu_);
  QueueNode* h = head_;
  QueueNode* next = h->next.load(std::memory_order_acquire);
  if (h == &stub_) {
    if (!next) return nullptr;
    head_ = h = next;
    next = h->next.load(std::memory_order_acquire);
  }
  if (!next) {
    // h is the last task, or a push behind it is half done (tail moved, link not yet set).
    if (tail_.load(std::memory_order_acquire) != h) return nullptr;
    Link(&stub_);  // queue the stub behind h so that h can be handed out
    next = h->next.load(std::memory_order_acquire);
    if (!next) return nullptr;
  }
  head_ = next;
  return h;
}

bool WorkerPool::HasWork() {
  std::lock_guard<SpinLock> g(pop_mu_);
  // tail_ (seq_cst) rather than stub_.next: the producer's exchange of tail_ and its load of the
  // sleeper count are both seq_cst, so a sleeper that registered after that load sees the task.
  return head_ != &stub_ || tail_.load(std::memory_order_seq_cst) != &stub_;
}

void WorkerPool::Loop() {
  for (;;) {
    QueueNode* t = TryPop();
    // Spin briefly before sleeping: a producer pushing tiny ops then never pays a wake-up.
    for (int i = 0; !t && i < 4000; ++i) {
      KILN_PAUSE();
      t = TryPop();
    }
    if (t) {
      run_(t);
      continue;
    }
    if (stop_.load()) return;
    ready_.Wait([&] { return HasWork() || stop_.load(); });
  }
}

}  // namespace kiln::engine::detail

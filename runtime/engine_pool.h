// The worker pools of the threaded engine (engine.cc): a FIFO of ready tasks per (device,
// stream) served by a few threads, and the spin lock the engine's tiny critical sections use.
// A pool knows nothing of variables or dependencies: it runs what it is handed, in order.
#pragma once

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/wait_point.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define KILN_PAUSE() _mm_pause()
#else
#define KILN_PAUSE() std::this_thread::yield()
#endif

namespace kiln::engine::detail {

// Test-and-test-and-set lock for the engine's tiny critical sections (a few loads and stores):
// under the producer/worker ping-pong of small ops, a sleeping mutex costs more than the work.
class SpinLock {
 public:
  void lock() {
    for (int spins = 0; flag_.exchange(true, std::memory_order_acquire); ++spins) {
      while (flag_.load(std::memory_order_relaxed)) {
        if (++spins > 2000) std::this_thread::yield();
        else KILN_PAUSE();
      }
    }
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

// A link in a worker pool's ready queue.
struct QueueNode {
  std::atomic<QueueNode*> next{nullptr};
};

// A FIFO of ready tasks served by a few threads. Workers spin briefly on an empty queue, then
// sleep on a WaitPoint; Enqueue makes no system call unless a worker sleeps.
//
// The queue is an intrusive multi-producer list (Vyukov's): a push is one exchange on `tail_`
// and one store to the previous task's link, so handing a task to a spinning worker moves about
// one cache line. Workers pop under `pop_mu_`, which producers never touch. A task is popped only
// once its link is set, so no producer writes to a task a worker may already have finished.
class WorkerPool {
 public:
  /// Starts `threads` workers for (device, stream); each calls `on_start` once, then `run` on
  /// every node enqueued.
  WorkerPool(int threads, Device device, StreamKind stream, std::function<void()> on_start,
             std::function<void(QueueNode*)> run);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Enqueue(QueueNode* n);

 private:
  void Link(QueueNode* n);
  QueueNode* TryPop();
  bool HasWork();
  void Loop();

  std::function<void(QueueNode*)> run_;
  QueueNode stub_;
  alignas(64) std::atomic<QueueNode*> tail_{&stub_};  // written by producers
  alignas(64) SpinLock pop_mu_;                       // the workers' side
  QueueNode* head_ = &stub_;
  WaitPoint ready_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

}  // namespace kiln::engine::detail

// The fork-join pool behind host::ParallelFor. kiln's kernels do not use OpenMP for their own
// loops: libgomp's idle threads spin for a long time after each region, which on a small machine
// starves the engine's workers and the thread that queues work. These helpers spin briefly, then
// sleep on an atomic. One parallel region runs at a time; a second caller (another device's
// worker) runs its loop on its own thread instead of waiting.
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/wait_point.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define KILN_PAUSE() _mm_pause()
#else
#define KILN_PAUSE() std::this_thread::yield()
#endif

namespace kiln::host {

int NumThreads() {
  static int n = [] {
    int64_t v = env::GetInt("KILN_NUM_THREADS");
    if (v > 0) return static_cast<int>(v);
    unsigned hw = std::thread::hardware_concurrency();
    return hw ? static_cast<int>(hw) : 1;
  }();
  return n;
}

namespace {

class ForkJoinPool {
 public:
  explicit ForkJoinPool(int helpers) {
    for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { Loop(); });
  }

  // Runs body(c) for c in [0, chunks) on the caller and the helpers; false if the pool is busy.
  bool TryRun(int64_t chunks, const std::function<void(int64_t)>& body) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    // Close the previous region before publishing this one: a helper still looping in Work()
    // must find nothing, then see body_/chunks_ through the release store that opens it.
    next_.store(kClosed);
    body_ = &body;
    chunks_.store(chunks);
    error_ = nullptr;
    remaining_.store(chunks);
    next_.store(0, std::memory_order_release);
    generation_.fetch_add(1);
    new_region_.Notify();
    Work();
    for (int spins = 0; remaining_.load(std::memory_order_acquire) > 0; ++spins) {
      if (spins < 20000) KILN_PAUSE();
      else std::this_thread::yield();
    }
    // Close the region and wait until no helper is between its fetch_add and its chunk check:
    // a straggler must never see the next region's chunk count with this region's index.
    next_.store(kClosed);
    while (active_.load() > 0) KILN_PAUSE();
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  void Work() {
    active_.fetch_add(1);
    struct Leave {
      std::atomic<int>& a;
      ~Leave() { a.fetch_sub(1); }
    } leave{active_};
    for (;;) {
      int64_t c = next_.fetch_add(1, std::memory_order_acq_rel);
      if (c >= chunks_.load(std::memory_order_acquire)) return;
      try {
        (*body_)(c);
      } catch (...) {
        std::lock_guard<std::mutex> g(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  void Loop() {
    uint64_t seen = generation_.load();
    for (;;) {
      // Spin a little (a kernel's loops often come in bursts), then sleep until a new region.
      for (int i = 0; i < 2000 && generation_.load(std::memory_order_acquire) == seen; ++i) KILN_PAUSE();
      new_region_.Wait([&] { return generation_.load() != seen; });
      seen = generation_.load();
      Work();
    }
  }

  std::mutex run_mu_, error_mu_;
  const std::function<void(int64_t)>* body_ = nullptr;
  static constexpr int64_t kClosed = int64_t{1} << 62;
  std::atomic<int64_t> chunks_{0};
  std::atomic<int64_t> next_{kClosed}, remaining_{0};
  std::atomic<int> active_{0};  // threads inside Work()
  std::atomic<uint64_t> generation_{0};
  WaitPoint new_region_;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

ForkJoinPool& Pool() {
  // Leaked: helper threads never exit, and nothing may run destructors under them.
  static ForkJoinPool* pool = new ForkJoinPool(NumThreads() - 1);
  return *pool;
}

}  // namespace

void RunChunks(int64_t chunks, const std::function<void(int64_t)>& body) {
  if (chunks <= 1 || !Pool().TryRun(chunks, body))
    for (int64_t c = 0; c < chunks; ++c) body(c);
}

}  // namespace kiln::host

// The CPU implementation of lanes (kiln/runtime/lanes.h): what is issued between Begin and Finish
// is queued per lane; Finish runs lane 0 on the calling thread and the others on helper threads
// kept for the process (one per lane beyond the first), an event being a flag per step. One run at
// a time: a second Begin while one is in progress (a nested plan, another thread) returns false.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/lanes.h"
#include "kiln/runtime/profiler.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define KILN_LANE_PAUSE() _mm_pause()
#else
#define KILN_LANE_PAUSE() std::this_thread::yield()
#endif

namespace kiln::exec {

namespace {

class CpuLanesImpl final : public Lanes {
 public:
  CpuLanesImpl() : max_lanes_(std::max(2, host::NumThreads())) {
    for (int k = 1; k < max_lanes_; ++k)
      threads_.emplace_back([this, k] {
        profiler::NameThisThread("cpu plan lane " + std::to_string(k));  // a compiled call's concurrent steps
        Loop(k);
      });
  }

  int MaxLanes() const override { return max_lanes_; }

  bool Begin(int num_lanes, int num_steps, const std::function<void(int)>& launch) override {
    if (num_lanes > max_lanes_ || busy_.exchange(true, std::memory_order_acquire)) return false;
    num_lanes_ = num_lanes;
    launch_ = &launch;
    ops_.resize(static_cast<size_t>(num_lanes));
    for (auto& ops : ops_) ops.clear();
    if (num_done_ < num_steps) {
      done_ = std::make_unique<std::atomic<uint8_t>[]>(static_cast<size_t>(num_steps));
      num_done_ = num_steps;
    }
    for (int i = 0; i < num_steps; ++i) done_[static_cast<size_t>(i)].store(0, std::memory_order_relaxed);
    abort_.store(false);
    error_ = nullptr;
    return true;
  }

  void Wait(int lane, int event) override { Issue(lane, {Op::kWait, event}); }
  void Launch(int lane, int step) override { Issue(lane, {Op::kLaunch, step}); }
  void Record(int lane, int event) override { Issue(lane, {Op::kRecord, event}); }

  void Finish() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      pending_ = num_lanes_ - 1;
      ++generation_;
    }
    cv_.notify_all();
    RunLane(0);
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return pending_ == 0; });
    }
    std::exception_ptr error = std::move(error_);
    error_ = nullptr;
    launch_ = nullptr;
    busy_.store(false, std::memory_order_release);
    if (error) std::rethrow_exception(error);
  }

 private:
  struct Op {
    enum Kind : uint8_t { kWait, kLaunch, kRecord } kind;
    int arg;
  };

  void Issue(int lane, Op op) {
    KILN_CHECK(lane >= 0 && lane < num_lanes_) << "lane " << lane << " of " << num_lanes_;
    ops_[static_cast<size_t>(lane)].push_back(op);
  }

  void WaitFor(int event) {
    std::atomic<uint8_t>& d = done_[static_cast<size_t>(event)];
    for (int i = 0; i < 4000; ++i) {
      if (d.load(std::memory_order_acquire) || abort_.load()) return;
      KILN_LANE_PAUSE();
    }
    std::unique_lock<std::mutex> lock(event_mu_);
    event_cv_.wait(lock, [&] { return d.load(std::memory_order_acquire) || abort_.load(); });
  }

  void RunLane(int lane) {
    for (const Op& op : ops_[static_cast<size_t>(lane)]) {
      switch (op.kind) {
        case Op::kWait: WaitFor(op.arg); break;
        case Op::kLaunch:
          if (abort_.load()) break;
          try {
            (*launch_)(op.arg);
          } catch (...) {
            std::lock_guard<std::mutex> g(event_mu_);
            if (!error_) error_ = std::current_exception();
            abort_.store(true);
            event_cv_.notify_all();
          }
          break;
        case Op::kRecord: {
          {
            std::lock_guard<std::mutex> g(event_mu_);  // a waiter between its check and its sleep sees it
            done_[static_cast<size_t>(op.arg)].store(1, std::memory_order_release);
          }
          event_cv_.notify_all();
          break;
        }
      }
    }
  }

  void Loop(int lane) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (lane >= num_lanes_) continue;
      }
      RunLane(lane);
      std::lock_guard<std::mutex> g(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  const int max_lanes_;
  // Set from Begin to Finish: one run at a time. A flag, not a mutex: a step on the thread that
  // began the run may begin another (a nested plan), which must see "busy", not deadlock.
  std::atomic<bool> busy_{false};
  // The run in progress (written between Begin and Finish by the issuing thread only).
  int num_lanes_ = 0;
  const std::function<void(int)>* launch_ = nullptr;
  std::vector<std::vector<Op>> ops_;
  std::unique_ptr<std::atomic<uint8_t>[]> done_;
  int num_done_ = 0;
  std::atomic<bool> abort_{false};
  std::exception_ptr error_;
  std::mutex event_mu_;
  std::condition_variable event_cv_;
  // Handing lanes to the helpers.
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  int pending_ = 0;
  uint64_t generation_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace

Lanes& CpuLanes() {
  // Leaked, as the kernels' fork-join pool: helper threads never exit.
  static CpuLanesImpl* lanes = new CpuLanesImpl();
  return *lanes;
}

}  // namespace kiln::exec

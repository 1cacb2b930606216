// Stream assignment and the CPU executor of streams (see streams.h).
#include "streams.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define KILN_STREAM_PAUSE() _mm_pause()
#else
#define KILN_STREAM_PAUSE() std::this_thread::yield()
#endif

namespace kiln::streams {

Schedule Assign(std::span<const Step> steps, int max_streams) {
  size_t n = steps.size();
  std::vector<int> stream(n, 0);
  std::vector<double> finish(n, 0);
  std::vector<double> free_at;  // per stream: when its last step ends
  std::vector<int> tail;        // per stream: its last step
  max_streams = std::max(1, max_streams);
  for (size_t i = 0; i < n; ++i) {
    double ready = 0;
    for (int d : steps[i].deps) {
      KILN_CHECK(d >= 0 && static_cast<size_t>(d) < i) << "step " << i << " depends on step " << d;
      ready = std::max(ready, finish[static_cast<size_t>(d)]);
    }
    // Candidates: every open stream, and a new one while there is room.
    int best = -1;
    double best_start = 0;
    bool best_holds_dep = false;
    for (size_t k = 0; k < free_at.size(); ++k) {
      double start = std::max(ready, free_at[k]);
      bool holds = std::find(steps[i].deps.begin(), steps[i].deps.end(), tail[k]) != steps[i].deps.end();
      if (best < 0 || start < best_start || (start == best_start && holds && !best_holds_dep)) {
        best = static_cast<int>(k), best_start = start, best_holds_dep = holds;
      }
    }
    if (static_cast<int>(free_at.size()) < max_streams && (best < 0 || ready < best_start)) {
      best = static_cast<int>(free_at.size());
      best_start = ready;
      free_at.push_back(0);
      tail.push_back(-1);
    }
    size_t b = static_cast<size_t>(best);
    stream[i] = best;
    finish[i] = best_start + steps[i].cost;
    free_at[b] = finish[i];
    tail[b] = static_cast<int>(i);
  }
  return Finalize(steps, std::move(stream));
}

Schedule Finalize(std::span<const Step> steps, std::vector<int> stream) {
  Schedule s;
  size_t n = steps.size();
  KILN_CHECK(stream.size() == n) << stream.size() << " streams for " << n << " steps";
  s.stream = std::move(stream);
  for (int k : s.stream) s.num_streams = std::max(s.num_streams, k + 1);
  s.lists.assign(static_cast<size_t>(s.num_streams), {});
  s.waits.assign(n, {});
  std::vector<double> finish(n, 0), free_at(static_cast<size_t>(s.num_streams), 0);
  for (size_t i = 0; i < n; ++i) {
    size_t k = static_cast<size_t>(s.stream[i]);
    double start = free_at[k];
    // Waits: per other stream, only its latest step this one needs (streams run in order).
    std::vector<int> latest(static_cast<size_t>(s.num_streams), -1);
    for (int d : steps[i].deps) {
      KILN_CHECK(d >= 0 && static_cast<size_t>(d) < i) << "step " << i << " depends on step " << d;
      start = std::max(start, finish[static_cast<size_t>(d)]);
      size_t t = static_cast<size_t>(s.stream[static_cast<size_t>(d)]);
      if (t != k) latest[t] = std::max(latest[t], d);
    }
    for (int d : latest)
      if (d >= 0) s.waits[i].push_back(d);
    finish[i] = free_at[k] = start + steps[i].cost;
    s.lists[k].push_back(static_cast<int>(i));
    s.total += steps[i].cost;
    s.critical = std::max(s.critical, finish[i]);
  }
  return s;
}

void ReuseDeps(std::span<const Buffer> buffers, std::vector<Step>& steps) {
  for (const Buffer& later : buffers) {
    if (later.writer < 0) continue;
    std::vector<int>& deps = steps[static_cast<size_t>(later.writer)].deps;
    for (const Buffer& earlier : buffers) {
      if (&earlier == &later || earlier.writer < 0 || earlier.writer >= later.writer) continue;
      if (earlier.end <= later.begin || later.end <= earlier.begin) continue;  // no overlap
      auto add = [&](int d) {
        if (d < later.writer && std::find(deps.begin(), deps.end(), d) == deps.end()) deps.push_back(d);
      };
      add(earlier.writer);
      for (int r : earlier.readers) add(r);
    }
  }
}

double& MinConcurrentWork() {
  static double bytes = 4 << 20;
  return bytes;
}

bool& AlwaysConcurrent() {
  static bool always = false;
  return always;
}

int MaxStreams() {
  static int n = std::max(2, host::NumThreads());
  return n;
}

namespace {

// One run of a schedule, shared by the calling thread and the helpers.
struct Job {
  const Schedule* s = nullptr;
  const std::function<void(int)>* run = nullptr;
  std::unique_ptr<std::atomic<uint8_t>[]> done;
  std::atomic<bool> abort{false};
  std::exception_ptr error;
  std::mutex mu;
  std::condition_variable cv;

  void Wait(int step) {
    std::atomic<uint8_t>& d = done[static_cast<size_t>(step)];
    for (int i = 0; i < 4000; ++i) {
      if (d.load(std::memory_order_acquire) || abort.load()) return;
      KILN_STREAM_PAUSE();
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return d.load(std::memory_order_acquire) || abort.load(); });
  }

  void RunStream(int k) {
    for (int i : s->lists[static_cast<size_t>(k)]) {
      for (int w : s->waits[static_cast<size_t>(i)]) Wait(w);
      if (!abort.load()) {
        try {
          (*run)(i);
        } catch (...) {
          std::lock_guard<std::mutex> g(mu);
          if (!error) error = std::current_exception();
          abort.store(true);
        }
      }
      {
        std::lock_guard<std::mutex> g(mu);  // a waiter between its check and its sleep sees it
        done[static_cast<size_t>(i)].store(1, std::memory_order_release);
      }
      cv.notify_all();
    }
  }
};

// Helper threads, one per stream beyond the first; one schedule runs on them at a time.
class Helpers {
 public:
  explicit Helpers(int n) {
    for (int k = 0; k < n; ++k) threads_.emplace_back([this, k] { Loop(k + 1); });
  }

  bool TryRun(Job& job) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    int helpers = job.s->num_streams - 1;
    {
      std::lock_guard<std::mutex> g(mu_);
      job_ = &job;
      pending_ = helpers;
      ++generation_;
    }
    cv_.notify_all();
    job.RunStream(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    return true;
  }

 private:
  void Loop(int stream) {
    uint64_t seen = 0;
    for (;;) {
      Job* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
      }
      if (!job || stream >= job->s->num_streams) continue;
      job->RunStream(stream);
      std::lock_guard<std::mutex> g(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  std::mutex run_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  Job* job_ = nullptr;
  int pending_ = 0;
  uint64_t generation_ = 0;
  std::vector<std::thread> threads_;
};

Helpers& Pool() {
  // Leaked, as the kernels' fork-join pool: helper threads never exit.
  static Helpers* pool = new Helpers(MaxStreams() - 1);
  return *pool;
}

}  // namespace

void Execute(const Schedule& s, const std::function<void(int)>& run) {
  size_t n = s.stream.size();
  auto sequential = [&] {
    for (size_t i = 0; i < n; ++i) run(static_cast<int>(i));
  };
  if (s.num_streams <= 1 || s.num_streams > MaxStreams()) return sequential();
  Job job;
  job.s = &s;
  job.run = &run;
  job.done = std::make_unique<std::atomic<uint8_t>[]>(n);
  for (size_t i = 0; i < n; ++i) job.done[i].store(0);
  if (!Pool().TryRun(job)) return sequential();  // the helpers run another plan
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace kiln::streams

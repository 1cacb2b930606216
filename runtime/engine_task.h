// What both engines share (engine.cc's threaded one, engine_naive.cc's synchronous one): the
// variable and task records, the error rules of engine.h (Execute), the pending counters and
// backpressure. Internal to runtime/.
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "engine_gpu.h"
#include "engine_pool.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"
#include "kiln/runtime/profiler.h"
#include "kiln/runtime/wait_point.h"

namespace kiln::engine {

namespace detail {
struct Task;

// A task's error, shared by the variables it failed: its outputs and, passed on, the outputs of
// the tasks that read them. `raised` is set once a sync point on one of them (WaitForVar) has
// thrown it; WaitForAll uses it to tell an error the user has seen from one nobody has.
struct TaskError {
  explicit TaskError(std::exception_ptr e) : error(std::move(e)) {}
  std::exception_ptr error;
  std::atomic<bool> raised{false};
};
using TaskErrorPtr = std::shared_ptr<TaskError>;

// A list with a few entries inline (most tasks touch one to three variables).
template <class T, size_t N>
class InlineVec {
 public:
  void push_back(T v) {
    if (size_ < N) inline_[size_] = v;
    else heap_.push_back(v);
    ++size_;
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T operator[](size_t i) const { return i < N ? inline_[i] : heap_[i - N]; }
  class It {
   public:
    It(const InlineVec* v, size_t i) : v_(v), i_(i) {}
    T operator*() const { return (*v_)[i_]; }
    It& operator++() { return ++i_, *this; }
    bool operator!=(const It& o) const { return i_ != o.i_; }

   private:
    const InlineVec* v_;
    size_t i_;
  };
  It begin() const { return {this, 0}; }
  It end() const { return {this, size_}; }

 private:
  T inline_[N];
  size_t size_ = 0;
  std::vector<T> heap_;
};
}  // namespace detail

// A variable's state lives on four cache lines, by who writes it: the pushing thread alone
// (reference count, lock-free reads issued), the slow path under `mu`, flags that change rarely,
// and the count of finished lock-free reads that the workers bump. Reading a value no one is
// writing, the common case of every eager op's inputs, then moves no cache line between the
// pushing thread and the workers. (Padding rather than alignas: an over-aligned `new` takes
// malloc's slow memalign path.)
class Var {
 public:
  struct Pending {
    detail::Task* task;
    bool write;
  };
  // Changed by Push, ReleaseVar and the reaping of finished tasks, all on pushing threads.
  std::atomic<int> refs{1};
  // Reads granted without the lock while the variable was idle (see ThreadedEngine::Enter).
  // Written only under the engine's push order; read under mu.
  std::atomic<int64_t> fast_issued{0};
  // Work touching it is held back by the frontend (HoldVars): the process engine flushes first.
  std::atomic<uint8_t> held{0};  // 1: read by held work, 2: written by it

  char pad0_[64];
  detail::SpinLock mu;
  std::vector<Pending> queue;  // waiting tasks, FIFO from `head`
  size_t head = 0;
  int running_reads = 0;       // reads granted under mu
  bool running_write = false;
  detail::TaskErrorPtr error;  // guarded by mu

  char pad1_[64];
  // running_write || a task is queued. Written under mu; producers test it without the lock.
  std::atomic<bool> busy{false};
  std::atomic<bool> has_error{false};  // mirrors `error != nullptr` for lock-free checks

  char pad2_[64];
  std::atomic<int64_t> fast_done{0};
  // GPU work pending on the variable (engine_gpu.h); null until a GPU task touches it.
  std::atomic<detail::GpuVarState*> gpu{nullptr};

  ~Var() { detail::DeleteGpuState(gpu.load()); }

  bool QueueEmpty() const { return head == queue.size(); }
  Pending Pop() {
    Pending p = queue[head++];
    if (head == queue.size()) {
      queue.clear(), head = 0;
    } else if (head >= 64 && head * 2 >= queue.size()) {  // a busy variable never drains fully
      queue.erase(queue.begin(), queue.begin() + static_cast<ptrdiff_t>(head));
      head = 0;
    }
    return p;
  }
  bool FastReadsDone() const { return fast_done.load() == fast_issued.load(std::memory_order_relaxed); }
};

namespace detail {

struct Task : QueueNode {
  std::function<void()> fn;
  TaskOptions opts;
  InlineVec<Var*, 4> reads, writes;
  uint64_t writes_read = 0;  // bit i: writes[i] was also listed as a read (an in-place update)
  uint64_t fast_reads = 0;   // bit i: reads[i] was granted without the variable's lock
  std::atomic<int> wait{0};
  int64_t pushed_ns = 0;  // when it was pushed, while the profiler records (profiler.h)
  Task* next_dead = nullptr;  // link in the graveyard (see ThreadedEngine::Bury)
};

// `e` with the task's name (and call site) in front of its message, its type kept.
std::exception_ptr NameError(std::exception_ptr e, const TaskOptions& o);
/// Fills the task's reads and writes from the lists given, without duplicates; a variable both
/// read and written counts as written (and is marked in writes_read).
void Dedupe(std::span<Var* const> reads, std::span<Var* const> writes, Task* t);
/// The synchronous engine (KILN_ENGINE=naive).
std::unique_ptr<Engine> MakeNaiveEngine();

// Shared by both engines: error state, counters, backpressure.
class EngineBase : public Engine {
 public:
  EngineBase() {
    max_pending_ = std::max<int64_t>(1, env::GetInt("KILN_ENGINE_MAX_PENDING"));
    max_pending_bytes_ = std::max<int64_t>(1, env::GetInt("KILN_ENGINE_MAX_PENDING_MB")) << 20;
  }

  Var* NewVar() override { return new Var(); }
  void ReleaseVar(Var* v) override { Unref(v); }

  std::exception_ptr VarError(Var* v) override {
    std::lock_guard<SpinLock> g(v->mu);
    return v->error ? v->error->error : nullptr;
  }

  EngineStats Stats() const override {
    EngineStats s;
    s.completed = completed_.load();
    s.pushed = pushed_.load();
    s.pending = std::max<int64_t>(0, s.pushed - s.completed);
    s.peak_pending = peak_pending_.load();
    s.pending_bytes = std::max<int64_t>(0, pushed_bytes_.load() - completed_bytes_.load());
    s.peak_pending_bytes = peak_pending_bytes_.load();
    return s;
  }
  void ResetPeak() override {
    peak_pending_ = Pending();
    peak_pending_bytes_ = PendingBytes();
  }
  void SetLimits(int64_t max_pending, int64_t max_pending_bytes) override {
    if (max_pending > 0) max_pending_ = max_pending;
    if (max_pending_bytes > 0) max_pending_bytes_ = max_pending_bytes;
  }

 protected:
  static void Unref(Var* v) {
    if (v->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete v;
  }

  // Runs the task body with the error rules of engine.h; returns nothing, stores errors.
  void Execute(Task* t) {
    // Errors are rare: has_error is checked without the lock. It is current here because the
    // grant that scheduled this task went through the variable's lock after its last writer.
    TaskErrorPtr err;
    for (Var* r : t->reads) {
      if (!r->has_error.load(std::memory_order_acquire)) continue;
      std::lock_guard<SpinLock> g(r->mu);
      if (r->error) {
        err = r->error;
        break;
      }
    }
    for (size_t i = 0; !err && i < t->writes.size() && i < 64; ++i) {
      if (!(t->writes_read >> i & 1)) continue;
      Var* w = t->writes[i];
      if (!w->has_error.load(std::memory_order_acquire)) continue;
      std::lock_guard<SpinLock> g(w->mu);
      err = w->error;  // an in-place update of a failed value fails too
    }
    // The profiler: one relaxed load when off. The task's run is one event on this worker's
    // lane; its wait between Push and now goes in the event's args.
    const bool prof = profiler::Enabled(profiler::kOperator | profiler::kGpu);
    const int64_t prof_start = prof ? profiler::Now() : 0;
    if (!err) {
      try {
        // GPU work is ordered by events (engine_gpu.h); waiting for it, and the errors it
        // reports, happen inside the try so they are stored on the outputs like any other.
        const bool gpu_task = t->opts.device.is_gpu() && static_cast<uint8_t>(t->opts.stream) != 255;
        bool gpu_state = gpu_task;
        for (Var* v : t->reads) gpu_state |= v->gpu.load(std::memory_order_relaxed) != nullptr;
        for (Var* v : t->writes) gpu_state |= v->gpu.load(std::memory_order_relaxed) != nullptr;
        std::vector<Var*> reads, writes;
        if (gpu_state) {
          for (Var* v : t->reads) reads.push_back(v);
          for (Var* v : t->writes) writes.push_back(v);
          WaitForGpuWork(reads, writes, t->opts);
        }
        // The naive engine runs GPU tasks on the pushing thread: their device must be current
        // there, so that their work goes to that device's default stream (the one synchronized).
        std::optional<gpurt::DeviceGuard> on_device;
        if (gpu_task && IsNaive()) on_device.emplace(t->opts.device.index);
        {  // the profiler: the stream's own time for the work the body issues
          const bool gpu_span = prof && gpu_task && !IsNaive() && profiler::Enabled(profiler::kGpu) &&
                                t->opts.stream != StreamKind::kComm && cuda::CurrentStream() != nullptr;
          profiler::GpuScope span(gpu_span, gpu_span ? cuda::CurrentStream() : nullptr, t->opts.device.index,
                                  static_cast<int>(t->opts.stream), t->opts.name);
          t->fn();
        }
        if (gpu_task) {
          if (IsNaive()) cuda::SynchronizeDevice(t->opts.device), cuda::RaiseDeferredDeviceErrors();
          else MarkGpuWork(reads, writes, t->opts);
        }
      } catch (...) {
        err = RecordError(std::current_exception(), t->opts);
      }
    }
    if (prof && profiler::Enabled(profiler::kOperator)) {
      const int64_t queued = t->pushed_ns ? prof_start - t->pushed_ns : 0;
      profiler::Complete(profiler::kOperator, t->opts.name, prof_start, profiler::Now(),
                         profiler::Args("queued_us", static_cast<double>(std::max<int64_t>(0, queued)) / 1e3));
    }
    for (Var* w : t->writes) {
      if (!err && !w->has_error.load(std::memory_order_acquire)) continue;  // nothing to clear
      std::lock_guard<SpinLock> g(w->mu);
      w->error = err;
      w->has_error.store(err != nullptr, std::memory_order_release);
    }
  }

  // Pending work is pushed minus completed: the pushing thread writes only the pushed counters,
  // the workers only the completed ones, so neither side's fast path writes a cache line the
  // other side owns. Both counters only grow; loading `completed` before `pushed` never counts
  // a task as done too early.
  int64_t Pending() const {
    int64_t c = completed_.load();
    return std::max<int64_t>(0, pushed_.load() - c);
  }
  /// Completed minus `target`: at least zero once as many tasks have completed as `target` counts.
  int64_t CompletedSince(int64_t target) const { return completed_.load() - target; }
  int64_t PushedSoFar() const { return pushed_.load(); }
  int64_t PendingBytes() const {
    int64_t c = completed_bytes_.load();
    return std::max<int64_t>(0, pushed_bytes_.load() - c);
  }

  void CountPushed(const Task* t) {
    auto bytes = static_cast<int64_t>(t->opts.bytes);
    int64_t b = pushed_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes -
                completed_bytes_.load(std::memory_order_relaxed);
    int64_t p = pushed_.fetch_add(1, std::memory_order_seq_cst) + 1 - completed_.load(std::memory_order_relaxed);
    if (p > peak_pending_.load(std::memory_order_relaxed)) peak_pending_.store(p, std::memory_order_relaxed);
    if (b > peak_pending_bytes_.load(std::memory_order_relaxed))
      peak_pending_bytes_.store(b, std::memory_order_relaxed);
  }

  // Wakes sleepers only when it matters: WaitForAll at zero pending, a blocked producer once the
  // queue has drained to half its limits (hysteresis: no wake-up per completed task). Reads the
  // pushing side's counters only when someone sleeps.
  void CountCompleted(size_t bytes) {
    completed_bytes_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    completed_.fetch_add(1, std::memory_order_seq_cst);
    if (!drained_.HasSleepers()) return;
    int64_t p = Pending(), b = PendingBytes();
    if (p <= 1 || (p <= max_pending_.load() / 2 && b <= max_pending_bytes_.load() / 2)) drained_.Notify();
  }

  template <class Pred>
  void SleepUntil(Pred done) {
    drained_.Wait(done);
  }

  // A task body threw: names the error and remembers it for WaitForAll (engine.h).
  TaskErrorPtr RecordError(std::exception_ptr e, const TaskOptions& o) {
    auto rec = std::make_shared<TaskError>(NameError(std::move(e), o));
    std::lock_guard<std::mutex> g(error_mu_);
    // Only the first reportable error is ever thrown: once one is certain to be (no variable
    // holds it, so no WaitForVar can raise it first), the later ones need not be kept. Errors
    // that were raised and are held by no variable can never be reported again: dropped. This
    // bounds the list by the failed variables alive, plus one.
    std::erase_if(errors_, [](const TaskErrorPtr& r) { return r->raised.load() && r.use_count() == 1; });
    bool settled = false;
    for (const TaskErrorPtr& r : errors_) settled |= !r->raised.load() && r.use_count() == 1;
    if (!settled) errors_.push_back(rec);
    return rec;
  }

  // A sync point on a variable throws its error; WaitForAll will not report it for that alone.
  [[noreturn]] static void Raise(const TaskErrorPtr& rec) {
    rec->raised.store(true);
    std::rethrow_exception(rec->error);
  }

  // WaitForAll's error (engine.h): the first recorded since the previous WaitForAll that either
  // no sync point has raised yet or a live variable still holds. An error raised at
  // wait_to_read whose arrays are gone is not thrown again by a later, unrelated waitall.
  void RethrowFirstError() {
    std::vector<TaskErrorPtr> errors;
    {
      std::lock_guard<std::mutex> g(error_mu_);
      std::swap(errors, errors_);
    }
    for (const TaskErrorPtr& r : errors)  // a count above one: a variable holds it too
      if (!r->raised.load() || r.use_count() > 1) std::rethrow_exception(r->error);
  }

  // Counters on separate cache lines by writer: the pushing thread and the workers.
  alignas(64) std::atomic<int64_t> pushed_{0}, pushed_bytes_{0};
  std::atomic<int64_t> peak_pending_{0}, peak_pending_bytes_{0};
  alignas(64) std::atomic<int64_t> completed_{0}, completed_bytes_{0};
  alignas(64) std::atomic<int64_t> max_pending_{1024}, max_pending_bytes_{32 << 20};
  WaitPoint drained_;
  std::mutex error_mu_;
  std::vector<TaskErrorPtr> errors_;  // recorded since the previous WaitForAll, oldest first
};

}  // namespace detail
}  // namespace kiln::engine

// The threaded dependency engine (see engine.h for semantics), and the choice of engine.
//
// Each Var keeps a FIFO of tasks waiting on it and the number of running readers / whether a
// writer runs. A task carries a counter of variables that have not yet granted it access; the
// last grant schedules it on the worker pool of its (device, stream) (engine_pool.h). Pushes are
// serialized by one lock so that tasks enter every variable's FIFO in the same order (no deadlock
// between two tasks that read and write the same pair of variables from different threads).
// The records and error rules both engines share are in engine_task.h; the naive engine is in
// engine_naive.cc.
#include "kiln/runtime/engine.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "engine_pool.h"
#include "engine_task.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/interrupt.h"
#include "kiln/runtime/profiler.h"
#include "kiln/runtime/wait_point.h"

namespace kiln::engine {

namespace {
using namespace detail;
thread_local bool tls_on_worker = false;

// Task memory is recycled per thread: a pushing thread reaps what it pushed, so its cache serves
// its next pushes without a trip through malloc.
struct TaskCache {  // trivially destructible: still usable by exit handlers after TLS destructors
  void* slot[1024];
  int n;
  bool dead;
};
thread_local TaskCache tls_tasks;
struct TaskCacheGuard {
  ~TaskCacheGuard() {
    for (int i = 0; i < tls_tasks.n; ++i) ::operator delete(tls_tasks.slot[i]);
    tls_tasks.n = 0;
    tls_tasks.dead = true;
  }
};
thread_local TaskCacheGuard tls_cache_guard;


class ThreadedEngine final : public EngineBase {
 public:
  explicit ThreadedEngine(int cpu_workers) : cpu_workers_(std::max(1, cpu_workers)) {}
  ~ThreadedEngine() override {
    try {
      WaitForAll();
    } catch (...) {
    }
    for (auto& p : pools_) delete p.load();
    Reap();
  }

  void Push(std::function<void()> fn, std::span<Var* const> reads, std::span<Var* const> writes,
            const TaskOptions& opts) override {
    if (!tls_on_worker) {
      if (graveyard_.load(std::memory_order_relaxed)) Reap();
      if (opts.may_run_inline && opts.device.is_cpu() && RunInline(fn, reads, writes, opts)) return;
      Backpressure(static_cast<int64_t>(opts.bytes));
    }
    Task* t = NewTask();
    t->fn = std::move(fn);
    t->opts = opts;
    if (profiler::Enabled(profiler::kOperator)) t->pushed_ns = profiler::Now();
    Dedupe(reads, writes, t);
    Enter(t);
  }

  void WaitForVar(Var* v) override {
    bool writer_ahead = false;
    {  // fast path: nothing writes v now or later in the queue
      std::lock_guard<SpinLock> g(v->mu);
      writer_ahead = v->running_write;
      for (size_t i = v->head; i < v->queue.size() && !writer_ahead; ++i)
        writer_ahead = v->queue[i].write;
      if (!writer_ahead && v->error) Raise(v->error);
    }
    if (!writer_ahead) {
      WaitForGpuWrite(v);  // its writer is done here, its GPU work perhaps not
      return;
    }
    if (tls_on_worker)
      KILN_THROW(StateError) << "wait_to_read called inside an engine task: that would deadlock; "
                                "sync only from the thread that queues work";
    // The flag is shared with the task: the waker may still be inside notify when we return, or
    // run long after an interrupted wait (interrupt.h) gave up.
    // The error is captured by the waiter itself: a writer queued behind it may clear it later.
    struct Result {
      std::atomic<int> done{0};
      TaskErrorPtr error;
      WaitPoint woken;
    };
    auto r = std::make_shared<Result>();
    Var* vs[1] = {v};
    TaskOptions o;
    o.name = "wait_to_read";
    o.device = cpu(0);
    PushWaiter([r, v] {
      {
        std::lock_guard<SpinLock> g(v->mu);
        r->error = v->error;
      }
      r->done.store(1), r->woken.Notify();
    }, vs, o);
    // Spin a little first: a short task finishes sooner than a futex sleep and wake-up take.
    for (int i = 0; i < 2000 && !r->done.load(std::memory_order_acquire); ++i) KILN_PAUSE();
    r->woken.WaitInterruptible([&] { return r->done.load() != 0; });
    Reap();
    // Taken out of the shared result: the waiter task, until reaped, must not count as holding
    // the error (WaitForAll reports an error a live holder has).
    if (TaskErrorPtr err = std::move(r->error)) Raise(err);
    WaitForGpuWrite(v);
  }

  void WaitForAll() override {
    if (tls_on_worker)
      KILN_THROW(StateError) << "waitall called inside an engine task: that would deadlock";
    for (int i = 0; i < 2000 && (Pending() != 0 || inline_in_flight_.load() != 0); ++i) KILN_PAUSE();
    // An inline run on another thread (a C++ caller racing with exit's drain) is waited for too.
    auto idle = [&] { return Pending() == 0 && inline_in_flight_.load() == 0; };
    // Reaping may queue more work (a GPU storage is freed by a task on its stream): until none.
    do {
      drained_.WaitInterruptible(idle);
      Reap();
    } while (!idle());
    RethrowFirstError();
    WaitForAllGpuWork();
  }

  // Waits, polling, until as many tasks have completed as had been pushed when it started (tasks
  // pushed since, by this thread or others, are not waited for: a thread that keeps pushing
  // cannot hold an allocation up for ever), then reaps (storage freed then pushes its frees) and
  // waits for those the same way. No device synchronization: the GPU allocator waits for each
  // freed block's event.
  bool Drain() override {
    if (tls_on_worker) return false;
    BlockingRegion region;  // called from an allocation, with the GIL held: a queued task may need it
    InterruptCheck check = GetInterruptCheck();
    for (int round = 0; round < 2; ++round) {
      const int64_t target = PushedSoFar();
      auto last_check = std::chrono::steady_clock::now();
      for (int spins = 0; CompletedSince(target) < 0; ++spins) {
        if (spins < 200) {
          KILN_PAUSE();
          continue;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        if (check && std::chrono::steady_clock::now() - last_check >= kInterruptPoll) {
          check();  // may throw (Ctrl-C): the allocation ends with it
          last_check = std::chrono::steady_clock::now();
        }
      }
      Reap();
    }
    return true;
  }

  bool IsNaive() const override { return false; }

  EngineStats Stats() const override {  // inline runs count as pushed and completed at once
    EngineStats s = EngineBase::Stats();
    int64_t n = inline_runs_.load(std::memory_order_relaxed);
    s.pushed += n, s.completed += n;
    return s;
  }

 private:
  // A waiter reads v like any task but must run even if v holds an error, and runs inline
  // on the thread that completes v's writer (it only flips a flag).
  void PushWaiter(std::function<void()> fn, std::span<Var* const> reads, const TaskOptions& o) {
    Task* t = NewTask();
    t->fn = std::move(fn);
    t->opts = o;
    t->opts.stream = static_cast<StreamKind>(255);  // marks an inline waiter
    Dedupe(reads, {}, t);
    Enter(t);
  }

  // Appends `t` to the FIFO of each of its variables, in one global order, and schedules it
  // when every variable granted access at once.
  //
  // A read of an idle variable (no writer running or queued) is granted without its lock: only
  // pushes make a variable busy, and they are serialized here, so `busy` read false stays false
  // until this push is done. The read is counted in fast_issued; the worker that finishes it
  // bumps fast_done, and a writer may start once the two are equal. A writer that arrives while
  // fast reads run sets `busy` before it compares the counts, and a finishing read bumps its
  // count before it looks at `busy` (both seq_cst), so one of them sees the other and grants
  // the writer, under the lock, exactly once.
  void Enter(Task* t) {
    // Relaxed: other threads see `t` only through a variable's lock, after this store.
    t->wait.store(static_cast<int>(t->reads.size() + t->writes.size()) + 1, std::memory_order_relaxed);
    CountPushed(t);
    int granted = 1;  // the guard: nothing schedules `t` before every variable has seen it
    {
      std::lock_guard<SpinLock> order(push_mu_);
      for (size_t i = 0; i < t->reads.size(); ++i) {
        Var* r = t->reads[i];
        r->refs.fetch_add(1, std::memory_order_relaxed);
        if (i < 64 && !r->busy.load(std::memory_order_acquire)) {
          r->fast_issued.store(r->fast_issued.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
          t->fast_reads |= uint64_t{1} << i;
          ++granted;
          continue;
        }
        std::lock_guard<SpinLock> g(r->mu);
        if (!r->running_write && r->QueueEmpty()) {
          ++r->running_reads;
          ++granted;
        } else {
          r->queue.push_back({t, false});
        }
      }
      for (Var* w : t->writes) {
        w->refs.fetch_add(1, std::memory_order_relaxed);
        std::lock_guard<SpinLock> g(w->mu);
        w->busy.store(true);  // before FastReadsDone: see above
        if (!w->running_write && w->running_reads == 0 && w->QueueEmpty() && w->FastReadsDone()) {
          w->running_write = true;
          ++granted;
        } else {
          w->queue.push_back({t, true});
        }
      }
    }
    if (t->wait.fetch_sub(granted, std::memory_order_acq_rel) != granted) return;
    if (t->opts.may_run_inline && t->opts.device.is_cpu() && !tls_on_worker) {
      struct InTask {  // inside the task this thread is a worker: no throttling, waits refused
        bool was = tls_on_worker;
        InTask() { tls_on_worker = true; }
        ~InTask() { tls_on_worker = was; }
      } in_task;
      Finish(t, /*execute=*/true);  // ready now: cheaper here than on a worker (see engine.h)
      return;
    }
    Schedule(t);
  }

  // The inline path without a Task: when every variable of `fn` is idle at Push, it runs right
  // here. Its reads are granted as lock-free reads of idle variables (see Enter) and its writes
  // take the variables under their locks, so a task pushed meanwhile by another thread waits for
  // it exactly as for a queued one; variables need no extra reference (the caller holds them for
  // the duration of Push). It is never counted as pending (it is done before Push returns), which
  // saves the counters, the task block, the graveyard and the reference counts of the general
  // path. Returns false, having changed nothing, when a variable is busy or holds an error (the
  // general path then applies every rule of engine.h).
  bool RunInline(const std::function<void()>& fn, std::span<Var* const> reads_in,
                 std::span<Var* const> writes_in, const TaskOptions& opts) {
    constexpr size_t kMax = 8;
    if (reads_in.size() > kMax || writes_in.size() > kMax) return false;
    Var* writes[kMax];
    Var* reads[kMax];
    size_t nw = 0, nr = 0;
    for (Var* w : writes_in) {
      bool dup = false;
      for (size_t i = 0; i < nw; ++i) dup |= writes[i] == w;
      if (!dup) writes[nw++] = w;
    }
    for (Var* r : reads_in) {
      bool dup = false;
      for (size_t i = 0; i < nw; ++i) dup |= writes[i] == r;
      for (size_t i = 0; i < nr; ++i) dup |= reads[i] == r;
      if (!dup) reads[nr++] = r;
    }
    {
      std::lock_guard<SpinLock> order(push_mu_);
      for (size_t i = 0; i < nr; ++i) {
        Var* r = reads[i];
        if (r->busy.load(std::memory_order_acquire) || r->has_error.load(std::memory_order_acquire)) return false;
      }
      for (size_t i = 0; i < nw; ++i) {
        Var* w = writes[i];
        bool idle = false;
        if (!w->busy.load(std::memory_order_acquire) && !w->has_error.load(std::memory_order_acquire)) {
          std::lock_guard<SpinLock> g(w->mu);
          // With push_mu_ held no read can be issued, so once the issued ones are done none is in
          // flight, and `busy` can be set after the check (Enter sets it before, for that race).
          // Only pushers read `busy` for an idle variable, under push_mu_: a release store will do.
          idle = !w->running_write && w->running_reads == 0 && w->QueueEmpty() && w->FastReadsDone();
          if (idle) {
            w->running_write = true;
            w->busy.store(true, std::memory_order_release);
          }
        }
        if (!idle) {
          for (size_t j = 0; j < i; ++j) {  // nobody queued behind them: push_mu_ is held
            std::lock_guard<SpinLock> g(writes[j]->mu);
            writes[j]->running_write = false;
            writes[j]->busy.store(false);
          }
          return false;
        }
      }
      for (size_t i = 0; i < nr; ++i) {
        std::atomic<int64_t>& issued = reads[i]->fast_issued;
        issued.store(issued.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      }
      // Counted as pushed and completed here (Stats() may see a running one as completed);
      // in flight until its grants are done, which WaitForAll waits for.
      inline_runs_.store(inline_runs_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      inline_in_flight_.fetch_add(1, std::memory_order_seq_cst);
    }
    TaskErrorPtr err;
    {
      struct InTask {  // inside the task this thread is a worker: no throttling, waits refused
        bool was = tls_on_worker;
        InTask() { tls_on_worker = true; }
        ~InTask() { tls_on_worker = was; }
      } in_task;
      const int64_t prof_start = profiler::Enabled(profiler::kOperator) ? profiler::Now() : 0;
      try {
        WaitForGpuWork({reads, nr}, {writes, nw}, opts);
        fn();
      } catch (...) {
        err = RecordError(std::current_exception(), opts);
      }
      if (prof_start)  // ran inline, on the pushing thread: it waited for nothing
        profiler::Complete(profiler::kOperator, opts.name, prof_start, profiler::Now(), profiler::Args("queued_us", 0));
    }
    std::vector<Task*> ready;
    for (size_t i = 0; i < nr; ++i) {
      Var* r = reads[i];
      r->fast_done.fetch_add(1);  // before looking at busy: see Enter
      if (!r->busy.load()) continue;
      std::lock_guard<SpinLock> g(r->mu);
      GrantQueued(r, &ready);
    }
    for (size_t i = 0; i < nw; ++i) {
      Var* w = writes[i];
      std::lock_guard<SpinLock> g(w->mu);
      if (err) {  // the variable held no error (checked above): nothing to clear on success
        w->error = err;
        w->has_error.store(err != nullptr, std::memory_order_release);
      }
      w->running_write = false;
      if (w->QueueEmpty()) w->busy.store(false, std::memory_order_release);  // nobody came meanwhile
      else GrantQueued(w, &ready);
    }
    err.reset();  // before the run counts as done: the variables hold the error now, not this run
    for (Task* r : ready)
      if (r->wait.fetch_sub(1, std::memory_order_acq_rel) == 1) Schedule(r);
    if (inline_in_flight_.fetch_sub(1, std::memory_order_seq_cst) == 1 && drained_.HasSleepers())
      drained_.Notify();
    return true;
  }

  // Grants what the head of v's queue waits for, if it may run now; under v->mu.
  static void GrantQueued(Var* v, std::vector<Task*>* ready) {
    if (!v->running_write) {
      while (!v->QueueEmpty() && !v->queue[v->head].write) {
        ++v->running_reads;
        ready->push_back(v->Pop().task);
      }
      if (!v->QueueEmpty() && v->running_reads == 0 && v->FastReadsDone()) {
        v->running_write = true;
        ready->push_back(v->Pop().task);
      }
    }
    v->busy.store(v->running_write || !v->QueueEmpty());
  }

  // A task is admitted while both limits hold with it counted. Otherwise the producer sleeps until the queue
  // has drained to half of both limits.
  void Backpressure(int64_t bytes) {
    auto fits = [&](int64_t div) {
      return Pending() < std::max<int64_t>(1, max_pending_.load() / div) &&
             PendingBytes() + bytes <= max_pending_bytes_.load() / div;
    };
    // One task may always wait behind the running one, so even ops larger than the byte limit
    // keep the producer and the worker overlapped.
    if (fits(1) || Pending() <= 1) return;
    {
      BlockingRegion region;  // Python lets go of the GIL: a running task may need it
      SleepUntil([&] { return fits(2) || Pending() <= 1; });
    }
    Reap();
  }

  void Schedule(Task* t) {
    if (static_cast<uint8_t>(t->opts.stream) == 255) {
      Finish(t, /*execute=*/false);
      return;
    }
    Pool(t->opts.device, t->opts.stream)->Enqueue(t);
  }

  WorkerPool* Pool(const Device& d, StreamKind s) {
    int dev = d.index;
    KILN_CHECK(dev >= 0 && dev < kMaxDevices) << "device index " << dev;
    // CPU devices have a compute pool and a one-thread comm pool (made on the first kComm task):
    // a collective streams every device's memory for a while; on the compute worker it would wait
    // behind the device's kernels and hold up the next ones, on its own thread it runs beside them.
    int stream = d.is_cpu() ? (s == StreamKind::kComm ? 3 : 0) : static_cast<int>(s);
    size_t slot = (static_cast<size_t>(d.type) * kMaxDevices + dev) * 4 + stream;
    WorkerPool* p = pools_[slot].load(std::memory_order_acquire);
    if (p) return p;
    std::lock_guard<std::mutex> g(pool_mu_);
    p = pools_[slot].load();
    if (!p) {
      p = new WorkerPool(
          d.is_cpu() && stream == 0 ? cpu_workers_ : 1, d, static_cast<StreamKind>(stream),
          [] { tls_on_worker = true; }, [this](QueueNode* n) { Finish(static_cast<Task*>(n), true); });
      pools_[slot].store(p, std::memory_order_release);
    }
    return p;
  }

  void Finish(Task* t, bool execute) {
    if (execute) {
      Execute(t);
    } else {
      t->fn();
    }
    std::vector<Task*> ready;
    for (size_t i = 0; i < t->reads.size(); ++i) {
      Var* r = t->reads[i];
      if (i < 64 && (t->fast_reads >> i & 1)) {
        r->fast_done.fetch_add(1);  // before looking at busy: see Enter
        if (!r->busy.load()) continue;
        std::lock_guard<SpinLock> g(r->mu);
        GrantQueued(r, &ready);
        continue;
      }
      std::lock_guard<SpinLock> g(r->mu);
      --r->running_reads;
      GrantQueued(r, &ready);
    }
    for (Var* w : t->writes) {
      std::lock_guard<SpinLock> g(w->mu);
      w->running_write = false;
      GrantQueued(w, &ready);
    }
    for (Task* r : ready)
      if (r->wait.fetch_sub(1, std::memory_order_acq_rel) == 1) Schedule(r);
    size_t bytes = t->opts.bytes;
    Bury(t);
    CountCompleted(bytes);
  }

  // Finished tasks are destroyed by the thread that pushes work (on its next Push or wait), not
  // by the worker: what a task captured (tensors, storages, closures) was allocated by the pusher,
  // and freeing it there keeps malloc on one thread's fast path instead of contending for arena
  // locks across threads, which dominated the cost of tiny ops.
  void Bury(Task* t) {
    Task* head = graveyard_.load(std::memory_order_relaxed);
    do {
      t->next_dead = head;
    } while (!graveyard_.compare_exchange_weak(head, t, std::memory_order_release, std::memory_order_relaxed));
  }

  void Reap() {
    Task* t = graveyard_.exchange(nullptr, std::memory_order_acquire);
    while (t) {
      Task* next = t->next_dead;
      // The task's references to its variables are dropped here too, so that a variable's
      // reference count stays on the pushing thread's cache line.
      for (Var* v : t->reads) Unref(v);
      for (Var* v : t->writes) Unref(v);
      FreeTask(t);
      t = next;
    }
  }

  // Task memory is recycled per thread (see TaskCache).
  static Task* NewTask() {
    TaskCache& c = tls_tasks;
    void* mem = c.n > 0 ? c.slot[--c.n] : ::operator new(sizeof(Task));
    return new (mem) Task();
  }
  static void FreeTask(Task* t) {
    t->~Task();
    TaskCache& c = tls_tasks;
    if (c.dead || c.n == 1024) return ::operator delete(t);
    if (c.n == 0) (void)&tls_cache_guard;  // registers the destructor that frees the cache
    c.slot[c.n++] = t;
  }

  static constexpr int kMaxDevices = 64;
  int cpu_workers_;
  std::atomic<Task*> graveyard_{nullptr};
  std::atomic<int64_t> inline_runs_{0};  // written under push_mu_ (RunInline)
  std::atomic<int64_t> inline_in_flight_{0};  // inline runs between their start and their grants
  SpinLock push_mu_;  // held for a few loads and stores per variable: a sleeping mutex costs more
  std::mutex pool_mu_;
  std::atomic<WorkerPool*> pools_[2 * kMaxDevices * 4] = {};
};

}  // namespace

bool OnWorkerThread() { return tls_on_worker; }

void DrainBeforeExit() {
  // Errors nobody waited for are dropped at exit.
  std::atexit([] {
    try {
      Engine::Get().WaitForAll();
    } catch (...) {
    }
  });
}

std::unique_ptr<Engine> CreateEngine(const std::string& kind) {
  if (kind == "naive") return MakeNaiveEngine();
  if (kind == "threaded")
    return std::make_unique<ThreadedEngine>(static_cast<int>(env::GetInt("KILN_CPU_WORKERS")));
  KILN_THROW(ValueError) << "KILN_ENGINE=" << kind << " is not an engine: expected threaded or naive";
}

// ---- held work ---------------------------------------------------------------------------------

namespace {

std::atomic<int64_t> g_num_held{0};
std::atomic<void (*)()> g_flush{nullptr};

// The process engine: the chosen one, behind the check for held variables (see HoldVars). The
// check is one atomic load while nothing is held.
class HoldingEngine final : public Engine {
 public:
  explicit HoldingEngine(Engine* e) : e_(e) {}
  Var* NewVar() override { return e_->NewVar(); }
  void ReleaseVar(Var* v) override { e_->ReleaseVar(v); }
  void Push(std::function<void()> fn, std::span<Var* const> reads, std::span<Var* const> writes,
            const TaskOptions& opts) override {
    if (g_num_held.load(std::memory_order_acquire) != 0 && (AnyHeld(reads, kWritten) || AnyHeld(writes, kAny))) Flush();
    e_->Push(std::move(fn), reads, writes, opts);
  }
  void WaitForVar(Var* v) override {
    if (g_num_held.load(std::memory_order_acquire) != 0 && (v->held.load(std::memory_order_acquire) & kWritten)) Flush();
    e_->WaitForVar(v);
  }
  void WaitForAll() override {
    if (g_num_held.load(std::memory_order_acquire) != 0) Flush();
    e_->WaitForAll();
  }
  bool Drain() override { return e_->Drain(); }
  std::exception_ptr VarError(Var* v) override { return e_->VarError(v); }
  EngineStats Stats() const override { return e_->Stats(); }
  void ResetPeak() override { e_->ResetPeak(); }
  bool IsNaive() const override { return e_->IsNaive(); }
  void SetLimits(int64_t max_pending, int64_t max_pending_bytes) override {
    e_->SetLimits(max_pending, max_pending_bytes);
  }

 private:
  static constexpr uint8_t kWritten = 2, kAny = 3;
  static bool AnyHeld(std::span<Var* const> vars, uint8_t how) {
    for (Var* v : vars)
      if (v->held.load(std::memory_order_acquire) & how) return true;
    return false;
  }
  static void Flush() {
    if (void (*f)() = g_flush.load(std::memory_order_acquire)) f();
  }
  Engine* e_;
};

}  // namespace

void HoldVars(std::span<Var* const> vars, bool written) {
  const uint8_t bit = written ? 2 : 1;
  for (Var* v : vars)
    if (v->held.fetch_or(bit, std::memory_order_acq_rel) == 0) g_num_held.fetch_add(1, std::memory_order_acq_rel);
}

void ReleaseHeldVars(std::span<Var* const> vars) {
  for (Var* v : vars)
    if (v->held.exchange(0, std::memory_order_acq_rel) != 0) g_num_held.fetch_sub(1, std::memory_order_acq_rel);
}

void SetFlushHook(void (*flush)()) { g_flush.store(flush, std::memory_order_release); }

Engine& Engine::Get() {
  static Engine* engine = [] {
    env::CheckEnvironment();
    profiler::StartFromEnvironment();  // before the drain below: its trace is written after it
    // Leaked on purpose: worker threads must outlive every static that may push at exit.
    Engine* e = new HoldingEngine(CreateEngine(env::Get("KILN_ENGINE")).release());
    DrainBeforeExit();  // statics made before the engine outlive this drain
    return e;
  }();
  return *engine;
}

}  // namespace kiln::engine

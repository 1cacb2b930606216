// Threaded and naive implementations of the dependency engine (see engine.h for semantics).
//
// Each Var keeps a FIFO of tasks waiting on it and the number of running readers / whether a
// writer runs. A task carries a counter of variables that have not yet granted it access; the
// last grant schedules it on the worker pool of its (device, stream). Pushes are serialized by
// one mutex so that tasks enter every variable's FIFO in the same order (no deadlock between
// two tasks that read and write the same pair of variables from different threads).
#include "kiln/runtime/engine.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "kiln/runtime/env.h"
#include "kiln/runtime/wait_point.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/cuda.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define KILN_PAUSE() _mm_pause()
#else
#define KILN_PAUSE() std::this_thread::yield()
#endif

namespace kiln::engine {

namespace {
thread_local bool tls_on_worker = false;
struct Task;

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
}  // namespace

// A variable's state lives on four cache lines, by who writes it: the pushing thread alone
// (reference count, lock-free reads issued), the slow path under `mu`, flags that change rarely,
// and the count of finished lock-free reads that the workers bump. Reading a value no one is
// writing, the common case of every eager op's inputs, then moves no cache line between the
// pushing thread and the workers. (Padding rather than alignas: an over-aligned `new` takes
// malloc's slow memalign path.)
class Var {
 public:
  struct Pending {
    Task* task;
    bool write;
  };
  // Changed by Push, ReleaseVar and the reaping of finished tasks, all on pushing threads.
  std::atomic<int> refs{1};
  // Reads granted without the lock while the variable was idle (see ThreadedEngine::Enter).
  // Written only under the engine's push order; read under mu.
  std::atomic<int64_t> fast_issued{0};

  char pad0_[64];
  SpinLock mu;
  std::vector<Pending> queue;  // waiting tasks, FIFO from `head`
  size_t head = 0;
  int running_reads = 0;       // reads granted under mu
  bool running_write = false;
  std::exception_ptr error;    // guarded by mu

  char pad1_[64];
  // running_write || a task is queued. Written under mu; producers test it without the lock.
  std::atomic<bool> busy{false};
  std::atomic<bool> has_error{false};  // mirrors `error != nullptr` for lock-free checks

  char pad2_[64];
  std::atomic<int64_t> fast_done{0};

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

namespace {

// A link in a worker pool's ready queue.
struct QueueNode {
  std::atomic<QueueNode*> next{nullptr};
};

struct Task : QueueNode {
  std::function<void()> fn;
  TaskOptions opts;
  InlineVec<Var*, 4> reads, writes;
  uint64_t writes_read = 0;  // bit i: writes[i] was also listed as a read (an in-place update)
  uint64_t fast_reads = 0;   // bit i: reads[i] was granted without the variable's lock
  std::atomic<int> wait{0};
  Task* next_dead = nullptr;  // link in the graveyard (see ThreadedEngine::Bury)
};

// Rethrows `e` as the same kiln error type with the task's name (and call site) in front.
std::exception_ptr NameError(std::exception_ptr e, const TaskOptions& o) {
  std::string prefix = std::string("error in operator '") + o.name + "'";
  if (o.call_site) prefix += std::string(" (called from ") + o.call_site + ")";
  prefix += ": ";
  try {
    std::rethrow_exception(e);
  } catch (const InternalError& x) {
    return std::make_exception_ptr(InternalError(prefix + x.what()));
  } catch (const ShapeError& x) {
    return std::make_exception_ptr(ShapeError(prefix + x.what()));
  } catch (const DTypeError& x) {
    return std::make_exception_ptr(DTypeError(prefix + x.what()));
  } catch (const DeviceError& x) {
    return std::make_exception_ptr(DeviceError(prefix + x.what()));
  } catch (const FormatError& x) {
    return std::make_exception_ptr(FormatError(prefix + x.what()));
  } catch (const ValueError& x) {
    return std::make_exception_ptr(ValueError(prefix + x.what()));
  } catch (const StateError& x) {
    return std::make_exception_ptr(StateError(prefix + x.what()));
  } catch (const MemoryError& x) {
    return std::make_exception_ptr(MemoryError(prefix + x.what()));
  } catch (const std::bad_alloc&) {
    return std::make_exception_ptr(MemoryError(prefix + "out of memory"));
  } catch (const std::exception& x) {
    return std::make_exception_ptr(Error(prefix + x.what()));
  } catch (...) {
    return std::make_exception_ptr(Error(prefix + "unknown exception"));
  }
}

void Dedupe(std::span<Var* const> reads, std::span<Var* const> writes, Task* t) {
  for (Var* w : writes) {
    bool dup = false;
    for (Var* x : t->writes) dup |= x == w;
    if (!dup) t->writes.push_back(w);
  }
  for (Var* r : reads) {
    bool dup = false;
    for (size_t i = 0; i < t->writes.size(); ++i)
      if (t->writes[i] == r) {
        dup = true;
        if (i < 64) t->writes_read |= uint64_t{1} << i;
      }
    for (Var* x : t->reads) dup |= x == r;
    if (!dup) t->reads.push_back(r);
  }
}

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
    return v->error;
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
    std::exception_ptr err;
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
    if (!err) {
      try {
        t->fn();
        // GPU work is asynchronous: its errors surface at the stream sync, which must be inside
        // the try so they are stored on the outputs like any other.
        if (t->opts.device.is_gpu() && static_cast<uint8_t>(t->opts.stream) != 255) {
          if (IsNaive()) cuda::SynchronizeDevice(t->opts.device);
          else cuda::SynchronizeWorkerStream();
        }
      } catch (...) {
        err = NameError(std::current_exception(), t->opts);
        std::lock_guard<std::mutex> g(error_mu_);
        if (!first_error_) first_error_ = err;
      }
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

  void RethrowFirstError() {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> g(error_mu_);
      std::swap(e, first_error_);
    }
    if (e) std::rethrow_exception(e);
  }

  // Counters on separate cache lines by writer: the pushing thread and the workers.
  alignas(64) std::atomic<int64_t> pushed_{0}, pushed_bytes_{0};
  std::atomic<int64_t> peak_pending_{0}, peak_pending_bytes_{0};
  alignas(64) std::atomic<int64_t> completed_{0}, completed_bytes_{0};
  alignas(64) std::atomic<int64_t> max_pending_{1024}, max_pending_bytes_{32 << 20};
  WaitPoint drained_;
  std::mutex error_mu_;
  std::exception_ptr first_error_;
};

// ---- naive -------------------------------------------------------------------------------------

class NaiveEngine final : public EngineBase {
 public:
  void Push(std::function<void()> fn, std::span<Var* const> reads, std::span<Var* const> writes,
            const TaskOptions& opts) override {
    Task t;
    t.fn = std::move(fn);
    t.opts = opts;
    Dedupe(reads, writes, &t);
    CountPushed(&t);
    Execute(&t);
    CountCompleted(opts.bytes);
  }
  void WaitForVar(Var* v) override {
    if (auto e = VarError(v)) std::rethrow_exception(e);
  }
  void WaitForAll() override { RethrowFirstError(); }
  bool IsNaive() const override { return true; }
};

// ---- threaded ----------------------------------------------------------------------------------

// A FIFO of ready tasks served by a few threads. Workers spin briefly on an empty queue, then
// sleep on a WaitPoint; Enqueue makes no system call unless a worker sleeps.
//
// The queue is an intrusive multi-producer list (Vyukov's): a push is one exchange on `tail_`
// and one store to the previous task's link, so handing a task to a spinning worker moves about
// one cache line. Workers pop under `pop_mu_`, which producers never touch. A task is popped only
// once its link is set, so no producer writes to a task a worker may already have finished.
class WorkerPool {
 public:
  WorkerPool(int threads, Device device, StreamKind stream, std::function<void(Task*)> run)
      : run_(std::move(run)) {
    for (int i = 0; i < threads; ++i)
      threads_.emplace_back([this, device, stream] {
        tls_on_worker = true;
        if (device.is_gpu()) cuda::BindWorkerThread(device, static_cast<int>(stream));
        Loop();
      });
  }
  ~WorkerPool() {
    stop_.store(true);
    ready_.Notify();
    for (auto& t : threads_) t.join();
  }

  void Enqueue(Task* t) {
    Link(t);
    ready_.Notify();
  }

 private:
  void Link(QueueNode* n) {
    n->next.store(nullptr, std::memory_order_relaxed);
    QueueNode* prev = tail_.exchange(n, std::memory_order_seq_cst);  // seq_cst: see HasWork
    prev->next.store(n, std::memory_order_release);
  }

  Task* TryPop() {
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
    return static_cast<Task*>(h);
  }

  bool HasWork() {
    std::lock_guard<SpinLock> g(pop_mu_);
    // tail_ (seq_cst) rather than stub_.next: the producer's exchange of tail_ and its load of the
    // sleeper count are both seq_cst, so a sleeper that registered after that load sees the task.
    return head_ != &stub_ || tail_.load(std::memory_order_seq_cst) != &stub_;
  }

  void Loop() {
    for (;;) {
      Task* t = TryPop();
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

  std::function<void(Task*)> run_;
  QueueNode stub_;
  alignas(64) std::atomic<QueueNode*> tail_{&stub_};  // written by producers
  alignas(64) SpinLock pop_mu_;                       // the workers' side
  QueueNode* head_ = &stub_;
  WaitPoint ready_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

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
    Dedupe(reads, writes, t);
    Enter(t);
  }

  void WaitForVar(Var* v) override {
    {  // fast path: nothing writes v now or later in the queue
      std::lock_guard<SpinLock> g(v->mu);
      bool writer_ahead = v->running_write;
      for (size_t i = v->head; i < v->queue.size() && !writer_ahead; ++i)
        writer_ahead = v->queue[i].write;
      if (!writer_ahead) {
        if (v->error) std::rethrow_exception(v->error);
        return;
      }
    }
    if (tls_on_worker)
      KILN_THROW(StateError) << "wait_to_read called inside an engine task: that would deadlock; "
                                "sync only from the thread that queues work";
    // The flag is shared with the task: the waker may still be inside notify when we return.
    // The error is captured by the waiter itself: a writer queued behind it may clear it later.
    struct Result {
      std::atomic<int> done{0};
      std::exception_ptr error;
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
      r->done.store(1), r->done.notify_all();
    }, vs, o);
    // Spin a little first: a short task finishes sooner than a futex sleep and wake-up take.
    for (int i = 0; i < 2000 && !r->done.load(std::memory_order_acquire); ++i) KILN_PAUSE();
    r->done.wait(0);
    Reap();
    if (r->error) std::rethrow_exception(r->error);
  }

  void WaitForAll() override {
    if (tls_on_worker)
      KILN_THROW(StateError) << "waitall called inside an engine task: that would deadlock";
    for (int i = 0; i < 2000 && (Pending() != 0 || inline_in_flight_.load() != 0); ++i) KILN_PAUSE();
    // An inline run on another thread (a C++ caller racing with exit's drain) is waited for too.
    auto idle = [&] { return Pending() == 0 && inline_in_flight_.load() == 0; };
    SleepUntil(idle);
    Reap();
    RethrowFirstError();
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
    std::exception_ptr err;
    {
      struct InTask {  // inside the task this thread is a worker: no throttling, waits refused
        bool was = tls_on_worker;
        InTask() { tls_on_worker = true; }
        ~InTask() { tls_on_worker = was; }
      } in_task;
      try {
        fn();
      } catch (...) {
        err = NameError(std::current_exception(), opts);
        std::lock_guard<std::mutex> g(error_mu_);
        if (!first_error_) first_error_ = err;
      }
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
    SleepUntil([&] { return fits(2) || Pending() <= 1; });
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
      p = new WorkerPool(d.is_cpu() && stream == 0 ? cpu_workers_ : 1, d, static_cast<StreamKind>(stream),
                         [this](Task* t) { Finish(t, true); });
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
  if (kind == "naive") return std::make_unique<NaiveEngine>();
  if (kind == "threaded")
    return std::make_unique<ThreadedEngine>(static_cast<int>(env::GetInt("KILN_CPU_WORKERS")));
  KILN_THROW(ValueError) << "KILN_ENGINE=" << kind << " is not an engine: expected threaded or naive";
}

Engine& Engine::Get() {
  static Engine* engine = [] {
    env::CheckEnvironment();
    // Leaked on purpose: worker threads must outlive every static that may push at exit.
    Engine* e = CreateEngine(env::Get("KILN_ENGINE")).release();
    DrainBeforeExit();  // statics made before the engine outlive this drain
    return e;
  }();
  return *engine;
}

}  // namespace kiln::engine

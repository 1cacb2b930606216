// The dependency engine (DESIGN.md section 4), in the manner of MXNet's.
//
// Every task names the variables it reads and the ones it writes. A task runs once the earlier
// writers of its reads, and the earlier readers and writers of its writes, have finished; tasks
// with no conflict run concurrently on the workers of their device. Push returns at once.
//
// Errors: an exception thrown by a task is stored on the variables it writes; tasks that read
// such a variable are skipped and pass the error on. WaitForVar rethrows the stored error (its
// type kept, its message naming the task and its call site); WaitForAll, the first since its last
// call that no WaitForVar raised or a live variable holds. The engine keeps running. While they
// sleep, both run the interrupt check (interrupt.h), which may end the wait early (Ctrl-C).
//
// Backpressure: at most `max_pending` tasks (KILN_ENGINE_MAX_PENDING) and `max_pending_bytes`
// bytes of task outputs (KILN_ENGINE_MAX_PENDING_MB) wait at once, except that one task may always
// wait behind the running one; Push from a non-worker thread blocks until there is room, which
// bounds the memory a fast producer can claim (and, on CPUs, keeps queued outputs in cache).
//
// Inline: a task marked may_run_inline whose variables are all free at Push runs on the pushing
// thread before Push returns (the frontend marks CPU ops that touch few bytes: the hand-off to a
// worker would cost more than the op). Ordering and errors are exactly as if a worker ran it.
// The caller must keep the variables alive for the duration of Push (an inline run takes no
// reference of its own); WaitForAll also waits for inline runs in progress on other threads.
//
// KILN_ENGINE=naive runs every task on the calling thread at Push (same error semantics).
// What it does not do: priorities, or fairness between devices beyond FIFO per worker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kiln/runtime/device.h"

namespace kiln::engine {

/// An engine variable: the unit of dependency tracking (one per Storage). Opaque.
class Var;

/// Which queue of a device runs the task. On CPU devices kComm tasks (collectives) run on a
/// one-thread pool of their own, so communication never waits behind busy compute workers; the
/// other kinds share the compute workers. On GPUs each kind is its own CUDA stream.
enum class StreamKind : uint8_t { kCompute = 0, kCopyH2D = 1, kCopyD2H = 2, kComm = 3 };

struct TaskOptions {
  Device device = cpu(0);
  StreamKind stream = StreamKind::kCompute;
  const char* name = "task";       ///< op name, used in error messages and the profiler
  const char* call_site = nullptr;  ///< where the user called it (set by the frontend), optional
  size_t bytes = 0;                 ///< bytes the task writes, for memory backpressure
  /// A short CPU kernel that never blocks: when nothing it depends on is pending at Push, it runs
  /// right there on the pushing thread, which is cheaper than handing it to a worker.
  bool may_run_inline = false;
};

struct EngineStats {
  int64_t pushed = 0;
  int64_t completed = 0;
  int64_t pending = 0;
  int64_t peak_pending = 0;
  int64_t pending_bytes = 0;
  int64_t peak_pending_bytes = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;

  /// The process-wide engine, chosen by KILN_ENGINE ("threaded", the default, or "naive").
  static Engine& Get();

  virtual Var* NewVar() = 0;
  /// Releases the creator's reference; the variable dies once no pending task uses it.
  virtual void ReleaseVar(Var* v) = 0;

  /// Queues `fn`. A variable listed in both `reads` and `writes` counts as a write;
  /// duplicates are ignored.
  virtual void Push(std::function<void()> fn, std::span<Var* const> reads,
                    std::span<Var* const> writes, const TaskOptions& opts) = 0;

  /// Blocks until every task that writes `v` pushed so far has finished; rethrows its error.
  virtual void WaitForVar(Var* v) = 0;
  /// Blocks until every task pushed so far has finished; rethrows the first error since the
  /// previous call that no WaitForVar raised or a live variable holds (and forgets them all).
  virtual void WaitForAll() = 0;
  /// Blocks until as many tasks have completed as had been pushed when it was called (then once
  /// more for the frees that reaping pushes), leaving errors where they are for WaitForVar and
  /// WaitForAll to raise, and without synchronizing devices; false, without waiting, on a worker
  /// thread (it would deadlock). An allocator's last resort before out of memory: storage the
  /// user dropped is given back by tasks queued behind the work that uses it. The interrupt
  /// check (Ctrl-C) may end it with an exception.
  virtual bool Drain() = 0;
  /// The error stored on `v`, if any (without waiting).
  virtual std::exception_ptr VarError(Var* v) = 0;

  virtual EngineStats Stats() const = 0;
  virtual void ResetPeak() = 0;
  virtual bool IsNaive() const = 0;
  /// Sets the backpressure limits (tasks, bytes); 0 keeps the current value.
  virtual void SetLimits(int64_t max_pending, int64_t max_pending_bytes) = 0;
};

/// Work the frontend holds back before pushing it (frontend/deferred.h: a compiled call recorded
/// under autograd.record(), which the next compiled call may join). Its variables are held, as
/// read or `written` by it: the process engine (Engine::Get) calls the flush hook before a Push
/// that writes a held variable or reads one held as written, before WaitForVar on one held as
/// written, and before WaitForAll (not Drain: pushing more frees nothing); the hook pushes the
/// held work and releases its variables. A held variable must stay alive until it is released.
void HoldVars(std::span<Var* const> vars, bool written);
void ReleaseHeldVars(std::span<Var* const> vars);
void SetFlushHook(void (*flush)());

/// Creates an engine of the given kind ("threaded" or "naive"); for tests and benchmarks.
std::unique_ptr<Engine> CreateEngine(const std::string& kind);

/// Registers one more exit handler that finishes queued work. Exit handlers and the destructors
/// of statics run in reverse order of registration, so a library that builds static state lazily
/// (oneDNN on its first primitive of a kind, possibly on a worker) calls this right after: queued
/// tasks then finish before that state is destroyed.
void DrainBeforeExit();

/// True on a thread that belongs to an engine's worker pool.
bool OnWorkerThread();

}  // namespace kiln::engine

// The profiler (DESIGN.md section 4): a process-wide recorder of Chrome trace-event JSON, the
// format Perfetto and chrome://tracing open ("traceEvents" with "X" complete events, "C"
// counters, "M" lane names).
//
// What records into it: engine tasks (one lane per worker thread and per GPU stream; the op's name,
// the time it ran and, in args, the time it waited between Push and its start), GPU work timed
// by events on its stream (a lane per stream, "device time"), a compiled call and its steps
// nested inside it, collectives with their byte counts, compile events (tracing, each pass,
// codegen, kernel-cache hits and misses), and a memory counter per device (bytes in use).
//
// Cost: off, every hook is one relaxed atomic load (Enabled). On, an event is appended to a
// buffer of the recording thread (no global lock; the buffer's own mutex is contended only by a
// dump), with steady_clock timestamps. Events stay in memory until Clear or a dump with
// finished=true; what it does not do: sampling, call stacks, streaming to disk while running.
//
// KILN_PROFILE=path profiles the whole run and writes the trace to `path` at exit.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::profiler {

/// What is recorded, by kind (MXNet's profile_* switches select among them).
enum Category : uint32_t {
  kOperator = 1u << 0,   ///< engine tasks: eager ops and compiled calls as queued work
  kSymbolic = 1u << 1,   ///< a compiled call and the steps inside it
  kMemory = 1u << 2,     ///< bytes in use per device ("C" counters)
  kCompile = 1u << 3,    ///< tracing, passes, codegen, kernel-cache hits and misses
  kCollective = 1u << 4, ///< collectives, with their byte counts
  kGpu = 1u << 5,        ///< GPU work timed by events on its stream
  kAll = (1u << 6) - 1,
};

namespace detail {
inline std::atomic<uint32_t> g_recording{0}; // the categories recorded now; 0 when off
} // namespace detail

/// Whether `c` is being recorded: one relaxed load (the whole cost of a hook when off).
inline bool Enabled(uint32_t c) { return (detail::g_recording.load(std::memory_order_relaxed) & c) != 0; }
/// steady_clock in nanoseconds.
inline int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// An event's numeric arguments: up to three (key, value) pairs; keys are static strings.
struct Args {
  const char* key[3] = {nullptr, nullptr, nullptr};
  double value[3] = {0, 0, 0};
  Args() = default;
  Args(const char* k0, double v0) { key[0] = k0, value[0] = v0; }
  Args(const char* k0, double v0, const char* k1, double v1) {
    key[0] = k0, value[0] = v0, key[1] = k1, value[1] = v1;
  }
};

/// Records a complete ("X") event on the calling thread's lane. `cat` is a static string.
void Complete(Category c, std::string_view name, int64_t start_ns, int64_t end_ns, const Args& args = {});
/// The same on a lane that is not a thread (a GPU stream's device time), named `lane`.
void CompleteOnLane(Category c, std::string_view lane, std::string_view name, int64_t start_ns,
                    int64_t end_ns, const Args& args = {});
/// Records a counter ("C") sample, e.g. Counter(kMemory, "memory cpu(0)", "bytes_in_use", n).
void Counter(Category c, std::string_view name, const char* key, double value);
/// Names the calling thread's lane (engine workers: "cpu(0) worker 0", "gpu(1) compute stream").
/// Cheap; may be called when the profiler is off (the name is kept for later).
void NameThisThread(std::string_view name);

/// Times the enclosing scope as one complete event when `c` is recorded (checked once, at entry).
class Scope {
public:
  Scope(Category c, std::string_view name, const Args& args = {}) : c_(c) {
    if (Enabled(c)) name_ = name, args_ = args, start_ = Now();
  }
  ~Scope() {
    if (start_) Complete(c_, name_, start_, Now(), args_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  /// Changes the event's name before it is recorded (a kernel-cache "hit" becomes a "miss").
  void Rename(std::string_view name) {
    if (start_) name_ = name;
  }

private:
  Category c_;
  std::string name_;
  Args args_;
  int64_t start_ = 0;
};

/// Starts recording the categories in `mask` (kAll by default); 0 stops. Keeps events so far.
void SetRecording(uint32_t mask);
uint32_t Recording();
/// Forgets every event recorded so far and their aggregate statistics (lane names stay).
void Clear();
/// Forgets the trace's events but keeps their aggregate statistics for AggregateTable() until
/// Clear(): MXNet's dump(finished=True), whose statistics stay until dumps(reset=True).
void ClearTrace();
/// The trace as Chrome trace-event JSON (every event so far, lanes named, times in microseconds
/// since the profiler's epoch).
std::string TraceJson();
/// Writes TraceJson() to `path` atomically (WriteFileAtomic). Throws FileError naming the path
/// when it cannot be written.
void WriteTrace(const std::string& path);
/// The aggregate table, per category and name: count, total, min, max, mean (milliseconds for
/// times, kilobytes for memory), in the layout of MXNet's profiler.dumps(): the events recorded
/// so far and those ClearTrace() forgot since the last Clear().
std::string AggregateTable();
/// Number of events recorded so far (all lanes).
int64_t EventCount();
/// A GPU task's device-time interval: events recorded on its stream before and after its work,
/// resolved to host time when the trace is read. Called by the engine on the stream's worker.
struct GpuSpan {
  void* start = nullptr; ///< gpurt::Event (timing)
  void* stream = nullptr;
  int64_t issued_ns = 0; ///< host time just before the start event was recorded
};
/// Records a timing event on `stream` (the worker's current stream) before a GPU task's work.
GpuSpan GpuBegin(void* stream, int device);
/// Records the end event and queues the span; resolved (EventElapsedMs) when the trace is read.
void GpuEnd(const GpuSpan& s, int device, int stream_kind, std::string_view name);

/// Times a GPU task's stream work (GpuBegin at construction, GpuEnd when the scope ends, also
/// when the task's body throws). `name` must outlive the scope.
class GpuScope {
public:
  GpuScope(bool on, void* stream, int device, int stream_kind, const char* name)
      : device_(device), kind_(stream_kind), name_(name) {
    if (on) span_ = GpuBegin(stream, device);
  }
  ~GpuScope() {
    if (!span_.start) return;
    try {
      GpuEnd(span_, device_, kind_, name_);
    } catch (...) { // a faulted stream: the task's own error is what gets reported
    }
  }
  GpuScope(const GpuScope&) = delete;
  GpuScope& operator=(const GpuScope&) = delete;

private:
  GpuSpan span_;
  int device_, kind_;
  const char* name_;
};

/// KILN_PROFILE: when set, starts recording everything and registers the write at exit.
/// Called once by Engine::Get (idempotent).
void StartFromEnvironment();

} // namespace kiln::profiler

// The synchronous engine (KILN_ENGINE=naive: every task runs on the pushing thread, with the
// threaded engine's error semantics), and the task helpers both engines use.
#include <cstring>
#include <string>

#include "engine_task.h"

namespace kiln::engine::detail {

// Names the task in the error's message, keeping the error's own type: a DistributedError stays
// a DistributedError, a GpuError keeps its code. The message is replaced in place, through the
// std::runtime_error base of the very object thrown (assigning the base leaves the dynamic type
// and the derived members alone), so no list of types can miss one. An error that already names
// a task (a body that rethrew another task's stored error) is passed on unchanged. The object is
// not shared yet: the task that threw it is the only one holding it.
std::exception_ptr NameError(std::exception_ptr e, const TaskOptions& o) {
  static constexpr const char kHead[] = "error in operator '";
  std::string prefix = std::string(kHead) + o.name + "'";
  if (o.call_site) prefix += std::string(" (called from ") + o.call_site + ")";
  prefix += ": ";
  try {
    std::rethrow_exception(e);
  } catch (Error& x) {
    if (std::strncmp(x.what(), kHead, sizeof(kHead) - 1) != 0)
      static_cast<std::runtime_error&>(x) = std::runtime_error(prefix + x.what());
    return std::current_exception();
  } catch (const std::bad_alloc&) {
    // The size of the failed request is unknown here; the task's device and output size are known.
    return std::make_exception_ptr(MemoryError(
        prefix + "out of memory: a host allocation failed (std::bad_alloc) in a task on " + o.device.str() +
        " writing " + std::to_string(o.bytes) + " bytes; free tensors or use smaller batches"));
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

namespace {

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
    TaskErrorPtr e;
    {
      std::lock_guard<SpinLock> g(v->mu);
      e = v->error;
    }
    if (e) Raise(e);
  }
  void WaitForAll() override { RethrowFirstError(); }
  bool Drain() override { return true; }  // every task ran at its Push
  bool IsNaive() const override { return true; }
};

}  // namespace

std::unique_ptr<Engine> MakeNaiveEngine() { return std::make_unique<NaiveEngine>(); }

}  // namespace kiln::engine::detail

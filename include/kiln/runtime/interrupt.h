// Interrupting the engine's sync points. A host language that lets its user stop a program (the
// Python bindings: Ctrl-C raises KeyboardInterrupt) installs a check; a thread that waits at a
// sync point (Engine::WaitForVar, Engine::WaitForAll) calls it every kInterruptPoll while it
// sleeps, and a check that throws ends the wait with that exception. The queued work is not
// cancelled: it runs to its end in the background, and its results and errors are there for the
// next wait. Waits that must not throw (backpressure inside Push, which destructors reach) are
// never interrupted, nor is a kernel that already runs; they call the blocking hook instead.
#pragma once

#include <chrono>

namespace kiln {

/// A check that throws to end a wait (or returns to go on waiting).
using InterruptCheck = void (*)();

/// How often a waiting sync point calls the check (Ctrl-C is answered within about this).
inline constexpr std::chrono::milliseconds kInterruptPoll{20};

/// Installs `check` for the whole process (nullptr removes it).
void SetInterruptCheck(InterruptCheck check);
/// The installed check, or nullptr.
InterruptCheck GetInterruptCheck();

/// Around a wait that cannot be interrupted and may last (backpressure inside Push): a host
/// language lets go of its global lock there, so that the threads the wait depends on can run
/// (the Python bindings: the GIL, which a worker freeing a Python-owned buffer needs). Called with
/// true before the wait and false after it, on the waiting thread; it must not throw.
using BlockingHook = void (*)(bool entering);
/// Installs `hook` for the whole process (nullptr removes it).
void SetBlockingHook(BlockingHook hook);

/// Calls the blocking hook for the scope's lifetime.
class BlockingRegion {
 public:
  BlockingRegion();
  ~BlockingRegion();
  BlockingRegion(const BlockingRegion&) = delete;
  BlockingRegion& operator=(const BlockingRegion&) = delete;

 private:
  BlockingHook hook_;
};

}  // namespace kiln

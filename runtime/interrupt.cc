// The interrupt check of the engine's sync points and the blocking hook of its other waits
// (interrupt.h): process-wide hooks.
#include "kiln/runtime/interrupt.h"

#include <atomic>

namespace kiln {

namespace {
std::atomic<InterruptCheck> g_check{nullptr};
std::atomic<BlockingHook> g_blocking{nullptr};
}  // namespace

void SetInterruptCheck(InterruptCheck check) { g_check.store(check, std::memory_order_release); }

InterruptCheck GetInterruptCheck() { return g_check.load(std::memory_order_acquire); }

void SetBlockingHook(BlockingHook hook) { g_blocking.store(hook, std::memory_order_release); }

// The hook seen on entry is the one called on exit, so removing it in between cannot unbalance it.
BlockingRegion::BlockingRegion() : hook_(g_blocking.load(std::memory_order_acquire)) {
  if (hook_) hook_(true);
}
BlockingRegion::~BlockingRegion() {
  if (hook_) hook_(false);
}

}  // namespace kiln

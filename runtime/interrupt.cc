// The interrupt check of the engine's sync points (interrupt.h): one process-wide hook.
#include "kiln/runtime/interrupt.h"

#include <atomic>

namespace kiln {

namespace {
std::atomic<InterruptCheck> g_check{nullptr};
}  // namespace

void SetInterruptCheck(InterruptCheck check) { g_check.store(check, std::memory_order_release); }

InterruptCheck GetInterruptCheck() { return g_check.load(std::memory_order_acquire); }

}  // namespace kiln

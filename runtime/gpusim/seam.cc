// The registry behind gpusim/emulator.h: the module compiler codegen installs, and the device
// memory window and live-range check the simulated GPUs install. Nothing else.
#include "kiln/runtime/gpusim/emulator.h"
#include "kiln/runtime/gpusim/seam_internal.h"

#include <atomic>

namespace kiln::gpusim {

namespace {
std::atomic<ModuleCompiler> g_compiler{nullptr};
std::atomic<RangeChecker> g_checker{nullptr};
MemoryWindow g_window;
}  // namespace

void SetModuleCompiler(ModuleCompiler compiler) { g_compiler.store(compiler); }
ModuleCompiler GetModuleCompiler() { return g_compiler.load(); }

const MemoryWindow& DeviceMemoryWindow() { return g_window; }
void SetDeviceMemoryWindow(const MemoryWindow& w) { g_window = w; }

void SetLiveRangeChecker(RangeChecker checker) { g_checker.store(checker); }
RangeChecker GetLiveRangeChecker() { return g_checker.load(); }
bool IsLiveDeviceRange(uintptr_t address, size_t bytes) {
  RangeChecker c = g_checker.load();
  return c ? c(address, bytes) : false;
}

}  // namespace kiln::gpusim

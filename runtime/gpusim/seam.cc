// The registry behind gpusim/emulator.h: the module compiler codegen installs, and the device
// memories of the simulated platforms (a process may hold several), with the calling thread's
// launch scope. Nothing else.
#include "kiln/runtime/gpusim/emulator.h"
#include "kiln/runtime/gpusim/seam_internal.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace kiln::gpusim {

namespace {
std::atomic<ModuleCompiler> g_compiler{nullptr};
std::mutex g_mu;
std::vector<const DeviceMemory*> g_memories;  // registered, oldest first
thread_local const DeviceMemory* t_memory = nullptr;  // the launch's, inside a DeviceMemoryScope
}  // namespace

void SetModuleCompiler(ModuleCompiler compiler) { g_compiler.store(compiler); }
ModuleCompiler GetModuleCompiler() { return g_compiler.load(); }

void RegisterDeviceMemory(const DeviceMemory* memory) {
  std::lock_guard<std::mutex> g(g_mu);
  g_memories.push_back(memory);
}

void UnregisterDeviceMemory(const DeviceMemory* memory) {
  std::lock_guard<std::mutex> g(g_mu);
  g_memories.erase(std::remove(g_memories.begin(), g_memories.end(), memory), g_memories.end());
}

DeviceMemoryScope::DeviceMemoryScope(const DeviceMemory& memory) : prev_(t_memory) { t_memory = &memory; }
DeviceMemoryScope::~DeviceMemoryScope() { t_memory = prev_; }

const MemoryWindow& DeviceMemoryWindow() {
  static const MemoryWindow none;
  if (t_memory) return t_memory->window();
  std::lock_guard<std::mutex> g(g_mu);
  return g_memories.empty() ? none : g_memories.back()->window();
}

bool IsLiveDeviceRange(uintptr_t address, size_t bytes) {
  if (t_memory) return t_memory->IsLive(address, bytes);
  std::lock_guard<std::mutex> g(g_mu);
  for (const DeviceMemory* m : g_memories) {
    const MemoryWindow& w = m->window();
    if (address >= w.device_begin && address < w.device_end) return m->IsLive(address, bytes);
  }
  return false;
}

}  // namespace kiln::gpusim

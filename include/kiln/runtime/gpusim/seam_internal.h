// What the simulated GPUs (runtime/gpusim/) install behind gpusim/emulator.h. Not for codegen.
#pragma once

#include "kiln/runtime/gpusim/emulator.h"

namespace kiln::gpusim {

/// One simulated platform's device memory, as the seam answers for it.
class DeviceMemory {
 public:
  virtual const MemoryWindow& window() const = 0;  ///< fixed for the object's life
  virtual bool IsLive(uintptr_t address, size_t bytes) const = 0;

 protected:
  ~DeviceMemory() = default;
};

/// A device memory is registered for its life (its constructor and destructor call these): the
/// one registered last is the window outside launches, and any answers IsLiveDeviceRange there.
void RegisterDeviceMemory(const DeviceMemory* memory);
void UnregisterDeviceMemory(const DeviceMemory* memory);

/// Makes `memory` the calling thread's for the scope: DeviceMemoryWindow and IsLiveDeviceRange
/// answer for it alone. A simulated platform runs each kernel inside one, with its own memory.
class DeviceMemoryScope {
 public:
  explicit DeviceMemoryScope(const DeviceMemory& memory);
  ~DeviceMemoryScope();
  DeviceMemoryScope(const DeviceMemoryScope&) = delete;
  DeviceMemoryScope& operator=(const DeviceMemoryScope&) = delete;

 private:
  const DeviceMemory* prev_;
};

}  // namespace kiln::gpusim

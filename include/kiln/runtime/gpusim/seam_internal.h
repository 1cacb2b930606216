// What the simulated GPUs (runtime/gpusim/) install behind gpusim/emulator.h. Not for codegen.
#pragma once

#include "kiln/runtime/gpusim/emulator.h"

namespace kiln::gpusim {

/// Set once, before the first simulated kernel or copy, by the simulated device memory.
void SetDeviceMemoryWindow(const MemoryWindow& w);
using RangeChecker = bool (*)(uintptr_t address, size_t bytes);
void SetLiveRangeChecker(RangeChecker checker);
RangeChecker GetLiveRangeChecker();  ///< for tests that install their own and restore it

}  // namespace kiln::gpusim

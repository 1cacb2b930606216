// The CUDA driver API as the CUDA platform (gpu_cuda.cc) uses it: modules and launches. Internal
// to runtime/cuda/; errors are gpurt::GpuErrors with the driver's CUresult.
#pragma once

#include <string>

#include "kiln/runtime/gpu.h"

namespace kiln::cuda::drv {

/// cuModuleLoadDataEx of `ptx` in the current context; the JIT log is quoted on failure.
void* LoadModule(const std::string& ptx);
void UnloadModule(void* module);
/// GpuError kNotFound naming `name` when the module has none.
void* GetFunction(void* module, const std::string& name);
void SetMaxDynamicSharedMemory(void* function, int bytes);
void Launch(void* function, gpurt::Dim3 grid, gpurt::Dim3 block, unsigned shared_bytes, void* stream, void** args);

}  // namespace kiln::cuda::drv

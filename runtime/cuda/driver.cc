// Kernels on a real GPU through the CUDA driver API: PTX modules loaded with cuModuleLoadDataEx
// (the driver JIT-compiles them; its error log is quoted in the DeviceError) and launches with
// cuLaunchKernel on a kiln stream. The driver's functions are reached through
// cudaGetDriverEntryPointByVersion for the toolkit's CUDA_VERSION, so each binds the interface
// cuda.h declares (never dlsym of a bare legacy name, which binds the old one, e.g. cuMemAlloc
// instead of cuMemAlloc_v2).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "driver.h"
#include "kiln/runtime/error.h"

namespace kiln::cuda {

namespace {

struct DriverApi {
  decltype(&::cuModuleLoadDataEx) module_load_data_ex = nullptr;
  decltype(&::cuModuleGetFunction) module_get_function = nullptr;
  decltype(&::cuLaunchKernel) launch_kernel = nullptr;
  decltype(&::cuModuleUnload) module_unload = nullptr;
  decltype(&::cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
};

template <class F>
void Resolve(const char* name, F& f) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, CUDA_VERSION, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    KILN_THROW(DeviceError) << "the CUDA driver gives no entry point '" << name << "' for CUDA " << CUDA_VERSION / 1000
                            << "." << CUDA_VERSION % 1000 / 10 << " (" << cudaGetErrorString(e) << ", query result "
                            << static_cast<int>(q) << "); kiln was built with this toolkit: install an NVIDIA "
                            << "driver that supports it";
  }
  f = reinterpret_cast<F>(p);
}

const DriverApi& Driver() {
  static const DriverApi api = [] {
    DriverApi a;
    Resolve("cuModuleLoadDataEx", a.module_load_data_ex);
    Resolve("cuModuleGetFunction", a.module_get_function);
    Resolve("cuLaunchKernel", a.launch_kernel);
    Resolve("cuModuleUnload", a.module_unload);
    Resolve("cuFuncSetAttribute", a.func_set_attribute);
    Resolve("cuGetErrorName", a.get_error_name);
    Resolve("cuGetErrorString", a.get_error_string);
    return a;
  }();
  return api;
}

std::string Describe(CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  Driver().get_error_name(r, &name);
  Driver().get_error_string(r, &text);
  return std::string(name ? name : "CUresult") + " (" + std::to_string(static_cast<int>(r)) + "): " +
         (text ? text : "unknown error");
}

}  // namespace

namespace drv {

void* LoadModule(const std::string& ptx) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  static char error_log[16384], info_log[16384];  // under `mu`
  error_log[0] = info_log[0] = 0;
  CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER,
                         CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
  void* vals[] = {error_log, reinterpret_cast<void*>(uintptr_t{sizeof error_log}), info_log,
                  reinterpret_cast<void*>(uintptr_t{sizeof info_log})};
  CUmodule module = nullptr;
  CUresult r = Driver().module_load_data_ex(&module, ptx.c_str(), 4, opts, vals);
  if (r != CUDA_SUCCESS)
    gpurt::Fail(r, "cuModuleLoadDataEx",
              "the driver rejected the PTX (" + Describe(r) + "); the driver's JIT log: " +
                  (error_log[0] ? error_log : "(empty)") +
                  (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION
                       ? " (the PTX is newer than this driver: update the driver or generate older PTX)"
                       : ""));
  return module;
}

void UnloadModule(void* module) { Driver().module_unload(static_cast<CUmodule>(module)); }

void* GetFunction(void* module, const std::string& name) {
  CUfunction fn = nullptr;
  CUresult r = Driver().module_get_function(&fn, static_cast<CUmodule>(module), name.c_str());
  if (r != CUDA_SUCCESS)
    gpurt::Fail(r, "cuModuleGetFunction", "the module has no kernel '" + name + "' (" + Describe(r) + ")");
  return fn;
}

void SetMaxDynamicSharedMemory(void* function, int bytes) {
  CUresult r = Driver().func_set_attribute(static_cast<CUfunction>(function),
                                           CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
  if (r != CUDA_SUCCESS)
    gpurt::Fail(r, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
              std::to_string(bytes) + " bytes: " + Describe(r));
}

void Launch(void* function, gpurt::Dim3 g, gpurt::Dim3 b, unsigned shared_bytes, void* stream, void** args) {
  CUresult r = Driver().launch_kernel(static_cast<CUfunction>(function), g.x, g.y, g.z, b.x, b.y, b.z, shared_bytes,
                                      static_cast<CUstream>(stream), args, nullptr);
  if (r != CUDA_SUCCESS)
    gpurt::Fail(r, "cuLaunchKernel",
              "grid (" + std::to_string(g.x) + ", " + std::to_string(g.y) + ", " + std::to_string(g.z) +
                  "), block (" + std::to_string(b.x) + ", " + std::to_string(b.y) + ", " + std::to_string(b.z) +
                  "), " + std::to_string(shared_bytes) + " bytes of dynamic shared memory: " + Describe(r));
}

}  // namespace drv

}  // namespace kiln::cuda

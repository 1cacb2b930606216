// Kernels on a real GPU through the CUDA driver API: PTX modules loaded with cuModuleLoadDataEx
// (the driver JIT-compiles them; its error log is quoted in the DeviceError) and launches with
// cuLaunchKernel on a kiln stream. The driver's functions are reached through
// cudaGetDriverEntryPointByVersion for the toolkit's CUDA_VERSION, so each binds the interface
// cuda.h declares (never dlsym of a bare legacy name, which binds the old one, e.g. cuMemAlloc
// instead of cuMemAlloc_v2). Also: driver version and device description for reports.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "kiln/runtime/cuda.h"
#include "kiln/runtime/error.h"

namespace kiln::cuda {

namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    KILN_THROW(DeviceError) << what << " failed: " << cudaGetErrorString(e) << " (" << static_cast<int>(e) << ")";
  }
}

struct DriverApi {
  decltype(&::cuModuleLoadDataEx) module_load_data_ex = nullptr;
  decltype(&::cuModuleGetFunction) module_get_function = nullptr;
  decltype(&::cuLaunchKernel) launch_kernel = nullptr;
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
                            << "driver that supports it (driver CUDA version " << DriverVersion() << ")";
  }
  f = reinterpret_cast<F>(p);
}

const DriverApi& Driver() {
  static const DriverApi api = [] {
    DriverApi a;
    Resolve("cuModuleLoadDataEx", a.module_load_data_ex);
    Resolve("cuModuleGetFunction", a.module_get_function);
    Resolve("cuLaunchKernel", a.launch_kernel);
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

/// Makes `d` current on this thread for the lifetime of the guard (the primary context, which
/// cudart creates on first use), restoring the previous device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(const Device& d) {
    cudaGetDevice(&prev_);
    Check(cudaSetDevice(d.index), "cudaSetDevice");
    Check(cudaFree(nullptr), "cudaFree(nullptr) (context creation)");
  }
  ~DeviceGuard() { cudaSetDevice(prev_); }

 private:
  int prev_ = 0;
};

}  // namespace

int DriverVersion() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

int ComputeCapability(const Device& d) {
  int major = 0, minor = 0;
  Check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d.index), "cudaDeviceGetAttribute");
  Check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d.index), "cudaDeviceGetAttribute");
  return major * 10 + minor;
}

std::string DeviceDescription(const Device& d) {
  cudaDeviceProp p{};
  Check(cudaGetDeviceProperties(&p, d.index), "cudaGetDeviceProperties");
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB", p.name, p.major, p.minor,
                p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1u << 30),
                static_cast<double>(p.l2CacheSize) / (1u << 20));
  return buf;
}

void* LoadKernel(const Device& d, const std::string& ptx, const std::string& name) {
  static std::mutex mu;
  static auto* loaded = new std::map<std::tuple<int, std::string, std::string>, void*>;  // process lifetime
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(d.index, name, ptx);
  if (auto it = loaded->find(key); it != loaded->end()) return it->second;
  const DriverApi& api = Driver();
  DeviceGuard guard(d);
  static char error_log[16384], info_log[16384];  // under `mu`
  error_log[0] = info_log[0] = 0;
  CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER,
                         CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
  void* vals[] = {error_log, reinterpret_cast<void*>(uintptr_t{sizeof error_log}), info_log,
                  reinterpret_cast<void*>(uintptr_t{sizeof info_log})};
  CUmodule module = nullptr;
  CUresult r = api.module_load_data_ex(&module, ptx.c_str(), 4, opts, vals);
  if (r != CUDA_SUCCESS)
    KILN_THROW(DeviceError) << "cuModuleLoadDataEx on gpu(" << d.index << ") rejected the PTX of kernel '" << name
                            << "': " << Describe(r) << "; the driver's JIT log: "
                            << (error_log[0] ? error_log : "(empty)")
                            << (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION
                                    ? " (the PTX is newer than this driver: update the driver or generate older PTX)"
                                    : "");
  CUfunction fn = nullptr;
  r = api.module_get_function(&fn, module, name.c_str());
  if (r != CUDA_SUCCESS)
    KILN_THROW(DeviceError) << "cuModuleGetFunction: the PTX module has no kernel '" << name << "': " << Describe(r);
  loaded->emplace(std::move(key), fn);
  return fn;
}

void LaunchKernel(void* kernel, unsigned grid, unsigned block, unsigned shared_bytes, void** args, void* stream) {
  CUstream s = static_cast<CUstream>(stream ? stream : CurrentStream());
  CUresult r = Driver().launch_kernel(static_cast<CUfunction>(kernel), grid, 1, 1, block, 1, 1, shared_bytes, s, args,
                                      nullptr);
  if (r != CUDA_SUCCESS)
    KILN_THROW(DeviceError) << "cuLaunchKernel(grid " << grid << ", block " << block << ", " << shared_bytes
                            << " bytes of dynamic shared memory) failed: " << Describe(r);
}

}  // namespace kiln::cuda

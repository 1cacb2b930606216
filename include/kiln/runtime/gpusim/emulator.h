// The seam between the simulated GPU and its kernel emulator (DESIGN.md section 4a).
//
// runtime/gpusim/ owns the simulated devices: streams as worker threads, events, device memory
// the host cannot touch, copies, launch-limit checks and capture rules. It knows no LLVM. The
// kernel emulator (in codegen/, which has LLVM) turns the NVPTX LLVM IR of a module into x86 code
// whose GPU threads run as fibers, and registers itself here at start-up. A simulated launch
// checks the limits, then calls EmulatedKernel::Run on the stream's worker thread.
//
// The device memory of a simulated platform (all its GPUs) lies in one reserved address range that
// the host cannot touch (a host access faults, as on a real GPU). The same pages are mapped a second
// time at `address + alias_delta`; simulated kernels and simulated copies reach device memory only
// through that alias. A process may hold several simulated platforms (tests make private ones),
// each with a window of its own: a launch translates with the window of the platform running it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::gpusim {

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

/// What a launch check needs to know of a kernel (as cuFuncGetAttribute reports it; registers
/// from `ptxas -v` of the same IR's PTX when ptxas is available, else an estimate).
struct KernelAttributes {
  int num_regs = 0;
  size_t static_smem_bytes = 0;
  int max_threads_per_block = 1024;
  size_t max_dynamic_smem_bytes = 48 * 1024;  ///< raised by the per-kernel opt-in
  /// Bytes of each kernel parameter, in order (cuFuncGetParamInfo): a launch copies the values
  /// `args` points to before it returns, as CUDA does. Empty: unknown, and a launch then waits
  /// for the kernel (the caller's `args` must stay valid while it runs), and cannot be captured.
  std::vector<size_t> param_sizes;
};

/// A kernel failed while it ran: the CUDA error it stands for (e.g. 700 illegal address, 719
/// launch failure) and what happened (which block and thread, which barrier, which address).
struct KernelFault {
  int cuda_error = 0;
  std::string message;
};

class EmulatedKernel {
 public:
  virtual ~EmulatedKernel() = default;
  virtual KernelAttributes& attributes() = 0;
  /// Runs every block of the launch, in a random order, on the calling thread. `args` is
  /// cuLaunchKernel's `void**` (one pointer per kernel parameter). Returns a fault instead of
  /// throwing, so that the stream can record it as a sticky error as a real GPU does.
  virtual std::unique_ptr<KernelFault> Run(Dim3 grid, Dim3 block, size_t dynamic_smem_bytes,
                                           void** args) = 0;
};

class EmulatedModule {
 public:
  virtual ~EmulatedModule() = default;
  /// nullptr when the module has no kernel of that name (CUDA_ERROR_NOT_FOUND above).
  virtual EmulatedKernel* Function(const std::string& name) = 0;
};

/// Builds a module from NVPTX LLVM IR (text). Throws kiln::DeviceError naming what it could not
/// translate. Installed by codegen at start-up (see SetModuleCompiler's caller there).
using ModuleCompiler = std::unique_ptr<EmulatedModule> (*)(std::string_view nvptx_ir);
void SetModuleCompiler(ModuleCompiler compiler);
/// nullptr when no emulator was installed (a build without codegen): launches then fail clearly.
ModuleCompiler GetModuleCompiler();

/// Where one simulated platform's device memory lies. `alias_delta` is 0 when no simulated GPU exists.
struct MemoryWindow {
  uintptr_t device_begin = 0, device_end = 0;
  intptr_t alias_delta = 0;
};
/// The window of the device memory the calling thread reaches: inside a simulated platform's
/// launch (on its stream's worker), that platform's; elsewhere, that of the simulated device
/// memory made last that still lives. Read it when a launch starts: it may change between launches.
const MemoryWindow& DeviceMemoryWindow();

/// For the emulator's checked mode (KILN_GPU_SIM_ASAN=1): whether [address, address + bytes)
/// lies inside one live device allocation (device addresses, not alias addresses): inside a
/// launch, one of the launching platform's; elsewhere, one of any simulated platform's.
bool IsLiveDeviceRange(uintptr_t address, size_t bytes);

}  // namespace kiln::gpusim

// The kernel emulator of the simulated GPU (DESIGN.md section 4a): runs the NVPTX LLVM IR that
// becomes PTX on a real GPU (codegen's kernels, PtxKernel::ir; or CUDA C++ compiled by clang to
// NVPTX IR) on the host. The IR is rewritten for x86 and JIT-compiled; each GPU thread of a block
// is a fiber, so __syncthreads and shared memory work; blocks run in a seeded random order.
// Device memory is reached through the simulated devices' alias window (gpusim/emulator.h); in
// checked mode (KILN_GPU_SIM_ASAN=1) every device access is checked against the live allocations.
// This header includes no LLVM header.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "kiln/runtime/gpusim/emulator.h"

namespace kiln::codegen {

struct EmulatorOptions {
  /// Check every device access (out of bounds: cuda error 700; misaligned: 716). Default:
  /// KILN_GPU_SIM_ASAN.
  std::optional<bool> checked;
  /// The seed of the blocks' order. Default: KILN_GPU_SIM_SEED when the module is compiled (a
  /// bad value is a ValueError there, not in a launch).
  std::optional<uint64_t> seed;
};

/// Compiles a module of NVPTX LLVM IR (text) for the emulator. Throws DeviceError when the IR
/// cannot be parsed or uses what the emulator does not translate (warp shuffles, unknown inline
/// PTX, external functions), naming it. Thread-safe. The code lives as long as the process.
std::unique_ptr<gpusim::EmulatedModule> CompileEmulatedModule(std::string_view nvptx_ir,
                                                              const EmulatorOptions& options = {});

/// Installs CompileEmulatedModule as the simulated GPUs' module compiler
/// (gpusim::SetModuleCompiler). Called once at start-up by whoever links codegen (an explicit
/// call: a static initializer in a static library may be dropped by the linker).
void InstallGpuEmulator();

} // namespace kiln::codegen

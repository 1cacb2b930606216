// Internal to codegen/'s kernel emulator (DESIGN.md section 4a): what the IR rewriter
// (gpusim_rewrite.cc), the fiber scheduler (gpusim_fiber.cc) and the module compiler
// (gpusim_module.cc) share. The rewritten kernel code calls the host helpers below through
// constant addresses baked into the IR, so nothing depends on the JIT resolving kiln's symbols.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/runtime/gpusim/emulator.h"

namespace llvm {
class Module;
}

namespace kiln::codegen::gpusim_detail {

/// The special registers a kernel may read, as the helper's argument.
enum Sreg : int {
  kTidX,
  kTidY,
  kTidZ,
  kNtidX,
  kNtidY,
  kNtidZ,
  kCtaidX,
  kCtaidY,
  kCtaidZ,
  kNctaidX,
  kNctaidY,
  kNctaidZ,
  kWarpSize,
  kLaneId,
  kWarpId,
};

/// A __syncthreads variant: plain, or one that also reduces a predicate over the block.
enum BarrierKind : int { kBarPlain, kBarPopc, kBarAnd, kBarOr };

/// A directed-rounding arithmetic operation (libdevice uses add.rz, fma.rm, ...).
enum RoundOp : int { kRAdd, kRMul, kRFma, kRDiv, kRSqrt, kRRcp };
enum RoundMode : int { kRoundNearest, kRoundZero, kRoundDown, kRoundUp };

/// Addresses of the host helpers the rewritten IR calls (extern "C", plain scalar arguments).
struct Helpers {
  uintptr_t sreg;         ///< uint32_t (int which)
  uintptr_t barrier;      ///< int (int kind, int predicate)
  uintptr_t shared_base;  ///< char* ()
  uintptr_t check_access; ///< void* (void* address, uint64_t bytes, int flags, uint64_t align): translated
                          ///< flags: 1 a store, 2 a shared-memory access
  uintptr_t rounded_f32;  ///< float (int op, int mode, float a, float b, float c)
  uintptr_t rounded_f64;  ///< double (int op, int mode, double a, double b, double c)
  uintptr_t window;       ///< const gpusim::MemoryWindow* (): the launch's (its platform's device memory)
};
const Helpers& HostHelpers();

/// What the rewriter found out about a module.
struct RewriteResult {
  struct Kernel {
    std::string name;       ///< as in the IR
    std::string entry;      ///< the trampoline `void entry(void** args)` in the rewritten module
    int max_threads = 1024; ///< from a maxntid annotation
  };
  std::vector<Kernel> kernels;
  size_t static_smem_bytes = 0;
  bool has_barrier = false; ///< some code calls __syncthreads (fibers need stacks of their own)
  std::string table;        ///< `void table(void** out)`: stores each kernel's entry, in order
};

/// Rewrites NVPTX IR in `m` for the host (special registers, barriers, shared memory, device
/// memory translation or checks, libdevice intrinsics, inline PTX) and retargets it to the host.
/// `unique` names the module's one external symbol. Throws DeviceError for what it cannot translate.
RewriteResult RewriteForHost(llvm::Module& m, bool checked, const std::string& unique);

/// The entry of one kernel, after JIT compilation.
using EntryFn = void (*)(void** args);

/// Runs every block of a launch as fibers on the calling thread, blocks in a seeded random order.
std::unique_ptr<gpusim::KernelFault> RunLaunch(EntryFn entry, const std::string& kernel, bool has_barrier,
                                               size_t static_smem, gpusim::Dim3 grid, gpusim::Dim3 block,
                                               size_t dynamic_smem, void** args, uint64_t seed);

} // namespace kiln::codegen::gpusim_detail

// PTX for NVIDIA GPUs from fused elementwise expressions (DESIGN.md section 9), through LLVM's
// NVPTX backend with NVIDIA's libdevice linked in for the transcendental functions. The PTX is
// text: the CUDA driver (cuModuleLoadData) compiles it for the GPU at hand; `ptxas` checks it on
// a machine without one. This header includes no LLVM header.
#pragma once

#include <string>

#include "kiln/codegen/elementwise.h"

namespace kiln::codegen {

/// One generated GPU kernel.
struct PtxKernel {
  /// The entry point: extern "C" __global__ void name(float* out, const float* in0, ...,
  /// const float* in{k-1}, int64_t n). Each thread computes the elements
  /// i = blockIdx.x * blockDim.x + threadIdx.x + j * gridDim.x * blockDim.x < n (a grid-stride
  /// loop), so any launch shape covers all n; inputs are read as Expr says (broadcast inputs at
  /// (i / inner) % outer). `out` may be one of the inputs.
  std::string name;
  std::string arch;  ///< "sm_80", ...
  std::string ptx;   ///< the PTX module (text), self-contained: libdevice is linked in
  /// The optimized NVPTX LLVM IR (text) the PTX was emitted from, libdevice linked in: what the
  /// simulated GPU's kernel emulator runs (codegen/gpusim_emulator.h).
  std::string ir;
  int num_inputs = 0;
  double compile_ms = 0;
};

/// Generates the PTX kernel of `e` for the GPU architecture `arch` ("sm_75", "sm_80", "sm_90",
/// ...), optimized at O3. Results are kept in the kernel cache (kernel_cache.h), in memory and on
/// disk, by expression, architecture and libdevice.
/// Throws UnsupportedError when `e` cannot be lowered (or needs libdevice and it is missing),
/// ValueError for an architecture LLVM's NVPTX backend does not know.
PtxKernel GeneratePtx(const Expr& e, const std::string& arch);

/// libdevice (libdevice.10.bc) of the CUDA toolkit under $CUDA_HOME, $CUDA_PATH or
/// /usr/local/cuda; "" when none is found.
std::string FindLibdevice();

/// The `ptxas` assembler of the CUDA toolkit (same places, then PATH); "" when none is found.
std::string FindPtxas();

}  // namespace kiln::codegen

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

/// The reductions GenerateReducePtx makes (mean is a sum with scale 1 / len).
enum class GpuReduce : int { kSum, kMax, kMin };
/// Threads per block of a reduction kernel (its launch must use exactly this many).
constexpr int kReduceThreads = 256;

/// Dims the strided GPU kernels index (sizes and strides passed as that many i64 each; unused
/// leading dims have size 1 and stride 0).
constexpr int kGpuIndexDims = 6;

/// The PTX kernel `kiln_reduce_<kind>`(float* out, const float* in, int64_t rows, int64_t len,
/// float scale, int64_t kept_sizes[6], kept_strides[6], reduced_sizes[6], reduced_strides[6]) (each
/// array as six i64 arguments): out[r] = scale * reduce over j < len of in[kept offset of r +
/// reduced offset of j] for r < rows, offsets in elements, indices row-major over the dims. Any
/// set of axes of a strided tensor of up to six dims. One block of kReduceThreads threads per
/// row, any grid (a grid-stride loop over rows); shared-memory tree. Kept in the kernel cache
/// like GeneratePtx's.
PtxKernel GenerateReducePtx(GpuReduce kind, const std::string& arch);

/// The PTX kernel `kiln_strided_copy_<bytes>`(void* out, const void* in, int64_t n, int64_t
/// sizes[6], strides[6]): out[i] = in[offset of i] for i < n, elements of `element_bytes` (1, 2,
/// 4 or 8) bytes, offsets in elements; a strided view made contiguous.
PtxKernel GenerateStridedCopyPtx(int element_bytes, const std::string& arch);

/// The PTX kernel `kiln_fill_<bytes>`(void* out, int64_t n, int64_t bits): every one of the n
/// elements of `element_bytes` (1, 2, 4 or 8) bytes set to the low bits of `bits`.
PtxKernel GenerateFillPtx(int element_bytes, const std::string& arch);

/// libdevice (libdevice.10.bc) of the CUDA toolkit under $CUDA_HOME, $CUDA_PATH or
/// /usr/local/cuda; "" when none is found.
std::string FindLibdevice();

/// The `ptxas` assembler of the CUDA toolkit (same places, then PATH); "" when none is found.
std::string FindPtxas();

}  // namespace kiln::codegen

// What codegen's GPU kernel bindings share (gpu_kernels*.cc): the PTX target of a device, the
// cache of loaded kernels, the hand-written kernels of codegen/cu/, strided index arguments and
// the grid-stride launch. Internal to codegen/.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/codegen/ptx.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel.h"

namespace kiln::codegen {

/// The PTX target for device `d`: its compute capability, at most sm_90 (the newest LLVM 19's
/// NVPTX backend emits; PTX is forward compatible, the driver compiles it for newer GPUs).
std::string ArchOf(const Device& d);

/// The kernel `make` generates for `key` (an expression's exact form, or a fixed kernel's name),
/// loaded once per device; later calls are one lookup.
void* LoadedOnce(const std::string& key, const Device& d, const std::function<PtxKernel()>& make);

/// The hand-written kernel `kernel` of codegen/cu/`module`.cu on device `d`, loaded once.
void* CuKernel(const Device& d, const char* module, const std::string& kernel);

/// The sizes and strides of `dims` of `v` as a strided kernel's 2 * kGpuIndexDims arguments
/// (unused leading dims size 1, stride 0). DeviceError beyond kGpuIndexDims dims.
void IndexArgs(const OpInfo& op, const TensorView& v, const std::vector<int>& dims, int64_t* out);

/// Launches a grid-stride kernel over n > 0 elements: blocks of 256 threads, enough blocks to
/// fill the GPU (a few per SM) and no more; the loop covers the rest.
void LaunchGridStride(void* fn, int64_t n, void** args);

/// Unary and binary elementwise ops, cast, and sum/mean/max/min (kind 0-3) of any dtype and
/// strides (gpu_kernels_dtypes.cc; gpu_kernels.cc sends them what its float32 kernels do not take).
void ElementwiseAnyGpu(const KernelArgs& a);
void CastGpu(const KernelArgs& a);
void ReduceAnyGpu(const KernelArgs& a, int kind);
/// IndexArgs of `dims` of `v` with size-1 dims dropped and neighbours merged where the strides allow.
void MergedIndexArgs(const OpInfo& op, const TensorView& v, const std::vector<int>& dims, int64_t* out);

/// A reduction of a.in[0] over the op's `axes` (all when none): its rows (kept elements) and row
/// length, and the kept then the reduced dims (merged) as 4 * kGpuIndexDims kernel arguments;
/// the arguments `args` of a reduce kernel (out, in, rows, len, fifth) with them.
struct GpuReduction {
  void* out;
  void* in;
  int64_t rows = 1, len = 1;
  int64_t index[4 * kGpuIndexDims];
  void* args[5 + 4 * kGpuIndexDims];
};
void SetUpReduction(const KernelArgs& a, GpuReduction* r);
/// Launches reduce kernel `fn` of `r` (whose args[4] the caller set): one block of
/// kReduceThreads per row, at most 4096 blocks (more rows loop).
void LaunchReduction(void* fn, GpuReduction& r);

/// Binds the kernels of each file of codegen's GPU kernels (called by BindGpuElementwiseKernels).
void BindGpuCreationKernels(KernelTable& t);  // gpu_kernels_creation.cc
void BindGpuIndexKernels(KernelTable& t);     // gpu_kernels_index.cc

}  // namespace kiln::codegen

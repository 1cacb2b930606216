// GPU kernels that codegen provides to runtime's kernel table (codegen/gpu_kernels.cc): the
// elementwise ops and reductions, generated through the NVPTX path. frontend/dispatch.cc adds them
// (KernelTable::AddBinder) where ops dispatch; runtime/ itself knows nothing of codegen.
#pragma once

#include "kiln/runtime/kernel.h"

namespace kiln::codegen {

/// Binds the GPU kernels of the unary and binary elementwise ops, copy, stop_gradient, full
/// (float32), reshape views, sum/mean/max/min and broadcast_to into `t`; nothing in
/// a build without CUDA.
void BindGpuElementwiseKernels(KernelTable& t);

}  // namespace kiln::codegen

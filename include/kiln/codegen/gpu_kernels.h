// GPU kernels that codegen provides to runtime's kernel table (codegen/gpu_elementwise.cc): the
// elementwise ops, generated through the NVPTX path. frontend/dispatch.cc adds them
// (KernelTable::AddBinder) where ops dispatch; runtime/ itself knows nothing of codegen.
#pragma once

#include "kiln/runtime/kernel.h"

namespace kiln::codegen {

/// Binds the GPU kernels of the unary and binary elementwise ops, copy, stop_gradient and cast
/// (same-dtype only) into `t`; nothing in a build without CUDA.
void BindGpuElementwiseKernels(KernelTable& t);

}  // namespace kiln::codegen

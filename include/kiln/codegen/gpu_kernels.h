// GPU kernels that codegen provides to runtime's kernel table (codegen/gpu_kernels.cc): the
// elementwise ops and reductions, generated through the NVPTX path. frontend/dispatch.cc adds them
// (KernelTable::AddBinder) where ops dispatch; runtime/ itself knows nothing of codegen.
#pragma once

#include "kiln/runtime/kernel.h"

namespace kiln::codegen {

/// Binds the GPU kernels into `t`: the unary and binary elementwise ops and sum/mean/max/min
/// (float32), copy, stop_gradient and full (any dtype), and the view ops (reshape, transpose,
/// slice, broadcast_to, expand_dims, squeeze; any dtype). Also in a build without CUDA: simulated GPUs (KILN_GPU_SIM) run them there too.
void BindGpuElementwiseKernels(KernelTable& t);

}  // namespace kiln::codegen

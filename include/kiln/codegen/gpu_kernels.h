// GPU kernels that codegen provides to runtime's kernel table (codegen/gpu_kernels.cc): the
// elementwise ops and reductions, generated through the NVPTX path. frontend/dispatch.cc adds them
// (KernelTable::AddBinder) where ops dispatch; runtime/ itself knows nothing of codegen.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kiln/runtime/kernel.h"

namespace kiln::codegen {

/// Binds the GPU kernels into `t`: the unary and binary elementwise ops and sum/mean/max/min
/// (float32), copy, stop_gradient and full (any dtype), and the view ops (reshape, transpose,
/// slice, broadcast_to, expand_dims, squeeze; any dtype). Also in a build without CUDA: simulated GPUs (KILN_GPU_SIM) run them there too.
void BindGpuElementwiseKernels(KernelTable& t);

/// The PTX target of GPU `d` ("sm_80", ...): its compute capability, at most sm_90.
std::string PtxArchOf(const Device& d);

}  // namespace kiln::codegen

namespace kiln::codegen {

/// One parameter of a GPU SGD update (device pointers; mom null without momentum; lr and wd with
/// the parameter's multipliers applied).
struct GpuSgdParam {
  void* w;
  void* g;
  void* mom;
  int64_t n;
  double lr, wd;
};
/// One parameter of a GPU Adam/AdamW update.
struct GpuAdamParam {
  void* w;
  void* g;
  void* m;
  void* v;
  int64_t n;
  double lr, wd;
};
struct GpuAdamScalars {
  double rescale, clip, beta1, beta2, eps, step_scale /*1/(1-beta1^t)*/, bc2_sqrt /*sqrt(1-beta2^t)*/;
  bool decoupled;
};

/// Whether this build has the optimizers' GPU kernels (codegen/cu/optim.cu: clang-19 was found).
bool HaveGpuOptimizerKernels();
/// The updates of include/kiln/frontend/optim.h on device `d`, float32 or float64 (`dt`), launched
/// on the calling engine worker's stream (run them inside an engine task of device `d`).
void GpuSgdUpdate(const Device& d, DType dt, std::span<const GpuSgdParam> ps, double rescale, double clip,
                  double momentum);
void GpuAdamUpdate(const Device& d, DType dt, std::span<const GpuAdamParam> ps, const GpuAdamScalars& s);

}  // namespace kiln::codegen

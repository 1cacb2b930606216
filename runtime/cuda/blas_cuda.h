// The CUDA platform's GEMM (blas_cuda.cc), internal to runtime/cuda/: gpu.h's Platform::Gemm on
// cuBLASLt. Errors are gpurt::BlasErrors with cuBLAS's status.
#pragma once

#include "kiln/runtime/gpu.h"

namespace kiln::cuda {

/// `g` (already through gpurt::CheckGemm) on `stream` (a cudaStream_t) with `handle` (a
/// cublasLtHandle_t of the current device): returns once queued.
void LtGemm(void* handle, void* stream, const gpurt::GemmArgs& g);

}  // namespace kiln::cuda

// What every hand-written GPU kernel of codegen/cu/ needs. They are compiled by clang-19 as CUDA
// C++ without the CUDA headers (-nocudainc -nocudalib, ../../shared/GPU-SIM.md) into NVPTX LLVM
// IR (what a simulated GPU runs) and PTX (what a real GPU loads), libdevice linked in for the
// math functions (codegen/CMakeLists.txt); so the attribute macros and libdevice's declarations
// are written here.
#pragma once
#include <__clang_cuda_builtin_vars.h>

#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __device__ __attribute__((device))

extern "C" __device__ double __nv_log(double);
extern "C" __device__ double __nv_sin(double);
extern "C" __device__ double __nv_cos(double);
extern "C" __device__ double __nv_sqrt(double);

constexpr double kPi = 3.14159265358979323846;

/// This thread's index in the whole launch, and the launch's thread count (a grid-stride loop's
/// start and step).
__device__ inline long long GlobalThread() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline long long GridThreads() { return static_cast<long long>(gridDim.x) * blockDim.x; }

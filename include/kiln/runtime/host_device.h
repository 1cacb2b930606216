// KILN_HOST_DEVICE marks a function that both the CPU side (g++) and the hand-written GPU kernels
// (codegen/cu/*.cu, clang-19 as CUDA C++ without CUDA headers) compile.
#pragma once

#if defined(__CUDA__)
#define KILN_HOST_DEVICE __attribute__((device))
#else
#define KILN_HOST_DEVICE
#endif

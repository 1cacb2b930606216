// Hand-written CUDA C++ kernels compiled by clang-19 to NVPTX LLVM IR at build time
// (codegen/CMakeLists.txt), for the kernel emulator's tests (tests/cpp/test_gpu_emulator_cuda.cc):
// the IR clang makes of CUDA C++ (2D indices, __shared__ tiles, extern __shared__, __syncthreads,
// __syncthreads_count) runs on the emulator as it would on a GPU. Built without the CUDA headers
// (-nocudainc, GPU-SIM.md), so the attribute macros are defined here.
#include <__clang_cuda_builtin_vars.h>

#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __device__ __attribute__((device))

/// out (cols x rows) = transpose of in (rows x cols), through a 32 x 33 shared tile; blocks of
/// 32 x 8 threads, each thread moving 4 elements; any rows and cols.
extern "C" __global__ void transpose(const float* in, float* out, int rows, int cols) {
  __shared__ float tile[32][33];  // 33: no bank conflicts on the column reads
  int x = blockIdx.x * 32 + threadIdx.x;
  int y = blockIdx.y * 32 + threadIdx.y;
  for (int j = 0; j < 32; j += 8)
    if (x < cols && y + j < rows) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * cols + x];
  __syncthreads();
  x = blockIdx.y * 32 + threadIdx.x;
  y = blockIdx.x * 32 + threadIdx.y;
  for (int j = 0; j < 32; j += 8)
    if (x < rows && y + j < cols) out[(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}

/// Inclusive prefix sums of each block's stretch of `in` (Hillis-Steele over two halves of the
/// dynamic shared memory: 2 * blockDim.x floats); positives[block] = how many inputs were > 0
/// (__syncthreads_count, clang's __nvvm_bar0_popc).
extern "C" __global__ void block_scan(const float* in, float* out, int* positives, int n) {
  extern __shared__ float buf[];
  int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  float v = i < n ? in[i] : 0.0f;
  int count = __nvvm_bar0_popc(v > 0.0f);
  if (t == 0) positives[blockIdx.x] = count;
  float* src = buf;
  float* dst = buf + blockDim.x;
  src[t] = v;
  __syncthreads();
  for (unsigned step = 1; step < blockDim.x; step *= 2) {
    dst[t] = t >= step ? src[t] + src[t - step] : src[t];
    __syncthreads();
    float* swap = src;
    src = dst;
    dst = swap;
  }
  if (i < n) out[i] = src[t];
}

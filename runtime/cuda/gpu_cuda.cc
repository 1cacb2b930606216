// The GPU interface over the CUDA runtime. Without a driver or a GPU, DeviceCount() is 0
// (cudaGetDeviceCount reports error 35 or 100) and nothing else is called.
#include <cuda_runtime.h>

#include <mutex>

#include "kiln/runtime/error.h"
#include "kiln/runtime/cuda.h"

namespace kiln::cuda {

namespace {
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    KILN_THROW(DeviceError) << what << " failed: " << cudaGetErrorString(e) << " ("
                            << static_cast<int>(e) << ")";
}

thread_local cudaStream_t tls_stream = nullptr;
thread_local int tls_device = -1;
}  // namespace

bool CompiledWithCuda() { return true; }

int DeviceCount() {
  static int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver (35) or no device (100): no GPUs
      return 0;
    }
    return n;
  }();
  return count;
}

void BindWorkerThread(const Device& d, int stream_kind) {
  (void)stream_kind;
  Check(cudaSetDevice(d.index), "cudaSetDevice");
  Check(cudaStreamCreateWithFlags(&tls_stream, cudaStreamNonBlocking), "cudaStreamCreate");
  tls_device = d.index;
}

void* CurrentStream() { return tls_stream; }

void SynchronizeWorkerStream() {
  if (tls_stream) Check(cudaStreamSynchronize(tls_stream), "cudaStreamSynchronize");
}

void SynchronizeDevice(const Device& d) {
  Check(cudaSetDevice(d.index), "cudaSetDevice");
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void* DeviceMalloc(const Device& d, size_t nbytes) {
  int prev = 0;
  cudaGetDevice(&prev);
  Check(cudaSetDevice(d.index), "cudaSetDevice");
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, nbytes);
  cudaSetDevice(prev);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw std::bad_alloc();
  }
  Check(e, "cudaMalloc");
  return p;
}

void DeviceFree(const Device& d, void* p) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(d.index);
  cudaFree(p);
  cudaSetDevice(prev);
}

void* HostMallocPinned(size_t nbytes) {
  void* p = nullptr;
  Check(cudaHostAlloc(&p, nbytes, cudaHostAllocPortable), "cudaHostAlloc");
  return p;
}

void HostFreePinned(void* p) { cudaFreeHost(p); }

void CopyAsync(void* dst, const void* src, size_t nbytes, CopyKind kind) {
  cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                     : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                       : cudaMemcpyDeviceToDevice;
  Check(cudaMemcpyAsync(dst, src, nbytes, k, tls_stream), "cudaMemcpyAsync");
}

void CopyPeerAsync(void* dst, const Device& dst_dev, const void* src, const Device& src_dev,
                   size_t nbytes) {
  Check(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, nbytes, tls_stream),
        "cudaMemcpyPeerAsync");
}

void Memset(void* dst, int value, size_t nbytes) {
  Check(cudaMemsetAsync(dst, value, nbytes, tls_stream), "cudaMemsetAsync");
}

}  // namespace kiln::cuda

namespace kiln {
int NumGPUs() { return cuda::DeviceCount(); }
}  // namespace kiln

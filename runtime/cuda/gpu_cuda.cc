// The GPU interface over the CUDA runtime. Without a driver or a GPU, DeviceCount() is 0
// (cudaGetDeviceCount reports error 35 or 100) and nothing else is called.
//
// Pinned staging: kiln's host tensors are pageable memory, which the GPU's copy engines cannot
// read directly; the driver's own path for them ran at 7-15 GB/s on an H100 against 54 GB/s from
// pinned memory. A worker copying 1 MiB or more of pageable memory goes through two pinned
// buffers of its own instead: host memcpy (split over kiln's CPU threads) into one while the DMA
// of the other runs, ordered by events on the worker's stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "kiln/runtime/cpu/loops.h"

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

namespace {

constexpr size_t kStageChunk = size_t{8} << 20;  // bytes per staging buffer
constexpr size_t kStageMin = size_t{1} << 20;    // smaller copies go to cudaMemcpyAsync as they are

// Two pinned buffers per worker thread (so per stream and device), each with the event recorded
// after the last DMA that used it. Kept for the thread's life: workers live as long as the engine.
struct Staging {
  void* buf[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};
};
thread_local Staging tls_staging;

Staging& WorkerStaging() {
  Staging& s = tls_staging;
  if (!s.buf[0]) {
    for (int i = 0; i < 2; ++i) {
      Check(cudaHostAlloc(&s.buf[i], kStageChunk, cudaHostAllocPortable), "cudaHostAlloc (staging buffer)");
      Check(cudaEventCreateWithFlags(&s.done[i], cudaEventDisableTiming), "cudaEventCreate (staging)");
    }
  }
  return s;
}

bool IsPageable(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return a.type == cudaMemoryTypeUnregistered;
}

void HostCopy(void* dst, const void* src, size_t n) {
  constexpr size_t kPiece = size_t{1} << 20;
  host::ParallelFor(static_cast<int64_t>((n + kPiece - 1) / kPiece), 2, [&](int64_t b, int64_t e) {
    size_t lo = static_cast<size_t>(b) * kPiece, hi = std::min(n, static_cast<size_t>(e) * kPiece);
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, hi - lo);
  });
}

void StagedHostToDevice(char* dst, const char* src, size_t n) {
  Staging& s = WorkerStaging();
  for (size_t off = 0, i = 0; off < n; off += kStageChunk, ++i) {
    const size_t k = i & 1, len = std::min(kStageChunk, n - off);
    Check(cudaEventSynchronize(s.done[k]), "cudaEventSynchronize (staging)");  // its last DMA is over
    HostCopy(s.buf[k], src + off, len);
    Check(cudaMemcpyAsync(dst + off, s.buf[k], len, cudaMemcpyHostToDevice, tls_stream), "cudaMemcpyAsync");
    Check(cudaEventRecord(s.done[k], tls_stream), "cudaEventRecord (staging)");
  }
}

void StagedDeviceToHost(char* dst, const char* src, size_t n) {
  Staging& s = WorkerStaging();
  const size_t chunks = (n + kStageChunk - 1) / kStageChunk;
  auto issue = [&](size_t i) {  // buffer i & 1 was emptied by the host copy of chunk i - 2
    const size_t off = i * kStageChunk, len = std::min(kStageChunk, n - off);
    Check(cudaMemcpyAsync(s.buf[i & 1], src + off, len, cudaMemcpyDeviceToHost, tls_stream), "cudaMemcpyAsync");
    Check(cudaEventRecord(s.done[i & 1], tls_stream), "cudaEventRecord (staging)");
  };
  issue(0);
  for (size_t i = 0; i < chunks; ++i) {
    if (i + 1 < chunks) issue(i + 1);  // the next DMA runs while this chunk is copied out
    const size_t off = i * kStageChunk, len = std::min(kStageChunk, n - off);
    Check(cudaEventSynchronize(s.done[i & 1]), "cudaEventSynchronize (staging)");
    HostCopy(dst + off, s.buf[i & 1], len);
  }
}

}  // namespace

void CopyAsync(void* dst, const void* src, size_t nbytes, CopyKind kind) {
  // Staging needs the worker's own stream (events and buffers are the worker's).
  if (tls_stream && nbytes >= kStageMin) {
    if (kind == CopyKind::kHostToDevice && IsPageable(src)) {
      StagedHostToDevice(static_cast<char*>(dst), static_cast<const char*>(src), nbytes);
      return;
    }
    if (kind == CopyKind::kDeviceToHost && IsPageable(dst)) {
      StagedDeviceToHost(static_cast<char*>(dst), static_cast<const char*>(src), nbytes);
      return;
    }
  }
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

// The GPU side of the runtime as the rest of kiln sees it: device count, per-worker CUDA
// streams, device memory and copies. Implemented over the CUDA runtime in runtime/cuda/ when
// kiln is built with CUDA, and by runtime/gpu_none.cc (no GPUs, every call a DeviceError)
// otherwise. Headers of the CUDA toolkit never leak through this file.
#pragma once

#include <cstddef>

#include "kiln/runtime/device.h"

namespace kiln::cuda {

/// True when kiln was compiled with the CUDA backend (whether or not a GPU is present).
bool CompiledWithCuda();
int DeviceCount();

/// Called once by each engine worker thread of a GPU device: makes the device current and
/// creates the thread's CUDA stream for `stream_kind` (compute, copy in, copy out, comm).
void BindWorkerThread(const Device& d, int stream_kind);
/// The CUDA stream (cudaStream_t) of the calling worker thread, as an opaque pointer.
void* CurrentStream();
/// Waits for the calling worker's stream.
void SynchronizeWorkerStream();
void SynchronizeDevice(const Device& d);

void* DeviceMalloc(const Device& d, size_t nbytes);
void DeviceFree(const Device& d, void* p);
void* HostMallocPinned(size_t nbytes);
void HostFreePinned(void* p);

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
/// Copies on the calling worker's stream (asynchronous when the host side is pinned).
void CopyAsync(void* dst, const void* src, size_t nbytes, CopyKind kind);
/// Copies between two GPUs (peer access when available, staged otherwise).
void CopyPeerAsync(void* dst, const Device& dst_dev, const void* src, const Device& src_dev,
                   size_t nbytes);
void Memset(void* dst, int value, size_t nbytes);

}  // namespace kiln::cuda

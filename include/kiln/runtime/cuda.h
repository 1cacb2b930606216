// The GPU side of the runtime as the engine, the allocator, collectives and tensors use it: device
// count, per-worker streams, device memory and copies, kernels. Implemented once
// (runtime/gpu_facade.cc) over the GPU platform of gpu.h, so the same code serves CUDA and the
// simulator (KILN_GPU_SIM). Headers of the CUDA toolkit never leak through this file.
#pragma once

#include <cstddef>
#include <string>

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
/// Copies on the calling worker's stream (asynchronous when the host side is pinned). On a GPU
/// worker, 1 MiB or more of pageable host memory goes through the worker's pinned staging buffers
/// (the host side is then done when this returns; the device side when the stream is).
void CopyAsync(void* dst, const void* src, size_t nbytes, CopyKind kind);
/// Copies between two GPUs (peer access when available, staged otherwise).
void CopyPeerAsync(void* dst, const Device& dst_dev, const void* src, const Device& src_dev,
                   size_t nbytes);
void Memset(void* dst, int value, size_t nbytes);

/// Checks a GPU kernel makes without the host waiting for it (DESIGN.md section 4: GPU work is
/// ordered by events, never by host waits). A kernel that finds bad input (a class label out of
/// range) writes what it found into its device's error record; the copy of that record into
/// pinned host memory is queued behind it (CUDA-graph capturable: fixed addresses); the host
/// raises it at its next sync point with the GPU (wait_to_read, asnumpy, waitall, a copy to the
/// CPU), as CUDA reports a kernel's fault at the next synchronization.
enum class DeferredCheck : int64_t { kNone = 0, kBadLabel = 1, kBadTakeIndex = 2, kBadTakeGradIndex = 3 };
/// The record of device `d` (8 int64 on the device, laid out as codegen/cu/index.cu's
/// RecordFirstBad writes them), zeroed; allocated on its first use.
int64_t* DeviceErrorRecord(const Device& d);
/// Queues, on the calling worker's stream, the copy of `d`'s record into host memory.
void PublishDeviceErrors(const Device& d);
/// At a sync point: throws an error recorded on a device and not raised yet (DeferredDeviceError,
/// a ValueError: the first bad label or index of the first failed check since the last one raised
/// on that device, with the CPU's message for it), and clears it; nothing when no check failed.
void RaiseDeferredDeviceErrors();

/// The CUDA version the driver supports (13000 for 13.0); 0 without a driver.
int DriverVersion();
/// "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB" for device `d`.
std::string DeviceDescription(const Device& d);
/// The compute capability of `d` as 10 * major + minor (90 for sm_90).
int ComputeCapability(const Device& d);
/// Loads the PTX module `ptx` on device `d` (the driver JIT-compiles it; cached by the driver for
/// the process) and returns its kernel `name` as an opaque CUfunction. A module the driver rejects
/// (PTX newer than the driver, a wrong name) is a DeviceError quoting the driver's JIT log.
/// PTX alone does not run on the simulator: give it the NVPTX IR with the overload below.
void* LoadKernel(const Device& d, const std::string& ptx, const std::string& name);
/// As above for a module image holding both the NVPTX IR (for the simulator) and the PTX.
void* LoadKernel(const Device& d, const std::string& nvptx_ir, const std::string& ptx, const std::string& name);
/// Launches `kernel` with a 1-D grid on `stream` (a cudaStream_t; nullptr: the calling worker's
/// stream). `args` is the real void** of kernel parameters. Launch errors (block too large, too
/// much shared memory) are DeviceErrors with the driver's name for them.
void LaunchKernel(void* kernel, unsigned grid, unsigned block, unsigned shared_bytes, void** args,
                  void* stream = nullptr);

/// CUDA graphs on the calling worker's stream (thread-local capture mode: this thread may not
/// allocate, free or synchronize until EndCapture). EndCapture instantiates what was captured and
/// returns it (opaque); a capture a prohibited call invalidated throws the platform's GpuError.
void BeginCapture();
void* EndCapture();
/// Whether the calling thread is between BeginCapture and EndCapture (an invalidated capture
/// included). Costs no API call.
bool Capturing();
void LaunchGraph(void* graph);
void DestroyGraph(void* graph);

}  // namespace kiln::cuda

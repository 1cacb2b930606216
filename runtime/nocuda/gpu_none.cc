// The GPU interface when kiln is built without CUDA: no devices, and every use is a DeviceError.
#include "kiln/runtime/error.h"
#include "kiln/runtime/cuda.h"

namespace kiln::cuda {

namespace {
[[noreturn]] void NoCuda() {
  KILN_THROW(DeviceError) << "kiln was built without CUDA (KILN_CUDA=OFF); use kiln.cpu(), or "
                             "rebuild with the CUDA toolkit installed";
}
}  // namespace

bool CompiledWithCuda() { return false; }
int DeviceCount() { return 0; }
void BindWorkerThread(const Device&, int) { NoCuda(); }
void* CurrentStream() { return nullptr; }
void SynchronizeWorkerStream() {}
void SynchronizeDevice(const Device&) {}
void* DeviceMalloc(const Device&, size_t) { NoCuda(); }
void DeviceFree(const Device&, void*) { NoCuda(); }
void* HostMallocPinned(size_t) { NoCuda(); }
void HostFreePinned(void*) { NoCuda(); }
void CopyAsync(void*, const void*, size_t, CopyKind) { NoCuda(); }
void CopyPeerAsync(void*, const Device&, const void*, const Device&, size_t) { NoCuda(); }
void Memset(void*, int, size_t) { NoCuda(); }

}  // namespace kiln::cuda

namespace kiln {
int NumGPUs() { return 0; }
}  // namespace kiln

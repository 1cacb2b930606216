// The fuzz build links the readers without the device layer (runtime/gpu_facade.cc pulls in the
// GPU simulator, CUDA and the engine): a process with no GPU, built without CUDA, as the readers
// see it through CheckDeviceExists.
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/device.h"

namespace kiln {
int NumGPUs() { return 0; }
namespace cuda {
bool CompiledWithCuda() { return false; }
}  // namespace cuda
}  // namespace kiln
